"""The floors of the design card: the services and their ground packages never import
`splitspec` (the command line and launcher on top of them), so a service image needs none of
it and the top floor can change without touching what serves."""

from __future__ import annotations

import ast
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
BELOW_THE_TOP = (
    "router", "target_service", "draft_service", "model_runtime", "plumbing", "kernels",
)  # fmt: skip


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    return names | {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}


def test_services_never_import_the_command_line() -> None:
    files = [p for package in BELOW_THE_TOP for p in (REPO_ROOT / package).rglob("*.py")]
    assert len(files) > 100  # every package was found
    upward = sorted(
        f"{path.relative_to(REPO_ROOT)}: {module}"
        for path in files
        for module in imported_modules(path)
        if module == "splitspec" or module.startswith("splitspec.")
    )
    assert upward == [], upward
