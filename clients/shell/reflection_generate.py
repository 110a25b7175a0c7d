"""A client that knows nothing of splitspec but its address: it lists the services through
gRPC server reflection, fetches their descriptors the same way, and streams a Generate built
from them (what `grpcurl` does, for machines without grpcurl).

    python reflection_generate.py HOST:PORT "prompt" [--max-tokens N]

Prints the service names, a line `---`, then the generated text as it streams.
"""

from __future__ import annotations

import argparse
import sys

import grpc
from google.protobuf import descriptor_pool, json_format, message_factory
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)

SERVICE, METHOD = "splitspec.v1.Generation", "Generate"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("address")
    parser.add_argument("prompt")
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args()
    with grpc.insecure_channel(args.address) as channel:
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
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
