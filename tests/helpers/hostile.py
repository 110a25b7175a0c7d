"""Hostile GenerateRequests for hypothesis: each has at least one defect by construction, so
every one of them must be refused (and with which status), whatever the rest holds.

A case is (raw bytes of the request, API key to send, the statuses allowed). Defects that a
protobuf object cannot hold (invalid UTF-8, truncated or mistyped fields) are written as raw
wire bytes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import grpc
from hypothesis import strategies as st

from protos import generation_pb2 as pb

VOCAB = 49152
MAX_PROMPT_TOKENS = 512  # the test stack's --max-prompt-tokens
MAX_REQUEST_BYTES = 65536  # its --max-request-bytes
MAX_NEW_LIMIT = 4096
INVALID = grpc.StatusCode.INVALID_ARGUMENT
EXHAUSTED = grpc.StatusCode.RESOURCE_EXHAUSTED


@dataclass(frozen=True)
class Case:
    defect: str
    raw: bytes
    wrong_key: bool = False
    duplicate: bool = False  # the request id of an in-flight request is filled in at send time
    allowed: tuple[grpc.StatusCode, ...] = (INVALID,)


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def field_bytes(number: int, payload: bytes) -> bytes:
    """A length-delimited field (strings, nested messages)."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


# ---- random (possibly valid) parts ---------------------------------------------------------

ids = st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=40)
floats = st.floats(allow_nan=True, allow_infinity=True, width=32)


@st.composite
def base_request(draw) -> pb.GenerateRequest:
    req = pb.GenerateRequest(request_id=draw(st.sampled_from(["", "h-" + str(draw(st.uuids()))])))
    kind = draw(st.sampled_from(["text", "ids", "messages"]))
    if kind == "text":
        req.text = draw(st.text(min_size=1, max_size=64))
    elif kind == "ids":
        req.input_ids.ids.extend(draw(ids))
    else:
        role = draw(st.sampled_from(["user", "system", "assistant"]))
        req.messages.items.add(role=role, content=draw(st.text(max_size=32)))
    s = req.sampling
    if draw(st.booleans()):
        s.max_new_tokens = draw(st.integers(1, 4))
    s.temperature = draw(st.sampled_from([0.0, 0.5, 1.0]))
    s.stop.extend(draw(st.lists(st.text(min_size=1, max_size=8), max_size=3)))
    req.speculation.enabled = draw(st.booleans())
    return req


# ---- defects -------------------------------------------------------------------------------


def _set_defect(draw, req: pb.GenerateRequest) -> str:
    """Makes ``req`` invalid in one of the ways a protobuf object can be; returns which."""
    s = req.sampling
    defect = draw(st.sampled_from(sorted(_OBJECT_DEFECTS)))
    _OBJECT_DEFECTS[defect](draw, req, s)
    return defect


def _no_input(draw, req, s):
    req.ClearField("input")


def _oov_ids(draw, req, s):
    req.input_ids.ids[:] = draw(ids) + [draw(st.one_of(
        st.integers(-(2**63), -1), st.integers(VOCAB, 2**63 - 1)))]


def _bad_temperature(draw, req, s):
    s.temperature = draw(st.one_of(st.floats(max_value=-0.5, width=32),
                                   st.just(math.nan), st.just(math.inf)))


def _bad_top_p(draw, req, s):
    s.top_p = draw(st.one_of(st.floats(max_value=0.0, width=32),
                             st.floats(min_value=1.5, width=32), st.just(math.nan)))


def _bad_top_k(draw, req, s):
    s.top_k = draw(st.integers(-(2**31), -1))


def _bad_max_new(draw, req, s):
    s.max_new_tokens = draw(st.one_of(st.just(0), st.integers(MAX_NEW_LIMIT + 1, 2**32 - 1)))


def _bad_stop(draw, req, s):
    choice = draw(st.sampled_from(["many", "empty", "long"]))
    if choice == "many":
        s.stop[:] = draw(st.lists(st.text(min_size=1, max_size=4), min_size=17, max_size=400))
    elif choice == "empty":
        s.stop.append("")
    else:
        s.stop.append("x" * draw(st.integers(257, 4000)))


def _bad_stop_ids(draw, req, s):
    choice = draw(st.booleans())
    if choice:
        s.stop_token_ids.append(draw(st.one_of(st.integers(-(2**63), -1),
                                               st.integers(VOCAB, 2**63 - 1))))
    else:
        s.stop_token_ids[:] = draw(st.lists(st.integers(0, VOCAB - 1), min_size=65,
                                            max_size=300))


def _long_prompt(draw, req, s):
    req.input_ids.ids[:] = [draw(st.integers(0, VOCAB - 1))] * draw(
        st.integers(MAX_PROMPT_TOKENS + 1, 4000))


def _empty_messages(draw, req, s):
    req.messages.SetInParent()
    del req.messages.items[:]


def _bad_request_id(draw, req, s):
    req.request_id = draw(st.one_of(st.text(min_size=129, max_size=300),
                                    st.just("bad\nid"), st.just("\x00")))


_OBJECT_DEFECTS = {
    "no-input": _no_input, "oov-input-ids": _oov_ids, "temperature": _bad_temperature,
    "top-p": _bad_top_p, "top-k": _bad_top_k, "max-new-tokens": _bad_max_new,
    "stop-strings": _bad_stop, "stop-token-ids": _bad_stop_ids, "long-prompt": _long_prompt,
    "empty-messages": _empty_messages, "request-id": _bad_request_id,
}

_BAD_UTF8 = st.sampled_from([b"\xff", b"\xc3\x28", b"\xe2\x82", b"\xed\xa0\x80", b"ok\x80"])


@st.composite
def hostile_case(draw) -> Case:
    req = draw(base_request())
    kind = draw(st.sampled_from(["object"] * 6 + ["utf8", "truncated", "oversized", "key",
                                                   "duplicate"]))
    if kind == "object":
        defect = _set_defect(draw, req)
        return Case(defect, req.SerializeToString())
    if kind == "utf8":
        where = draw(st.sampled_from(["text", "request_id", "stop"]))
        bad = draw(_BAD_UTF8)
        req.ClearField("request_id")
        if where == "text":
            raw = req.SerializeToString() + field_bytes(1, bad)
        elif where == "request_id":
            raw = req.SerializeToString() + field_bytes(4, bad)
        else:
            raw = req.SerializeToString() + field_bytes(5, field_bytes(6, bad))
        return Case(f"utf8-{where}", raw)
    if kind == "truncated":
        # A field that announces more bytes than the message has left.
        return Case("truncated", req.SerializeToString() + field_bytes(3, b"\x08\x05")[:-1])
    if kind == "oversized":
        size = draw(st.integers(MAX_REQUEST_BYTES + 1, 4 * MAX_REQUEST_BYTES))
        req.text = "a" * size
        return Case("oversized", req.SerializeToString(), allowed=(EXHAUSTED,))
    if kind == "key":
        return Case("wrong-key", req.SerializeToString(), wrong_key=True,
                    allowed=(grpc.StatusCode.UNAUTHENTICATED,))
    req.request_id = ""  # filled with the in-flight request's id when sent
    req.ClearField("input")
    req.input_ids.ids.extend([1, 2, 3])
    req.sampling.max_new_tokens = 2
    req.sampling.temperature = 0.0
    return Case("duplicate", req.SerializeToString(), duplicate=True,
                allowed=(grpc.StatusCode.ALREADY_EXISTS,))
