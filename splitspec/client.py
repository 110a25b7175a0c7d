"""A small client of the public API: streams one generation and measures it."""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TextIO

import grpc
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from plumbing.grpc_util import CHANNEL_OPTIONS
from protos import generation_pb2 as pb
from protos import generation_pb2_grpc
from splitspec.connection import ClientCert, Connection
from splitspec.tls_probe import asks_for_client_cert


@dataclass
class GenerationResult:
    request_id: str = ""
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    final: pb.GenerateResponse | None = None
    seconds: float = 0.0
    num_items: int = 0
    logprobs: list[pb.LogprobEntry] = field(default_factory=list)  # when the request asked
    prompt_logprobs: list[pb.LogprobEntry] = field(default_factory=list)  # likewise

    @property
    def tokens_per_s(self) -> float:
        return len(self.token_ids) / self.seconds if self.seconds > 0 else 0.0

    def summary(self) -> str:
        f = self.final
        line = (
            f"{len(self.token_ids)} tokens in {self.seconds:.2f} s = {self.tokens_per_s:.1f} tok/s"
            f" | {self.num_items} stream items"
        )
        if f is None:
            return line
        reason = pb.FinishReason.Name(f.finish_reason).removeprefix("FINISH_REASON_").lower()
        line += (
            f" | finish {reason}"
            f" | TTFT {f.timings.time_to_first_token_ms:.0f} ms"
            f" | prompt {f.usage.prompt_tokens} (cached {f.usage.cached_tokens})"
        )
        if f.speculation.verify_steps:
            line += " | " + acceptance_summary(f.speculation, len(self.token_ids))
        return line


def acceptance_summary(s: pb.SpeculationStats, num_tokens: int) -> str:
    """Acceptance over the verify steps, and how many tokens came from target-only steps: where
    the router's switch turned speculation off partway, the acceptance covers only the part of
    the reply that speculated, and the speed is mostly target-only's."""
    line = (
        f"acceptance {s.mean_acceptance_length:.2f} tokens/step over "
        f"{counted(s.verify_steps, 'verify step')} ({s.accepted_tokens}/{s.draft_tokens} drafts "
        "accepted"
    )
    target_only_tokens = num_tokens - s.accepted_tokens - s.verify_steps
    if target_only_tokens > 0:
        line += f"; {counted(target_only_tokens, 'token')} from target-only steps"
    return line + ")"


