"""The decide corpus: seeded random traces and records decided by the Python reference, replayed by
``rust/engine/tests/decide_corpus.rs`` (the engine's ``decide::Sampler`` must give the same decision,
or fail the same traces, bit for bit).

Regenerate (from the repository's root, with a venv that has the project's dependencies)::

    PYTHONPATH=. OTEL_LLM_CORE=python .venv/bin/python rust/engine/tests/data/decide/generate.py

It writes ``corpus.json`` next to itself. The reference is ``TailSampler(config, core=None,
clock=clock)`` (the Python policies) fed through ``decide_batch``, one batch per instant of a
fixed clock. Two defaults no configuration sets are given here as ``SlowestPolicy``'s and
``RateLimit``'s own defaults: ``max_models`` (small in some cases, so models past it share the
``__other__`` window and bucket) and the rate limit's clock (``TailSampler`` leaves it
``time.monotonic``; a fixed clock makes its token buckets deterministic).

A record is ``[model, outcome, side, ttft_s, tpot_s, e2e_s, queue_s, gateway_overhead_s]``, a trace's
expected decision ``[kept|dropped|rate_limited, policy, threshold]`` or ``["error", exception class,
message]``; each case
ends with the tally of its decisions (``policy:kept|dropped|rate_limited``, or the exception's class).
Floats are written as their ``repr`` (a string: NaN and infinities are not JSON numbers, and
``str.parse::<f64>`` reads a ``repr`` back to the same float).
"""

from __future__ import annotations

import json
import math
import pathlib
import random
from typing import Any

from opentelemetry.proto.common.v1.common_pb2 import InstrumentationScope
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

from otel_llm.pdata.records import Outcome, RequestRecord, Side
from otel_llm.pdata.spans import BufferedSpan, Origin, PendingTrace
from otel_llm.pdata.traces import Decision
from otel_llm.processor.tail_sampling import policies
from otel_llm.processor.tail_sampling.config import (
    PolicyConfig,
    ProbabilisticPolicyConfig,
    RateLimitConfig,
    SloPolicyConfig,
    SlowestPolicyConfig,
    TailSamplingProcessor,
)
from otel_llm.processor.tail_sampling.sampler import TailSampler
from otel_llm.service.declarations import number, policy_json

ORIGIN = Origin(Resource(), InstrumentationScope(name="corpus"), "svc", {})
METRICS = ("ttft", "tpot", "e2e", "queue", "gateway_overhead")
# Model names as spans may carry them: the overflow names themselves, empty, non-ASCII, quotes.
HOSTILE_MODELS = ["", "__other__", "__none__", "模型-7b", 'q"uote\\d\nnl']


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def outcome(decision: Decision) -> str:
    """How a decision is tallied: kept, dropped or rate_limited."""
    return "rate_limited" if decision.rate_limited else "kept" if decision.keep else "dropped"


def pending_trace(trace_id: bytes, statuses: list[int]) -> PendingTrace:
    pending = PendingTrace(trace_id, 0.0)
    for index, status in enumerate(statuses):
        span = Span(trace_id=trace_id, span_id=bytes([index + 1]) * 8, name=f"s{index}", kind=Span.SPAN_KIND_SERVER,
                    start_time_unix_nano=1, end_time_unix_nano=2, status=Status(code=status))  # type: ignore[arg-type]
        pending.spans[span.span_id] = BufferedSpan(
            span.trace_id, span.span_id, span.parent_span_id, span.kind, span.status.code, span.start_time_unix_nano,
            span.end_time_unix_nano, span.trace_state, span.SerializeToString(), ORIGIN, ())
    return pending


