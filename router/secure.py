"""The router's security settings: API key on the public API, TLS on its port, mTLS to the
model services. Built once from the command line; the key never appears in a repr or log."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

from plumbing.security import (
    ClientTLS,
    ServerTLS,
    add_client_tls_arguments,
    add_server_tls_arguments,
    client_tls_from_args,
    server_tls_from_args,
)
from router import auth


@dataclass(frozen=True)
class RouterSecurity:
    api_key: bytes | None = field(default=None, repr=False)
    public_tls: ServerTLS | None = None  # the public port
    internal_tls: ClientTLS | None = None  # channels to the target and draft replicas


def add_arguments(parser: argparse.ArgumentParser) -> None:
    auth.add_arguments(parser)
    add_server_tls_arguments(parser)
    add_client_tls_arguments(parser)


def security_from_args(args: argparse.Namespace) -> RouterSecurity:
    return RouterSecurity(
        auth.api_key_from_args(args), server_tls_from_args(args), client_tls_from_args(args)
    )
