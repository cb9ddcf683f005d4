"""The sampling policies and the rate limit on their own, with an injected clock.

Traces are built from real OTLP spans (their status is what the errors policy reads); request records
carry the latencies put in here. Expected decisions follow from those inputs and the policy's
definition (DESIGN.md, the tail sampling section), never from running the code first.
"""

from __future__ import annotations

from typing import Any

import pytest
from opentelemetry.proto.common.v1.common_pb2 import InstrumentationScope
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

from otel_llm.pdata.records import Outcome, RequestRecord, Side
from otel_llm.processor.tail_sampling.assembler import BufferedSpan, Origin, PendingTrace
from otel_llm.processor.tail_sampling.policies import (
    ErrorsPolicy,
    Policy,
    ProbabilisticPolicy,
    RateLimit,
    SloPolicy,
    SlowestPolicy,
    TokenBucket,
    encode_threshold,
    randomness_of,
    threshold_for,
)
from tests.support import engine_fixtures as F
from tests.support.records import as_core_record

ORIGIN = Origin(Resource(), InstrumentationScope(name="test"), "svc", {})


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class TickingClock(Clock):
    """A clock that moves 1 µs each time it is read."""

    def __call__(self) -> float:
        self.now += 1e-6
        return self.now


def record(model: str = "m", *, ttft: float | None = None, e2e: float | None = None, tpot: float | None = None,
           queue: float | None = None, gateway_overhead: float | None = None, outcome: str = Outcome.STOP,
           side: str = Side.SERVER) -> RequestRecord:
    return RequestRecord(trace_id=b"\x01" * 16, span_id=b"\x02" * 8, engine_kind="vllm", adapter="vllm_v1",
                         service_name="s", model=model, model_source="test", request_model=model,
                         response_model=model, operation_name="chat", provider_name="vllm", outcome=outcome,
                         side=side, ttft_s=ttft, e2e_s=e2e, tpot_s=tpot, queue_s=queue,
                         gateway_overhead_s=gateway_overhead)


def trace(*statuses: int, trace_id: bytes = b"\x01" * 16) -> PendingTrace:
    """A pending trace holding one OTLP span per status given."""
    pending = PendingTrace(trace_id, 0.0)
    for i, status in enumerate(statuses):
        span = F.make_span(f"s{i}", trace=trace_id, sid=F.span_id(f"s{i}"), parent=None, kind=Span.SPAN_KIND_SERVER,
                           start_ns=1, end_ns=2, status_code=status)
        pending.spans[span.span_id] = BufferedSpan(
            span.trace_id, span.span_id, span.parent_span_id, span.kind, span.status.code, span.start_time_unix_nano,
            span.end_time_unix_nano, span.trace_state, span.SerializeToString(), ORIGIN, ())
    return pending


def test_policy_base_is_abstract():
    with pytest.raises(NotImplementedError):
        Policy().matches(trace(), [])


def test_default_names():
    assert ErrorsPolicy().name == "errors"
    assert SloPolicy({}).name == "slo"
    assert SlowestPolicy(["ttft"], 0.99, 60).name == "slowest"
    assert ProbabilisticPolicy(0.5).name == "probabilistic"


# --- errors ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("outcome", [Outcome.ERROR, Outcome.ABORT])
def test_errors_policy_keeps_failed_requests(outcome):
    assert ErrorsPolicy().matches(trace(Status.STATUS_CODE_OK), [record(outcome=outcome)]) is True


def test_errors_policy_keeps_a_span_with_error_status():
    assert ErrorsPolicy().matches(trace(Status.STATUS_CODE_OK, Status.STATUS_CODE_ERROR), [record()]) is True
    assert ErrorsPolicy().matches(trace(Status.STATUS_CODE_ERROR), []) is True


