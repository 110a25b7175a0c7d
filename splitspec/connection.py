"""How the CLI's client commands (`generate`, `status`, `bench`) reach a router: address, API
key, TLS, and the client certificate a router under mTLS asks for."""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import NoReturn

from plumbing.arg_types import port
from splitspec.serve_flags import ROUTER_PORT

API_KEY_ENV = "SPLITSPEC_API_KEY"
USAGE_ERROR = 2  # argparse's exit status for a bad command line


@dataclass(frozen=True)
class ClientCert:
    """Our certificate and its private key (PEM), presented to a router that wants one."""

    chain: bytes
    key: bytes = field(repr=False)


@dataclass(frozen=True)
class Connection:
    address: str
    api_key: str | None = None  # sent as `authorization: Bearer KEY`
    ca: bytes | None = None  # TLS, trusting this CA's certificates; None: plaintext
    key_env: str = API_KEY_ENV  # where the key came from, for the hint of a refused one
    client_cert: ClientCert | None = None  # only with ``ca``: mTLS is TLS first


def add_connection_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("router")
    where = group.add_mutually_exclusive_group()
    where.add_argument("--address", default=f"127.0.0.1:{ROUTER_PORT}",
                       help="the router's public gRPC API (`splitspec serve` listens here by "
                            "default)")  # fmt: skip
    where.add_argument("--port", type=port, default=None,
                       help="a router on this machine: the same as --address 127.0.0.1:PORT "
                            "(what `splitspec serve --port PORT` printed)")  # fmt: skip
    group.add_argument("--api-key-env", default=API_KEY_ENV, metavar="VAR",
                       help="the environment variable holding the router's API key, sent when "
                            f"set (default: {API_KEY_ENV})")  # fmt: skip
    group.add_argument("--tls-ca", type=Path, default=None, metavar="FILE",
                       help="reach a router that serves TLS, trusting the CA certificate in "
                            "FILE (PEM); default: plaintext")  # fmt: skip
    group.add_argument("--tls-client-cert", type=Path, default=None, metavar="FILE",
                       help="present the certificate in FILE (PEM) to a router that wants "
                            "one (its --tls-client-ca); with --tls-client-key and "
                            "--tls-ca")  # fmt: skip
    group.add_argument("--tls-client-key", type=Path, default=None, metavar="FILE",
                       help="the private key (PEM, unencrypted) of --tls-client-cert")  # fmt: skip


def connection_from_args(args: argparse.Namespace) -> Connection:
    _check_client_cert_flags(args)  # a usage error first, before any file is read
    key = os.environ.get(args.api_key_env, "").strip() or None
    ca = None if args.tls_ca is None else _read_pem("--tls-ca", args.tls_ca)
    client_cert = None
    if args.tls_client_cert is not None:
        chain = _read_pem("--tls-client-cert", args.tls_client_cert)
        client_cert = ClientCert(chain, _read_pem("--tls-client-key", args.tls_client_key))
    address = args.address if args.port is None else f"127.0.0.1:{args.port}"
    return Connection(address, key, ca, args.api_key_env, client_cert)


def _check_client_cert_flags(args: argparse.Namespace) -> None:
    cert, key = args.tls_client_cert, args.tls_client_key
    if (cert is None) != (key is None):
        missing = "--tls-client-key" if key is None else "--tls-client-cert"
        _usage_error(f"{missing} is missing: --tls-client-cert and --tls-client-key go together")
    if cert is not None and args.tls_ca is None:  # gRPC sends one only in a TLS handshake
        _usage_error("--tls-client-cert needs --tls-ca: a client certificate is for a router "
                     "serving TLS, and TLS needs the CA that signed the router's "
                     "certificate")  # fmt: skip


def _read_pem(flag: str, path: Path) -> bytes:
    """The file's bytes, or one line saying why not (exit 1), before any connection: gRPC
    would take a file that is not PEM and fail only at the handshake, saying less."""
    try:
        data = path.read_bytes()
    except OSError as err:
        raise SystemExit(f"{flag}: cannot read {path}: {err.strerror}") from None
    if b"-----BEGIN " not in data:
        raise SystemExit(f"{flag}: {path} is not PEM (no -----BEGIN line)")
    return data


def _usage_error(message: str) -> NoReturn:
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(USAGE_ERROR)
