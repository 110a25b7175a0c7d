"""Rendering a model's jinja chat template the way transformers renders it, without transformers.

Templates come from model files, i.e. untrusted code, so they run in jinja's immutable sandbox.
The environment matches transformers' (`trim_blocks`, `lstrip_blocks`, `loopcontrols`, and the
`raise_exception` / `strftime_now` / `tojson` helpers) so the rendered text is byte-identical.
Tools are passed as transformers passes them (`tools`, None when there are none); a template
that never reads `tools` gets the chat rewritten in the Hermes format instead
(router/tool_prompt.py).
"""

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
import jinja2.meta
from jinja2.sandbox import ImmutableSandboxedEnvironment

from router.tool_prompt import hermes_messages, uses_tools

ALLOWED_ROLES = frozenset({"system", "user", "assistant", "tool"})


class ChatTemplate:
    """A compiled, sandboxed chat template.

    `render` validates messages first, so every failure a client can cause (bad role, non-string
    content, a template's `raise_exception`) surfaces as ValueError and never as a jinja error.
    """

    def __init__(self, source: str, special_tokens: Mapping[str, str]) -> None:
        env = _environment()
        try:
            self._template = env.from_string(source)
            self.reads_tools = "tools" in jinja2.meta.find_undeclared_variables(env.parse(source))
        except jinja2.TemplateSyntaxError as e:
            raise ValueError(f"chat template does not compile: {e}") from e
        # Templates read e.g. `bos_token`; transformers passes its special-token strings likewise.
        self._special_tokens = dict(special_tokens)

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool,
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> str:
        """The prompt text for `messages`, ending in the assistant header if asked; `tools`:
        OpenAI's function definitions (router/tool_prompt.py when the template ignores them)."""
        validate_messages(messages)
        chat: Sequence[Mapping[str, Any]] = messages
        if not self.reads_tools and uses_tools(messages, tools):
            chat, tools = hermes_messages(messages, tools), None
        try:
            return self._template.render(
                messages=[dict(m) for m in chat],
                tools=list(tools) if tools else None,
                add_generation_prompt=add_generation_prompt,
                **self._special_tokens,
            )
        except jinja2.TemplateError as e:
            raise ValueError(f"chat template rejected the conversation: {e}") from e


def validate_messages(messages: Sequence[Mapping[str, Any]]) -> None:
    """Raise ValueError unless every message has an allowed role and string content."""
    if not messages:
        raise ValueError("a chat needs at least one message")
    for n, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise ValueError(f"message {n} is {type(message).__name__}, expected an object")
        role = message.get("role")
        if role not in ALLOWED_ROLES:
            raise ValueError(f"message {n} has role {role!r}; allowed: {sorted(ALLOWED_ROLES)}")
        content = message.get("content")
        if not isinstance(content, str):
            raise ValueError(f"message {n} content is {type(content).__name__}, expected a string")


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


def _raise_exception(message: str) -> None:
    raise jinja2.TemplateError(message)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # jinja's own `tojson` HTML-escapes `<`, `>`, `&` and `'`, which would change the prompt.
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)
