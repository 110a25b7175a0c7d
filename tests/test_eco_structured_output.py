"""Structured output end to end (real target, EAGLE replica and router; router and target
sides in router/structured_output.py and target_service/token_masks.py): JSON Schema, regex
and choice outputs follow their format, speculation gives exactly what target-only gives
(greedy), sampled outputs follow it too, and both APIs refuse bad formats with the reason."""

from __future__ import annotations

import json
import re

import grpc
import openai
import pytest

from protos import generation_pb2 as pb
from tests.helpers.eco_stack import EcoStack

pytestmark = pytest.mark.slow
MAX_NEW = 64
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer"},
        "colours": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "maxItems": 3},
    },
    "required": ["name", "age", "colours"],
    "additionalProperties": False,
}
ASK = "Describe Ada, who is 36 and likes red, as JSON."


def request(
    speculate: bool, text: str = ASK, forced_drafts: bool = True, **fmt
) -> pb.GenerateRequest:
    req = pb.GenerateRequest()
    req.messages.items.append(pb.ChatMessage(role="user", content=text))
    req.sampling.max_new_tokens = MAX_NEW
    req.sampling.temperature = 0.0
    req.sampling.structured_output.CopyFrom(pb.StructuredOutput(**fmt))
    req.speculation.enabled = speculate
    req.speculation.forced_drafts = forced_drafts
    return req


def check_person(text: str) -> None:
    value = json.loads(text)
    assert set(value) == {"name", "age", "colours"}, value
    assert isinstance(value["name"], str) and len(value["name"]) <= 20
    assert isinstance(value["age"], int) and not isinstance(value["age"], bool)
    assert set(value["colours"]) <= {"red", "green", "blue"} and len(value["colours"]) <= 3


@pytest.fixture(scope="module")
def person_runs(eco_stack: EcoStack) -> dict:
    """Target-only, and speculation with and without the format's forced drafts."""
    schema = json.dumps(PERSON)
    runs = {s: eco_stack.router.generate(request(s, json_schema=schema)) for s in (True, False)}
    runs["unforced"] = eco_stack.router.generate(request(True, forced_drafts=False,
                                                         json_schema=schema))  # fmt: skip
    return runs


def test_json_schema_output_parses_and_conforms(person_runs: dict) -> None:
    stream = person_runs[False]
    assert stream.final.finish_reason == pb.FINISH_REASON_EOS, stream.text
    check_person(stream.text)


def test_speculation_gives_what_target_only_gives(person_runs: dict) -> None:
    """With the schema's forced keys in the trees or without (router/grammar_tree.py)."""
    forced = person_runs[True].final.speculation
    unforced = person_runs["unforced"].final.speculation
    assert person_runs[True].token_ids == person_runs[False].token_ids
    assert person_runs["unforced"].token_ids == person_runs[False].token_ids
    assert forced.verify_steps > 0 and unforced.verify_steps > 0, "speculation did not run"
    assert forced.forced_tokens > 0 and unforced.forced_tokens == 0, (forced, unforced)


def test_target_only_chains_of_forced_tokens_change_nothing(eco_stack: EcoStack) -> None:
    """A regex that forces "Answer: " and ". Sure: ": target-only steps verify them as chains
    (router/forced_steps.py) and give the tokens the plain Forwards give."""
    regex = r"Answer: (yes|no)\. Sure: [0-9]"
    text = "Is the sky blue? Say how sure you are, 0 to 9."
    chained, plain = (
        eco_stack.router.generate(request(False, text, forced_drafts=forced, regex=regex))
        for forced in (True, False)
    )
    assert re.fullmatch(regex, chained.text), chained.text
    assert chained.token_ids == plain.token_ids
    stats = chained.final.speculation
    assert stats.forced_tokens >= 4 and stats.accepted_tokens == stats.forced_tokens, stats
    assert not plain.final.HasField("speculation")


def test_regex_and_choice_outputs_match(eco_stack: EcoStack) -> None:
    date = r"\d{4}-\d{2}-\d{2}"
    stream = eco_stack.router.generate(
        request(True, "When did the first person walk on the moon?", regex=date)
    )
    assert re.fullmatch(date, stream.text), stream.text
    choices = ["positive", "negative", "neutral"]
    stream = eco_stack.router.generate(
        request(True, "Sentiment of: 'I love this film!'", choice=pb.Choices(values=choices))
    )
    assert stream.text in choices


def test_sampled_outputs_conform_too(eco_stack: EcoStack) -> None:
    reqs = []
    for seed in range(3):
        req = request(True, json_schema=json.dumps(PERSON))
        req.sampling.temperature = 1.0
        req.sampling.seed = seed
        reqs.append(req)
    for stream in eco_stack.router.generate_many(reqs):
        if stream.final.finish_reason == pb.FINISH_REASON_EOS:  # a length cut is cut JSON
            check_person(stream.text)


@pytest.mark.parametrize(
    ("fmt", "message"),
    [({"json_schema": '{"type": "strin"}'}, "structured_output.json_schema: "),
     ({"regex": "(("}, "structured_output.regex: ")],
)  # fmt: skip
def test_bad_formats_are_refused(eco_stack: EcoStack, fmt: dict, message: str) -> None:
    with pytest.raises(grpc.RpcError) as err:
        eco_stack.router.generate(request(False, **fmt))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert message in err.value.details()


def test_http_takes_openais_and_vllms_spellings(eco_stack: EcoStack, person_runs: dict) -> None:
    client = openai.OpenAI(base_url=eco_stack.base_url + "/v1", api_key="x", max_retries=0)
    messages = [{"role": "user", "content": ASK}]
    reply = client.chat.completions.create(
        model=eco_stack.model_name, messages=messages, max_tokens=MAX_NEW, temperature=0,
        response_format={"type": "json_schema",
                         "json_schema": {"name": "person", "schema": PERSON}},
    )  # fmt: skip
    assert reply.choices[0].message.content == person_runs[False].text
    reply = client.chat.completions.create(
        model=eco_stack.model_name, messages=messages, max_tokens=4 * MAX_NEW, temperature=0,
        response_format={"type": "json_object"},
    )  # fmt: skip
    assert reply.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(reply.choices[0].message.content), dict)
    reply = client.completions.create(
        model=eco_stack.model_name, prompt="Is the sky blue? Answer:", max_tokens=8,
        temperature=0, extra_body={"guided_choice": [" yes", " no"]},
    )  # fmt: skip
    assert reply.choices[0].text in (" yes", " no")


@pytest.mark.parametrize(
    ("extra", "param"),
    [({"response_format": {"type": "xml"}}, "response_format"),
     ({"response_format": {"type": "json_schema", "json_schema": {}}}, "response_format"),
     ({"guided_regex": 5}, "guided_regex"),
     ({"guided_json": {"type": "object"}, "guided_regex": "a"}, "guided_regex"),
     ({"structured_outputs": {"xml": "x"}}, "structured_outputs")],
)  # fmt: skip
def test_http_refuses_bad_formats(eco_stack: EcoStack, extra: dict, param: str) -> None:
    status, body = eco_stack.post(
        "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], **extra}
    )
    assert status == 400 and body["error"]["param"] == param, body
    status, body = eco_stack.post("/v1/chat/completions", {
        "messages": [{"role": "user", "content": "hi"}], "guided_regex": "(("})  # fmt: skip
    assert status == 400 and "structured_output.regex" in body["error"]["message"], body
