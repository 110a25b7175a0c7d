"""The endpoints protected: an API key on the public API, TLS on its port, mTLS inside.

One stack of real processes on the tiny model: the target and an n-gram replica serve mTLS
(they refuse clients without a certificate from the test CA), the router reaches them with its
own client certificate, serves TLS on the public port and wants an API key read from a file.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import http.client
import json
import os
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from plumbing.security import ClientTLS, ServerTLS
from protos import generation_pb2 as pb
from protos import generation_pb2_grpc
from router import http_server, secure, telemetry
from splitspec import cli
from splitspec.launcher import LocalStack, free_ports
from tests.helpers.certs import CertFiles, certs_fixture  # noqa: F401 (fixture)
from tests.helpers.node import NO_NODE, NO_NODE_REASON, npm_installed
from tests.helpers.spec_fixtures import FP64, ids_request
from tests.helpers.tiny_llama import tiny_model_dir_fixture  # noqa: F401 (fixture)

pytestmark = pytest.mark.timeout(300)
API_KEY = "sk-test-" + os.urandom(12).hex()  # random: it can only be in a log if we leaked it
TIMEOUT_S = 60.0
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def secure_stack(
    tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path, certs: CertFiles
) -> Iterator[LocalStack]:
    log_dir = tmp_path_factory.mktemp("secure-stack")
    key_file = log_dir.parent / "api-key"
    key_file.write_text(API_KEY + "\n")
    mtls = ServerTLS(certs.server_cert, certs.server_key, certs.ca).args()
    internal = ClientTLS(certs.ca, certs.client_cert, certs.client_key).args()
    public = ServerTLS(certs.server_cert, certs.server_key).args()
    stack = LocalStack(
        ["--model", str(tiny_model_dir), *FP64, "--threads", "1", *mtls],
        ["--model", str(tiny_model_dir), "--api-key-file", str(key_file), *public, *internal],
        log_dir=log_dir,
        draft_args=[["--method", "ngram", *mtls]],
        tls=ClientTLS(certs.ca, certs.client_cert, certs.client_key),
        api_key=API_KEY,
        http=True,
    )
    stack.start(timeout_s=240)
    try:
        yield stack
    finally:
        stack.stop()


def public_stub(stack: LocalStack, certs: CertFiles) -> tuple[grpc.Channel, object]:
    creds = grpc.ssl_channel_credentials(root_certificates=certs.ca.read_bytes())
    channel = grpc.secure_channel(stack.router_address, creds)
    return channel, generation_pb2_grpc.GenerationStub(channel)


def bearer(key: str) -> list[tuple[str, str]]:
    return [("authorization", f"Bearer {key}")]


def generate(stub, metadata) -> list[pb.GenerateResponse]:
    request = ids_request([5, 6, 7, 5, 6, 7, 5, 6], 8, True, ignore_eos=True)
    return list(stub.Generate(request, timeout=TIMEOUT_S, metadata=metadata))


def test_right_key_over_tls_generates(secure_stack: LocalStack, certs: CertFiles) -> None:
    channel, stub = public_stub(secure_stack, certs)
    with channel:
        items = generate(stub, bearer(API_KEY))
        assert items[-1].finish_reason == pb.FINISH_REASON_LENGTH
        assert sum(len(i.token_ids) for i in items) == 8
        # The router reached the mTLS replica too: it is healthy and drafted.
        status = stub.GetServerStatus(pb.GetServerStatusRequest(), timeout=10,
                                      metadata=[("x-api-key", API_KEY)])
        assert [r.healthy for r in status.draft_replicas] == [True]
        assert items[-1].speculation.verify_steps > 0


@pytest.mark.parametrize("metadata", [None, bearer("wrong"), bearer(API_KEY[:-1]),
                                      bearer(API_KEY + "x"), [("x-api-key", "")]])
def test_missing_or_wrong_key_is_unauthenticated(
    secure_stack: LocalStack, certs: CertFiles, metadata
) -> None:
    channel, stub = public_stub(secure_stack, certs)
    with channel:
        calls = [
            lambda: generate(stub, metadata),
            lambda: stub.GetServerStatus(pb.GetServerStatusRequest(), timeout=10,
                                         metadata=metadata),
            lambda: stub.Abort(pb.AbortRequest(request_id="x"), timeout=10, metadata=metadata),
            lambda: stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=10, metadata=metadata),
        ]
        for call in calls:
            with pytest.raises(grpc.RpcError) as err:
                call()
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert "API key" in err.value.details()


def test_health_stays_open_without_key(secure_stack: LocalStack, certs: CertFiles) -> None:
    channel, _ = public_stub(secure_stack, certs)
    with channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(),
                                                          timeout=10)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING


def test_plaintext_client_cannot_use_the_tls_port(secure_stack: LocalStack) -> None:
    with grpc.insecure_channel(secure_stack.router_address) as channel:
        stub = generation_pb2_grpc.GenerationStub(channel)
        with pytest.raises(grpc.RpcError) as err:
            stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=5, metadata=bearer(API_KEY))
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE


def _health(address: str, creds: grpc.ChannelCredentials | None) -> int:
    channel = (grpc.secure_channel(address, creds) if creds is not None
               else grpc.insecure_channel(address))
    with channel:
        stub = health_pb2_grpc.HealthStub(channel)
        return stub.Check(health_pb2.HealthCheckRequest(), timeout=5).status


def test_mtls_ports_refuse_clients_without_a_good_certificate(
    secure_stack: LocalStack, certs: CertFiles
) -> None:
    ca = certs.ca.read_bytes()
    no_cert = grpc.ssl_channel_credentials(root_certificates=ca)
    stranger = grpc.ssl_channel_credentials(
        root_certificates=ca,
        private_key=certs.stranger_key.read_bytes(),
        certificate_chain=certs.stranger_cert.read_bytes(),
    )
    good = ClientTLS(certs.ca, certs.client_cert, certs.client_key).credentials()
    for address in (secure_stack.target_address, secure_stack.drafts[0].address):
        for creds in (None, no_cert, stranger):
            with pytest.raises(grpc.RpcError) as err:
                _health(address, creds)
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE, address
        assert _health(address, good) == health_pb2.HealthCheckResponse.SERVING


def test_no_key_in_any_log(secure_stack: LocalStack, certs: CertFiles) -> None:
    # Make every service log something about a refused and an accepted call first.
    test_right_key_over_tls_generates(secure_stack, certs)
    channel, stub = public_stub(secure_stack, certs)
    with channel, pytest.raises(grpc.RpcError):
        generate(stub, bearer("wrong"))
    logs = sorted(Path(secure_stack.log_dir).glob("*.log"))
    assert {p.stem for p in logs} == {"target", "router", "draft-0"}
    router_log = (Path(secure_stack.log_dir) / "router.log").read_text()
    assert "requires an API key" in router_log  # the log was written, and says where from
    for path in logs:
        assert API_KEY not in path.read_text(errors="replace"), path.name


def test_key_from_an_environment_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    import argparse

    from router import auth
    from router.secure import RouterSecurity

    parser = argparse.ArgumentParser()
    auth.add_arguments(parser)
    monkeypatch.setenv("SPLITSPEC_TEST_KEY", " k3y \n")
    assert auth.api_key_from_args(parser.parse_args(["--api-key-env", "SPLITSPEC_TEST_KEY"])) \
        == b"k3y"
    monkeypatch.setenv("SPLITSPEC_TEST_KEY", "")
    with pytest.raises(SystemExit, match="empty"):
        auth.api_key_from_args(parser.parse_args(["--api-key-env", "SPLITSPEC_TEST_KEY"]))
    assert auth.api_key_from_args(parser.parse_args([])) is None
    assert "k3y" not in repr(RouterSecurity(api_key=b"k3y"))


def http_call(
    url: str, headers: dict[str, str], body: dict | None = None, ca: Path | None = None
) -> tuple[int, dict]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        url, data=data, headers={"Content-Type": "application/json", **headers}
    )
    context = ssl.create_default_context(cafile=str(ca)) if ca else None
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S, context=context) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def test_the_http_api_takes_the_same_key_over_https(
    secure_stack: LocalStack, certs: CertFiles
) -> None:
    """The router's TLS covers its HTTP port too: before, the bearer key went in the clear."""
    base = f"https://{secure_stack.http_address}"
    right = {"Authorization": f"Bearer {API_KEY}"}
    status, models = http_call(f"{base}/v1/models", right, ca=certs.ca)
    assert status == 200
    body = {"model": models["data"][0]["id"], "prompt": "hi", "max_tokens": 4}
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        status, refused = http_call(f"{base}/v1/completions", headers, body, ca=certs.ca)
        assert status == 401 and refused["error"]["type"] == "authentication_error"
    status, done = http_call(f"{base}/v1/completions", right, body, ca=certs.ca)
    assert status == 200 and done["usage"]["completion_tokens"] == 4
    with pytest.raises((urllib.error.URLError, ConnectionError, http.client.HTTPException)):
        http_call(f"http://{secure_stack.http_address}/v1/models", right)


