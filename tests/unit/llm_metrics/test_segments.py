"""``derive_timings`` and ``build_segments`` on their own: validation bounds, tolerances, derivations,
and every engine's waterfall with exact names and nanosecond boundaries.

The waterfalls of vLLM and TGI start from the OTLP/JSON spans in ``testdata/`` (read by ``classify``);
the rules' edge cases use ``EngineObservation`` directly, since that is the module's input. Expected
boundaries are sums of the durations put in (DESIGN.md §4), never the code's output.
"""

from __future__ import annotations

import math

import pytest

from otel_llm.pdata.observation import EngineKind, EngineObservation, MalformedSpan
from otel_llm.processor.llm_metrics.adapters.engines import classify
from otel_llm.processor.llm_metrics.segments import build_segments, derive_timings
from tests.unit.llm_metrics.test_adapters import L, load

START = 1_767_225_600_000_000_000
MAX = 86400.0
ABS_TOL = 1e-3  # DESIGN.md §4: a millisecond ...
REL_TOL = 0.01  # ... or 1 % of e2e


def ns(seconds: float) -> int:
    return round(seconds * 1e9)


def obs(kind: str = EngineKind.VLLM, **kw) -> EngineObservation:
    return EngineObservation(kind, "test", **kw)


def waterfall(o: EngineObservation, start: int = START) -> list[tuple[str, int, int]]:
    return [(s.name, s.start_unix_ns - start, s.end_unix_ns - start)
            for s in build_segments(start, derive_timings(o, MAX))]


def reason(o: EngineObservation, max_latency: float = MAX) -> str:
    with pytest.raises(MalformedSpan) as raised:
        derive_timings(o, max_latency)
    return raised.value.reason


# --- validation --------------------------------------------------------------------------------


@pytest.mark.parametrize("field", ["ttft_s", "e2e_s", "queue_s", "prefill_s", "decode_s", "inference_s",
                                   "preprocess_s", "tpot_s"])
def test_every_latency_is_checked(field):
    assert reason(obs(**{field: -0.5})) == "negative_latency"
    assert reason(obs(**{field: math.nan})) == "nan_latency"
    assert reason(obs(**{field: math.inf})) == "infinite_latency"
    assert reason(obs(**{field: 100.5}), max_latency=100.0) == "absurd_latency"


def test_zero_values_are_accepted():
    t = derive_timings(obs(ttft_s=0.0, e2e_s=0.0, queue_s=0.0, prefill_s=0.0, decode_s=0.0, inference_s=0.0,
                           tpot_s=0.0), MAX)
    assert (t.ttft_s, t.e2e_s, t.queue_s, t.prefill_s, t.decode_s, t.inference_s) == (0.0,) * 6
    assert t.preprocess_s == 0.0 and t.postprocess_s == 0.0 and t.tpot_s == 0.0


def test_the_maximum_itself_is_accepted():
    assert derive_timings(obs(e2e_s=100.0), 100.0).e2e_s == 100.0


@pytest.mark.parametrize("field", ["prompt_tokens", "completion_tokens"])
def test_token_bounds(field):
    for ok in (0, 1, 100_000_000):
        derive_timings(obs(**{field: ok}), MAX)
    for bad in (-1, 100_000_001):
        assert reason(obs(**{field: bad})) == "absurd_token_count"


def test_absent_values_stay_absent():
    t = derive_timings(obs(), MAX)
    assert all(v is None for v in (t.ttft_s, t.e2e_s, t.queue_s, t.prefill_s, t.decode_s, t.inference_s,
                                   t.preprocess_s, t.postprocess_s, t.tpot_s))
    assert build_segments(START, t) == ()


# --- tolerance: a millisecond absolute, or 1 % of e2e -------------------------------------------------


def test_absolute_tolerance_on_a_short_request():
    # e2e 10 ms: 1 % is 0.1 ms, so only the absolute millisecond lets 0.8 ms of rounding through
    t = derive_timings(obs(ttft_s=0.002, e2e_s=0.010, decode_s=0.0088), MAX)
    assert t.postprocess_s == 0.0
    t = derive_timings(obs(ttft_s=0.002, e2e_s=0.010, decode_s=0.0093), MAX)  # 1.3 ms over: two clocks
    assert t.postprocess_s is None and t.not_measurable == ("postprocess",) and t.decode_s == 0.0093