class Case:
    """One configuration's traces: random draws within the bounds given."""

    def __init__(self, name: str, config: TailSamplingProcessor, max_models: int, models: list[str],
                 seed: int, window: float, batches: int = 200, jumps: tuple[float, ...] = (0.5, 1.0, 0.25, 2.0, 5.0)) -> None:
        self.name = name
        self.config = config
        self.max_models = max_models
        self.models = models
        self.rng = random.Random(seed)
        self.window = window  # the slowest window (or a time scale) the clock's steps are drawn against
        self.batches = batches
        # Steps the clock sometimes takes exactly: the token buckets' edges and the cached
        # threshold's lifetime (0.5 s).
        self.jumps = jumps

    def value(self) -> float | None:
        rng = self.rng
        roll = rng.random()
        if roll < 0.2:
            return None
        if roll < 0.24:  # what the windows refuse (NaN, infinity, past the bins' arithmetic) or bin first
            return rng.choice((0.0, -1.0, math.nan, math.inf, -math.inf, 1e300, 1e-5, 1e-4))
        if roll < 0.4:
            return 1e-4 * 1.1 ** rng.randrange(75, 115)  # a bin's edge: a threshold's own value
        return float(f"{rng.lognormvariate(-1, 1):.4g}")  # four digits: a short repr in the corpus

    def record(self) -> RequestRecord:
        rng = self.rng
        model = rng.choice(self.models)
        return RequestRecord(
            trace_id=b"\x01" * 16, span_id=b"\x02" * 8, engine_kind="vllm", adapter="vllm_v1", service_name="s",
            model=model, model_source="test", request_model=model, response_model=model, operation_name="chat",
            provider_name="vllm",
            outcome=rng.choice((Outcome.STOP,) * 10 + (Outcome.LENGTH, Outcome.UNKNOWN, Outcome.ABORT, Outcome.ERROR)),
            side=rng.choice((Side.SERVER,) * 9 + (Side.CLIENT,)),
            ttft_s=self.value(), tpot_s=self.value(), e2e_s=self.value(), queue_s=self.value(),
            gateway_overhead_s=self.value())  # in METRICS' order

    def trace_id(self) -> bytes:
        rng = self.rng
        trace_id = rng.randbytes(16)
        if rng.random() < 0.1:  # randomness exactly at a threshold (50 %: 2^55), just below, or the ends
            trace_id = trace_id[:9] + rng.choice((b"\x80" + bytes(6), b"\x7f" + b"\xff" * 6, bytes(7), b"\xff" * 7))
        return trace_id

    def run(self) -> dict[str, Any]:
        rng = self.rng
        clock = Clock(1000.0 + rng.random())
        # The defaults TailSampler does not pass: max_models for both, and the rate limit's clock.
        slowest_defaults = policies.SlowestPolicy.__init__.__defaults__
        rate_defaults = policies.RateLimit.__init__.__defaults__
        assert slowest_defaults is not None and rate_defaults is not None
        policies.SlowestPolicy.__init__.__defaults__ = (self.max_models,) + slowest_defaults[1:]
        policies.RateLimit.__init__.__defaults__ = (self.max_models, clock)
        try:
            sampler = TailSampler(self.config, core=None, clock=clock)
        finally:
            policies.SlowestPolicy.__init__.__defaults__ = slowest_defaults
            policies.RateLimit.__init__.__defaults__ = rate_defaults
        start = clock.now
        batches = []
        counts: dict[str, int] = {}
        for _ in range(self.batches):
            roll = rng.random()
            if roll < 0.2:
                step = 0.0
            elif roll < 0.9:
                step = rng.random() * self.window / 100
            elif roll < 0.97:
                step = rng.choice(self.jumps)
            else:
                step = self.window * rng.choice((0.1, 1.0, 1.5))
            clock.now += step
            traces = []
            for _ in range(rng.choice((1, 1, 2, 3, 8))):
                statuses = [rng.choice((0,) * 8 + (1, 2)) for _ in range(rng.choice((0, 1, 1, 2, 3)))]
                records = [self.record() for _ in range(rng.choice((0, 1, 1, 1, 2, 3)))]
                traces.append((self.trace_id(), statuses, records))
            decided = sampler.decide_batch([(pending_trace(t, s), r) for t, s, r in traces])
            batch = []
            for (trace_id, statuses, records), decision in zip(traces, decided):
                if isinstance(decision, Decision):
                    expected = [outcome(decision), decision.policy, decision.threshold]
                    key = f"{decision.policy}:{outcome(decision)}"
                else:
                    expected = ["error", type(decision).__name__, str(decision)]
                    key = type(decision).__name__
                counts[key] = counts.get(key, 0) + 1
                batch.append({
                    "trace_id": trace_id.hex(), "statuses": statuses, "expected": expected,
                    "records": [[r.model, r.outcome, r.side, *(number(getattr(r, f"{m}_s")) for m in METRICS)]
                                for r in records],
                })
            batches.append({"now": number(clock.now), "traces": batch})
        rate = self.config.rate_limit
        print(f"{self.name}: {dict(sorted(counts.items()))}")
        return {
            "name": self.name,
            "config": {"policies": [policy_json(p) for p in self.config.policies],
                       "traces_per_second": number(rate.traces_per_second),
                       "per_model_traces_per_second": number(rate.per_model_traces_per_second),
                       "applies_to": list(rate.applies_to), "max_models": self.max_models},
            "start": number(start),
            "batches": batches,
            "outcomes": dict(sorted(counts.items())),
        }