def test_errors_policy_drops_healthy_traces():
    assert ErrorsPolicy().matches(trace(Status.STATUS_CODE_OK, Status.STATUS_CODE_UNSET), [record()]) is False
    assert ErrorsPolicy().matches(trace(), [record(outcome=Outcome.LENGTH)]) is False


# --- slo ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("metric,field", [("ttft", "ttft"), ("tpot", "tpot"), ("e2e", "e2e"), ("queue", "queue"),
                                          ("gateway_overhead", "gateway_overhead")])
def test_slo_on_every_metric(metric, field):
    policy = SloPolicy({metric: 1.0})
    assert policy.matches(trace(), [record(**{field: 1.5})]) is True
    assert policy.matches(trace(), [record(**{field: 1.0})]) is False  # at the threshold is within the SLO
    assert policy.matches(trace(), [record(**{field: 0.5})]) is False
    assert policy.matches(trace(), [record()]) is False  # no value: nothing to compare


def test_slo_ignores_client_records_and_checks_every_record():
    policy = SloPolicy({"e2e": 1.0})
    assert policy.matches(trace(), [record(e2e=5.0, side=Side.CLIENT)]) is False
    assert policy.matches(trace(), [record(e2e=0.5), record(e2e=5.0)]) is True


def test_slo_per_model_override_keeps_the_other_defaults():
    policy = SloPolicy({"ttft": 1.0, "e2e": 10.0}, {"big": {"ttft": 3.0}})
    assert policy.matches(trace(), [record("big", ttft=2.0)]) is False
    assert policy.matches(trace(), [record("big", ttft=2.0, e2e=11.0)]) is True
    assert policy.matches(trace(), [record("small", ttft=2.0)]) is True


# --- slowest ----------------------------------------------------------------------------------------------


def test_slowest_keeps_per_model_quantiles():
    """Two models at different speeds: each is judged against its own traffic."""
    clock = Clock()
    policy = SlowestPolicy(["ttft"], 0.9, window_s=600, clock=clock)
    for i in range(300):
        policy.matches(trace(), [record("fast", ttft=0.1 + (i % 10) * 0.001)])
        policy.matches(trace(), [record("slow", ttft=1.0 + (i % 10) * 0.01)])
    assert policy.matches(trace(), [record("fast", ttft=0.3)]) is True  # 3x fast's, far below slow's
    assert policy.matches(trace(), [record("slow", ttft=0.9)]) is False  # slow's usual is slower


def test_slowest_first_request_and_new_extremes_are_kept():
    policy = SlowestPolicy(["ttft"], 0.99, window_s=600, clock=Clock())
    assert policy.matches(trace(), [record(ttft=0.2)]) is True  # nothing seen before
    for _ in range(100):
        policy.matches(trace(), [record(ttft=0.2)])
    assert policy.matches(trace(), [record(ttft=0.2)]) is False
    assert policy.matches(trace(), [record(ttft=0.5)]) is True


def test_slowest_skips_failed_client_and_valueless_records():
    policy = SlowestPolicy(["ttft"], 0.5, window_s=600, clock=Clock())
    assert policy.matches(trace(), [record(ttft=1.0, outcome=Outcome.ABORT)]) is False
    assert policy.matches(trace(), [record(ttft=1.0, side=Side.CLIENT)]) is False
    assert policy.matches(trace(), [record(ttft=None)]) is False
    assert policy.matches(trace(), [record(ttft=1.0)]) is True  # still the first one it learns from


def test_slowest_learns_every_metric_of_every_record():
    policy = SlowestPolicy(["ttft", "e2e"], 0.5, window_s=600, clock=Clock())
    for _ in range(50):
        policy.matches(trace(), [record(ttft=0.1, e2e=1.0), record(ttft=0.1, e2e=1.0)])
    assert policy.matches(trace(), [record(ttft=0.1, e2e=1.0)]) is False
    assert policy.matches(trace(), [record(ttft=0.1, e2e=3.0)]) is True  # e2e alone is slow
    assert policy.matches(trace(), [record(ttft=0.1, e2e=1.0), record(ttft=0.5, e2e=1.0)]) is True


