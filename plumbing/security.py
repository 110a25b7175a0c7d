"""TLS for every port and mTLS between services: flags, credentials, binding.

A service serves TLS when given ``--tls-cert``/``--tls-key``; with ``--tls-client-ca`` it also
requires every client to present a certificate signed by that CA (mTLS). A client of the
internal services (the router, the launcher's health checks) uses ``--internal-ca`` to check
the server and ``--internal-cert``/``--internal-key`` as its own certificate. Without flags
everything stays plaintext on loopback, as before.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import grpc


@dataclass(frozen=True)
class ServerTLS:
    cert: Path
    key: Path
    client_ca: Path | None = None  # set: clients must present a certificate signed by it

    def credentials(self) -> grpc.ServerCredentials:
        ca = self.client_ca.read_bytes() if self.client_ca else None
        return grpc.ssl_server_credentials(
            [(self.key.read_bytes(), self.cert.read_bytes())],
            root_certificates=ca,
            require_client_auth=ca is not None,
        )

    def args(self) -> list[str]:
        out = ["--tls-cert", str(self.cert), "--tls-key", str(self.key)]
        return out + (["--tls-client-ca", str(self.client_ca)] if self.client_ca else [])


@dataclass(frozen=True)
class ClientTLS:
    ca: Path
    cert: Path | None = None  # our certificate, for servers that require one (mTLS)
    key: Path | None = None

    def credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(
            root_certificates=self.ca.read_bytes(),
            private_key=self.key.read_bytes() if self.key else None,
            certificate_chain=self.cert.read_bytes() if self.cert else None,
        )

    def args(self) -> list[str]:
        out = ["--internal-ca", str(self.ca)]
        if self.cert and self.key:
            out += ["--internal-cert", str(self.cert), "--internal-key", str(self.key)]
        return out


def add_server_tls_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("TLS (default: plaintext)")
    group.add_argument("--tls-cert", type=Path, default=None, help="server certificate (PEM)")
    group.add_argument("--tls-key", type=Path, default=None, help="server private key (PEM)")
    group.add_argument(
        "--tls-client-ca", type=Path, default=None,
        help="CA of client certificates; set, a client without one is refused (mTLS)",
    )


def add_client_tls_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("TLS to the internal services (default: plaintext)")
    group.add_argument("--internal-ca", type=Path, default=None, help="CA of their certificates")
    group.add_argument("--internal-cert", type=Path, default=None, help="our client certificate")
    group.add_argument("--internal-key", type=Path, default=None, help="its private key")


def server_tls_from_args(args: argparse.Namespace) -> ServerTLS | None:
    if args.tls_cert is None and args.tls_key is None:
        if args.tls_client_ca is not None:
            raise SystemExit("--tls-client-ca needs --tls-cert and --tls-key")
        return None
    if args.tls_cert is None or args.tls_key is None:
        raise SystemExit("--tls-cert and --tls-key go together")
    return ServerTLS(args.tls_cert, args.tls_key, args.tls_client_ca)


def client_tls_from_args(args: argparse.Namespace) -> ClientTLS | None:
    if (args.internal_cert is None) != (args.internal_key is None):
        raise SystemExit("--internal-cert and --internal-key go together")
    if args.internal_ca is None:
        if args.internal_cert is not None:
            raise SystemExit("--internal-cert needs --internal-ca")
        return None
    return ClientTLS(args.internal_ca, args.internal_cert, args.internal_key)


def bind(server: grpc.Server | grpc.aio.Server, address: str, tls: ServerTLS | None) -> int:
    """Binds ``address`` with TLS when configured; returns the port (0: could not bind)."""
    if tls is None:
        return server.add_insecure_port(address)
    return server.add_secure_port(address, tls.credentials())


def aio_channel(
    address: str, tls: ClientTLS | None, options: list[tuple[str, int]]
) -> grpc.aio.Channel:
    if tls is None:
        return grpc.aio.insecure_channel(address, options=options)
    return grpc.aio.secure_channel(address, tls.credentials(), options=options)


def sync_channel(
    address: str, tls: ClientTLS | None, options: list[tuple[str, int]]
) -> grpc.Channel:
    if tls is None:
        return grpc.insecure_channel(address, options=options)
    return grpc.secure_channel(address, tls.credentials(), options=options)