def cases() -> list[Case]:
    base = [f"model-{i}" for i in range(3)]
    many = [f"model-{i}" for i in range(12)] + HOSTILE_MODELS
    return [
        Case("defaults", TailSamplingProcessor(), 1000, base + HOSTILE_MODELS, 1, 600.0),
        Case("slo_probabilistic_rate_limited", TailSamplingProcessor(
            policies=[
                PolicyConfig(name="errors", type="errors"),
                PolicyConfig(name="slo", type="slo", slo=SloPolicyConfig(
                    thresholds={"ttft": 0.5, "e2e": 2.0},
                    per_model={"model-1": {"ttft": 1.5, "queue": 0.1}, "模型-7b": {"e2e": 0.25}})),
                PolicyConfig(name="half", type="probabilistic", probabilistic=ProbabilisticPolicyConfig(50.0)),
            ],
            rate_limit=RateLimitConfig(traces_per_second=5.0, per_model_traces_per_second=2.0)),
            1000, base + HOSTILE_MODELS, 2, 10.0),
        Case("slowest_past_max_models", TailSamplingProcessor(
            policies=[
                PolicyConfig(name="slow", type="slowest", slowest=SlowestPolicyConfig(
                    metrics=["e2e", "queue", "tpot", "gateway_overhead"], quantile=0.9, window=30.0)),
                PolicyConfig(name="errors", type="errors"),
                PolicyConfig(name="third", type="probabilistic", probabilistic=ProbabilisticPolicyConfig(100 / 3)),
            ],
            rate_limit=RateLimitConfig(per_model_traces_per_second=1.0, applies_to=["slow"])),
            3, many, 3, 30.0),
        Case("all_none_and_duplicate_metrics", TailSamplingProcessor(
            policies=[
                PolicyConfig(name="none", type="probabilistic", probabilistic=ProbabilisticPolicyConfig(0.0)),
                PolicyConfig(name="ttft-twice", type="slowest", slowest=SlowestPolicyConfig(
                    metrics=["ttft", "ttft"], quantile=0.5, window=0.001)),
                PolicyConfig(name="errors", type="errors"),
                PolicyConfig(name="all", type="probabilistic", probabilistic=ProbabilisticPolicyConfig(100.0)),
            ],
            rate_limit=RateLimitConfig(traces_per_second=0.2, applies_to=["errors", "all", "ttft-twice"])),
            2, many, 4, 2.0),
        # One model, many requests: windows past the size where thresholds are cached (200 values),
        # the clock stepping exactly the cache's lifetime.
        Case("cached_thresholds", TailSamplingProcessor(
            policies=[PolicyConfig(name="slowest", type="slowest", slowest=SlowestPolicyConfig(
                metrics=["ttft", "e2e"], quantile=0.95, window=600.0))]),
            1000, ["m"], 6, 60.0, batches=400, jumps=(0.5, 0.5, 0.25)),
        Case("one_per_second", TailSamplingProcessor(
            policies=[
                PolicyConfig(name="errors", type="errors"),
                PolicyConfig(name="slowest", type="slowest", slowest=SlowestPolicyConfig(metrics=["ttft"], quantile=0.99,
                                                                                          window=60.0)),
                PolicyConfig(name="quarter", type="probabilistic", probabilistic=ProbabilisticPolicyConfig(25.0)),
            ],
            rate_limit=RateLimitConfig(traces_per_second=1.0, per_model_traces_per_second=1.0)),
            1, many, 5, 4.0),
    ]


def main() -> None:
    corpus = {"generator": "rust/engine/tests/data/decide/generate.py", "cases": [case.run() for case in cases()]}
    path = pathlib.Path(__file__).with_name("corpus.json")
    path.write_text(json.dumps(corpus, ensure_ascii=False, separators=(",", ":")) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
