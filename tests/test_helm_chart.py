"""The Helm chart (k8s/splitspec): lint, render and validate, then assert on what it renders.

Helm itself runs in-process (helm-python-sdk: the Helm v4 Go library, no binary); every
rendered object is validated strictly against the Kubernetes 1.30 API schemas
(kubernetes-validate). The ServiceMonitor is a prometheus-operator CRD, not in those schemas,
so its fields are asserted here instead. The flags the chart renders for each service are
parsed by that service's own argument parser, so a renamed flag fails here, not in a cluster.
TLS, mutual TLS, the API key and the values schema's refusals: test_helm_chart_security.py.
"""

from __future__ import annotations

import helm_python as helm  # dev dependencies: a missing one fails, never skips
import kubernetes_validate
import pytest

from tests.helpers.helm_chart import (
    CHART,
    CRDS,
    GRPC_SERVICES,
    KUBE,
    NAMESPACE,
    PROFILES,
    Objects,
    container,
    flag,
    name,
    profile,
    render,
    service_args,
    service_parsers,
)


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
