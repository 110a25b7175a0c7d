"""A client that knows nothing of splitspec but its address: it lists the services through
gRPC server reflection, fetches their descriptors the same way, and streams a Generate built
from them (what `grpcurl` does, for machines without grpcurl).

    python reflection_generate.py HOST:PORT "prompt" [--max-tokens N] [--tls-ca FILE]
        [--tls-client-cert FILE --tls-client-key FILE] [--api-key-env VAR]

Prints the service names, a line `---`, then the generated text as it streams.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import grpc
from google.protobuf import descriptor_pool, json_format, message_factory
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)

SERVICE, METHOD = "splitspec.v1.Generation", "Generate"


class _Metadata(grpc.UnaryStreamClientInterceptor, grpc.StreamStreamClientInterceptor):
    """Adds ``pairs`` to every call: the API key, on the Generate and the reflection calls."""

    def __init__(self, pairs: list[tuple[str, str]]) -> None:
        self.pairs = pairs

    def _with_pairs(self, details):
        return details._replace(metadata=[*(details.metadata or ()), *self.pairs])

    def intercept_unary_stream(self, continuation, details, request):
        return continuation(self._with_pairs(details), request)

    def intercept_stream_stream(self, continuation, details, requests):
        return continuation(self._with_pairs(details), requests)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("address")
    parser.add_argument("prompt")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--tls-ca", type=Path, help="the router serves TLS: trust this CA")
    parser.add_argument("--tls-client-cert", type=Path, help="present this certificate (mTLS)")
    parser.add_argument("--tls-client-key", type=Path, help="the certificate's key")
    parser.add_argument("--api-key-env", metavar="VAR", default="SPLITSPEC_API_KEY",
                        help="the environment variable holding the router's API key, sent "
                             "when set (default: SPLITSPEC_API_KEY)")  # fmt: skip
    args = parser.parse_args()
    if (args.tls_client_cert is None) != (args.tls_client_key is None) or (
        args.tls_client_cert is not None and args.tls_ca is None
    ):
        parser.error("--tls-client-cert and --tls-client-key go together, with --tls-ca")
    return args


def open_channel(args: argparse.Namespace) -> grpc.Channel:
    if args.tls_ca is None:
        channel = grpc.insecure_channel(args.address)
    else:
        pem = [p.read_bytes() if p else None for p in
               (args.tls_ca, args.tls_client_key, args.tls_client_cert)]  # fmt: skip
        channel = grpc.secure_channel(args.address, grpc.ssl_channel_credentials(*pem))
    key = os.environ.get(args.api_key_env, "").strip()
    if key:
        channel = grpc.intercept_channel(channel, _Metadata([("authorization", f"Bearer {key}")]))
    return channel


def main() -> int:
    args = parse_args()
    try:
        with open_channel(args) as channel:
            stream(channel, args)
    except grpc.RpcError as err:  # one line, not a traceback: what the router said
        print(f"\nerror: {err.code().name}: {err.details()}", file=sys.stderr)
        return 1
    print()
    return 0


def stream(channel: grpc.Channel, args: argparse.Namespace) -> None:
    """Lists the services, then streams the Generate built from their descriptors."""
    database = ProtoReflectionDescriptorDatabase(channel)
    print("\n".join(database.get_services()))
    print("---", flush=True)
    pool = descriptor_pool.DescriptorPool(database)
    method = pool.FindServiceByName(SERVICE).FindMethodByName(METHOD)
    request_class = message_factory.GetMessageClass(method.input_type)
    response_class = message_factory.GetMessageClass(method.output_type)
    request = json_format.ParseDict(
        {
            "messages": {"items": [{"role": "user", "content": args.prompt}]},
            "sampling": {"maxNewTokens": args.max_tokens, "temperature": 0.0},
        },
        request_class(),
    )
    call = channel.unary_stream(
        f"/{SERVICE}/{METHOD}",
        request_serializer=request_class.SerializeToString,
        response_deserializer=response_class.FromString,
    )
    for item in call(request, timeout=300):
        sys.stdout.write(item.text)
        sys.stdout.flush()


if __name__ == "__main__":
    sys.exit(main())