class _Described:
    """What /v1/models reads of the router's servicer; enough for a TLS handshake's test."""

    scheduler = None
    model_info = SimpleNamespace(max_context_length=64)


def _models_status(address: str, context: ssl.SSLContext) -> int:
    host, port = address.rsplit(":", 1)
    conn = http.client.HTTPSConnection(host, int(port), context=context, timeout=10)
    try:
        conn.request("GET", "/v1/models")
        return conn.getresponse().status
    finally:
        conn.close()


async def _serve_mtls_http(tls: ServerTLS, check: Callable[[str], None]) -> None:
    """The router's HTTP port as its start_http serves it under ``tls``, until ``check`` (run
    in a thread: its calls are blocking) returns; then uvicorn shuts down and frees the port."""
    servers: list[http_server._EmbeddedServer] = []

    class Recorded(http_server._EmbeddedServer):  # to stop it as the router's exit would
        def __init__(self, config) -> None:
            super().__init__(config)
            servers.append(self)

    (port,) = free_ports(1)
    with mock.patch.object(http_server, "_EmbeddedServer", Recorded):
        tasks = http_server.start_http(_Described(), "127.0.0.1", port, "m", tls=tls)
    try:
        while not servers[0].started:
            assert not any(task.done() for task in tasks), [t.result() for t in tasks]
            await asyncio.sleep(0.02)
        await asyncio.to_thread(check, f"127.0.0.1:{port}")
    finally:
        servers[0].should_exit = True
        await asyncio.wait(tasks, timeout=10)


