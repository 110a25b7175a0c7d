"""How the CLI's client commands (`generate`, `status`) reach a router: address, API key, TLS."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path

from splitspec.serve_flags import ROUTER_PORT

API_KEY_ENV = "SPLITSPEC_API_KEY"


@dataclass(frozen=True)
class Connection:
    address: str
    api_key: str | None = None  # sent as `authorization: Bearer KEY`
    ca: bytes | None = None  # TLS, trusting this CA's certificates; None: plaintext
    key_env: str = API_KEY_ENV  # where the key came from, for the hint of a refused one


def add_connection_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("router")
    group.add_argument("--address", default=f"127.0.0.1:{ROUTER_PORT}",
                       help="the router's public gRPC API (`splitspec serve` listens here by "
                            "default)")  # fmt: skip
    group.add_argument("--api-key-env", default=API_KEY_ENV, metavar="VAR",
                       help="the environment variable holding the router's API key, sent when "
                            f"set (default: {API_KEY_ENV})")  # fmt: skip
    group.add_argument("--tls-ca", type=Path, default=None, metavar="FILE",
                       help="reach a router that serves TLS, trusting the CA certificate in "
                            "FILE (PEM); default: plaintext")  # fmt: skip


def connection_from_args(args: argparse.Namespace) -> Connection:
    key = os.environ.get(args.api_key_env, "").strip() or None
    ca = None
    if args.tls_ca is not None:
        try:
            ca = args.tls_ca.read_bytes()
        except OSError as err:
            raise SystemExit(f"--tls-ca: cannot read {args.tls_ca}: {err.strerror}") from None
    return Connection(args.address, key, ca, args.api_key_env)
