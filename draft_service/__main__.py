from plumbing.omp_spin import shorten_idle_spin

shorten_idle_spin("draft")  # before the server's imports load torch

from draft_service.server import main  # noqa: E402

main()
