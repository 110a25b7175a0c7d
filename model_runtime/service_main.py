"""The command line of a model service (target, draft): parse, check, serve.

Both services start the same way: die with the launcher that spawned them, take their own
arguments plus TLS and --keep-cpus-awake, refuse a device this machine cannot run (before
looking for the model), turn them into a config (an out-of-range setting is a usage error), then
serve; what stops a start as configured (plumbing/errors.StartupRefused: a cache that cannot be
written, a model or EAGLE head that is not there, pools past the free memory) is one line and
exit status 2, not a traceback from deep down.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable
from typing import Any, NoReturn

from model_runtime.cuda_setup import device_problem
from plumbing import cpu_wake
from plumbing.arg_types import port
from plumbing.errors import StartupRefused
from plumbing.flag_hints import HintingParser
from plumbing.lifecycle import die_with_parent_if_asked
from plumbing.logs import add_log_flags, setup_logging
from plumbing.security import ServerTLS, add_server_tls_arguments, server_tls_from_args

log = logging.getLogger("splitspec")


def add_endpoint_flags(parser: argparse.ArgumentParser, default_port: int) -> None:
    """A model service's --host and --port, first among its flag groups."""
    group = parser.add_argument_group("endpoint")
    group.add_argument(
        "--host", default="127.0.0.1", help="interface to listen on (0.0.0.0: every one)"
    )
    group.add_argument("--port", type=port, default=default_port, help="0: a free one, logged")


def service_parser(
    name: str, description: str | None, add_arguments: Callable[[argparse.ArgumentParser], None]
) -> argparse.ArgumentParser:
    """A model service's whole command line: its own flags, then TLS, logging and the CPUs."""
    parser = HintingParser(prog=f"splitspec {name}", description=description)
    add_arguments(parser)
    add_server_tls_arguments(parser)
    add_log_flags(parser)
    cpu_wake.add_argument(parser.add_argument_group("CPUs"))
    return parser


def run_service(
    name: str,
    description: str | None,
    add_arguments: Callable[[argparse.ArgumentParser], None],
    config_from_args: Callable[[argparse.Namespace], Any],  # a config with a .device
    serve: Callable[[Any, ServerTLS | None], None],
    argv: list[str] | None = None,
) -> None:
    die_with_parent_if_asked()
    parser = service_parser(name, description, add_arguments)
    args = parser.parse_args(argv)
    setup_logging(name, args.log_level, args.log_format)
    cpu_wake.apply(args.keep_cpus_awake)
    problem = device_problem(args.device) if args.device else ""  # None: the service picks
    if problem:
        raise SystemExit(f"{name}: {problem}")
    try:
        config = config_from_args(args)
    except StartupRefused as err:  # before ValueError: some refusals are ValueErrors too
        refuse(name, err)
    except ValueError as err:
        parser.error(str(err))
    try:
        serve(config, server_tls_from_args(args))
    except StartupRefused as err:
        refuse(name, err)


def refuse(name: str, err: StartupRefused) -> NoReturn:
    log.error("%s: %s", name, err)
    raise SystemExit(2) from None