def test_the_http_port_under_mtls_serves_only_clients_with_a_certificate_from_its_ca(
    certs: CertFiles, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--tls-cert, --tls-key and --tls-client-ca, parsed as the router parses them, make its
    HTTP port ask for a client certificate and refuse a connection without one from the CA."""
    monkeypatch.setattr(telemetry, "_observer", telemetry.observer())  # start_http installs one
    parser = argparse.ArgumentParser()
    secure.add_arguments(parser)
    flags = ServerTLS(certs.server_cert, certs.server_key, certs.ca).args()
    tls = secure.security_from_args(parser.parse_args(flags)).public_tls
    assert tls is not None and tls.client_ca == certs.ca

    def client(cert: Path | None, key: Path | None) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(certs.ca))
        if cert is not None:
            context.load_cert_chain(cert, key)
        return context

    def check(address: str) -> None:
        assert _models_status(address, client(certs.client_cert, certs.client_key)) == 200
        for cert, key in ((None, None), (certs.stranger_cert, certs.stranger_key)):
            with pytest.raises((ssl.SSLError, ConnectionError, http.client.HTTPException)):
                _models_status(address, client(cert, key))  # TLS 1.3: refused on the read

    asyncio.run(asyncio.wait_for(_serve_mtls_http(tls, check), timeout=60))


def test_the_cli_reaches_a_router_with_tls_and_a_key(
    secure_stack: LocalStack, certs: CertFiles, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """`splitspec generate` and `status` had no way to send a key or to speak TLS: against
    this router both failed, whatever the user did."""
    address = ["--address", secure_stack.router_address]
    tls = ["--tls-ca", str(certs.ca)]
    monkeypatch.setenv("SPLITSPEC_API_KEY", API_KEY)
    assert cli.main(["generate", "hello", "--max-new-tokens", "4", *address, *tls]) == 0
    generated = capsys.readouterr().out
    assert cli.main(["status", *address, *tls]) == 0
    status = capsys.readouterr().out
    assert cli.main(["generate", "hello", "--max-new-tokens", "4", *address]) == 1
    plaintext = capsys.readouterr().err
    monkeypatch.delenv("SPLITSPEC_API_KEY")
    assert cli.main(["status", *address, *tls]) == 1
    keyless = capsys.readouterr().err

    assert "4 tokens in" in generated, generated
    assert status.startswith(f"router {secure_stack.router_address} (up "), status
    assert "): serving\n" in status, status
    assert "draft replicas: 1 of 1 healthy" in status, status
    assert "--tls-ca" in plaintext, plaintext
    assert "refused the call" in keyless and "$SPLITSPEC_API_KEY" in keyless, keyless
    assert API_KEY not in generated + status + plaintext + keyless


@pytest.mark.skipif(NO_NODE, reason=NO_NODE_REASON)
def test_the_node_client_reaches_a_router_with_tls_and_a_key(
    secure_stack: LocalStack, certs: CertFiles
) -> None:
    node_dir = npm_installed()
    command = ["node", "generate.js", "--address", secure_stack.router_address, "--tls-ca",
               str(certs.ca), "--max-tokens", "4", "--json", "hello"]  # fmt: skip
    keyed = {**os.environ, "SPLITSPEC_API_KEY": API_KEY}
    keyless = {k: v for k, v in os.environ.items() if k != "SPLITSPEC_API_KEY"}
    run = functools.partial(subprocess.run, cwd=node_dir, capture_output=True, text=True,
                            timeout=120)  # fmt: skip
    served, refused = run(command, env=keyed), run(command, env=keyless)

    assert served.returncode == 0, served.stderr
    items = [json.loads(line) for line in served.stdout.splitlines()]
    assert items[-1]["finish_reason"] == "FINISH_REASON_LENGTH"
    assert refused.returncode == 1 and "error: 16" in refused.stderr, refused.stderr  # UNAUTH.


def test_the_shell_client_reaches_a_router_with_tls_and_a_key(
    secure_stack: LocalStack, certs: CertFiles
) -> None:
    """clients/shell/generate.sh (its reflection client): over TLS with the key from
    $SPLITSPEC_API_KEY (or the variable --api-key-env names) it streams; without a key the
    router's refusal is one line, and the key is in no output."""
    script = ["bash", str(REPO / "clients" / "shell" / "generate.sh"), "--tls-ca", str(certs.ca)]
    call = [secure_stack.router_address, "hello", "4"]
    base = {k: v for k, v in os.environ.items() if k != "SPLITSPEC_API_KEY"}
    base |= {"PYTHON": sys.executable, "SPLITSPEC_NO_GRPCURL": "1"}
    run = functools.partial(subprocess.run, capture_output=True, text=True, timeout=120)
    served = run([*script, *call], env={**base, "SPLITSPEC_API_KEY": API_KEY})
    named = run([*script, "--api-key-env", "OUR_KEY", *call], env={**base, "OUR_KEY": API_KEY})
    refused = run([*script, *call], env=base)

    for result in (served, named):
        assert result.returncode == 0, result.stderr
        services, _, reply = result.stdout.partition("\n---\n")
        assert "splitspec.v1.Generation" in services.split() and reply.strip(), result.stdout
    assert refused.returncode == 1, refused.stderr
    assert refused.stderr.strip().startswith("error: UNAUTHENTICATED: "), refused.stderr
    assert "API key" in refused.stderr and refused.stderr.strip().count("\n") == 0
    assert all(API_KEY not in r.stdout + r.stderr for r in (served, named, refused))

