from plumbing.omp_spin import shorten_idle_spin

shorten_idle_spin("target")  # before the server's imports load torch

from target_service.server import main  # noqa: E402

main()
