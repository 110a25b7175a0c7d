"""`splitspec generate`'s structured output flags: the format a reply must follow."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from plumbing.arg_types import utf8_text
from protos import generation_pb2 as pb


def add_format_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "structured output (one of; a reply that ends at EOS follows it)"
    ).add_mutually_exclusive_group()
    group.add_argument("--json-schema", metavar="SCHEMA", type=utf8_text,
                       help="a JSON Schema, as JSON text or @FILE")  # fmt: skip
    group.add_argument("--json", action="store_true", help="any JSON object")
    group.add_argument("--regex", metavar="RE", type=utf8_text,
                       help="the whole reply matches this expression")  # fmt: skip
    group.add_argument("--grammar", metavar="GRAMMAR", type=utf8_text,
                       help="a Lark or GBNF grammar, as text or @FILE")  # fmt: skip
    group.add_argument("--choice", action="append", metavar="TEXT", type=utf8_text,
                       help="the reply is exactly one of these (repeatable)")  # fmt: skip


def structured_output(args: argparse.Namespace) -> pb.StructuredOutput | None:
    """The request's format from the flags; None when none was given. ValueError says what is
    wrong with one before any connection: an @FILE that cannot be read, a schema that is not
    JSON (the router checks the rest)."""
    if args.json_schema is not None:
        schema = _text_or_file("--json-schema", args.json_schema)
        try:
            json.loads(schema)
        except json.JSONDecodeError as err:
            raise ValueError(f"--json-schema is not JSON: {err}") from None
        return pb.StructuredOutput(json_schema=schema)
    if args.json:
        return pb.StructuredOutput(json_object=True)
    if args.regex is not None:
        return pb.StructuredOutput(regex=args.regex)
    if args.grammar is not None:
        return pb.StructuredOutput(grammar=_text_or_file("--grammar", args.grammar))
    if args.choice:
        return pb.StructuredOutput(choice=pb.Choices(values=args.choice))
    return None


def _text_or_file(flag: str, value: str) -> str:
    if not value.startswith("@"):
        return value
    try:
        return Path(value[1:]).read_text()
    except (OSError, UnicodeDecodeError) as err:
        raise ValueError(f"{flag} {value}: cannot read the file ({err})") from None