def test_relative_tolerance_on_a_long_request():
    # e2e 10 s: 1 % + 1 ms = 101 ms; 50 ms over is rounding, 150 ms over is not
    assert derive_timings(obs(ttft_s=1.0, e2e_s=10.0, decode_s=9.05), MAX).postprocess_s == 0.0
    assert derive_timings(obs(ttft_s=1.0, e2e_s=10.0, decode_s=9.15), MAX).not_measurable == ("postprocess",)
    assert derive_timings(obs(ttft_s=10.05, e2e_s=10.0), MAX).ttft_s == 10.05
    assert reason(obs(ttft_s=10.15, e2e_s=10.0)) == "inconsistent_latency"


def test_tolerance_bounds_are_inclusive():
    e2e = 2.0
    at_bound = e2e + (ABS_TOL + REL_TOL * e2e)
    assert derive_timings(obs(ttft_s=at_bound, e2e_s=e2e), MAX).ttft_s == at_bound
    assert derive_timings(obs(ttft_s=0.001, e2e_s=0.0), MAX).ttft_s == 0.001
    # without e2e the tolerance is the absolute millisecond alone; exactly that far is still accepted
    t = derive_timings(obs(ttft_s=0.0, queue_s=0.0, prefill_s=0.001), MAX)
    assert t.preprocess_s == 0.0
    t = derive_timings(obs(ttft_s=0.0, e2e_s=0.0, decode_s=0.001), MAX)
    assert t.postprocess_s == 0.0
    assert derive_timings(obs(e2e_s=0.0, queue_s=0.001), MAX).e2e_s == 0.0


def test_without_e2e_only_the_absolute_tolerance_applies():
    assert derive_timings(obs(ttft_s=0.5, queue_s=0.2, prefill_s=0.3008), MAX).preprocess_s == 0.0
    t = derive_timings(obs(ttft_s=0.5, queue_s=0.2, prefill_s=0.305), MAX)  # 5 ms over
    assert t.preprocess_s is None and t.not_measurable == ("preprocess",)


def test_queue_and_prefill_beyond_ttft_leave_preprocess_not_measurable():
    # queue and prefill are the engine core's, ttft the API server's: the request is measured, its
    # preprocess is not measurable
    t = derive_timings(obs(ttft_s=0.5, e2e_s=1.0, queue_s=0.3, prefill_s=0.3, decode_s=0.5), MAX)
    assert (t.ttft_s, t.queue_s, t.prefill_s, t.preprocess_s, t.postprocess_s) == (0.5, 0.3, 0.3, None, 0.0)
    assert t.not_measurable == ("preprocess",)
    # the waterfall starts at the span's start: the queue drawn is what fits before the prefill
    assert waterfall(obs(ttft_s=0.5, e2e_s=1.0, queue_s=0.3, prefill_s=0.3, decode_s=0.5)) == [
        ("queue", 0, ns(0.2)), ("prefill", ns(0.2), ns(0.5)), ("decode", ns(0.5), ns(1.0))]
    t = derive_timings(obs(ttft_s=0.5, e2e_s=1.0, queue_s=0.2, prefill_s=0.305), MAX)  # within 11 ms
    assert t.preprocess_s == 0.0


def test_segments_sum_beyond_e2e_leaves_postprocess_not_measurable():
    # no ttft: preprocess + queue + inference is checked against e2e instead
    for kw in (dict(preprocess_s=0.1, queue_s=0.5, inference_s=0.5), dict(preprocess_s=0.6, queue_s=0.5),
               dict(inference_s=1.2)):
        t = derive_timings(obs(e2e_s=1.0, **kw), MAX)
        assert t.not_measurable == ("postprocess",) and t.e2e_s == 1.0 and t.postprocess_s is None
    t = derive_timings(obs(e2e_s=1.0, preprocess_s=0.1, queue_s=0.4, inference_s=0.505), MAX)
    assert t.postprocess_s is None and t.inference_s == 0.505


def test_ttft_above_e2e_is_inconsistent():
    assert reason(obs(ttft_s=3.0, e2e_s=2.0)) == "inconsistent_latency"


# --- derivations ------------------------------------------------------------------------------------


def test_inference_is_prefill_plus_decode_when_absent():
    t = derive_timings(obs(ttft_s=0.5, e2e_s=3.0, queue_s=0.2, prefill_s=0.25, decode_s=2.4), MAX)
    assert t.inference_s == pytest.approx(0.25 + 2.4)


