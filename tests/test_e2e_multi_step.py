"""Multi-step decoding through the whole stack changes no output.

Two stacks on the default model, CPU: the target with ``--decode-steps 1`` (one step per
Forward) and with ``--decode-steps 4`` (the router then asks for up to 4 target-only decode
steps per Forward). The same requests go to both in the same order (so their radix caches hold
the same KV), and every stream must match item for item in tokens, text and finish: greedy and
seeded sampling, lengths that are no multiple of 4, a stop string, a stop token and EOS inside
a burst. Afterwards every slot is free or cached and the target holds no request state. A
prompt arriving while another request decodes 4 steps per Forward is served at once, and both
outputs equal their outputs alone. Greedy structured output decodes bursts without the mask,
cut where the format refuses a token (router/grammar_bursts.py), and its outputs equal one
masked step a Forward too.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from plumbing.grpc_util import CHANNEL_OPTIONS
from protos import generation_pb2 as pb
from protos import target_pb2, target_pb2_grpc
from splitspec.launcher import LocalStack
from tests.conftest import StackLauncher
from tests.helpers.prompts import chat_ids, router_tokenizer
from tests.helpers.reference import HFReference, TieCase, assert_same_greedy
from tests.helpers.rpc import Router, Stream, assert_slots_accounted, greedy

pytestmark = pytest.mark.slow

STEPS = 4
TARGET = ["--num-slots", "4096"]  # a small pool: both stacks start faster
RELEASE_WAIT_S = 5.0  # the router releases in the step that ends the request


def ask(text: str) -> tuple[int, ...]:
    return chat_ids([{"role": "user", "content": text}])


def full_length(ids: tuple[int, ...], max_new: int) -> pb.GenerateRequest:
    request = greedy(ids, max_new)
    request.sampling.ignore_eos = True  # runs to max_new_tokens: the last burst is cut short
    return request


def sampled(ids: tuple[int, ...], max_new: int, seed: int, top_k: int = 0) -> pb.GenerateRequest:
    request = full_length(ids, max_new)
    request.sampling.temperature, request.sampling.top_p = 0.8, 0.95
    request.sampling.top_k, request.sampling.seed = top_k, seed
    return request


@pytest.fixture(scope="module")
def stacks(stack_launcher: StackLauncher) -> Iterator[tuple[LocalStack, LocalStack]]:
    one = stack_launcher.start("steps-1", [*TARGET, "--decode-steps", "1"])
    four = stack_launcher.start("steps-4", [*TARGET, "--decode-steps", str(STEPS)])
    try:
        yield one, four
    finally:
        stack_launcher.stop(four)
        stack_launcher.stop(one)


@pytest.fixture(scope="module")
def routers(stacks: tuple[LocalStack, LocalStack]) -> Iterator[tuple[Router, Router]]:
    one, four = Router(stacks[0].router_address), Router(stacks[1].router_address)
    try:
        yield one, four
    finally:
        one.close()
        four.close()


def both(routers: tuple[Router, Router], request: pb.GenerateRequest) -> tuple[Stream, Stream]:
    return routers[0].generate(request), routers[1].generate(request)


def assert_same_stream(name: str, one: Stream, four: Stream) -> None:
    assert four.token_ids == one.token_ids, f"{name}: tokens differ"
    assert four.text == one.text, f"{name}: text differs"
    assert four.final.finish_reason == one.final.finish_reason, name
    assert four.final.matched_stop == one.final.matched_stop, name
    assert four.final.usage.completion_tokens == len(four.token_ids), name


def stop_string(tokens: list[int], start: int) -> str:
    """The text of the first two tokens from ``start`` on that is not only whitespace."""
    pieces = (router_tokenizer().decode(tokens[i : i + 2]).strip() for i in range(start, 14))
    return next(text for text in pieces if text)


def test_outputs_equal_one_step_decoding(routers: tuple[Router, Router]) -> None:
    assert [r.status().decode_steps for r in routers] == [1, STEPS]
    copper, rivers = ask("Name three uses of copper."), ask("Describe the river Danube.")
    plain = [
        ("greedy, 10 tokens", full_length(copper, 10)),
        ("greedy, 13 tokens", full_length(rivers, 13)),
        ("seeded, 14 tokens", sampled(ask("Write a line about foxes."), 14, seed=1234)),
        ("seeded top-k, 9 tokens", sampled(ask("Tell me about owls."), 9, seed=99, top_k=20)),
    ]
    for name, request in plain:
        one, four = both(routers, request)
        assert_same_stream(name, one, four)
        assert len(one.token_ids) == request.sampling.max_new_tokens, name
    reference = routers[0].generate(greedy(copper, 16)).token_ids
    stop_token = greedy(copper, 16)  # stops at its 7th token, inside the second burst
    stop_token.sampling.stop_token_ids.append(reference[6])
    stop_text = greedy(copper, 16)  # the text of two tokens from the 6th: inside a burst
    stop_text.sampling.stop.append(stop_string(reference, 5))
    for name, request in (("stop token", stop_token), ("stop string", stop_text)):
        one, four = both(routers, request)
        assert_same_stream(name, one, four)
        assert one.final.finish_reason == pb.FINISH_REASON_STOP, name
        assert len(one.token_ids) < 16, name
    ends = sampled(ask("Write a line about foxes."), 14, seed=1234)
    ends.sampling.ignore_eos = False  # this seed draws EOS as the 7th token, inside a burst
    # (on this model and CPU kind; if its numerics change, pick a seed that ends inside one)
    one, four = both(routers, ends)
    assert_same_stream("EOS", one, four)
    assert one.final.finish_reason == pb.FINISH_REASON_EOS, one.token_ids
    status_one, status_four = (r.wait_idle() for r in routers)
    assert status_one.multi_step_forwards == 0 and status_four.multi_step_forwards > 0
    assert_slots_accounted(status_one)
    assert_slots_accounted(status_four)


PERSON = json.dumps(
    {
        "type": "object",
        "properties": {"name": {"type": "string"}, "born": {"type": "integer"}},
        "required": ["name", "born"],
        "additionalProperties": False,  # the model writes more fields: bursts are cut
    }
)
TOOL_CALLS = Path(__file__).resolve().parents[1] / "benchmarks" / "data" / "tool_calls.json"
LOWERCASE = "[a-z ,]+\\."  # the model starts its reply with a capital: the first burst is cut


def constrained(ids: tuple[int, ...], max_new: int, **fmt: str) -> pb.GenerateRequest:
    request = greedy(ids, max_new)
    request.sampling.structured_output.CopyFrom(pb.StructuredOutput(**fmt))
    return request


def tool_call(question: str) -> pb.GenerateRequest:
    """The chat API's request for a call of one of the benchmark's two tools (tool_choice
    required: the call's markup and the function's name forced), greedy, without the forced
    tokens verified as chains, so bursts run through the name; 24 tokens: the call's start."""
    from router.openai_api.protocol import parse_chat

    tools = json.loads(TOOL_CALLS.read_text())["tools"]
    chat = {"messages": [{"role": "user", "content": question}], "tools": tools,
            "tool_choice": "required", "parallel_tool_calls": False}  # fmt: skip
    request = parse_chat(chat).generate
    request.sampling.temperature, request.sampling.max_new_tokens = 0.0, 24
    request.speculation.forced_drafts = False
    return request


