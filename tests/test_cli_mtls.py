"""`splitspec generate`, `status` and `bench` against a router that wants client
certificates (mTLS): with `--tls-client-cert`/`--tls-client-key` they reach it; without, or
with a certificate from another CA, one line says what the router asked for. Before, the CLI
could only trust a server CA, so such a router refused it whatever the user did."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from plumbing.security import ClientTLS, ServerTLS
from splitspec import cli
from splitspec.launcher import LocalStack
from splitspec.tls_probe import asks_for_client_cert
from tests.helpers.certs import CertFiles, certs_fixture  # noqa: F401 (fixture)
from tests.helpers.node import NO_NODE, NO_NODE_REASON, npm_installed
from tests.helpers.spec_fixtures import FP64, START_TIMEOUT_S
from tests.helpers.tiny_llama import tiny_model_dir_fixture  # noqa: F401 (fixture)

pytestmark = pytest.mark.timeout(300)
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def mtls_stack(
    tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path, certs: CertFiles
) -> Iterator[LocalStack]:
    """A target and a router, no drafts; both ports refuse clients without a certificate from
    the test CA, the router's public port included."""
    mtls = ServerTLS(certs.server_cert, certs.server_key, certs.ca).args()
    ours = ClientTLS(certs.ca, certs.client_cert, certs.client_key)
    stack = LocalStack(
        ["--model", str(tiny_model_dir), *FP64, "--threads", "1", *mtls],
        ["--model", str(tiny_model_dir), *mtls, *ours.args()],
        log_dir=tmp_path_factory.mktemp("mtls-stack"),
        tls=ours,  # the launcher's health checks present a certificate too
    )
    stack.start(timeout_s=START_TIMEOUT_S)
    try:
        yield stack
    finally:
        stack.stop()


def _flags(stack: LocalStack, certs: CertFiles, cert: Path | None, key: Path | None) -> list[str]:
    flags = ["--address", stack.router_address, "--tls-ca", str(certs.ca)]
    if cert is not None and key is not None:
        flags += ["--tls-client-cert", str(cert), "--tls-client-key", str(key)]
    return flags


def test_a_client_certificate_from_the_ca_reaches_the_router(
    mtls_stack: LocalStack, certs: CertFiles, capsys: pytest.CaptureFixture[str]
) -> None:
    flags = _flags(mtls_stack, certs, certs.client_cert, certs.client_key)
    assert cli.main(["generate", "hello", "--max-new-tokens", "4", *flags]) == 0
    generated = capsys.readouterr().out
    assert cli.main(["status", *flags]) == 0
    status = capsys.readouterr().out
    bench = ["bench", "--num-prompts", "1", "--max-new-tokens", "4", "--speculation", "off"]
    assert cli.main([*bench, "--no-progress", *flags]) == 0, capsys.readouterr().err

    assert "4 tokens in" in generated, generated
    assert status.startswith(f"router {mtls_stack.router_address} (up "), status
    assert "): serving\n" in status, status


@pytest.mark.parametrize(
    "command", [["generate", "hello", "--max-new-tokens", "4"], ["status"], ["bench"]]
)
def test_no_client_certificate_is_one_line_naming_the_flags(
    mtls_stack: LocalStack, certs: CertFiles, capsys: pytest.CaptureFixture[str],
    command: list[str],
) -> None:  # fmt: skip
    assert cli.main([*command, *_flags(mtls_stack, certs, None, None)]) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"error: the router at {mtls_stack.router_address} asked for a "
                               "client certificate"), lines  # fmt: skip
    assert "--tls-client-cert" in lines[0] and "--tls-client-key" in lines[0], lines


def test_a_certificate_from_another_ca_is_one_line_saying_it_was_refused(
    mtls_stack: LocalStack, certs: CertFiles, capsys: pytest.CaptureFixture[str]
) -> None:
    flags = _flags(mtls_stack, certs, certs.stranger_cert, certs.stranger_key)
    assert cli.main(["status", *flags]) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"error: the router at {mtls_stack.router_address} refused our "
                               "client certificate"), lines  # fmt: skip
    assert "--tls-client-ca" in lines[0], lines


@pytest.mark.skipif(NO_NODE, reason=NO_NODE_REASON)
def test_the_node_client_presents_a_client_certificate(
    mtls_stack: LocalStack, certs: CertFiles
) -> None:
    """clients/node/generate.js: with its certificate it reaches the router, without one the
    router hangs up, and a certificate without its key is a one-line usage error."""
    node_dir = npm_installed()
    command = ["node", "generate.js", "--address", mtls_stack.router_address, "--tls-ca",
               str(certs.ca), "--max-tokens", "4", "--json", "hello"]  # fmt: skip
    cert = ["--tls-client-cert", str(certs.client_cert)]
    run = functools.partial(subprocess.run, cwd=node_dir, capture_output=True, text=True,
                            timeout=120)  # fmt: skip
    served = run([*command, *cert, "--tls-client-key", str(certs.client_key)])
    refused, half = run(command), run([*command, *cert])

    assert served.returncode == 0, served.stderr
    items = [json.loads(line) for line in served.stdout.splitlines()]
    assert items[-1]["finish_reason"] == "FINISH_REASON_LENGTH"
    assert refused.returncode == 1 and "error: 14" in refused.stderr, refused.stderr  # UNAVAIL.
    assert half.returncode == 2 and half.stderr == (
        "error: --tls-client-cert and --tls-client-key go together: pass both or neither\n"
    ), half.stderr


