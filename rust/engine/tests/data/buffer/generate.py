"""The Python reference's answers for the engine's trace buffer (``rust/engine/src/buffer.rs``):
seeded random workloads run on ``TraceAssembler`` (``otel_llm/processor/tail_sampling/assembler.py``),
each operation written with everything the buffer handed on during it (each ``consume_batch`` call
of the next stage, in order: reason, late, trace, spans and which copy of each, the prior decision)
and its state after it (pending traces and spans, counters, held traces, lag, the decision cache).
As ``tests/unit/tail_sampling/test_native_buffer.py`` varies them: spans come from three senders
(the ``service.name`` a held call counts against), calls in flight are held under a bound per
sender (``max_open_calls_per_sender``) or none, and in some runs many spans have a parent that never
arrives (a CLIENT one is a call in flight); ``overdue`` is asked what the intake log would carry.
``rust/engine/tests/buffer_python.rs`` replays the operations on ``TraceBuffer`` and must get the same;
``tests/unit/tail_sampling/test_engine_buffer_reference.py`` fails while this file is stale.

The next stage decides each trace it is handed (not late) whose id's byte sum is not a multiple of 3
(kept when even), remembering the engine spans it holds as measured, as the decision stage does;
the others stay undecided, so their later spans wait parked until their id completes again.

Regenerate (from the repository's root; the Python buffer, not the compiled core's):

    OTEL_LLM_CORE=python PYTHONPATH=. .venv/bin/python rust/engine/tests/data/buffer/generate.py
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path
from typing import Any

from opentelemetry.proto.common.v1.common_pb2 import InstrumentationScope
from opentelemetry.proto.resource.v1.resource_pb2 import Resource

from otel_llm.pdata.observation import EngineObservation
from otel_llm.pdata.spans import MAX_ANCESTRY, BufferedSpan, Origin, PendingTrace
from otel_llm.pdata.traces import CompletedTrace, Decision, Remembered
from otel_llm.processor.tail_sampling.assembler import AssemblySettings, TraceAssembler

OUT = Path(__file__).with_name("workloads.json")
SENDERS = ("svc", "app-a", "app-b")
ORIGINS = [Origin(Resource(), InstrumentationScope(), name, {}) for name in SENDERS]
CLIENT, SERVER, INTERNAL = 3, 2, 1
SEEDS = 160
BULK_SEEDS = 6  # traces by the hundred: completions past COMPLETION_BATCH in one call
HELD_SEEDS = 40  # many calls in flight held, from the three senders, in a buffer that fills up


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def number(span_id: bytes) -> int:
    return int.from_bytes(span_id, "big")


class Run:
    """One workload: the buffer, its next stage, and what is written of it."""

    def __init__(self, seed: int, bulk: bool = False, held: bool = False) -> None:
        self.rng = rng = random.Random(seed)
        self.bulk = bulk
        self.held = held
        if bulk:
            self.settings = AssemblySettings(
                decision_wait_s=rng.choice((1.0, 3.0)), grace_s=rng.choice((0.0, 0.5)),
                max_open_call_wait_s=rng.choice((0.0, 6.0)), max_open_calls_per_sender=rng.choice((0, 10, 40)),
                max_traces=rng.randint(200, 700), max_spans_per_trace=rng.randint(2, 30),
                decided_cache_size=rng.randint(20, 600))
        elif held:
            self.settings = AssemblySettings(
                decision_wait_s=rng.choice((1.0, 3.0)), grace_s=rng.choice((0.0, 0.5, 1.0)),
                max_open_call_wait_s=rng.choice((6.0, 20.0)), max_open_calls_per_sender=rng.choice((0, 1, 2, 4)),
                max_traces=rng.randint(6, 30), max_spans_per_trace=rng.randint(2, 30),
                decided_cache_size=rng.randint(0, 8))
        else:
            self.settings = AssemblySettings(
                decision_wait_s=rng.choice((1.0, 3.0)), grace_s=rng.choice((0.0, 0.5, 1.0)),
                max_open_call_wait_s=rng.choice((0.0, 0.0, 6.0, 6.0)),
                max_open_calls_per_sender=rng.choice((0, 1, 2, 4)), max_traces=rng.randint(1, 12),
                max_spans_per_trace=rng.randint(2, 30), decided_cache_size=rng.randint(0, 8))
        # How many spans have a parent that never arrives (a CLIENT one is a call in flight).
        self.open_calls = 0.4 if held else rng.choice((0.05, 0.05, 0.4))
        self.clock = Clock()
        self.buffer = TraceAssembler(self.settings, self, clock=self.clock)
        self.traces: list[str] = []  # every trace id, hex, in the order first made
        self.index: dict[bytes, int] = {}
        self.copies = 0
        self.handed: list[list[Any]] = []  # the consume_batch calls of the current operation
        self.sent: list[BufferedSpan] = []
        self.ids = self.trace_ids()

    # --- the next stage ---

    def consume_batch(self, batch: list[CompletedTrace]) -> None:
        seen = []
        decided = []
        for completed in batch:
            trace = completed.trace
            prior = completed.prior
            seen.append([
                completed.reason, completed.late, self.index[trace.trace_id],
                [[number(key), span.start_unix_ns] for key, span in trace.spans.items()],
                None if prior is None else [prior.decision.keep, prior.decision.policy,
                                            sorted(number(m) for m in prior.measured), prior.taken],
            ])
            if not completed.late and sum(trace.trace_id) % 3:
                measured = {key for key, span in trace.spans.items() if span.is_engine}
                decided.append((trace.trace_id, Remembered(Decision(sum(trace.trace_id) % 2 == 0, "p"),
                                                           tuple(sorted(measured)))))
        self.handed.append(seen)
        if decided:
            self.buffer.remember_decisions(decided)

    # --- what is sent ---

    def trace_ids(self) -> list[bytes]:
        count = self.rng.randint(300, 900) if self.bulk else self.rng.randint(10, 40) if self.held \
            else self.rng.randint(3, 12)
        ids = [self.rng.randbytes(16) for _ in range(count)]
        for trace_id in ids:
            if trace_id not in self.index:
                self.index[trace_id] = len(self.traces)
                self.traces.append(trace_id.hex())
        return ids

    def observation(self) -> EngineObservation | None:
        roll = self.rng.random()
        if roll < 0.45:
            return None
        if roll < 0.9:
            return EngineObservation("vllm", "vllm_v1", ttft_s=0.1, e2e_s=1.0)
        return EngineObservation("genai", "genai", may_be_gateway=True)  # not an engine's own span

    def span(self, trace_id: bytes, span_number: int, parent: bytes, kind: int) -> BufferedSpan:
        self.copies += 1  # which copy a trace holds: its start time
        return BufferedSpan(trace_id, span_number.to_bytes(8, "big"), parent, kind, 0, self.copies,
                            self.copies + 1, "", b"", self.rng.choice(ORIGINS), (), self.observation())

    def batch(self) -> list[BufferedSpan]:
        rng = self.rng
        spans = []
        for _ in range(rng.randint(1, 600) if self.bulk else rng.randint(1, 8)):
            if self.sent and rng.random() < 0.15:
                spans.append(rng.choice(self.sent))  # an exporter's retry: the same span again
                continue
            trace_id = rng.choice(self.ids)
            span_number = rng.randint(1, 40)
            roll = rng.random()
            if roll < 0.2:
                parent = b""
            elif roll < 0.2 + self.open_calls:
                parent = (1000 + span_number).to_bytes(8, "big")  # never arrives
            else:
                parent = rng.randint(1, 40).to_bytes(8, "big")  # any: late, early, cyclic
            spans.append(self.span(trace_id, span_number, parent, rng.choice((CLIENT, SERVER, INTERNAL, SERVER))))
        if rng.random() < 0.05:  # a chain about as deep as the walk's bound, in any order
            trace_id = rng.choice(self.ids)
            chain = [self.span(trace_id, 100 + depth, (99 + depth).to_bytes(8, "big") if depth else b"", SERVER)
                     for depth in range(MAX_ANCESTRY + rng.randint(-2, 2))]
            rng.shuffle(chain)
            spans += chain
        self.sent.extend(spans)
        return spans

    # --- the run ---

    def state(self) -> dict[str, Any]:
        buffer = self.buffer
        return {
            "len": len(buffer), "held_spans": buffer.held_spans(),
            "dropped": buffer.spans_dropped_over_trace_limit, "duplicate": buffer.spans_duplicate,
            "completions": dict(sorted(buffer.completions.items())),
            "held_traces": buffer.held_traces, "held_since": buffer.held_since(),
            "completion_lag": buffer.completion_lag(),
            "decisions": [[self.index[trace_id], r.decision.keep, r.decision.policy,
                           sorted(number(m) for m in r.measured), r.taken] for trace_id, r in buffer.decisions()],
        }

    def written(self, traces: list[PendingTrace]) -> list[Any]:
        """Pending traces handed out (taken, overdue): each one's trace and its spans' ids and copies."""
        return [[self.index[t.trace_id], [[number(k), s.start_unix_ns] for k, s in t.spans.items()]] for t in traces]

    def record(self, ops: list[dict[str, Any]], op: dict[str, Any]) -> None:
        op["now"] = self.clock.now
        op["handed"] = self.handed
        op["state"] = self.state()
        self.handed = []
        ops.append(op)

    def run(self) -> dict[str, Any]:
        rng, buffer, clock = self.rng, self.buffer, self.clock
        ops: list[dict[str, Any]] = []
        for _ in range(rng.randint(20, 120) if not self.bulk else rng.randint(10, 30)):
            roll = rng.random()
            if roll < 0.55:
                spans = self.batch()
                while spans:  # a deep chain arrives over several requests
                    size = rng.randint(1, 40) if not self.bulk else rng.randint(1, 700)
                    part, spans = spans[:size], spans[size:]
                    buffer.add_batch(part)
                    self.record(ops, {"op": "add", "spans": [
                        [self.index[s.trace_id], number(s.span_id), number(s.parent_span_id) if s.parent_span_id else None,
                         s.kind, s.is_engine, s.start_unix_ns, SENDERS.index(s.service_name)] for s in part]})
            elif roll < 0.75:
                clock.now += rng.choice((0.1, 0.4, 1.1, 2.5))
                buffer.tick()
                self.record(ops, {"op": "tick"})
            elif roll < 0.8:
                fraction = rng.choice((0.25, 0.5, 1.0))
                buffer.shed(fraction)
                self.record(ops, {"op": "shed", "fraction": fraction})
            elif roll < 0.85:
                keep = rng.randrange(3)
                taken = buffer.take_pending(lambda trace: trace.trace_id[0] % 3 == keep)
                complete = bool(taken) and rng.random() < 0.5
                if complete:
                    buffer.complete_now(taken, "shutdown")  # a hand-over that could not be written
                self.record(ops, {"op": "take", "keep": keep, "complete": complete, "taken": self.written(taken)})
            elif roll < 0.9:
                restored = rng.choice(self.ids)
                buffer.restore_decisions([(restored, Remembered(Decision(True, "restored"), ((5).to_bytes(8, "big"),)))])
                self.record(ops, {"op": "restore", "trace": self.index[restored], "measured": [5]})
            elif roll < 0.93:
                self.ids = self.trace_ids() + self.ids[:3]  # new traces, and some old ones coming back
            elif roll < 0.96:
                # The intake log's question after a tick: traces pending past a cutoff, and carried ones.
                seen_before = clock.now - rng.choice((0.0, self.settings.decision_wait_s, 1e9))
                carried = [self.ids[i] for i in sorted(rng.sample(range(len(self.ids)), min(2, len(self.ids))))]
                overdue = buffer.overdue(seen_before, carried)
                self.record(ops, {"op": "overdue", "seen_before": seen_before,
                                  "carried": [self.index[trace_id] for trace_id in carried],
                                  "overdue": self.written(overdue)})
            else:
                clock.now += 0.05
                self.record(ops, {"op": "wait"})
        buffer.drain()
        self.record(ops, {"op": "drain"})
        s = self.settings
        return {"settings": {"decision_wait_s": s.decision_wait_s, "grace_s": s.grace_s,
                             "max_open_call_wait_s": s.max_open_call_wait_s,
                             "max_open_calls_per_sender": s.max_open_calls_per_sender, "max_traces": s.max_traces,
                             "max_spans_per_trace": s.max_spans_per_trace,
                             "decided_cache_size": s.decided_cache_size},
                "traces": self.traces, "ops": ops}


def workloads() -> dict[str, Any]:
    """Every workload run on the reference, as written to ``workloads.json``."""
    runs = [Run(seed).run() for seed in range(SEEDS)]
    runs += [Run(10_000 + seed, bulk=True).run() for seed in range(BULK_SEEDS)]
    runs += [Run(20_000 + seed, held=True).run() for seed in range(HELD_SEEDS)]
    return {"generator": "rust/engine/tests/data/buffer/generate.py", "workloads": runs}


def main() -> None:
    data = workloads()
    OUT.write_text(json.dumps(data, separators=(",", ":")) + "\n")
    print(f"{OUT}: {len(data['workloads'])} workloads, {OUT.stat().st_size} bytes", file=sys.stderr)


if __name__ == "__main__":
    main()