def counted(n: int, noun: str) -> str:
    """"1 token", "2 tokens"."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


class Client:
    def __init__(
        self,
        address: str,
        api_key: str | None = None,
        ca: bytes | None = None,
        client_cert: ClientCert | None = None,
    ) -> None:
        """``ca`` None: plaintext (``client_cert`` needs TLS, so it is refused there)."""
        if ca is None:
            if client_cert is not None:
                raise ValueError("a client certificate needs TLS: pass the router's CA too")
            self.channel = grpc.insecure_channel(address, options=CHANNEL_OPTIONS)
        else:
            credentials = grpc.ssl_channel_credentials(
                root_certificates=ca,
                private_key=client_cert.key if client_cert else None,
                certificate_chain=client_cert.chain if client_cert else None,
            )
            self.channel = grpc.secure_channel(address, credentials, options=CHANNEL_OPTIONS)
        self.metadata = (("authorization", f"Bearer {api_key}"),) if api_key else ()
        self.stub = generation_pb2_grpc.GenerationStub(self.channel)

    @classmethod
    def connect(cls, connection: Connection) -> Client:
        return cls(connection.address, connection.api_key, connection.ca, connection.client_cert)

    def stream(
        self, request: pb.GenerateRequest, timeout_s: float = 600.0
    ) -> Iterator[pb.GenerateResponse]:
        yield from self.stub.Generate(request, timeout=timeout_s, metadata=self.metadata)

    def status(self, timeout_s: float = 10.0) -> pb.ServerStatus:
        request = pb.GetServerStatusRequest()
        return self.stub.GetServerStatus(request, timeout=timeout_s, metadata=self.metadata)

    def generate(
        self, request: pb.GenerateRequest, echo: TextIO | None = None, timeout_s: float = 600.0
    ) -> GenerationResult:
        result = GenerationResult()
        started = time.perf_counter()
        for item in self.stream(request, timeout_s):
            result.request_id = item.request_id
            result.num_items += 1
            result.token_ids += item.token_ids
            result.text += item.text
            result.logprobs += item.logprobs
            result.prompt_logprobs += item.prompt_logprobs
            if echo is not None and item.text:
                echo.write(item.text)
                echo.flush()
            if item.finish_reason:
                result.final = item
        result.seconds = time.perf_counter() - started
        return result

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def build_request(
    prompt: str,
    chat: bool,
    max_new_tokens: int,
    temperature: float,
    seed: int | None = None,
    speculate: bool | None = None,
    *,
    top_p: float = 1.0,
    top_k: int = 0,
    stop: Sequence[str] = (),
    top_logprobs: int | None = None,
    prompt_logprobs: bool = False,
    min_p: float = 0.0,
    repetition_penalty: float = 1.0,
    min_tokens: int = 0,
    structured_output: pb.StructuredOutput | None = None,
) -> pb.GenerateRequest:
    """``top_logprobs``: None, no logprobs; N >= 0, each token's and its N likeliest (the
    prompt's tokens' too with ``prompt_logprobs``)."""
    req = pb.GenerateRequest()
    if chat:
        req.messages.items.add(role="user", content=prompt)
    else:
        req.text = prompt
    req.sampling.max_new_tokens = max_new_tokens
    req.sampling.temperature = temperature
    req.sampling.top_p = top_p
    req.sampling.top_k = top_k
    req.sampling.stop.extend(stop)
    req.sampling.min_p = min_p
    req.sampling.repetition_penalty = repetition_penalty
    req.sampling.min_tokens = min_tokens
    if seed is not None:
        req.sampling.seed = seed
    if top_logprobs is not None:
        req.sampling.logprobs = True
        req.sampling.top_logprobs = top_logprobs
    req.sampling.prompt_logprobs = prompt_logprobs
    if structured_output is not None:
        req.sampling.structured_output.CopyFrom(structured_output)
    if speculate is not None:
        req.speculation.enabled = speculate
    return req


def describe_rpc_error(err: grpc.RpcError, connection: Connection) -> str:
    """One line for a failed call: the status and the router's message, or what to change when
    no router answered, or not to this client."""
    code, details, address = err.code(), err.details() or "", connection.address
    refusal = client_cert_refusal(details, connection) if code.name == "UNAVAILABLE" else ""
    if refusal:
        return refusal
    if code.name == "UNAVAILABLE" and "connect" in details:
        tls = "" if connection.ca is not None else "; a router serving TLS wants --tls-ca"
        return (f"no router answers at {address} ({details}); start one with `splitspec serve`, "
                f"or pass --port or --address{tls}")  # fmt: skip
    if code.name == "UNIMPLEMENTED":  # a target or a draft service: their ports are internal
        return (f"{address} is not a router (no Generate there: {details}); pass the router's "
                "--address")  # fmt: skip
    if code.name == "UNAUTHENTICATED":
        sent = "the key in" if connection.api_key else "no key: nothing in"
        return (f"the router at {address} refused the call ({details}); it sent {sent} "
                f"${connection.key_env} (--api-key-env names another variable)")  # fmt: skip
    return status_line(err)


def status_line(err: grpc.RpcError) -> str:
    """The call's status and the router's message, and the request fields a refusal names."""
    fields = bad_request_fields(err)
    at_fault = f" (field {', '.join(fields)})" if fields else ""
    return f"{err.code().name}: {err.details() or ''}{at_fault}"


def client_cert_refusal(details: str, connection: Connection) -> str:
    """One line when a router under mTLS hung up on us for want of a good client certificate
    (none, or one its --tls-client-ca did not sign); empty when that cannot be told. gRPC says
    only ``Socket closed`` then, so a probe of the router's handshake tells."""
    if connection.ca is None or "Socket closed" not in details:
        return ""
    address = connection.address
    if not asks_for_client_cert(address):
        return ""
    if connection.client_cert is None:
        return (f"the router at {address} asked for a client certificate and got none "
                f"({details}); pass --tls-client-cert and --tls-client-key, signed by the CA "
                "of its --tls-client-ca")  # fmt: skip
    return (f"the router at {address} refused our client certificate ({details}); it takes "
            "only an unexpired one signed by the CA of its --tls-client-ca")  # fmt: skip


def bad_request_fields(err: grpc.RpcError) -> list[str]:
    """The request fields a refusal names in gRPC's rich error model (a BadRequest in its
    google.rpc.Status: the router sends one with INVALID_ARGUMENT), as paths in a
    GenerateRequest (``sampling.top_p``, ``input``); empty where it names none."""
    if not isinstance(err, grpc.Call):
        return []
    try:
        status = rpc_status.from_call(err)
    except ValueError:  # its code or message differ from the call's: not a status to trust
        return []
    fields: list[str] = []
    for detail in status.details if status is not None else ():
        bad = error_details_pb2.BadRequest()
        if detail.Unpack(bad):
            fields += [violation.field for violation in bad.field_violations]
    return fields


def print_generation(
    connection: Connection, request: pb.GenerateRequest, out: TextIO | None = None
) -> GenerationResult:
    out = out or sys.stdout  # looked up now: a default bound at import outlives a swapped stdout
    with Client.connect(connection) as client:
        result = client.generate(request, echo=out)
    out.write("\n\n" + result.summary() + "\n")
    if result.prompt_logprobs:
        out.write("\nthe prompt:\n" + format_logprobs(result.prompt_logprobs) + "\n")
        out.write(prompt_score(result.prompt_logprobs) + "\n")
    if result.logprobs:
        out.write("\n" + format_logprobs(result.logprobs) + "\n")
    return result


def prompt_score(entries: Sequence[pb.LogprobEntry]) -> str:
    """The prompt's log-likelihood (its first token aside) and the perplexity it gives."""
    total = sum(entry.chosen.logprob for entry in entries)
    perplexity = math.exp(-total / len(entries))
    return f"log-likelihood {total:.3f} over {len(entries)} tokens, perplexity {perplexity:.2f}"


def format_logprobs(entries: Sequence[pb.LogprobEntry]) -> str:
    """A line per token: its text, its log-probability, then the likeliest at its place."""
    lines = ["token                 logprob   likeliest there"]
    for entry in entries:
        alternatives = "  ".join(f"{t.token!r} {t.logprob:.3f}" for t in entry.top)
        lines.append(f"{entry.chosen.token!r:20}  {entry.chosen.logprob:8.3f}   {alternatives}")
    return "\n".join(lines)