def test_slowest_model_limit_shares_one_window_past_it():
    """``max_models`` bounds memory: past it, new models share one window per metric."""
    policy = SlowestPolicy(["ttft", "e2e"], 0.5, window_s=600, max_models=1, clock=Clock())
    for _ in range(50):
        policy.matches(trace(), [record("a", ttft=0.1, e2e=0.1)])
    for _ in range(50):
        policy.matches(trace(), [record("b", ttft=1.0, e2e=1.0)])
    assert policy.matches(trace(), [record("a", ttft=0.5, e2e=0.05)]) is True  # a keeps its own ttft window
    assert policy.matches(trace(), [record("a", ttft=0.05, e2e=0.5)]) is True  # ... and its own e2e window
    # c's first request is judged against the shared window b filled, not kept as a first
    assert policy.matches(trace(), [record("c", ttft=0.5, e2e=0.5)]) is False


def test_the_cores_slowest_loop_is_the_python_one():
    """With the compiled core the slowest policy's loop and windows run there (``SlowestWindows``);
    the Python loop with ``quantiles.py``'s windows is the reference. Both get the same 12 000 traces
    of random records and clocks that agree: each answer (or error) must be the same. The records draw
    every branch: failed and client-side ones (skipped), absent metrics, ints beside floats, NaN and
    infinity (the window refuses them), a flood of model names past ``max_models`` (the shared
    window) and past the per-model cache's bound (cleared), the clock within a slice, across
    slices and past the window. Half the time the core reads the same records as its own
    ``RequestRecord`` (by index), half the time as Python's (by name)."""
    import math
    import random

    from otel_llm.internal import core as native_core

    extension = native_core.active()[0]
    if extension is None:
        pytest.skip("the compiled core is not installed")
    rng = random.Random(2025)
    answers = {True: 0, False: 0, "error": 0}
    for metrics, quantile, max_models, window_s in ((["ttft", "e2e"], 0.99, 1000, 600.0), (["ttft"], 0.5, 1, 60.0),
                                                     (["e2e", "tpot", "queue", "gateway_overhead"], 0.9, 3, 10.0)):
        # Each policy's own clock, moving a little at every read: both must read it as often, in the same order.
        clocks = (TickingClock(), TickingClock())
        python = SlowestPolicy(metrics, quantile, window_s, max_models=max_models, clock=clocks[0], core=None)
        native = SlowestPolicy(metrics, quantile, window_s, max_models=max_models, clock=clocks[1], core=extension)
        assert python._native is None and native._native is not None
        models = [f"model-{i}" for i in range(rng.choice((3, 120)) if max_models > 1 else 120)]
        for _ in range(4000):
            roll = rng.random()
            step = rng.random() * window_s / 1000 if roll < 0.99 else rng.choice((window_s / 10, window_s * 1.5))
            for clock in clocks:
                clock.now += step

            def value() -> float | int | None:
                roll = rng.random()
                if roll < 0.2:
                    return None
                if roll < 0.25:
                    return rng.choice((0, 3, 0.0, 1e300, math.nan, math.inf, 2**60))
                if roll < 0.4:
                    return 1e-4 * 1.1 ** rng.randrange(40, 80)  # a bin's edge: a threshold's own value
                return rng.lognormvariate(-1, 1)

            records = [record(rng.choice(models), ttft=value(), e2e=value(), tpot=value(), queue=value(),
                              gateway_overhead=value(),
                              outcome=rng.choice((Outcome.STOP,) * 8 + (Outcome.ABORT, Outcome.ERROR, Outcome.LENGTH)),
                              side=rng.choice((Side.SERVER,) * 9 + (Side.CLIENT,)))
                       for _ in range(rng.choice((0, 1, 1, 1, 2, 3)))]
            # The core reads its own records by index and Python's by name: it is given either.
            core_records = [as_core_record(r, extension) for r in records] if rng.random() < 0.5 else records
            results = []
            for policy, given in ((python, records), (native, core_records)):
                try:
                    results.append(policy.matches(trace(), given))
                except (ValueError, OverflowError) as exc:
                    results.append(type(exc))
            assert results[0] == results[1], (metrics, records, clocks[0].now)
            assert clocks[0].now == clocks[1].now
            answers[results[0] if isinstance(results[0], bool) else "error"] += 1
    assert min(answers.values()) > 100, answers
    # Memory stays bounded under a flood of model names: the windows past max_models are one shared
    # window per metric, and the per-model cache is cleared at its bound (2 * max_models + 64).
    flood = SlowestPolicy(["ttft"], 0.5, 60.0, max_models=2, clock=Clock(), core=extension)
    for index in range(1000):
        flood.matches(trace(), [record(f"flood-{index}", ttft=0.1)])
    assert 0 < flood._native.cached_models <= 2 * 2 + 64


