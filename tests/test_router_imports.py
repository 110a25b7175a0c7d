"""The router never imports torch (DESIGN invariant 2): importing every router module, in a
fresh interpreter, leaves torch and transformers out of sys.modules."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
FORBIDDEN = ("torch", "transformers")

# Walks router/ and imports each module; router/__main__.py would start a server on import,
# so the modules it imports are imported instead.
PROBE = r"""
import ast, importlib, json, pkgutil, sys
import router

names = []
for info in pkgutil.walk_packages(router.__path__, "router."):
    if info.name.rsplit(".", 1)[-1] == "__main__":
        tree = ast.parse(open(info.module_finder.path + "/__main__.py").read())
        deps = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
        deps += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
        for dep in deps:
            importlib.import_module(dep)
        names.append(info.name)
        continue
    importlib.import_module(info.name)
    names.append(info.name)
print(json.dumps({"imported": names, "loaded": sorted(sys.modules)}))
"""


def test_no_router_module_imports_torch() -> None:
    result = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    on_disk = {p.stem for p in (REPO_ROOT / "router").glob("*.py")} - {"__init__"}
    assert {n.removeprefix("router.") for n in report["imported"]} >= on_disk
    assert "router.server" in report["loaded"] and "router.scheduler" in report["loaded"]
    leaked = [
        m for m in report["loaded"] if any(m == f or m.startswith(f + ".") for f in FORBIDDEN)
    ]
    assert not leaked, f"importing router/ loaded {leaked[:10]}"


def test_the_router_image_installs_every_router_dependency() -> None:
    """deploy/requirements-router.txt (the router image) lists each torch-free dependency."""
    import tomllib
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    deps = tomllib.loads((root / "pyproject.toml").read_text())["project"]["dependencies"]
    model_side = ("torch", "transformers", "accelerate", "safetensors")
    wanted = {d for d in deps if not d.startswith(model_side)}
    lines = (root / "deploy" / "requirements-router.txt").read_text().splitlines()
    listed = {line.strip() for line in lines if line.strip() and not line.startswith("#")}
    assert wanted <= listed, f"missing from the router image: {sorted(wanted - listed)}"
