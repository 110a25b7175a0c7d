"""The Helm chart (k8s/splitspec): lint, render and validate, then assert on what it renders.

Helm itself runs in-process (helm-python-sdk: the Helm v4 Go library, no binary); every
rendered object is validated strictly against the Kubernetes 1.30 API schemas
(kubernetes-validate). The ServiceMonitor is a prometheus-operator CRD, not in those schemas,
so its fields are asserted here instead. The flags the chart renders for each service are
parsed by that service's own argument parser, so a renamed flag fails here, not in a cluster.
"""

from __future__ import annotations

import argparse
import base64
import shlex
from pathlib import Path
from typing import Any

import helm_python as helm  # dev dependencies: a missing one fails, never skips
import kubernetes_validate
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
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


@pytest.fixture(scope="module", params=sorted(PROFILES))
def profile_objects(request) -> tuple[str, Objects]:
    return request.param, render(profile(request.param))


def test_three_profiles_are_shipped() -> None:
    assert set(PROFILES) == {"cpu", "gpu-target-ngram-drafts", "gpu-eagle-drafts-hpa"}


@pytest.mark.parametrize("name_", sorted(PROFILES))
def test_lint_is_clean(name_: str) -> None:
    report = helm.lint(str(CHART), profile(name_), strict=True, kube_version=f"v{KUBE}")
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


def test_every_object_validates_against_kubernetes_1_30(profile_objects) -> None:
    _, objects = profile_objects
    kinds = {kind for kind, _ in objects}
    assert {"Deployment", "Service", "ConfigMap", "PodDisruptionBudget"} <= kinds
    for obj in objects.values():
        if (obj["apiVersion"], obj["kind"]) not in CRDS:
            kubernetes_validate.validate(obj, KUBE, strict=True)


def test_validation_catches_a_named_probe_port() -> None:
    """The check above can fail: the schema wants numeric gRPC probe ports."""
    deployment = render({})["Deployment", name("draft")]
    deployment["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["grpc"]["port"] = (
        "grpc"
    )
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBE, strict=True)


def test_probes_are_native_grpc_on_numeric_ports(profile_objects) -> None:
    _, objects = profile_objects
    for component, service in GRPC_SERVICES.items():
        c = container(objects, component)
        (port,) = [p["containerPort"] for p in c["ports"] if p["name"] == "grpc"]
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            assert c[probe]["grpc"]["port"] == port, (component, probe)
        assert c["readinessProbe"]["grpc"]["service"] == service
        assert "service" not in c["livenessProbe"]["grpc"]  # overall health, as liveness
        startup = c["startupProbe"]
        assert startup["periodSeconds"] * startup["failureThreshold"] >= 600  # model load


def test_router_resolves_the_drafts_headless_service(profile_objects) -> None:
    _, objects = profile_objects
    headless = objects["Service", name("draft")]["spec"]
    assert headless["clusterIP"] == "None" and headless["publishNotReadyAddresses"] is False
    pod_labels = objects["Deployment", name("draft")]["spec"]["template"]["metadata"]["labels"]
    assert headless["selector"].items() <= pod_labels.items()
    (port,) = headless["ports"]
    args = service_args(objects, "router")
    host = f"{name('draft')}.{NAMESPACE}.svc.cluster.local"
    assert flag(args, "--draft-dns") == f"{host}:{port['port']}"
    assert port["targetPort"] == int(flag(service_args(objects, "draft"), "--port"))
    target = objects["Service", name("target")]["spec"]["ports"][0]["port"]
    assert flag(args, "--target") == f"{name('target')}:{target}"


def test_drafts_scale_independently_of_the_target(profile_objects) -> None:
    profile_name, objects = profile_objects
    values = profile(profile_name)
    target = objects["Deployment", name("target")]["spec"]
    draft = objects["Deployment", name("draft")]["spec"]
    assert target["replicas"] == 1 and target["strategy"]["type"] == "Recreate"
    assert draft["selector"] != target["selector"]
    hpa = objects.get(("HorizontalPodAutoscaler", name("draft")))
    if values["draft"].get("autoscaling", {}).get("enabled"):
        assert "replicas" not in draft, "the HPA owns the draft replica count"
        assert hpa["spec"]["scaleTargetRef"] == {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "name": name("draft"),
        }
        assert hpa["spec"]["minReplicas"] >= 1  # never zero: nothing would scale it back
    else:
        assert hpa is None and draft["replicas"] == values["draft"]["replicas"]
    pdbs = {n for kind, n in objects if kind == "PodDisruptionBudget"}
    assert pdbs == {name(c) for c in GRPC_SERVICES}