def test_slowest_window_forgets_old_traffic():
    clock = Clock()
    policy = SlowestPolicy(["ttft"], 0.5, window_s=60, clock=clock)
    for _ in range(50):
        policy.matches(trace(), [record(ttft=5.0)])
    assert policy.matches(trace(), [record(ttft=1.0)]) is False
    clock.now += 200  # the window has passed
    assert policy.matches(trace(), [record(ttft=1.0)]) is True


# --- probabilistic --------------------------------------------------------------------------------------


def _with_randomness(value: int) -> bytes:
    return b"\xaa" * 9 + value.to_bytes(7, "big")


def test_probabilistic_threshold_is_inclusive():
    policy = ProbabilisticPolicy(0.25)
    threshold = round(0.75 * 2**56)  # W3C level 2: keep when the 56 random bits are >= (1 - rate) * 2^56
    assert policy.threshold == threshold and policy.th == "c"
    assert policy.matches(trace(trace_id=_with_randomness(threshold)), []) is True
    assert policy.matches(trace(trace_id=_with_randomness(threshold - 1)), []) is False
    assert policy.matches(trace(trace_id=_with_randomness(2**56 - 1)), []) is True


def test_randomness_is_the_rightmost_56_bits():
    assert randomness_of(bytes(range(16))) == int.from_bytes(bytes(range(9, 16)), "big")
    assert randomness_of(b"\xff" * 9 + b"\x00" * 7) == 0


@pytest.mark.parametrize("rate,th", [(1.0, "0"), (0.5, "8"), (0.25, "c"), (0.125, "e")])
def test_thresholds_encode_as_otel_th(rate, th):
    assert encode_threshold(threshold_for(rate)) == th


def test_keep_all_and_keep_none():
    assert ProbabilisticPolicy(1.0).matches(trace(trace_id=b"\x00" * 16), []) is True
    assert ProbabilisticPolicy(0.0).matches(trace(trace_id=b"\xff" * 16), []) is False


# --- token bucket and rate limit ----------------------------------------------------------------------------


def test_token_bucket_burst_then_refill_over_time():
    clock = Clock()
    bucket = TokenBucket(2.0, clock)
    assert [bucket.take() for _ in range(3)] == [True, True, False]  # starts full: a burst of 2
    clock.now += 0.25  # half a token
    assert bucket.take() is False
    clock.now += 0.25  # one token in all
    assert bucket.take() is True
    assert bucket.take() is False
    clock.now += 100.0  # idle: refills to its capacity, not beyond
    assert [bucket.take() for _ in range(3)] == [True, True, False]


def test_token_bucket_at_one_per_second():
    clock = Clock()
    bucket = TokenBucket(1.0, clock)
    assert bucket.take() is True
    assert bucket.take() is False
    clock.now += 0.5
    assert bucket.take() is False
    clock.now += 0.5  # exactly one token again
    assert bucket.take() is True
    assert bucket.take() is False