def test_the_shell_client_presents_a_client_certificate(
    mtls_stack: LocalStack, certs: CertFiles
) -> None:
    """clients/shell/generate.sh (its reflection client; grpcurl takes the same flags): with
    its certificate it finds the API by reflection over mTLS and streams; without one it ends
    with one error line, and a certificate without its key is a usage error."""
    script = ["bash", str(REPO / "clients" / "shell" / "generate.sh")]
    env = {**os.environ, "PYTHON": sys.executable, "SPLITSPEC_NO_GRPCURL": "1"}
    run = functools.partial(subprocess.run, capture_output=True, text=True, timeout=120, env=env)
    ca, cert = ["--tls-ca", str(certs.ca)], ["--tls-client-cert", str(certs.client_cert)]
    call = [mtls_stack.router_address, "hello", "4"]
    served = run([*script, *ca, *cert, "--tls-client-key", str(certs.client_key), *call])
    refused, half = run([*script, *ca, *call]), run([*script, *ca, *cert, *call])

    assert served.returncode == 0, served.stderr
    services, _, reply = served.stdout.partition("\n---\n")
    assert "splitspec.v1.Generation" in services.split() and reply.strip(), served.stdout
    assert refused.returncode == 1, refused.stderr
    assert refused.stderr.strip().startswith("error: UNAVAILABLE"), refused.stderr
    assert refused.stderr.strip().count("\n") == 0, refused.stderr
    assert half.returncode == 2, half.stderr
    assert half.stderr.startswith("--tls-client-cert and --tls-client-key go together"), half


@pytest.mark.parametrize(
    ("given", "said"),
    [(["--tls-client-cert", "c.pem"], "error: --tls-client-key is missing: "),
     (["--tls-client-key", "c.key"], "error: --tls-client-cert is missing: "),
     (["--tls-client-cert", "c.pem", "--tls-client-key", "c.key"],
      "error: --tls-client-cert needs --tls-ca: ")],
)  # fmt: skip
@pytest.mark.parametrize("command", ["generate", "status", "bench"])
def test_client_certificate_flags_without_their_partners_are_a_usage_error(
    given: list[str], said: str, command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Refused before any file is read or any connection made: exit 2, one line."""
    prompt = ["hello"] if command == "generate" else []
    with pytest.raises(SystemExit) as exit_:
        cli.main([command, *prompt, "--address", "127.0.0.1:1", *given])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(said) and err.count("\n") == 1, err


@pytest.mark.parametrize("broken", ["--tls-client-cert", "--tls-client-key"])
def test_an_unreadable_or_non_pem_file_is_one_line(
    broken: str, certs: CertFiles, tmp_path: Path
) -> None:
    """The key unreadable (exit 1, as --tls-ca's), or the certificate not PEM: one line,
    before gRPC would fail the handshake saying less."""
    files = {"--tls-client-cert": certs.client_cert, "--tls-client-key": certs.client_key}
    if broken == "--tls-client-cert":
        files[broken] = tmp_path / "client.der"
        files[broken].write_bytes(b"0\x82 DER, not PEM")
        said = f"--tls-client-cert: {files[broken]} is not PEM (no -----BEGIN line)"
    else:
        files[broken] = tmp_path / "missing.key"
        said = f"--tls-client-key: cannot read {files[broken]}: No such file or directory"
    flags = [a for flag, path in files.items() for a in (flag, str(path))]
    with pytest.raises(SystemExit) as exit_:
        cli.main(["status", "--address", "127.0.0.1:1", "--tls-ca", str(certs.ca), *flags])
    assert exit_.value.code == said


@pytest.mark.parametrize("client_ca", [True, False])
def test_the_probe_tells_a_server_that_wants_a_client_certificate(
    certs: CertFiles, client_ca: bool
) -> None:
    """Only a server under mTLS sends a CertificateRequest: a TLS-only one, a plaintext one
    and a closed port are all "no" (their refusals keep their own lines)."""
    tls = ServerTLS(certs.server_cert, certs.server_key, certs.ca if client_ca else None)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    tls_port = server.add_secure_port("127.0.0.1:0", tls.credentials())
    plain_port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        assert asks_for_client_cert(f"127.0.0.1:{tls_port}") is client_ca
        assert asks_for_client_cert(f"localhost:{tls_port}") is client_ca
        assert asks_for_client_cert(f"127.0.0.1:{plain_port}") is False
    finally:
        server.stop(grace=None)
    assert asks_for_client_cert(f"127.0.0.1:{tls_port}") is False  # nothing listens now