def test_gpu_requests_follow_the_profile(profile_objects) -> None:
    profile_name, objects = profile_objects
    values = profile(profile_name)
    for component in ("target", "draft"):
        limits = container(objects, component)["resources"]["limits"]
        gpus = values[component].get("gpus", 0)
        assert limits.get("nvidia.com/gpu", 0) == gpus, component
        device = flag(service_args(objects, component), "--device")
        assert device == ("cuda" if gpus else "cpu")
    assert "nvidia.com/gpu" not in container(objects, "router")["resources"].get("limits", {})
    draft_args = service_args(objects, "draft")
    assert flag(draft_args, "--method") == values["draft"]["method"]


def test_pods_run_as_non_root_with_a_read_only_root(profile_objects) -> None:
    _, objects = profile_objects
    for component in GRPC_SERVICES:
        pod = objects["Deployment", name(component)]["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        c = container(objects, component)
        assert c["securityContext"]["readOnlyRootFilesystem"] is True
        assert {m["mountPath"] for m in c["volumeMounts"]} >= {"/tmp", "/var/cache/splitspec"}


def service_parsers() -> dict[str, argparse.ArgumentParser]:
    """Each service's whole command line, as its process parses it."""
    from draft_service.server import add_arguments as draft_arguments
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


def test_rendered_flags_parse_in_each_service(profile_objects) -> None:
    _, objects = profile_objects
    for component, parser in service_parsers().items():
        parsed = parser.parse_args(service_args(objects, component))
        assert parsed.host == "0.0.0.0", component
        assert (parsed.log_format, parsed.log_level) == ("text", "info"), component


def test_json_logs_and_the_request_log_reach_every_service() -> None:
    objects = render({"logging": {"format": "json", "level": "debug", "requests": True}})
    for component, parser in service_parsers().items():
        parsed = parser.parse_args(service_args(objects, component))
        assert (parsed.log_format, parsed.log_level) == ("json", "debug"), component
    assert "--log-requests" in service_args(objects, "router")
    with pytest.raises(Exception, match="format"):  # the schema refuses what the flag would
        render({"logging": {"format": "xml"}})


def test_tracing_reaches_the_router_only_when_an_endpoint_is_set() -> None:
    assert "--otlp-traces-endpoint" not in service_args(render({}), "router")
    objects = render({"tracing": {"endpoint": "otel-collector.observability:4317"}})
    parsed = service_parsers()["router"].parse_args(service_args(objects, "router"))
    assert parsed.otlp_traces_endpoint == "otel-collector.observability:4317"
    assert parsed.otlp_service_name == "splitspec-router"
    with pytest.raises(helm.HelmValuesError, match="tracing"):  # the schema refuses a typo
        render({"tracing": {"endpiont": "collector:4317"}})


def test_without_drafts_the_router_decodes_target_only() -> None:
    objects = render({"draft": {"enabled": False}})
    assert not [k for k in objects if k[1] == name("draft")]
    args = service_args(objects, "router")
    assert "--draft-dns" not in args and flag(args, "--speculate") == "off"


def test_tls_api_key_and_monitoring() -> None:
    values = {
        "tls": {"enabled": True, "cert": "CERT", "key": "KEY"},
        "apiKey": {"enabled": True, "value": "sekrit"},
        "monitoring": {"serviceMonitor": {"enabled": True}},
    }
    objects = render(values)
    for obj in objects.values():
        if (obj["apiVersion"], obj["kind"]) not in CRDS:
            kubernetes_validate.validate(obj, KUBE, strict=True)
    assert objects["Secret", f"{RELEASE}-splitspec-tls"]["type"] == "kubernetes.io/tls"
    assert "api-key" in objects["Secret", f"{RELEASE}-splitspec-api-key"]["data"]
    args = service_args(objects, "router")
    assert flag(args, "--tls-cert") == "/etc/splitspec/tls/tls.crt"
    assert flag(args, "--api-key-file") == "/etc/splitspec/api-key/api-key"
    router = container(objects, "router")
    assert {"/etc/splitspec/tls", "/etc/splitspec/api-key"} <= {
        m["mountPath"] for m in router["volumeMounts"]
    }
    assert "tcpSocket" in router["readinessProbe"], "kubelet's gRPC probe cannot speak TLS"
    assert "grpc" in container(objects, "target")["readinessProbe"]
    monitor = objects["ServiceMonitor", name("router")]["spec"]
    service = objects["Service", name("router")]
    assert monitor["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    ports = {p["name"]: p for p in service["spec"]["ports"]}
    endpoint = monitor["endpoints"][0]
    assert endpoint["port"] == "http" and endpoint["scheme"] == "https"
    assert ports["http"]["appProtocol"] == "https"
    assert service_parsers()["router"].parse_args(args).http_port == ports["http"]["targetPort"]


def test_the_http_api_is_served_and_exposed_unless_turned_off() -> None:
    """Before, the router ran without --http-port, and a ServiceMonitor scraped a closed port."""
    objects = render({})
    args = service_args(objects, "router")
    assert service_parsers()["router"].parse_args(args).http_port == 8000
    assert {"name": "http", "containerPort": 8000, "protocol": "TCP"} in container(
        objects, "router"
    )["ports"]
    service_ports = objects["Service", name("router")]["spec"]["ports"]
    assert [p["port"] for p in service_ports if p["name"] == "http"] == [8000]
    objects = render({"router": {"httpPort": 0}})
    assert "--http-port" not in service_args(objects, "router")
    assert [p["name"] for p in objects["Service", name("router")]["spec"]["ports"]] == ["grpc"]
    with pytest.raises(helm.HelmError, match="router.httpPort"):
        render({"router": {"httpPort": 0}, "monitoring": {"serviceMonitor": {"enabled": True}}})


def tls_volume(objects: Objects) -> dict[str, Any]:
    pod = objects["Deployment", name("router")]["spec"]["template"]["spec"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == "tls"]
    return volume["secret"]


def test_mutual_tls_gives_the_router_the_client_ca_only_when_asked() -> None:
    tls = {"enabled": True, "cert": "CERT", "key": "KEY"}
    objects = render({"tls": tls})
    assert "--tls-client-ca" not in service_args(objects, "router")
    assert [i["key"] for i in tls_volume(objects)["items"]] == ["tls.crt", "tls.key"]
    objects = render({"tls": {**tls, "requireClientCert": True, "clientCa": "CA PEM"}})
    for obj in objects.values():
        if (obj["apiVersion"], obj["kind"]) not in CRDS:
            kubernetes_validate.validate(obj, KUBE, strict=True)
    parsed = service_parsers()["router"].parse_args(service_args(objects, "router"))
    assert str(parsed.tls_client_ca) == "/etc/splitspec/tls/ca.crt"
    data = objects["Secret", f"{RELEASE}-splitspec-tls"]["data"]
    assert base64.b64decode(data["ca.crt"]) == b"CA PEM"
    assert {"key": "ca.crt", "path": "ca.crt"} in tls_volume(objects)["items"]
    assert "tcpSocket" in container(objects, "router")["readinessProbe"]  # no handshake, no cert
    for component in ("target", "draft"):
        assert "--tls-client-ca" not in service_args(objects, component)
    # An existing Secret brings its own ca.crt (cert-manager's issuer CA): none is made.
    mine = {"enabled": True, "existingSecret": "mine", "requireClientCert": True}
    objects = render({"tls": mine})
    assert ("Secret", f"{RELEASE}-splitspec-tls") not in objects
    assert tls_volume(objects)["secretName"] == "mine"
    assert {"key": "ca.crt", "path": "ca.crt"} in tls_volume(objects)["items"]
    assert flag(service_args(objects, "router"), "--tls-client-ca") == "/etc/splitspec/tls/ca.crt"


@pytest.mark.parametrize(
    "tls, said",
    [
        ({"enabled": True, "cert": "C", "key": "K", "requireClientCert": True}, "tls.clientCa"),
        ({"requireClientCert": True, "clientCa": "CA"}, "needs tls.enabled"),
        ({"enabled": True, "cert": "C", "key": "K", "clientCa": "CA"}, "requireClientCert is off"),
        ({"enabled": True, "existingSecret": "s", "requireClientCert": True, "clientCa": "CA"},
         "unused with tls.existingSecret"),
    ],
)  # fmt: skip
def test_mutual_tls_asked_for_but_not_possible_fails_the_render(tls: dict, said: str) -> None:
    with pytest.raises(helm.HelmError, match=said):
        render({"tls": tls})


def test_security_values_without_material_are_refused() -> None:
    with pytest.raises(helm.HelmError, match="tls.cert"):
        render({"tls": {"enabled": True}})


@pytest.mark.parametrize(
    "values, where",
    [
        ({"router": {"replicas": 2}}, "/router/replicas"),
        ({"target": {"port": "grpc"}}, "/target/port"),
        ({"draft": {"method": "medusa"}}, "/draft/method"),
        ({"draft": {"replica": 3}}, "replica"),
        ({"tls": {"requireClientCert": "yes"}}, "/tls/requireClientCert"),
        ({"tls": {"clientCa": True}}, "/tls/clientCa"),
    ],
)
def test_the_values_schema_refuses_bad_values(values: dict, where: str) -> None:
    with pytest.raises(helm.HelmValuesError, match=where):
        render(values)


def test_the_draft_tree_is_left_to_the_service_unless_set() -> None:
    """0 (the default) passes no tree flag, so a draft pod gets its device's default shape."""
    args = service_args(render(profile("gpu-eagle-drafts-hpa")), "draft")
    assert not {"--num-steps", "--topk", "--num-draft-tokens"} & set(args)
    values = profile("gpu-eagle-drafts-hpa")
    values["draft"].update(numSteps=6, topk=6, numDraftTokens=32)
    args = service_args(render(values), "draft")
    assert [flag(args, f) for f in ("--num-steps", "--topk", "--num-draft-tokens")] == [
        "6", "6", "32"
    ]