def test_reported_inference_is_kept():
    t = derive_timings(obs(ttft_s=0.5, e2e_s=3.0, queue_s=0.2, prefill_s=0.25, decode_s=2.4, inference_s=2.7), MAX)
    assert t.inference_s == 2.7


def test_inference_needs_both_prefill_and_decode():
    assert derive_timings(obs(prefill_s=0.25), MAX).inference_s is None
    assert derive_timings(obs(decode_s=0.25), MAX).inference_s is None


def test_preprocess_and_postprocess_are_what_the_phases_leave():
    t = derive_timings(obs(ttft_s=0.5, e2e_s=3.0, queue_s=0.2, prefill_s=0.25, decode_s=2.4), MAX)
    assert t.preprocess_s == pytest.approx(0.5 - 0.2 - 0.25)
    assert t.postprocess_s == pytest.approx(3.0 - 0.5 - 2.4)


def test_reported_preprocess_is_kept():
    t = derive_timings(obs(ttft_s=0.5, e2e_s=3.0, queue_s=0.2, prefill_s=0.25, preprocess_s=0.01), MAX)
    assert t.preprocess_s == 0.01


def test_preprocess_needs_ttft_queue_and_prefill():
    for missing in ("ttft_s", "queue_s", "prefill_s"):
        kw = dict(ttft_s=0.5, queue_s=0.2, prefill_s=0.25)
        del kw[missing]
        assert derive_timings(obs(**kw), MAX).preprocess_s is None, missing


def test_postprocess_needs_e2e_ttft_and_decode():
    for missing in ("ttft_s", "e2e_s", "decode_s"):
        kw = dict(ttft_s=0.5, e2e_s=3.0, decode_s=2.4)
        del kw[missing]
        assert derive_timings(obs(**kw), MAX).postprocess_s is None, missing


def test_tpot_from_decode_and_completion_tokens():
    assert derive_timings(obs(decode_s=1.0, completion_tokens=2), MAX).tpot_s == 1.0
    assert derive_timings(obs(decode_s=1.0, completion_tokens=5), MAX).tpot_s == 0.25
    assert derive_timings(obs(decode_s=1.0, completion_tokens=1), MAX).tpot_s == 0.0  # vLLM: 0 below two tokens
    assert derive_timings(obs(decode_s=1.0), MAX).tpot_s is None
    assert derive_timings(obs(completion_tokens=5), MAX).tpot_s is None


def test_reported_tpot_is_kept():
    assert derive_timings(obs(decode_s=1.0, completion_tokens=5, tpot_s=0.3), MAX).tpot_s == 0.3


def test_observation_is_not_changed():
    o = obs(ttft_s=0.5, e2e_s=3.0, queue_s=0.2, prefill_s=0.25, decode_s=2.4)
    derive_timings(o, MAX)
    assert o.inference_s is None and o.preprocess_s is None


# --- waterfalls ---------------------------------------------------------------------------------------


def test_vllm_waterfall_from_its_span():
    spans, attrs = load("vllm")
    a = attrs["b7ad6b7169203331"]
    o, _ = classify(spans["b7ad6b7169203331"])
    ttft, e2e = 0.5, a[L + "e2e"]  # ttft: the first token_generated event
    q, p, d = a[L + "time_in_queue"], a[L + "time_in_model_prefill"], a[L + "time_in_model_decode"]
    assert waterfall(o) == [
        ("preprocess", 0, ns(ttft) - ns(p) - ns(q)),
        ("queue", ns(ttft) - ns(p) - ns(q), ns(ttft) - ns(p)),
        ("prefill", ns(ttft) - ns(p), ns(ttft)),
        ("decode", ns(ttft), ns(ttft) + ns(d)),
        ("postprocess", ns(ttft) + ns(d), ns(e2e)),
    ]


def test_tgi_waterfall_from_its_span():
    spans, _ = load("tgi")
    o, _ = classify(spans["5555555555555555"])
    validation, queue, inference, total = 0.0015, 0.2505, 1.5485, 1.85  # the span's Duration texts
    assert waterfall(o) == [
        ("preprocess", 0, ns(validation)),
        ("queue", ns(validation), ns(validation) + ns(queue)),
        ("inference", ns(validation) + ns(queue), ns(validation) + ns(queue) + ns(inference)),
        ("postprocess", ns(validation) + ns(queue) + ns(inference), ns(total)),
    ]