def test_token_bucket_clock_going_nowhere_adds_nothing():
    clock = Clock()
    bucket = TokenBucket(3.0, clock)
    assert [bucket.take() for _ in range(4)] == [True, True, True, False]
    assert bucket.take() is False


def test_errors_bypass_the_rate_limit():
    clock = Clock()
    limit = RateLimit(1.0, 1.0, applies_to=["slo", "slowest"], clock=clock)
    assert limit.allow("slo", [record()]) is True
    assert limit.allow("slo", [record()]) is False
    assert limit.allow("slowest", [record()]) is False
    for _ in range(5):
        assert limit.allow("errors", [record()]) is True


def test_overall_limit_with_refill():
    clock = Clock()
    limit = RateLimit(2.0, 0.0, applies_to=["slo"], clock=clock)
    assert [limit.allow("slo", [record(f"m{i}")]) for i in range(3)] == [True, True, False]
    clock.now += 0.5
    assert limit.allow("slo", [record("other")]) is True
    assert limit.allow("slo", [record("other")]) is False


def test_per_model_limit_alone_does_not_block_other_models():
    clock = Clock()
    limit = RateLimit(0.0, 1.0, applies_to=["slo"], clock=clock)  # no overall limit
    assert limit.allow("slo", [record("a")]) is True
    assert limit.allow("slo", [record("a")]) is False  # a's own budget is spent
    assert limit.allow("slo", [record("b")]) is True  # b has its own
    assert limit.allow("slo", []) is True  # a trace without records counts as one "model"
    assert limit.allow("slo", []) is False
    clock.now += 1.0
    assert limit.allow("slo", [record("a")]) is True


def test_per_model_and_overall_limits_together():
    clock = Clock()
    limit = RateLimit(2.0, 1.0, applies_to=["slo"], clock=clock)
    assert limit.allow("slo", [record("a")]) is True
    assert limit.allow("slo", [record("a")]) is False  # per model, the overall budget untouched
    assert limit.allow("slo", [record("b")]) is True
    assert limit.allow("slo", [record("c")]) is False  # overall spent


def test_per_model_limit_reads_the_first_record():
    limit = RateLimit(0.0, 1.0, applies_to=["slo"], clock=Clock())
    assert limit.allow("slo", [record("a"), record("b")]) is True
    assert limit.allow("slo", [record("b")]) is True
    assert limit.allow("slo", [record("a"), record("c")]) is False


def test_per_model_buckets_are_bounded():
    limit = RateLimit(0.0, 1.0, applies_to=["slo"], max_models=1, clock=Clock())
    assert limit.allow("slo", [record("a")]) is True  # a has its own bucket
    assert limit.allow("slo", [record("b")]) is True  # past the bound: b and c share one
    assert limit.allow("slo", [record("c")]) is False
    assert limit.allow("slo", [record("a")]) is False


def test_no_limits_allow_everything():
    limit = RateLimit(0.0, 0.0, applies_to=["slo"], clock=Clock())
    assert all(limit.allow("slo", [record()]) is True for _ in range(10))


def test_overall_limit_of_one_per_second():
    clock = Clock()
    limit = RateLimit(1.0, 0.0, applies_to=["slo"], clock=clock)
    assert limit.allow("slo", [record("a")]) is True
    assert limit.allow("slo", [record("b")]) is False
    clock.now += 1.0
    assert limit.allow("slo", [record("c")]) is True


