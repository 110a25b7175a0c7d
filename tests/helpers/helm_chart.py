"""Rendering k8s/splitspec in-process (helm-python-sdk: the Helm v4 Go library, no binary), and
reading what it renders: each object by kind and name, a service's flags as its pod gets them,
and each service's own argument parser to parse them with."""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path
from typing import Any

import helm_python as helm  # dev dependencies: a missing one fails, never skips
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "k8s" / "splitspec"
PROFILES = {p.stem: p for p in sorted((ROOT / "k8s" / "profiles").glob("*.yaml"))}
KUBE = "1.30.0"
NAMESPACE = "serving"
RELEASE = "demo"
GRPC_SERVICES = {
    "router": "splitspec.v1.Generation",
    "target": "splitspec.target.v1.TargetModel",
    "draft": "splitspec.draft.v1.DraftModel",
}
CRDS = {("monitoring.coreos.com/v1", "ServiceMonitor")}
Objects = dict[tuple[str, str], dict[str, Any]]


def profile(name: str) -> dict[str, Any]:
    return yaml.safe_load(PROFILES[name].read_text())


def render(values: dict[str, Any]) -> Objects:
    chart = helm.Chart.load(str(CHART))
    try:
        manifests = chart.render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)
    finally:
        chart.close()
    objects: Objects = {}
    for path, text in manifests.items():
        if path.endswith("NOTES.txt"):
            continue
        for doc in yaml.safe_load_all(text):
            if doc:
                key = (doc["kind"], doc["metadata"]["name"])
                assert key not in objects, f"{key} rendered twice"
                objects[key] = doc
    return objects


def name(component: str) -> str:
    return f"{RELEASE}-splitspec-{component}"


def container(objects: Objects, component: str) -> dict[str, Any]:
    (c,) = objects["Deployment", name(component)]["spec"]["template"]["spec"]["containers"]
    return c


def service_args(objects: Objects, component: str) -> list[str]:
    """The flags a pod's entrypoint reads: the ConfigMap key its env names."""
    c = container(objects, component)
    env = {e["name"]: e["value"] for e in c["env"]}
    path = Path(env["SPLITSPEC_ARGS_FILE"])
    mount = next(m for m in c["volumeMounts"] if m["mountPath"] == str(path.parent))
    pod = objects["Deployment", name(component)]["spec"]["template"]["spec"]
    volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    data = objects["ConfigMap", volume["configMap"]["name"]]["data"]
    return shlex.split(data[path.name])


def flag(args: list[str], name_: str) -> str:
    return args[args.index(name_) + 1]


def service_parsers() -> dict[str, argparse.ArgumentParser]:
    """Each service's whole command line, as its process parses it."""
    from draft_service.arguments import add_arguments as draft_arguments
    from model_runtime.service_main import service_parser
    from router.server import add_arguments as router_arguments
    from target_service.arguments import add_arguments as target_arguments

    router = argparse.ArgumentParser(exit_on_error=False)
    router_arguments(router)
    return {
        "router": router,
        "target": service_parser("target", None, target_arguments),
        "draft": service_parser("draft", None, draft_arguments),
    }
