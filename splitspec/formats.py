"""`splitspec generate`'s structured output flags: the format a reply must follow."""

from __future__ import annotations

import argparse
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
    """The request's format from the flags; None when none was given."""
    if args.json_schema is not None:
        return pb.StructuredOutput(json_schema=_text_or_file(args.json_schema))
    if args.json:
        return pb.StructuredOutput(json_object=True)
    if args.regex is not None:
        return pb.StructuredOutput(regex=args.regex)
    if args.grammar is not None:
        return pb.StructuredOutput(grammar=_text_or_file(args.grammar))
    if args.choice:
        return pb.StructuredOutput(choice=pb.Choices(values=args.choice))
    return None


def _text_or_file(value: str) -> str:
    return Path(value[1:]).read_text() if value.startswith("@") else value
