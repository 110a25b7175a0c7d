"""`splitspec serve`: the whole stack on this machine (router, target, draft replicas), its
first-start work and the endpoints it prints (its flags: serve_flags.py)."""

from __future__ import annotations

import argparse
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from plumbing import cpu_wake
from plumbing.logs import setup_logging
from splitspec.serve_flags import ROUTER_PORT, add_serve_flags
from splitspec.service_args import KINDS, service_args

if TYPE_CHECKING:  # the launcher is imported when a command needs it
    from splitspec.launcher import LocalStack


def _serve(args: argparse.Namespace) -> int:
    try:
        extra = {kind: service_args(kind, getattr(args, f"{kind}_args")) for kind in KINDS}
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    problem = pointless_draft_flags(args) or _busy_port(args) or _device_problem(args.device)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    if not _prepare(args):
        return 2
    setup_logging("serve", args.log_level, args.log_format)
    cpu_wake.apply(args.keep_cpus_awake)
    stack = _local_stack(args, extra)
    drafts = f", {len(stack.drafts)} draft ({draft_method(args)})" if stack.drafts else ""
    print(f"starting target, router{drafts} (logs in {stack.log_dir})", flush=True)
    try:
        stack.start(timeout_s=args.start_timeout, on_ready=_say_ready)
    except (RuntimeError, TimeoutError) as err:  # a service exited or never turned healthy
        print(f"error: {err}", file=sys.stderr)
        return 1
    try:
        _print_endpoints(stack, args)
        if args.demo and not _demo(stack, args):
            return 1
        if args.exit_after_demo:
            return 0
        print(f"\nserving; Ctrl-C stops every service. From another shell: {_own_command()} "
              f"generate{_generate_flag(stack.router_address)} \"Hello\"", flush=True)
        # Blocked first: sigwait only takes pending signals, and an unblocked SIGTERM (a `kill`,
        # `docker stop`, systemd) would end this process at once, leaving the services to die
        # of their parent's death instead of stopping here in order.
        stop_signals = {signal.SIGINT, signal.SIGTERM}
        signal.pthread_sigmask(signal.SIG_BLOCK, stop_signals)
        signal.sigwait(stop_signals)
        return 0
    finally:
        stack.stop()


def _demo(stack: LocalStack, args: argparse.Namespace) -> bool:
    from splitspec.demo import run_demo  # gRPC and the client: only for a demo

    return run_demo(stack.router_address, args, compare=bool(stack.drafts))


def _local_stack(
    args: argparse.Namespace, extra: dict[str, list[str]] | None = None
) -> LocalStack:
    """The stack serve's flags describe; ``extra``: each kind's --KIND-args, after serve's."""
    extra = extra or {}
    from splitspec.launcher import LocalStack

    target_args = ["--device", args.device, "--dtype", args.dtype]
    target_args += ["--num-slots", str(args.num_slots)]
    if args.model:
        target_args += ["--model", str(args.model)]
    if args.exact:
        target_args.append("--exact")
    if not args.warm_up:
        target_args.append("--no-warm-up")
    router_args = ["--model", str(args.model)] if args.model else []
    if args.http_port:
        router_args += ["--http-port", str(args.http_port)]
    if args.adaptive_speculation:
        router_args.append("--adaptive-speculation")
    if args.log_requests:
        router_args.append("--log-requests")
    if args.otlp_traces_endpoint:
        router_args += ["--otlp-traces-endpoint", args.otlp_traces_endpoint,
                        "--otlp-service-name", args.otlp_service_name]  # fmt: skip
    log_flags = ["--log-level", args.log_level, "--log-format", args.log_format]
    log_dir = Path(tempfile.mkdtemp(prefix="splitspec-logs-"))
    drafts = [[*draft, *log_flags, *extra.get("draft", [])] for draft in _draft_args(args)]
    return LocalStack([*target_args, *log_flags, *extra.get("target", [])],
                      [*router_args, *log_flags, *extra.get("router", [])], log_dir=log_dir,
                      draft_args=drafts,
                      http=not args.http_port,  # no port given: the launcher picks a free one
                      router_port=args.port)  # fmt: skip


def _print_endpoints(stack: LocalStack, args: argparse.Namespace) -> None:
    print(f"router (public API, splitspec.v1.Generation): {stack.router_address}")
    http = stack.http_address or f"127.0.0.1:{args.http_port}"
    print(f"router (OpenAI-compatible HTTP, /metrics): http://{http}/v1")
    print(f"target (internal, splitspec.target.v1.TargetModel): {stack.target_address}")
    for draft in stack.drafts:
        kind = f"splitspec.draft.v1.DraftModel, {draft_method(args)}"
        print(f"draft  (internal, {kind}): {draft.address}")
    sys.stdout.flush()


def _own_command() -> str:
    """How this shell ran splitspec: `splitspec` when that is on PATH, else the path it was run
    by (`make run` runs .venv/bin/splitspec, which an unactivated shell does not find)."""
    me = Path(sys.argv[0])
    on_path = shutil.which("splitspec")
    if me.name == "splitspec" and (on_path is None or Path(on_path).resolve() != me.resolve()):
        return str(me)
    return "splitspec"