def test_tgi_waterfall_without_validation_time_or_inference():
    assert waterfall(obs(EngineKind.TGI, e2e_s=1.0, preprocess_s=0.0, queue_s=0.25, inference_s=0.7)) == [
        ("queue", 0, ns(0.25)), ("inference", ns(0.25), ns(0.95)), ("postprocess", ns(0.95), ns(1.0))]
    assert waterfall(obs(EngineKind.TGI, e2e_s=1.0, preprocess_s=0.1, queue_s=0.25)) == [
        ("preprocess", 0, ns(0.1)), ("queue", ns(0.1), ns(0.35)), ("postprocess", ns(0.35), ns(1.0))]


def test_tgi_waterfall_ending_at_e2e_has_no_postprocess():
    assert waterfall(obs(EngineKind.TGI, e2e_s=1.0, preprocess_s=0.1, queue_s=0.2, inference_s=0.7)) == [
        ("preprocess", 0, ns(0.1)), ("queue", ns(0.1), ns(0.3)), ("inference", ns(0.3), ns(1.0))]


def test_decode_needs_a_first_token():
    # TGI-like timings plus a decode but no ttft: no decode segment, postprocess from the queue's end
    assert waterfall(obs(EngineKind.TGI, e2e_s=1.0, preprocess_s=0.0, queue_s=0.25, decode_s=0.5)) == [
        ("queue", 0, ns(0.25)), ("postprocess", ns(0.25), ns(1.0))]


def test_sglang_waterfall():
    ttft, prefill, decode, e2e = 0.4, 0.15, 1.5, 2.0
    assert waterfall(obs(EngineKind.SGLANG, ttft_s=ttft, prefill_s=prefill, decode_s=decode, e2e_s=e2e)) == [
        ("queue", 0, ns(ttft) - ns(prefill)),
        ("prefill", ns(ttft) - ns(prefill), ns(ttft)),
        ("decode", ns(ttft), ns(ttft) + ns(decode)),
        ("postprocess", ns(ttft) + ns(decode), ns(e2e)),
    ]


def test_sglang_waterfall_with_prefill_from_the_start():
    assert waterfall(obs(EngineKind.SGLANG, ttft_s=0.4, prefill_s=0.4, decode_s=1.6, e2e_s=2.0)) == [
        ("prefill", 0, ns(0.4)), ("decode", ns(0.4), ns(2.0))]
    # a prefill reported longer than ttft starts at the request's arrival, not before it
    assert waterfall(obs(EngineKind.SGLANG, ttft_s=0.4, prefill_s=0.45, e2e_s=2.0)) == [
        ("prefill", 0, ns(0.4)), ("postprocess", ns(0.4), ns(2.0))]


def test_vllm_waterfall_with_queue_and_prefill_past_ttft_is_clamped():
    # queue 0.2 + prefill 0.3005 > ttft 0.5 by 0.5 ms (within tolerance): the queue starts at arrival
    assert waterfall(obs(ttft_s=0.5, e2e_s=1.0, queue_s=0.2, prefill_s=0.3005, decode_s=0.5)) == [
        ("queue", 0, ns(0.5) - ns(0.3005)), ("prefill", ns(0.5) - ns(0.3005), ns(0.5)),
        ("decode", ns(0.5), ns(1.0))]
    # prefill alone past ttft: an empty queue at arrival, prefill from arrival to the first token
    assert waterfall(obs(ttft_s=0.5, e2e_s=1.0, queue_s=0.0, prefill_s=0.5004, decode_s=0.5)) == [
        ("queue", 0, 0), ("prefill", 0, ns(0.5)), ("decode", ns(0.5), ns(1.0))]


def test_zero_queue_and_prefill_are_kept():
    assert waterfall(obs(ttft_s=0.5, e2e_s=1.0, queue_s=0.0, prefill_s=0.0, decode_s=0.5)) == [
        ("preprocess", 0, ns(0.5)), ("queue", ns(0.5), ns(0.5)), ("prefill", ns(0.5), ns(0.5)),
        ("decode", ns(0.5), ns(1.0))]


def test_e2e_alone_gives_no_segments():
    assert waterfall(obs(e2e_s=2.0)) == []
    assert waterfall(obs(EngineKind.TGI, e2e_s=2.0, inference_s=1.0)) == []