def test_default_model_bounds_are_a_thousand():
    """Defaults: 1000 models get their own bucket and windows; the next ones share one."""
    limit = RateLimit(0.0, 1.0, applies_to=["slo"], clock=Clock())
    assert all(limit.allow("slo", [record(f"m{i}")]) for i in range(1000))
    assert limit.allow("slo", [record("m1000")]) is True  # the shared bucket's one token
    assert limit.allow("slo", [record("m1001")]) is False
    policy = SlowestPolicy(["ttft"], 0.5, window_s=600, clock=Clock())
    assert all(policy.matches(trace(), [record(f"m{i}", ttft=1.0)]) for i in range(1000))  # each its first
    assert policy.matches(trace(), [record("m1000", ttft=1.0)]) is True  # the shared window's first
    assert policy.matches(trace(), [record("m1001", ttft=1.0)]) is False  # judged against m1000's


def test_token_bucket_below_one_per_second():
    """0.2/s is one trace every 5 s (a valid rate_limit value): the bucket must still hold one token."""
    clock = Clock()
    bucket = TokenBucket(0.2, clock)
    assert bucket.take() is True
    clock.now += 4.0
    assert bucket.take() is False
    clock.now += 1.0  # 5 s after the first
    assert bucket.take() is True
    clock.now += 60.0  # a long idle still gives a burst of one, not twelve
    assert [bucket.take() for _ in range(2)] == [True, False]


def test_per_model_limit_below_one_per_second():
    clock = Clock()
    limit = RateLimit(0.0, 0.5, applies_to=["slo"], clock=clock)
    assert limit.allow("slo", [record("a")]) is True
    assert limit.allow("slo", [record("a")]) is False
    clock.now += 2.0
    assert limit.allow("slo", [record("a")]) is True


# --- the compiled core's decision ------------------------------------------------------------------------


