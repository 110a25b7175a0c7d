"""The reliability suite: load, faults, hostile input, overload and abort storms against one
stack of real processes on loopback (default model, two EAGLE replicas, an API key), bounded in
time and count. Prints one table and saves JSON.

    python -m benchmarks.reliability            # 50 streams (--streams N); ~15 min on 2 busy cores
    python -m benchmarks.reliability --quick    # 300 hostile cases, shorter replies (~5 min)

Phases, in order: target-only reference outputs; a steady load of greedy streams while replica
A is SIGKILLed and restarted and replica B is SIGSTOPped for 5 s; a burst of 10x the queue;
hostile requests (hypothesis); an abort storm; the target SIGKILLed mid-stream and restarted;
then the leak checks (router slots; target and replica request tables, by releasing every id
used: nothing may still be held). It reuses the test helpers (tests/helpers), so run it from
the repository root.
"""

from __future__ import annotations

import argparse
import os
import signal
import tempfile
import time
from collections import Counter
from pathlib import Path

import grpc
from hypothesis import HealthCheck, given, settings

from benchmarks.reliability_report import table, write_report
from benchmarks.reliability_stack import suite_stack
from benchmarks.run_record import REPO_ROOT
from protos import draft_pb2, draft_pb2_grpc, generation_pb2_grpc, target_pb2, target_pb2_grpc
from protos import generation_pb2 as pb
from tests.helpers import hostile, overload
from tests.helpers.load import SteadyLoad, median, step_gaps

STREAMS = 50  # the concurrent greedy streams through the draft faults
BASELINE_S = 15.0  # steady load before the SIGSTOP: 50 streams on 2 cores step slowly
PROMPTS = [
    "Write a haiku about gRPC.", "Explain speculative decoding in two sentences.",
    "List three prime numbers.", "What is a radix tree?", "Say hello in French.",
    "Give me a short story about a robot.", "How do bees make honey?", "Define entropy.",
]