def test_structured_output_bursts_change_no_output(routers: tuple[Router, Router]) -> None:
    """The same constrained greedy streams as one masked step a Forward, with bursts run and
    some cut (the regex refuses the model's own first token, and others later; in the tool
    call the model splits the forced "convert_currency" as "con", "ver", "t", which the mask
    refuses after "con")."""
    before = [r.wait_idle() for r in routers]
    person = ask("Ada Lovelace was born in 1815 in London. Give her name and birth year as JSON.")
    cases = [
        ("schema", constrained(person, 40, json_schema=PERSON)),
        ("regex", constrained(ask("Name three uses of copper."), 24, regex=LOWERCASE)),
        ("tool call", tool_call("What's the temperature in Sydney in celsius?")),
    ]
    for name, request in cases:
        one, four = both(routers, request)
        assert_same_stream(name, one, four)
        if one.final.finish_reason == pb.FINISH_REASON_EOS:
            assert name != "schema" or set(json.loads(one.text)) == {"name", "born"}, one.text
            assert name != "regex" or re.fullmatch(LOWERCASE, one.text), one.text
    after = [r.wait_idle() for r in routers]
    bursts, cut = (after[1].grammar_bursts - before[1].grammar_bursts,
                   after[1].grammar_bursts_cut - before[1].grammar_bursts_cut)  # fmt: skip
    assert bursts > cut > 0, (bursts, cut)
    assert after[0].grammar_bursts == 0, "one step a Forward ran a burst"
    for status in after:
        assert_slots_accounted(status)


def held_on_target(stub: target_pb2_grpc.TargetModelStub, request_id: str) -> bool:
    """Whether the target holds state under ``request_id``, asked without changing it: a read
    of no hidden rows answers NOT_FOUND for an id it does not hold."""
    read = target_pb2.ReadHiddenRequest(request_id=request_id, start_pos=0, end_pos=0)
    try:
        list(stub.ReadHidden(read, timeout=10))
    except grpc.RpcError as err:
        if err.code() == grpc.StatusCode.NOT_FOUND:
            return False
        raise
    return True