def test_the_cores_decision_is_the_python_one():
    """With the compiled core, a configuration of errors, slowest and probabilistic policies is decided
    in one call (``Decider``); the Python policies are the reference. 9 000 random traces go through
    both samplers (each with its own ticking clock): the same decision, or the same error, every
    time. The traces hold the core's own spans (the bench's, read by ``digest_in_process``) or the
    Python class's, with random statuses and trace ids; the records draw failed, client-side,
    absent and extreme values, given to the core as its own records or Python's. A configuration with a policy the core does not run (``slo``) stays
    Python's."""
    import math
    import random

    from bench.workload import generate
    from otel_llm.internal import core as native_core
    from otel_llm.pdata.traces import Decision
    from otel_llm.processor.llm_metrics.digest import AttributeLimits, DigestSettings, digest_in_process
    from otel_llm.processor.tail_sampling.config import (
        PolicyConfig, ProbabilisticPolicyConfig, SloPolicyConfig, SlowestPolicyConfig, TailSamplingProcessor)
    from otel_llm.processor.tail_sampling.sampler import TailSampler

    extension = native_core.active()[0]
    if extension is None:
        pytest.skip("the compiled core is not installed")
    digest = DigestSettings(AttributeLimits(256, 16 * 1024), 3600.0, (), frozenset())
    core_spans = [span for batch in generate(2, seed=5) for span in digest_in_process(batch.payload, digest)[0]]
    assert type(core_spans[0]).__module__ == "otel_llm._core"
    configs = [
        TailSamplingProcessor(),
        TailSamplingProcessor(policies=[
            PolicyConfig(name="half", type="probabilistic", probabilistic=ProbabilisticPolicyConfig(50.0)),
            PolicyConfig(name="errors", type="errors")]),
        TailSamplingProcessor(policies=[
            PolicyConfig(name="slow", type="slowest",
                         slowest=SlowestPolicyConfig(metrics=["e2e", "queue"], quantile=0.9, window=30.0)),
            PolicyConfig(name="all", type="probabilistic", probabilistic=ProbabilisticPolicyConfig(100.0)),
            PolicyConfig(name="none", type="probabilistic", probabilistic=ProbabilisticPolicyConfig(0.0))]),
    ]
    rng = random.Random(99)
    outcomes: dict[object, int] = {}
    mixed_batches = 0
    for config in configs:
        clocks = (TickingClock(), TickingClock())
        python = TailSampler(config, core=None, clock=clocks[0])
        native = TailSampler(config, core=extension, clock=clocks[1])
        assert python._native is None and native._native is not None
        batch: list[tuple[PendingTrace, list[Any], list[Any]]] = []
        for _ in range(3000):
            step = rng.random() * 0.05
            for clock in clocks:
                clock.now += step
            trace_id = rng.randbytes(16)
            if rng.random() < 0.05:  # randomness exactly at a threshold (50 %: 2^55), or just below it
                trace_id = trace_id[:9] + rng.choice((b"\x80" + bytes(6), b"\x7f" + b"\xff" * 6, bytes(7)))
            pending = PendingTrace(trace_id, 0.0)
            if rng.random() < 0.5:
                for span in rng.sample(core_spans, rng.randrange(1, 4)):
                    status = rng.choice((Status.STATUS_CODE_UNSET,) * 8 + (Status.STATUS_CODE_ERROR, Status.STATUS_CODE_OK))
                    span = type(span)(**{name: getattr(span, name) for name in (
                        "trace_id", "span_id", "parent_span_id", "kind", "status_code", "start_unix_ns", "end_unix_ns",
                        "trace_state", "payload", "origin", "attrs", "observation")} | {"status_code": status})
                    pending.spans[span.span_id] = span
            else:
                pending = trace(*[rng.choice((Status.STATUS_CODE_UNSET,) * 8 + (Status.STATUS_CODE_ERROR,))
                                  for _ in range(rng.randrange(0, 3))], trace_id=trace_id)

            def value() -> float | int | None:
                roll = rng.random()
                if roll < 0.2:
                    return None
                if roll < 0.23:
                    return rng.choice((0, 2, math.nan, math.inf))
                return rng.lognormvariate(-1, 1)

            records = [record(rng.choice(("a", "b", "c")), ttft=value(), e2e=value(), queue=value(),
                              outcome=rng.choice((Outcome.STOP,) * 12 + (Outcome.ABORT, Outcome.ERROR)),
                              side=rng.choice((Side.SERVER,) * 9 + (Side.CLIENT,)))
                       for _ in range(rng.choice((0, 1, 1, 2)))]
            core_records = [as_core_record(r, extension) for r in records] if rng.random() < 0.5 else records
            batch.append((pending, records, core_records))
            results: list[object] = []
            for sampler, given in ((python, records), (native, core_records)):
                try:
                    results.append(sampler.decide(pending, given))
                except (ValueError, OverflowError) as exc:
                    results.append(type(exc))
            assert results[0] == results[1], (records, pending.spans)
            assert clocks[0].now == clocks[1].now
            key = (results[0].policy, results[0].keep) if isinstance(results[0], Decision) else results[0]
            outcomes[key] = outcomes.get(key, 0) + 1
            if len(batch) == 64:
                # A completion batch's decisions (one call into the core): each trace's, a failing
                # one's error in its place, the others decided, as the Python policies decide them.
                decided = [[d if isinstance(d, Decision) else type(d) for d in sampler.decide_batch(
                    [(pending, given[index]) for pending, *given in batch])]
                    for index, sampler in ((0, python), (1, native))]
                assert decided[0] == decided[1]
                mixed_batches += ValueError in decided[1] and any(isinstance(d, Decision) and d.keep for d in decided[1])
                batch.clear()
    # Every policy of every configuration decided some traces, and none decided the rest.
    for policy in ("errors", "slowest", "baseline", "half", "slow", "all"):
        assert outcomes.get((policy, True), 0) > 5, outcomes
    assert outcomes.get(("", False), 0) > 500 and outcomes.get(ValueError, 0) > 10, outcomes
    assert mixed_batches > 3, mixed_batches
    slo = TailSamplingProcessor(policies=[PolicyConfig(name="slo", type="slo", slo=SloPolicyConfig({"ttft": 1.0}))])
    assert TailSampler(slo, core=extension)._native is None
