"""The generated docs stay true: the configuration reference equals what the CLI's parsers
say now, the plots render from the committed benchmark JSON, and the API page names every
RPC of the public service and every HTTP route."""

from __future__ import annotations

import re
from pathlib import Path

from docs import build
from docs.benchmark_plots import render_all
from protos import generation_pb2 as pb

DOCS = Path(__file__).resolve().parents[1] / "docs"


def test_config_reference_is_fresh() -> None:
    assert (DOCS / "config.md").read_text() == build.config_markdown(), (
        "docs/config.md is stale: run `make docs` (or .venv/bin/python docs/build.py)"
    )


def test_config_reference_covers_every_flag() -> None:
    text = (DOCS / "config.md").read_text()
    for _, parser in build.parsers():
        for action in parser._actions:
            for flag in action.option_strings:
                if flag not in ("-h", "--help"):
                    assert f"`{flag}`" in text, flag


def test_service_flags_sit_in_named_groups() -> None:
    """Every command's --help (and docs/config.md) shows its flags in named groups; a flag
    added outside one would land in a bare "options" list."""
    grouped = build.parsers()
    assert len(grouped) == 10  # serve, generate, status, bench, 3 training commands, 3 services
    for title, parser in grouped:
        loose = [a.option_strings for a in parser._optionals._group_actions if a.dest != "help"]
        assert loose == [], f"{title}: flags outside a named group: {loose}"
        assert "### " in build.parser_table(title, parser), title


def test_every_flag_says_what_it_does() -> None:
    """A flag without help shows a bare name in --help and an empty cell in docs/config.md."""
    for title, parser in build.parsers():
        bare = [a.option_strings or a.dest for a in parser._actions if not a.help]
        assert bare == [], f"{title}: flags without help: {bare}"


def test_plots_render_from_committed_json(tmp_path: Path) -> None:
    written = render_all(tmp_path)
    assert len(written) >= 4
    for path in written:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", path
        assert (DOCS / "plots" / path.name).is_file(), f"{path.name} not committed"


def test_api_page_names_every_rpc_and_route() -> None:
    text = (DOCS / "api.md").read_text()
    for method in pb.DESCRIPTOR.services_by_name["Generation"].methods:
        assert f"`{method.name}`" in text, method.name
    from router.openai_api.app import OpenAIServer

    class _Servicer:  # only for listing routes: no request is served
        scheduler = None

    routes = [r.path for r in OpenAIServer(_Servicer(), "m", registry=object()).app().routes]
    assert len(routes) == 9  # the OpenAI ones, /health, /metrics and the tokenizer ones
    for route in routes:
        shown = re.sub(r":\w+\}", "}", route)  # {model_id:path} reads {model_id}
        assert re.search(rf"`(GET|POST) {re.escape(shown)}`", text), route
