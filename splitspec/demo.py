"""`splitspec serve --demo`: one streamed generation with its speed and acceptance, then, where
the stack has a drafter, the same request with speculation off, so that a first run shows what
speculation buys and that it changes no token."""

from __future__ import annotations

import argparse
import sys

import grpc

from protos import generation_pb2 as pb
from splitspec.client import (
    Client,
    GenerationResult,
    build_request,
    describe_rpc_error,
    print_generation,
)
from splitspec.connection import Connection


def run_demo(address: str, args: argparse.Namespace, compare: bool) -> bool:
    """Streams the demo's generation (and with ``compare`` runs it target-only too); a refused
    request (a prompt past --max-context, say) is one line on stderr, and False."""
    print(f"\ndemo: {args.demo_prompt!r}\n", flush=True)
    request = build_request(args.demo_prompt, True, args.demo_tokens, 0.0)
    router = Connection(address)
    try:
        speculative = print_generation(router, request)
        if compare:
            print(target_only_comparison(router, request, speculative), flush=True)
    except grpc.RpcError as err:
        print(f"\nerror: the demo's request failed: {describe_rpc_error(err, router)}",
              file=sys.stderr)  # fmt: skip
        return False
    return True


def target_only_comparison(
    router: Connection, request: pb.GenerateRequest, speculative: GenerationResult
) -> str:
    """The request again with speculation off (not streamed): its figures, the speed ratio and
    whether its tokens are the speculative run's. Its prompt is cached by then, which favours
    target-only's time to first token: the ratio errs against speculation."""
    plain = pb.GenerateRequest()
    plain.CopyFrom(request)
    plain.speculation.enabled = False
    with Client.connect(router) as client:
        target_only = client.generate(plain)
    rate = target_only.tokens_per_s
    ratio = speculative.tokens_per_s / rate if rate else 0.0
    return (
        f"target-only, the same request (speculation off): {target_only.summary()}\n"
        f"speculation: {ratio:.2f}x target-only's tok/s; {same_tokens(speculative, target_only)}"
    )


def same_tokens(speculative: GenerationResult, target_only: GenerationResult) -> str:
    a, b = speculative.token_ids, target_only.token_ids
    if a == b:
        return f"the same {len(a)} tokens"
    pairs = enumerate(zip(a, b, strict=False))
    first = next((i for i, (x, y) in pairs if x != y), min(len(a), len(b)))
    return f"the tokens differ from token {first} on ({len(a)} against {len(b)})"
