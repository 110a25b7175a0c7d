"""`splitspec serve --target-args/--router-args/--draft-args`: a service's own flags that serve
has none of its own for (the target's `--attention torch`, the router's `--max-queue 64`...),
passed to every service of that kind after serve's. Each is checked against the service's own
parser before anything starts, so a wrong one is a usage error naming it, not a service that
dies half-way through the start."""

from __future__ import annotations

import importlib
import shlex

from plumbing.flag_hints import HintingParser

KINDS = ("target", "router", "draft")
_ARGUMENTS = {"target": "target_service.arguments", "router": "router.arguments",
              "draft": "draft_service.arguments"}  # fmt: skip

# Flags serve sets itself. Its own flag of the same name (or --keep-cpus-awake, which serve
# applies for the whole machine) says it once for the stack; the addresses are the stack's.
_SERVES_OWN = {
    "target": {"--model", "--device", "--dtype", "--num-slots", "--exact", "--warm-up",
               "--no-warm-up", "--log-level", "--log-format", "--keep-cpus-awake"},
    "router": {"--model", "--http-port", "--adaptive-speculation", "--no-adaptive-speculation",
               "--log-requests", "--otlp-traces-endpoint", "--otlp-service-name", "--log-level",
               "--log-format", "--keep-cpus-awake"},
    "draft": {"--model", "--method", "--num-steps", "--topk", "--num-draft-tokens", "--device",
              "--dtype", "--threads", "--eagle-head", "--log-level", "--log-format",
              "--keep-cpus-awake"},
}  # fmt: skip
_SERVE_NAMES = {("draft", "--method"): "--draft-method", ("draft", "--dtype"): "--draft-dtype",
                ("draft", "--threads"): "--draft-threads",
                ("target", "--warm-up"): "--no-warm-up"}  # fmt: skip
_ADDRESSES = {"--host", "--port", "--target", "--draft", "--draft-dns"}
_SECURITY_PREFIXES = ("--tls-", "--internal-", "--api-key-")


class _Refused(Exception):
    pass


class _CheckingParser(HintingParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise _Refused(message)


def service_args(kind: str, text: str | None) -> list[str]:
    """The flags in ``text`` for every service of ``kind``, checked; ValueError says why not."""
    flag = f"--{kind}-args"
    try:
        argv = shlex.split(text or "")
    except ValueError as err:  # an unclosed quote
        raise ValueError(f"{flag}: {err}") from err
    if not argv:
        return []  # nothing to check: the service's parser (and torch) stay unimported
    for token in argv:
        name = token.split("=", 1)[0]
        if name.startswith("--") and (problem := _refusal(kind, name)):
            raise ValueError(f"{flag}: {name} {problem}")
    parser = _CheckingParser(prog=f"splitspec {kind}", add_help=False, allow_abbrev=False)
    importlib.import_module(_ARGUMENTS[kind]).add_arguments(parser)
    try:
        parser.parse_args(argv)
    except _Refused as err:
        raise ValueError(f"{flag}: {err} (see `splitspec {kind} --help`)") from err
    return argv


def _refusal(kind: str, name: str) -> str:
    if name in _ADDRESSES:
        return "is serve's to set: it picks the stack's addresses"
    if name.startswith(_SECURITY_PREFIXES):
        return ("is not for serve, which runs its services in plaintext on this machine and "
                "checks them so: start them one by one for TLS or an API key "
                "(docs/deployment.md)")  # fmt: skip
    if name in _SERVES_OWN[kind]:
        own = _SERVE_NAMES.get((kind, name), name)
        return f"is set by serve: give serve's own {own}"
    return ""
