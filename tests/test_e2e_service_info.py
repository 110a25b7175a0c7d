"""GetModelInfo, health and reflection of the router and the target, on the shared stack."""

from __future__ import annotations

import grpc
import pytest
from google.protobuf.descriptor_pool import DescriptorPool
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)

from plumbing.grpc_util import CHANNEL_OPTIONS
from splitspec.launcher import LocalStack
from tests.helpers.rpc import UNARY_TIMEOUT_S, Router

pytestmark = pytest.mark.slow

SERVICES = {
    "router": ("splitspec.v1.Generation", {"Generate", "Abort", "GetModelInfo", "GetServerStatus"}),
    "target": ("splitspec.target.v1.TargetModel", {"Forward", "Release", "GetInfo"}),
}
HEALTH = "grpc.health.v1.Health"
REFLECTION = "grpc.reflection.v1alpha.ServerReflection"


def test_model_info_describes_the_default_model(router: Router) -> None:
    info = router.model_info()
    assert "smollm2" in info.model_name.lower()
    assert info.architecture == "llama"
    assert info.vocab_size == 49152
    assert info.max_context_length == 8192
    assert info.max_new_tokens_limit == 4096  # the router's --max-new-tokens-limit default
    assert list(info.eos_token_ids) == [2]
    assert info.dtype == "float32" and info.device == "cpu"
    assert info.has_chat_template


def address(stack: LocalStack, which: str) -> str:
    return stack.router_address if which == "router" else stack.target_address


@pytest.mark.parametrize("which", ["router", "target"])
def test_health_reports_serving(stack: LocalStack, which: str) -> None:
    service, _ = SERVICES[which]
    with grpc.insecure_channel(address(stack, which), options=CHANNEL_OPTIONS) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for name in ("", service):
            reply = health.Check(
                health_pb2.HealthCheckRequest(service=name), timeout=UNARY_TIMEOUT_S
            )
            assert reply.status == health_pb2.HealthCheckResponse.SERVING, name
        with pytest.raises(grpc.RpcError) as err:
            health.Check(
                health_pb2.HealthCheckRequest(service="no.such.Service"), timeout=UNARY_TIMEOUT_S
            )
        assert err.value.code() == grpc.StatusCode.NOT_FOUND


@pytest.mark.parametrize("which", ["router", "target"])
def test_reflection_lists_and_describes_the_service(stack: LocalStack, which: str) -> None:
    service, methods = SERVICES[which]
    with grpc.insecure_channel(address(stack, which), options=CHANNEL_OPTIONS) as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        replies = list(
            stub.ServerReflectionInfo(
                iter([reflection_pb2.ServerReflectionRequest(list_services="")]),
                timeout=UNARY_TIMEOUT_S,
            )
        )
        listed = {s.name for r in replies for s in r.list_services_response.service}
        assert {service, HEALTH, REFLECTION} <= listed
        # The descriptors come over the wire: a client with no generated code sees the methods.
        pool = DescriptorPool(ProtoReflectionDescriptorDatabase(channel))
        described = pool.FindServiceByName(service)
        assert {m.name for m in described.methods} >= methods