def test_the_target_holds_no_request_after_multi_step_decoding(
    stacks: tuple[LocalStack, LocalStack], routers: tuple[Router, Router]
) -> None:
    """The router sends the Release after the stream has ended and after it stops counting
    the request as running, so the target may still hold it a moment after the router reads
    idle (a Release from here then found it: CI on the 2-core box, 2026-12-06): it must be
    gone within RELEASE_WAIT_S."""
    request = greedy(ask("Count from one to ten."), 11, request_id="ms-release-probe")
    stream = routers[1].generate(request)
    assert any(len(b) > 1 for b in stream.blocks), "no multi-step burst"
    assert_slots_accounted(routers[1].wait_idle())
    with grpc.insecure_channel(stacks[1].target_address, options=CHANNEL_OPTIONS) as channel:
        stub = target_pb2_grpc.TargetModelStub(channel)
        deadline = time.monotonic() + RELEASE_WAIT_S
        while held_on_target(stub, request.request_id) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not held_on_target(stub, request.request_id), (
            f"the router left the request's state on the target for {RELEASE_WAIT_S} s"
        )


def test_bad_multi_step_forwards_are_refused(stacks: tuple[LocalStack, LocalStack]) -> None:
    """Refused before any state changes, so the router's slots are never touched."""
    greedy_config = target_pb2.SamplingConfig(temperature=0.0, top_p=1.0)
    penalised = target_pb2.SamplingConfig(temperature=0.0, top_p=1.0, presence_penalty=0.5)
    cases = [
        (STEPS + 1, [5], greedy_config, "exceeds the target's max_decode_steps 4"),
        (2, [5, 6], greedy_config, "needs one token with sample = true"),
        (3, [5], penalised, "penalties and logit_bias need decode_steps 1"),
    ]
    with grpc.insecure_channel(stacks[1].target_address, options=CHANNEL_OPTIONS) as channel:
        stub = target_pb2_grpc.TargetModelStub(channel)
        assert stub.GetInfo(target_pb2.GetInfoRequest()).max_decode_steps == STEPS
        for steps, tokens, config, message in cases:
            item = target_pb2.ForwardItem(
                request_id="ms-bad", token_ids=tokens, start_pos=0, new_slots=list(range(8)),
                sample=True, sampling=config,
            )  # fmt: skip
            with pytest.raises(grpc.RpcError) as err:
                stub.Forward(target_pb2.ForwardRequest(items=[item], decode_steps=steps))
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert message in err.value.details()


class Timed(threading.Thread):
    """One Generate stream on its own thread, each item's arrival time kept."""

    def __init__(self, router: Router, request: pb.GenerateRequest) -> None:
        super().__init__(daemon=True)
        self.router, self.request = router, request
        self.stream = Stream()
        self.times: list[float] = []
        self.first_burst = threading.Event()  # an item of more than one token arrived

    def run(self) -> None:
        for item in self.router.stub.Generate(self.request, timeout=120):
            self.stream.items.append(item)
            self.times.append(time.monotonic())
            if len(item.token_ids) > 1:
                self.first_burst.set()
        self.first_burst.set()


def test_a_prompt_arriving_during_multi_step_decoding(
    routers: tuple[Router, Router], hf: HFReference, tie_cases: list[TieCase]
) -> None:
    long_one = full_length(ask("Explain how a steam engine works."), 48)
    late = full_length(ask("What is the capital of Peru?"), 12)
    first = Timed(routers[1], long_one)
    first.start()
    assert first.first_burst.wait(60)
    second = Timed(routers[1], late)
    second.start()
    first.join(120)
    second.join(120)
    assert second.times[0] < first.times[-1], "the late prompt waited for the long request"
    arrived = zip(first.stream.items, first.times, strict=True)
    bursts_after = [len(item.token_ids) for item, t in arrived if t > second.times[0]]
    assert max(bursts_after, default=0) > 1, "no multi-step decoding beside the late request"
    for name, request, together in (("long", long_one, first), ("late", late, second)):
        alone = routers[0].generate(request)  # one step per Forward, alone
        prompt = list(request.input_ids.ids)
        gap = hf.gap_after(prompt, alone.token_ids)
        name = f"multi-step beside another ({name})"
        assert_same_greedy(name, together.stream.token_ids, alone.token_ids, gap, tie_cases)
    assert_slots_accounted(routers[1].wait_idle())