def test_whole_seconds_are_exact_nanoseconds():
    assert waterfall(obs(EngineKind.TGI, e2e_s=7.0, preprocess_s=1.0, queue_s=2.0, inference_s=3.0)) == [
        ("preprocess", 0, 1_000_000_000), ("queue", 1_000_000_000, 3_000_000_000),
        ("inference", 3_000_000_000, 6_000_000_000), ("postprocess", 6_000_000_000, 7_000_000_000)]


def test_segments_start_at_the_given_start():
    other = START + 123
    assert waterfall(obs(EngineKind.SGLANG, ttft_s=0.4, prefill_s=0.1, decode_s=1.0, e2e_s=2.0), start=other) == \
        waterfall(obs(EngineKind.SGLANG, ttft_s=0.4, prefill_s=0.1, decode_s=1.0, e2e_s=2.0))


def test_queue_or_preprocess_alone_is_no_waterfall():
    # trtllm-serve without a measured ttft: a queue but neither a first token nor a validation time
    assert waterfall(obs(EngineKind.TRTLLM, e2e_s=2.0, queue_s=0.3)) == []
    assert waterfall(obs(EngineKind.TGI, e2e_s=2.0, preprocess_s=0.3, inference_s=1.0)) == []


def test_decode_without_earlier_phases_starts_at_the_first_token():
    # ttft, decode and e2e only (SGLang's root before its stage spans are read, vLLM without phase keys):
    # nothing is known before the first token, and decode still runs from it, not from the arrival
    ttft, decode, e2e = 0.4, 1.5, 2.0
    assert waterfall(obs(EngineKind.SGLANG, ttft_s=ttft, decode_s=decode, e2e_s=e2e)) == [
        ("decode", ns(ttft), ns(ttft) + ns(decode)), ("postprocess", ns(ttft) + ns(decode), ns(e2e))]


def test_timings_are_immutable_and_slotted():
    """Derived again wherever needed, never changed in place; slots, since it is made per request."""
    t = derive_timings(obs(e2e_s=1.0), MAX)
    with pytest.raises(AttributeError):  # a frozen dataclass or a named tuple: either refuses
        t.e2e_s = 2.0  # type: ignore[misc]
    assert not hasattr(t, "__dict__")


def test_long_requests_are_exact_to_the_nanosecond():
    """Minutes-long requests (a long decode): every boundary is the sum of the durations, to the ns."""
    ttft, q, p, d, e2e = 30.0, 12.0, 9.0, 400.0, 431.0
    assert waterfall(obs(ttft_s=ttft, e2e_s=e2e, queue_s=q, prefill_s=p, decode_s=d)) == [
        ("preprocess", 0, ns(ttft) - ns(p) - ns(q)),
        ("queue", ns(ttft) - ns(p) - ns(q), ns(ttft) - ns(p)),
        ("prefill", ns(ttft) - ns(p), ns(ttft)),
        ("decode", ns(ttft), ns(ttft) + ns(d)),
        ("postprocess", ns(ttft) + ns(d), ns(e2e)),
    ]
    assert waterfall(obs(EngineKind.SGLANG, ttft_s=ttft, prefill_s=p, decode_s=d, e2e_s=e2e)) == [
        ("queue", 0, ns(ttft) - ns(p)),
        ("prefill", ns(ttft) - ns(p), ns(ttft)),
        ("decode", ns(ttft), ns(ttft) + ns(d)),
        ("postprocess", ns(ttft) + ns(d), ns(e2e)),
    ]
    assert waterfall(obs(ttft_s=ttft, e2e_s=e2e, decode_s=d)) == [
        ("decode", ns(ttft), ns(ttft) + ns(d)), ("postprocess", ns(ttft) + ns(d), ns(e2e))]


def test_the_first_bad_value_names_the_reason_whatever_the_good_ones_before_it():
    # A zero and the maximum itself are valid: the reason is the later value's, not theirs.
    assert reason(obs(ttft_s=0.0, e2e_s=MAX * 2)) == "absurd_latency"
    assert reason(obs(ttft_s=MAX, e2e_s=math.nan)) == "nan_latency"
    assert reason(obs(prompt_tokens=0, completion_tokens=-1)) == "absurd_token_count"
    # Every latency invalid at once is still refused.
    nan = math.nan
    assert reason(obs(ttft_s=nan, e2e_s=nan, queue_s=nan, prefill_s=nan, decode_s=nan, inference_s=nan,
                      preprocess_s=nan, tpot_s=nan)) == "nan_latency"
