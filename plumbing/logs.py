"""How every splitspec process logs: `--log-level` and `--log-format` (text for a terminal, json
for a log pipeline: one object a line, keyed by request_id where a line concerns a request).

A line about a request passes its id as ``extra={"request_id": ...}``; the json format puts it
(and the other EXTRA_FIELDS a line carries) beside the message, the text format leaves the
message as it reads.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
from datetime import UTC, datetime

LEVELS = ("debug", "info", "warning", "error")
FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(name)s %(message)s"
# What a record may carry beyond its message, as `extra=`: the json format keeps these.
EXTRA_FIELDS = (
    "request_id", "replica", "prompt_tokens", "completion_tokens", "cached_tokens",
    "finish_reason", "queue_ms", "ttft_ms", "total_ms", "verify_steps", "acceptance_length",
    "error",
)  # fmt: skip


def add_log_flags(parser: argparse.ArgumentParser, level_help: str = "") -> argparse._ArgumentGroup:
    """A process's --log-level and --log-format; SPLITSPEC_LOG_FORMAT sets the format's
    default, so one variable switches a whole stack (compose, a Helm release) to json."""
    group = parser.add_argument_group("logging")
    group.add_argument(
        "--log-level",
        choices=LEVELS,
        default="info",
        help=level_help or "the least severe lines logged",
    )
    group.add_argument(
        "--log-format",
        type=log_format,  # argparse runs it on the default too: a bad variable is a usage error
        default=os.environ.get("SPLITSPEC_LOG_FORMAT", "text"),
        metavar="{text,json}",
        help="text: time, logger and message; json: one object a line with time, level, "
        "service, logger, message and the line's request_id (default: $SPLITSPEC_LOG_FORMAT, "
        "else text)",
    )
    return group


def log_format(value: str) -> str:
    if value not in FORMATS:
        raise argparse.ArgumentTypeError(
            f"{value!r} (from --log-format or $SPLITSPEC_LOG_FORMAT): use text or json"
        )
    return value


_bars = {"on": True}  # progress bars on stderr; off under json, where a pipeline reads stderr


def progress_bars() -> bool:
    """Whether long work (graph capture) may draw a progress bar: not among JSON lines."""
    return _bars["on"]


def setup_logging(service: str, level: str = "info", fmt: str = "text") -> None:
    """Replaces the root logger's handlers with one on stderr in ``fmt``."""
    if fmt not in FORMATS:
        raise ValueError(f"log format {fmt!r}: one of {', '.join(FORMATS)}")
    _bars["on"] = fmt == "text"
    handler = logging.StreamHandler()
    formatter = JsonFormatter(service) if fmt == "json" else logging.Formatter(TEXT_FORMAT)
    handler.setFormatter(formatter)
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)


class JsonFormatter(logging.Formatter):
    def __init__(self, service: str) -> None:
        super().__init__()
        self.service = service

    def format(self, record: logging.LogRecord) -> str:
        line = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "service": self.service,
            "logger": record.name,
            "message": record.getMessage(),
        }
        line.update({k: getattr(record, k) for k in EXTRA_FIELDS if hasattr(record, k)})
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)
