"""JSON that clients send (HTTP bodies; the gRPC API's tools, tool-call arguments and JSON
Schemas) parsed with every way it can fail as one ValueError, which callers turn into a 400 or
INVALID_ARGUMENT.

``json.loads`` alone lets three kinds of input through as something else: nesting past
Python's recursion limit raises RecursionError; an integer past Python's 4,300-digit limit a
plain ValueError (not JSONDecodeError); and an escaped lone UTF-16 surrogate (``"\\ud800"``)
parses into a str that cannot be encoded as UTF-8 again, so protobuf, the tokenizer or
llguidance fail on it later with errors that read as the server's fault.
"""

from __future__ import annotations

import json
from typing import Any


def parse_json(text: str | bytes) -> Any:
    """``text`` parsed; ValueError saying what is wrong when it is not JSON we can use."""
    try:
        value = json.loads(text)
    except RecursionError as err:
        raise ValueError("nested too deeply") from err
    except ValueError as err:
        if type(err) is ValueError:  # not JSONDecodeError: an integer past int's digit limit
            raise ValueError("a number has more digits than the 4,300 a number may have") from err
        raise
    _refuse_lone_surrogates(value)
    return value


def _refuse_lone_surrogates(value: Any) -> None:
    # One pass in C over every string and key: encoding the whole value is the cheap way to
    # find a surrogate anywhere in it (bytes bodies decode with surrogatepass, so raw UTF-8
    # surrogate bytes get here too, not only escapes).
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except RecursionError as err:  # parsed a little less deep than it can be written
        raise ValueError("nested too deeply") from err
    except UnicodeEncodeError as err:
        raise ValueError(
            f"a string holds a lone UTF-16 surrogate ({err.object[err.start]!r}), which is "
            "not a character; send text as valid Unicode"
        ) from err
