"""`splitspec bench` against the live ecosystem stack (real default model, EAGLE drafter), and
its prompt sources and errors without one."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from splitspec import cli
from splitspec.bench_open_loop import arrival_times
from splitspec.bench_prompts import PromptError, load_prompts
from splitspec.bench_report import arm_summary
from splitspec.bench_requests import Sample
from splitspec.launcher import free_port
from tests.helpers.eco_stack import EcoStack


@pytest.mark.parametrize(
    "load, described",
    [(["--concurrency", "3"], "concurrency 3"),
     # An open loop, sampled: with the same seeds both arms emit the same tokens.
     (["--request-rate", "40", "--temperature", "0.8"], "Poisson arrivals 40/s")],
)  # fmt: skip
def test_bench_compares_speculation_on_and_off(
    eco_stack: EcoStack,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    load: list[str],
    described: str,
) -> None:
    out = tmp_path / "bench.json"
    # Prompts no earlier test sent: the prefix cache holds none of them yet.
    prompts = tmp_path / "prompts.txt"
    ask = "Name three uses of {} in a house, a workshop and a kitchen, one line each ({})."
    words = ("salt", "copper", "glass")
    prompts.write_text("".join(ask.format(w, uuid.uuid4()) + "\n" for w in words))
    address = eco_stack.stack.router_address
    args = ["bench", "--address", address, "--prompts", str(prompts), "--num-prompts", "3",
            *load, "--max-new-tokens", "16", "--no-progress", "--out", str(out)]  # fmt: skip
    assert cli.main(args) == 0
    record = json.loads(out.read_text())
    arms = record["arms"]
    assert set(arms) == {"target-only", "speculative"}
    for arm in arms.values():
        assert arm["requests"] == 3 and arm["failed"] == 0 and arm["output_tokens"] > 0
        assert arm["ttft_ms"]["p50"] > 0 and arm["output_tokens_per_s"] > 0
    assert arms["target-only"]["verify_steps"] == 0
    # Neither arm prefills for the other: each wave's prompts were cached before both ran, so
    # both arms find the same tokens cached (not only the chat template's shared system turn).
    cached: dict[int, set[int]] = {}
    for sample in record["samples"]:
        assert 0 < sample["cached_tokens"] <= sample["prompt_tokens"]
        cached.setdefault(sample["prompt_index"], set()).add(sample["cached_tokens"])
    assert all(len(counts) == 1 for counts in cached.values()), cached
    if "--request-rate" in load:  # one by one, not together
        assert max(sample["sent_s"] for sample in record["samples"]) > 0
    assert arms["speculative"]["mean_acceptance_length"] > 1.0
    comparison = record["comparison"]
    assert comparison["outputs_equal"] == comparison["outputs_compared"] == 3
    rates = {name: arm["output_tokens_per_s"] for name, arm in arms.items()}
    assert comparison["speedup"] == pytest.approx(rates["speculative"] / rates["target-only"])
    means = {name: arm["e2e_ms"]["mean"] for name, arm in arms.items()}
    assert comparison["mean_request_time_ratio"] == pytest.approx(
        means["speculative"] / means["target-only"])
    printed = capsys.readouterr().out
    assert described in printed.splitlines()[0]
    assert "outputs equal: 3/3" in printed
    assert [line.split()[0] for line in printed.splitlines()[2:4]] == ["target-only", "speculative"]


def test_a_refused_request_is_recorded_with_its_field(
    eco_stack: EcoStack, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """More new tokens than the router allows: every request fails, and its record names the
    field the refusal named (gRPC's rich error model), not only the message."""
    out = tmp_path / "bench.json"
    address = eco_stack.stack.router_address
    args = ["bench", "--address", address, "--num-prompts", "1", "--speculation", "off",
            "--max-new-tokens", "10000000", "--no-progress", "--out", str(out)]  # fmt: skip
    assert cli.main(args) == 1
    (error,) = json.loads(out.read_text())["arms"]["target-only"]["errors"]
    assert error.startswith("INVALID_ARGUMENT: max_new_tokens"), error
    assert error.endswith("(field sampling.max_new_tokens)"), error
    assert "(field sampling.max_new_tokens)" in capsys.readouterr().out


def test_open_loop_arrivals_are_poisson_and_the_same_for_every_arm() -> None:
    times = arrival_times(2000, rate=4.0, seed=7)
    assert times[0] == 0 and times == sorted(times) and times == arrival_times(2000, 4.0, 7)
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    assert sum(gaps) / len(gaps) == pytest.approx(0.25, rel=0.1)
    assert arrival_times(2000, 4.0, 8) != times


def test_a_wave_lasts_from_its_first_send_to_its_last_end() -> None:
    """An open loop's requests leave one by one: its arm's time is their span, not the
    longest request's (waves start together, so both are the same there)."""
    samples = [Sample(0, "x", sent_s=0.0, seconds=1.0, token_ids=[1] * 10),
               Sample(1, "x", sent_s=2.0, seconds=1.5, token_ids=[1] * 10)]  # fmt: skip
    assert arm_summary(samples)["seconds"] == pytest.approx(3.5)


def test_an_unreachable_router_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["bench", "--address", f"127.0.0.1:{free_port()}", "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: no router answers at 127.0.0.1:") and err.count("\n") == 1


def test_prompt_files_in_each_format(tmp_path: Path) -> None:
    (tmp_path / "p.txt").write_text("# a comment\nfirst\n\nsecond\n")
    (tmp_path / "p.json").write_text(json.dumps(["first", "second"]))
    (tmp_path / "set.json").write_text(json.dumps({"about": "x", "prompts": ["first", "second"]}))
    (tmp_path / "p.jsonl").write_text('{"prompt": "first"}\n{"prompt": "second", "id": 2}\n')
    for name in ("p.txt", "p.json", "set.json", "p.jsonl"):
        assert load_prompts(str(tmp_path / name), 3) == ["first", "second", "first"]
    builtin = load_prompts("builtin", 100)
    assert len(set(builtin)) == 40 and not any(p.startswith("#") for p in builtin)


def test_the_dataset_sources() -> None:
    """Held-out ShareGPT and HumanEval, as the draft head's evaluation reads them."""
    humaneval = load_prompts("humaneval", 3)
    assert len(set(humaneval)) == 3
    assert all(p.startswith("Complete the following Python function.") for p in humaneval)
    assert "def has_close_elements(" in humaneval[0]
    sharegpt = load_prompts("sharegpt", 3)
    assert len(set(sharegpt)) == 3 and not set(sharegpt) & set(humaneval)


@pytest.mark.parametrize(
    "name, text, message",
    [
        ("missing.txt", None, "no such file"),
        ("empty.txt", "# only a comment\n", "no prompts"),
        ("bad.json", '{"prompt": "x"}', "list of strings"),
        ("bad2.json", '{"prompts": [1, 2]}', "an object whose 'prompts' is one"),
        ("bad.jsonl", '{"prompt": "x"}\n["x"]\n', "bad.jsonl:2: not a JSON object"),
        ("bad2.jsonl", '{"text": "x"}\n', "no 'prompt' string"),
    ],
)
def test_bad_prompt_files_are_named(
    tmp_path: Path, name: str, text: str | None, message: str
) -> None:
    if text is not None:
        (tmp_path / name).write_text(text)
    with pytest.raises(PromptError, match=message):
        load_prompts(str(tmp_path / name), 1)


def test_a_bad_prompt_file_stops_before_any_call(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["bench", "--address", f"127.0.0.1:{free_port()}", "--prompts", str(tmp_path / "x.txt")]
    assert cli.main(args) == 2
    assert "x.txt: no such file" in capsys.readouterr().err