def _generate_flag(router_address: str) -> str:
    """What `splitspec generate` needs to reach this router: nothing on the default port."""
    host, _, port = router_address.rpartition(":")
    if host != "127.0.0.1":
        return f" --address {router_address}"
    return "" if port == str(ROUTER_PORT) else f" --port {port}"


def _busy_port(args: argparse.Namespace) -> str:
    """The error for a public port given that something already listens on, else ''."""
    for port, flag in ((args.port, "--port"), (args.http_port, "--http-port")):
        if port and not port_free(port):
            return (f"port {port} of 127.0.0.1 is in use (another `splitspec serve`?): "
                    f"stop it, or pass {flag} with another port (0: a free one)")  # fmt: skip
    return ""


def _device_problem(device: str) -> str:
    if device == "cpu":
        return ""  # without importing torch
    from model_runtime.cuda_setup import device_problem

    return device_problem(device)


def port_free(port: int, host: str = "127.0.0.1") -> bool:
    """Whether nothing listens on ``port``: a plain bind fails beside any listener, one with
    SO_REUSEPORT too (a gRPC server's default), while SO_REUSEADDR lets a port whose last
    connections linger in TIME_WAIT count as free."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def _prepare(args: argparse.Namespace) -> bool:
    """The first-start work (model conversion, kernel build) in a process of its own, so that
    its progress shows here; False (its error already printed) when it failed."""
    command = [sys.executable, "-m", "splitspec.prepare"]
    if args.model:
        command += ["--model", str(args.model)]
    if args.device == "cpu" and args.dtype == "float32":
        command.append("--kernel")  # the CPU fp32 target packs its weights for the kernel
    return subprocess.run(command, check=False).returncode == 0


def _say_ready(name: str, seconds: float) -> None:
    print(f"  {name} ready after {seconds:.1f} s", flush=True)


def draft_method(args: argparse.Namespace) -> str:
    """auto: the EAGLE head when one fits the model (the shipped head fits the default model,
    or --eagle-head names one), else n-gram: a head with random weights would accept nothing."""
    if args.draft_method != "auto":
        return args.draft_method
    if args.eagle_head:  # a head named is EAGLE asked for, on any device
        return "eagle"
    if args.device.startswith("cuda"):
        # Measured on an H200 (README, "On a GPU"): with both services replaying CUDA graphs,
        # a round of the 135M default model costs about what the ~4 tokens it commits cost
        # target-only (0.75-1.27x by prompt set and box), so speculation there is asked for.
        return "off"
    return "ngram" if args.model else "eagle"


# The draft replicas' own flags, by their argparse names (--num-steps is num_steps).
DRAFT_ONLY = ("num_steps", "topk", "num_draft_tokens", "eagle_head", "draft_threads",
              "draft_dtype", "draft_args")  # fmt: skip


def pointless_draft_flags(args: argparse.Namespace) -> str:
    """Why the draft replicas' own flags given are a usage error, if no replica runs: they
    would change nothing, and a user who gave them meant speculation to run."""
    method = draft_method(args)
    if method == "ngram" and args.eagle_head:
        return "--eagle-head: the n-gram drafter has no head; give --draft-method eagle or auto"
    if method != "off" and args.num_draft_replicas > 0:
        return ""
    parser = argparse.ArgumentParser()
    add_serve_flags(parser)
    defaults = parser.parse_args([])
    given = ["--" + dest.replace("_", "-") for dest in DRAFT_ONLY
             if getattr(args, dest) != getattr(defaults, dest)]  # fmt: skip
    if not given:
        return ""
    if args.num_draft_replicas == 0:
        why, fix = "--num-draft-replicas 0", "--num-draft-replicas 1 or more"
    else:
        why = "--draft-method off" if args.draft_method == "off" else (
            "--draft-method auto, which is off on CUDA")  # fmt: skip
        fix = "--draft-method eagle or ngram"
    return f"{', '.join(given)}: no draft replica runs ({why}); give {fix}, or leave them out"


def _draft_args(args: argparse.Namespace) -> list[list[str]]:
    method = draft_method(args)
    if method == "off":
        return []
    tree = {"--num-steps": args.num_steps, "--topk": args.topk,
            "--num-draft-tokens": args.num_draft_tokens}  # fmt: skip
    shape = [
        "--method",
        method,
        *(arg for flag, value in tree.items() if value is not None for arg in (flag, str(value))),
        "--device",
        args.device,
        "--dtype",
        args.draft_dtype,
        "--threads",
        str(args.draft_threads),
    ]
    if args.model:
        shape += ["--model", str(args.model)]
    if args.eagle_head:
        shape += ["--eagle-head", str(args.eagle_head)]
    return [shape for _ in range(args.num_draft_replicas)]


def add_serve_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "serve", help="start the stack locally (router, target, draft replicas) and wait"
    )
    add_serve_flags(p)
    p.set_defaults(func=_serve)
