"""The Helm chart's security values (k8s/splitspec): TLS, mutual TLS for the router, the API
key and monitoring under them, and the values schema refusing what the services would not take.
Rendered and read as in test_helm_chart.py (tests/helpers/helm_chart.py)."""

from __future__ import annotations

import base64
from typing import Any

import helm_python as helm  # dev dependencies: a missing one fails, never skips
import kubernetes_validate
import pytest

from tests.helpers.helm_chart import (
    CRDS,
    KUBE,
    RELEASE,
    Objects,
    container,
    flag,
    name,
    render,
    service_args,
    service_parsers,
)


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


def test_an_eagle_head_for_the_ngram_drafter_fails_the_render() -> None:
    said = "draft.eagleHead is for draft.method eagle, not ngram"
    with pytest.raises(helm.HelmError, match=said):
        render({"draft": {"method": "ngram", "eagleHead": "heads/mine"}})


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
