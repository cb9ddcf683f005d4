"""Sampling policies as pure objects: static SLOs with per-model overrides, consistent probabilistic
decisions, rolling quantiles, and the sampler's first-match order."""

from __future__ import annotations

import random

from otel_llm.pdata.records import Outcome, RequestRecord
from otel_llm.pdata.spans import PendingTrace
from otel_llm.config import config_from_dict
from otel_llm.processor.tail_sampling.policies import ProbabilisticPolicy, SloPolicy, SlowestPolicy, encode_threshold, threshold_for
from otel_llm.processor.tail_sampling.quantiles import RollingQuantile
from otel_llm.processor.tail_sampling.sampler import TailSampler


def record(model: str = "m", ttft: float | None = 0.2, e2e: float | None = 1.0, outcome: str = Outcome.UNKNOWN,
           trace_id: bytes = b"\x01" * 16) -> RequestRecord:
    return RequestRecord(trace_id=trace_id, span_id=b"\x02" * 8, engine_kind="vllm", adapter="vllm_v1",
                         service_name="s", model=model, model_source="test", request_model=model,
                         response_model=model, operation_name="chat", provider_name="vllm", outcome=outcome,
                         ttft_s=ttft, e2e_s=e2e)


def trace(trace_id: bytes = b"\x01" * 16) -> PendingTrace:
    return PendingTrace(trace_id, 0.0)


def test_slo_thresholds_with_per_model_override():
    policy = SloPolicy({"ttft": 1.0, "e2e": 30.0}, {"big-model": {"ttft": 3.0}})
    assert not policy.matches(trace(), [record(ttft=0.9)])
    assert policy.matches(trace(), [record(ttft=1.1)])
    assert not policy.matches(trace(), [record(model="big-model", ttft=2.5)])  # its own, looser SLO
    assert policy.matches(trace(), [record(model="big-model", ttft=3.5)])
    assert policy.matches(trace(), [record(e2e=31.0)])
    assert not policy.matches(trace(), [record(ttft=None, e2e=None)])


def test_probabilistic_is_consistent_and_near_its_rate():
    policy = ProbabilisticPolicy(0.25)
    rng = random.Random(3)
    ids = [rng.randbytes(16) for _ in range(20_000)]
    kept = [policy.matches(trace(i), []) for i in ids]
    assert kept == [ProbabilisticPolicy(0.25).matches(trace(i), []) for i in ids]  # same id, same decision
    assert 0.23 < sum(kept) / len(kept) < 0.27
    assert encode_threshold(threshold_for(0.25)) == "c"  # OTel: 25 % keeps randomness >= 0xc000...
    assert encode_threshold(threshold_for(1.0)) == "0"


def test_rolling_quantile_tracks_the_window():
    now = [0.0]
    window = RollingQuantile(window_s=10.0, clock=lambda: now[0])
    assert window.quantile(0.99) is None
    for i in range(1000):
        window.add(0.1 + (i % 100) / 1000)  # 0.1 .. 0.199
    p50 = window.quantile(0.5)
    assert 0.14 <= p50 <= 0.17
    now[0] = 25.0  # the window has passed: old values no longer count
    window.add(5.0)
    assert window.quantile(0.5) >= 5.0


def test_rolling_quantile_expires_one_slice_at_a_time():
    """A slice leaves the window when its position is reused; newer slices keep counting."""
    now = [0.0]
    window = RollingQuantile(window_s=10.0, slices=10, clock=lambda: now[0])
    for _ in range(100):
        window.add(1.0)  # slice 0
    now[0] = 5.0
    for _ in range(100):
        window.add(0.01)  # slice 5
    now[0] = 9.9
    assert window.quantile(0.99) >= 1.0 and window.total == 200
    now[0] = 10.5  # slice 10 reuses slice 0's position: the 1.0 values expire, the 0.01 values stay
    assert window.quantile(0.99) < 0.02 and window.total == 100
    now[0] = 15.5  # slice 15 reuses slice 5's position
    assert window.quantile(0.99) is None and window.total == 0


def test_rolling_quantile_expires_slices_left_behind_by_an_idle_period():
    """After a pause, slices older than the window expire even though their positions were not
    reused; slices still inside the window stay."""
    now = [0.0]
    window = RollingQuantile(window_s=10.0, slices=10, clock=lambda: now[0])
    for _ in range(100):
        window.add(1.0)  # slice 0, position 0
    now[0] = 5.0
    for _ in range(100):
        window.add(0.01)  # slice 5, position 5
    now[0] = 14.5  # slice 14 takes position 4: slice 0 is out of the window without being overwritten
    assert window.quantile(0.99) < 0.02 and window.total == 100


def test_slowest_keeps_new_extremes_and_few_of_steady_traffic():
    policy = SlowestPolicy(["ttft"], 0.99, window_s=600)
    rng = random.Random(5)
    kept = sum(policy.matches(trace(), [record(ttft=rng.uniform(0.1, 0.2))]) for _ in range(5000))
    assert kept < 5000 * 0.03  # ~1 % plus the warm-up's new maxima
    assert policy.matches(trace(), [record(ttft=4.0)])  # 20x the rest
    assert not policy.matches(trace(), [record(ttft=4.0, outcome=Outcome.ERROR)])  # errors are the errors policy's


def test_sampler_first_match_names_the_decision():
    config = config_from_dict({"processors": {"tail_sampling": {"policies": [
        {"name": "errors", "type": "errors"},
        {"name": "fast-slo", "type": "slo", "slo": {"thresholds": {"ttft": "500ms"}}},
        {"name": "none", "type": "probabilistic", "probabilistic": {"sampling_percentage": 0}}]}}})
    sampler = TailSampler(config.processors.tail_sampling)
    assert sampler.decide(trace(), [record(ttft=0.9, outcome=Outcome.ABORT)]).policy == "errors"
    decision = sampler.decide(trace(), [record(ttft=0.9)])
    assert decision.keep and decision.policy == "fast-slo" and decision.threshold == "0"
    assert not sampler.decide(trace(), [record(ttft=0.1)]).keep