class Suite:
    def __init__(self, quick: bool, log_dir: Path, streams: int = STREAMS) -> None:
        self.quick = quick
        # All streams run and speculate at once; the queue holds as many (a burst is 10x it).
        self.max_running = self.max_queue = streams
        self.key = os.urandom(16).hex()
        self.meta = [("authorization", f"Bearer {self.key}")]
        self.stack = suite_stack(log_dir, streams, self.key)
        self.ids: set[str] = set()
        self.figures: dict = {}
        self.counter = 0

    def request(self, i: int, max_new: int, speculate: bool = True) -> pb.GenerateRequest:
        self.counter += 1
        rid = f"rel-{self.counter}"
        self.ids.add(rid)
        req = pb.GenerateRequest(text=PROMPTS[i % len(PROMPTS)], request_id=rid)
        req.sampling.max_new_tokens = max_new
        req.sampling.temperature = 0.0
        req.sampling.ignore_eos = True
        req.speculation.enabled = speculate
        return req

    def stub(self, channel: grpc.Channel):
        return generation_pb2_grpc.GenerationStub(channel)

    def run_batch(self, reqs: list[pb.GenerateRequest]) -> list[list[int]]:
        with grpc.insecure_channel(self.stack.router_address) as ch:
            out = []
            for s in range(0, len(reqs), self.max_running):
                calls = [self.stub(ch).Generate(r, timeout=300, metadata=self.meta)
                         for r in reqs[s:s + self.max_running]]
                out += [[t for item in c for t in item.token_ids] for c in calls]
            return out

    def status(self) -> pb.ServerStatus:
        with grpc.insecure_channel(self.stack.router_address) as ch:
            return self.stub(ch).GetServerStatus(pb.GetServerStatusRequest(), timeout=10,
                                                 metadata=self.meta)

    # ---- phases ----------------------------------------------------------------------------

    def draft_faults(self, reference: list[list[int]], max_new: int) -> None:
        n = 400  # more than the faults take: stopping the load lets running streams end
        load = SteadyLoad(self.stack.router_address,
                          [self.request(i, max_new) for i in range(n)], self.max_running,
                          timeout_s=300, metadata=self.meta).start()
        try:
            time.sleep(8)
            self.stack.drafts[0].kill()
            time.sleep(1)
            self.stack.drafts[0].start()
            self.stack.wait_drafts_serving(120)
            self._wait_both_replicas_busy(120)
            time.sleep(BASELINE_S)  # steady steps again: the baseline of the stall check
            pid = self.stack.drafts[1].started.pid
            stopped = time.monotonic()
            os.kill(pid, signal.SIGSTOP)
            time.sleep(5)
            os.kill(pid, signal.SIGCONT)
            resumed = time.monotonic()
            time.sleep(2)
        finally:
            records = load.stop(300)
        failed = sum(bool(r.error) or not r.done for r in records)
        wrong = sum(r.tokens != reference[r.prompt_index % len(PROMPTS)] for r in records
                    if not r.error)
        before = step_gaps(records, stopped - BASELINE_S + 2, stopped)
        during = step_gaps(records, stopped, resumed)
        self.figures["draft_faults"] = {
            "streams": len(records), "concurrency": self.max_running,
            "tokens": sum(len(r.tokens) for r in records), "failed": failed,
            "changed_outputs": wrong, "median_step_before_ms": median(before) * 1e3,
            "worst_step_while_stopped_ms": max(during, default=0) * 1e3,
            "steps_before": len(before), "steps_while_stopped": len(during),
        }

    def _wait_both_replicas_busy(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            replicas = self.status().draft_replicas
            if all(r.healthy and r.num_requests for r in replicas):
                return
            time.sleep(0.1)
        raise TimeoutError("the restarted replica got no requests")

    def burst(self, reference: list[list[int]]) -> None:
        n = 10 * self.max_queue
        results = overload.burst(self.stack.router_address,
                                 [self.request(i, 16) for i in range(n)], self.meta)
        codes = Counter(code for code, *_ in results)
        refused = [t for code, _, t, _ in results if code == "RESOURCE_EXHAUSTED"]
        ok = [(i, tokens) for i, (code, tokens, _, _) in enumerate(results) if code == "OK"]
        self.figures["burst"] = {
            "sent": n, "admitted": codes["OK"], "refused": len(refused),
            "other_status": n - codes["OK"] - len(refused),
            "slowest_refusal_ms": max(refused, default=0) * 1e3,
            "median_refusal_ms": median(refused) * 1e3 if refused else 0.0,
            "admitted_wrong": sum(t != reference[i % len(PROMPTS)][:16] for i, t in ok),
        }

    def hostile(self) -> None:
        count = 300 if self.quick else 1000
        outcomes: Counter[str] = Counter()
        wrong: list[str] = []
        channel = grpc.insecure_channel(self.stack.router_address)

        def holder() -> tuple[str, pb.GenerateRequest]:
            req = self.request(0, 1000)
            return req.request_id, req

        @settings(max_examples=count, deadline=None, database=None, derandomize=True,
                  suppress_health_check=list(HealthCheck))
        @given(case=hostile.hostile_case())
        def run(case: hostile.Case) -> None:
            err = overload.send_hostile(channel, case, self.meta, holder)
            code = "OK" if err is None else err.code().name
            outcomes[code] += 1
            if err is None or err.code() not in case.allowed or not err.details():
                wrong.append(f"{case.defect}: {code}")

        try:
            run()
        finally:
            channel.close()
        self.figures["hostile"] = {"tried": sum(outcomes.values()), "by_status": dict(outcomes),
                                   "wrong_answers": len(wrong), "examples_wrong": wrong[:5]}

    def abort_storm(self) -> None:
        reqs = [self.request(i, 8 + i % 120) for i in range(300)]
        # Fewer at once than the queue holds: the storm is of aborts, not of refusals.
        endings = overload.storm(self.stack.router_address, reqs, self.meta,
                                 self.max_queue // 2)
        unexpected = sum(n for e, n in endings.items() if e not in overload.STORM_ENDINGS)
        self.figures["abort_storm"] = {"requests": 300, "endings": dict(endings),
                                       "unexpected": unexpected}

    def target_loss(self, reference: list[list[int]], max_new: int) -> None:
        load = SteadyLoad(self.stack.router_address,
                          [self.request(i, 400) for i in range(self.max_running)],
                          self.max_running,
                          timeout_s=60, metadata=self.meta).start()
        time.sleep(6)
        killed = time.monotonic()
        self.stack.target.kill()
        records = load.stop(120)
        ended_s = max(r.ended for r in records) - killed
        self.stack.target.start()
        self.stack.target.wait_healthy(300)
        started = time.monotonic()
        again = None
        while time.monotonic() - started < 60:
            try:
                again = self.run_batch([self.request(i, max_new, False) for i in range(4)])
                break
            except grpc.RpcError:
                time.sleep(0.25)
        self.figures["target_loss"] = {
            "in_flight": len(records),
            "ended_unavailable": sum(r.error.startswith("UNAVAILABLE") for r in records),
            "ended_within_s": ended_s, "serving_again_after_s": time.monotonic() - started,
            "outputs_after_equal": again == reference[:4],
        }

    def leaks(self) -> None:
        deadline = time.monotonic() + 60
        status = self.status()
        while (status.num_running or status.num_waiting) and time.monotonic() < deadline:
            time.sleep(0.1)
            status = self.status()
        ids = sorted(self.ids)
        held = {}
        with grpc.insecure_channel(self.stack.target_address) as ch:
            held["target"] = target_pb2_grpc.TargetModelStub(ch).Release(
                target_pb2.ReleaseRequest(request_ids=ids), timeout=30).num_released
        for i, d in enumerate(self.stack.drafts):
            with grpc.insecure_channel(d.address) as ch:
                held[f"draft-{i}"] = draft_pb2_grpc.DraftModelStub(ch).Release(
                    draft_pb2.ReleaseRequest(request_ids=ids), timeout=30).num_released
        self.figures["leaks"] = {
            "router_slots_leaked": status.num_total_slots - status.num_free_slots
            - status.num_cached_tokens,
            "router_running": status.num_running, "router_waiting": status.num_waiting,
            "requests_still_held": held,
            "processes_alive": all(s.started.poll() is None for s in self.stack.services()),
        }

    def run(self) -> dict:
        max_new = 24 if self.quick else 48
        self.stack.start(timeout_s=600)
        try:
            reference = self.run_batch([self.request(i, max_new, False)
                                        for i in range(len(PROMPTS))])
            started = time.monotonic()
            self.draft_faults(reference, max_new)
            self.burst(reference)
            self.hostile()
            self.abort_storm()
            self.target_loss(reference, max_new)
            self.leaks()
            self.figures["wall_s"] = time.monotonic() - started
        finally:
            self.stack.stop()
        return self.figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--streams", type=int, default=STREAMS,
                        help="concurrent greedy streams through the draft faults (and the "
                        "router's running batch and queue)")
    parser.add_argument("--out", type=Path,
                        default=REPO_ROOT / "benchmarks" / "results" / "reliability_cpu.json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="splitspec-reliability-") as tmp:
        figures = Suite(args.quick, Path(tmp), args.streams).run()
    print(table(figures))
    write_report(args.out, args.quick, figures)
    print(f"saved {args.out}")


if __name__ == "__main__":
    main()
