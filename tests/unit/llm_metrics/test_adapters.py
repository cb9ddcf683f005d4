"""``classify`` per engine, one span at a time: what each adapter reads off a real OTLP span.

Inputs are OTLP protobuf spans, either parsed from the OTLP/JSON files in ``testdata/`` or built
here with ``tests.support.engine_fixtures``; every expected value is the number or string put into
the span (read back from the JSON document, or written twice below), never the adapter's output.
Key names and engine facts: ``tests/testdata/engines/FACTS.md`` and ``shared/research/engine-spans.md``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

from otel_llm.pdata.observation import EngineKind, MalformedSpan, Part
from otel_llm.processor.llm_metrics.adapters import engines
from otel_llm.processor.llm_metrics.adapters.engines import classify
from otel_llm.receiver.otlp.otlpjson import parse_otlp_json
from tests.support import engine_fixtures as F

TESTDATA = Path(__file__).parent / "testdata"
SERVER, CLIENT, INTERNAL = Span.SPAN_KIND_SERVER, Span.SPAN_KIND_CLIENT, Span.SPAN_KIND_INTERNAL
ERROR, OK = Status.STATUS_CODE_ERROR, Status.STATUS_CODE_OK
T0 = 1_767_225_600_000_000_000
L = "gen_ai.latency."


# --- inputs -------------------------------------------------------------------------------------


def load(name: str) -> tuple[dict[str, Span], dict[str, dict[str, Any]]]:
    """The testdata file ``name``: its spans by span id (hex), and each span's JSON attributes as values."""
    raw = (TESTDATA / f"{name}.json").read_bytes()
    spans = {s.span_id.hex(): s for s in F.all_spans(parse_otlp_json(raw))}
    attrs: dict[str, dict[str, Any]] = {}
    for rs in json.loads(raw)["resourceSpans"]:
        for ss in rs["scopeSpans"]:
            for span in ss["spans"]:
                attrs[span["spanId"]] = {a["key"]: _json_value(a["value"]) for a in span["attributes"]}
    return spans, attrs


def _json_value(value: dict[str, Any]) -> Any:
    (kind, v), = value.items()
    if kind == "intValue":
        return int(v)
    if kind == "arrayValue":
        return [_json_value(x) for x in v["values"]]
    return v


def span(name: str, kind: int = SERVER, attrs: dict[str, Any] | None = None, *, start_s: float = 0.0,
         end_s: float = 1.0, events: tuple[tuple[str, float], ...] = (), status: int = Status.STATUS_CODE_UNSET,
         dropped_events: int = 0, start_ns: int | None = None, end_ns: int | None = None) -> Span:
    s = F.make_span(name, trace=F.trace_id(name), sid=F.span_id(name), parent=None, kind=kind,
                    start_ns=T0 + round(start_s * 1e9) if start_ns is None else start_ns,
                    end_ns=T0 + round(end_s * 1e9) if end_ns is None else end_ns,
                    attrs=attrs, events=[F.event(n, T0 + round(t * 1e9)) for n, t in events], status_code=status)
    s.dropped_events_count = dropped_events
    return s


def obs_of(s: Span):
    obs, _ = classify(s)
    assert obs is not None
    return obs


def reason_of(s: Span) -> str:
    with pytest.raises(MalformedSpan) as raised:
        classify(s)
    return raised.value.reason


# --- vLLM ---------------------------------------------------------------------------------------


def test_vllm_v1_reads_every_key():
    spans, attrs = load("vllm")
    a = attrs["b7ad6b7169203331"]
    obs, attr_map = classify(spans["b7ad6b7169203331"])
    assert set(attr_map) == set(a)
    assert (obs.engine_kind, obs.adapter, obs.provider_name) == (EngineKind.VLLM, "vllm_v1", "vllm")
    assert obs.e2e_s == a[L + "e2e"] and obs.queue_s == a[L + "time_in_queue"]
    assert obs.prefill_s == a[L + "time_in_model_prefill"] and obs.decode_s == a[L + "time_in_model_decode"]
    assert obs.inference_s == a[L + "time_in_model_inference"]
    assert obs.prompt_tokens == a["gen_ai.usage.prompt_tokens"]
    assert obs.completion_tokens == a["gen_ai.usage.completion_tokens"]
    assert obs.max_tokens == a["gen_ai.request.max_tokens"]
    assert obs.cached_tokens == a["gen_ai.usage.cache_read.input_tokens"]
    assert obs.request_model == a["gen_ai.request.model"] and obs.response_model == a["gen_ai.response.model"]
    assert obs.finish_reason == a["gen_ai.response.finish_reasons"][0]
    assert obs.operation_name == a["gen_ai.operation.name"]
    assert obs.server_address == a["server.address"] and obs.server_port == str(a["server.port"])
    assert (obs.is_error, obs.error_type, obs.may_be_gateway, obs.part) == (False, None, False, "")
    # token_generated events at 0.5, 0.7, 0.9, 1.1 s after the start: exact TTFT and three 0.2 s steps
    assert obs.ttft_s == 0.5  # whole nanoseconds: exact
    assert obs.itl_s == (0.2, 0.2, 0.2)


def test_vllm_v0_with_renamed_token_keys_and_json_finish_reason():
    spans, attrs = load("vllm")
    a = attrs["00f067aa0ba902b7"]
    obs = obs_of(spans["00f067aa0ba902b7"])
    assert obs.adapter == "vllm_v0"
    assert obs.ttft_s == a[L + "time_to_first_token"] and obs.e2e_s == a[L + "e2e"]
    assert obs.prompt_tokens == a["gen_ai.usage.input_tokens"]  # vllm#40799: input_tokens
    assert obs.completion_tokens == a["gen_ai.usage.output_tokens"]
    assert obs.finish_reason == json.loads(a["gen_ai.response.finish_reasons"])[0]
    assert obs.itl_s == ()
    for absent in ("queue_s", "prefill_s", "decode_s", "inference_s", "max_tokens", "request_model",
                   "response_model", "operation_name", "server_address", "server_port", "cached_tokens"):
        assert getattr(obs, absent) is None, absent


def test_vllm_error_status_is_an_error_with_its_type():
    spans, attrs = load("vllm")
    obs = obs_of(spans["53995c3f42cd8ad8"])
    assert obs.adapter == "vllm_v1"  # "{operation} {model}" SERVER span with vLLM's phase keys (vllm#47633)
    assert obs.is_error is True and obs.error_type == attrs["53995c3f42cd8ad8"]["error.type"]


def test_error_status_without_error_type_is_other():
    obs = obs_of(span("llm_request", attrs={L + "e2e": 1.0, L + "time_in_model_inference": 0.5}, status=ERROR))
    assert obs.is_error is True and obs.error_type == "_OTHER"
    ok = obs_of(span("llm_request", attrs={L + "e2e": 1.0, L + "time_in_model_inference": 0.5,
                                           "error.type": "ignored"}, status=OK))
    assert ok.is_error is False and ok.error_type is None


def test_vllm_old_token_keys_win_over_new_ones():
    obs = obs_of(span("llm_request", attrs={L + "e2e": 1.0, L + "time_in_model_inference": 0.5,
                                            "gen_ai.usage.prompt_tokens": 7, "gen_ai.usage.input_tokens": 9,
                                            "gen_ai.usage.completion_tokens": 3, "gen_ai.usage.output_tokens": 4}))
    assert (obs.prompt_tokens, obs.completion_tokens) == (7, 3)


def test_vllm_prefill_alone_makes_v1():
    obs = obs_of(span("llm_request", attrs={L + "e2e": 1.0, L + "time_in_model_prefill": 0.25}))
    assert obs.adapter == "vllm_v1" and obs.prefill_s == 0.25 and obs.inference_s is None


@pytest.mark.parametrize("key,value,reason", [
    ("gen_ai.usage.prompt_tokens", 1.5, "non_integer_tokens"),
    ("gen_ai.usage.completion_tokens", "many", "non_integer_tokens"),
    ("gen_ai.request.max_tokens", True, "non_integer_tokens"),
    (L + "time_to_first_token", "soon", "non_numeric_latency"),
    (L + "time_in_queue", True, "non_numeric_latency"),
])
def test_vllm_unusable_values_are_malformed_with_reason(key, value, reason):
    attrs = {L + "e2e": 1.0, L + "time_in_model_inference": 0.5, key: value}
    assert reason_of(span("llm_request", attrs=attrs)) == reason


def test_vllm_span_without_e2e_is_malformed():
    assert reason_of(span("llm_request", attrs={L + "time_to_first_token": 0.1})) == "missing_latency"


def test_whole_float_token_counts_are_accepted():
    obs = obs_of(span("llm_request", attrs={L + "e2e": 1.0, L + "time_in_model_inference": 0.5,
                                            "gen_ai.usage.prompt_tokens": 12.0}))
    assert obs.prompt_tokens == 12


# vLLM token events (vllm#32573) ------------------------------------------------------------------


def _evented(events, **kw) -> Span:
    return span("llm_request", attrs={L + "e2e": 2.0, L + "time_in_model_inference": 1.0,
                                      L + "time_to_first_token": 0.9}, end_s=2.0, events=events, **kw)


def test_token_events_give_exact_ttft_and_steps():
    obs = obs_of(_evented((("token_scheduled", 0.2), ("token_generated", 0.3), ("token_scheduled", 0.4),
                           ("token_generated", 0.6), ("token_generated", 1.0))))
    assert obs.ttft_s == 0.3  # the event, not the attribute's 0.9
    assert obs.itl_s == (0.3, 0.4)


def test_other_events_leave_the_attribute_ttft():
    obs = obs_of(_evented((("some.other.event", 0.3),)))
    assert obs.ttft_s == 0.9 and obs.itl_s == ()


def test_events_at_the_span_bounds_are_in_order():
    obs = obs_of(_evented((("token_generated", 0.0), ("token_generated", 0.0), ("token_generated", 2.0))))
    assert obs.ttft_s == 0.0 and obs.itl_s == pytest.approx((0.0, 2.0))


@pytest.mark.parametrize("events,reason", [
    ((("token_scheduled", 0.2),), "missing_event"),
    ((("token_generated", 0.5), ("token_generated", 0.4)), "out_of_order_events"),
    ((("token_generated", 0.5), ("token_generated", 2.1)), "out_of_order_events"),
])
def test_unusable_token_events(events, reason):
    assert reason_of(_evented(events)) == reason


def test_event_before_the_start_is_out_of_order():
    s = _evented((("token_generated", 0.5),))
    s.events[0].time_unix_nano = T0 - 1
    assert reason_of(s) == "out_of_order_events"


def test_open_ended_span_accepts_late_events():
    obs = obs_of(_evented((("token_generated", 0.5), ("token_generated", 3.0)), end_ns=0))
    assert obs.itl_s == pytest.approx((2.5,))


def test_steps_are_dropped_when_the_sdk_dropped_events():
    obs = obs_of(_evented((("token_generated", 0.5), ("token_generated", 0.7)), dropped_events=1))
    assert obs.ttft_s == pytest.approx(0.5) and obs.itl_s == ()


def test_steps_are_kept_below_the_event_limit_and_dropped_at_it():
    below = tuple(("token_generated", 0.1 + i * 0.01) for i in range(127))
    assert len(obs_of(_evented(below)).itl_s) == 126
    at = tuple(("token_generated", 0.1 + i * 0.01) for i in range(128))
    obs = obs_of(_evented(at))
    assert obs.itl_s == () and obs.ttft_s == pytest.approx(0.1)


# finish reasons ----------------------------------------------------------------------------------


def _finish(value: Any) -> Span:
    return span("llm_request", attrs={L + "e2e": 1.0, L + "time_in_model_inference": 0.5,
                                      "gen_ai.response.finish_reasons": value})


@pytest.mark.parametrize("value,first", [('["stop"]', "stop"), ('["length", "stop"]', "length"), ("[]", None),
                                         (["abort", "stop"], "abort"), ([], None)])
def test_finish_reason_is_the_first_of_an_array_or_json_string(value, first):
    assert obs_of(_finish(value)).finish_reason == first
    assert obs_of(_finish(value)).finish_reason == first  # the second reading comes from the cache


def test_finish_reason_cache_stays_small():
    engines._FINISH_CACHE.clear()
    long_text = json.dumps(["x" * 61])  # 65 characters
    assert obs_of(_finish(long_text)).finish_reason == "x" * 61
    assert long_text not in engines._FINISH_CACHE  # texts over 64 characters are not kept
    exactly = json.dumps(["y" * 60])  # 64 characters with the brackets and quotes
    assert len(exactly) == 64
    obs_of(_finish(exactly))
    assert exactly in engines._FINISH_CACHE
    engines._FINISH_CACHE.clear()
    for i in range(300):
        assert obs_of(_finish(json.dumps([f"r{i}"]))).finish_reason == f"r{i}"
    assert len(engines._FINISH_CACHE) == 256
    engines._FINISH_CACHE.clear()


# --- trtllm-serve -----------------------------------------------------------------------------------


def test_trtllm_by_kv_key_with_derived_phases():
    ttft, e2e, queue, kv = 0.4, 1.5, 0.1, 0.02
    obs = obs_of(span("llm_request", attrs={
        L + "time_to_first_token": ttft, L + "e2e": e2e, L + "time_in_queue": queue,
        L + "kv_cache_transfer_time": kv, "gen_ai.usage.input_tokens": 10, "gen_ai.usage.prompt_tokens": 99,
        "gen_ai.usage.output_tokens": 20, "gen_ai.request.max_tokens": 30, "gen_ai.request.model": "trt-m",
        "gen_ai.response.model": "trt-r", "gen_ai.response.finish_reasons": ["length"]}, status=ERROR))
    assert (obs.engine_kind, obs.adapter, obs.provider_name) == (EngineKind.TRTLLM, "trtllm", "trtllm")
    assert (obs.ttft_s, obs.e2e_s, obs.queue_s) == (ttft, e2e, queue)
    assert obs.prefill_s == pytest.approx(ttft - queue) and obs.decode_s == pytest.approx(e2e - ttft)
    assert obs.derived == ("prefill", "decode")
    assert obs.mark("kv_transfer_s") == kv
    assert (obs.prompt_tokens, obs.completion_tokens, obs.max_tokens) == (10, 20, 30)
    assert (obs.request_model, obs.response_model, obs.finish_reason) == ("trt-m", "trt-r", "length")
    assert obs.is_error and obs.error_type == "_OTHER"


def test_trtllm_by_queue_without_vllm_phases_and_not_measured_values():
    obs = obs_of(span("llm_request", attrs={L + "time_to_first_token": -1.0, L + "e2e": 2.0,
                                            L + "time_in_queue": 0.3, "gen_ai.usage.prompt_tokens": 8}))
    assert obs.adapter == "trtllm"
    assert obs.ttft_s is None and obs.queue_s == 0.3 and obs.e2e_s == 2.0
    assert obs.prefill_s is None and obs.decode_s is None and obs.derived == () and obs.marks == ()
    assert obs.prompt_tokens == 8 and obs.finish_reason is None and not obs.is_error


def test_trtllm_without_queue_derives_decode_only():
    obs = obs_of(span("llm_request", attrs={L + "time_to_first_token": 0.5, L + "e2e": 2.0,
                                            L + "kv_cache_transfer_time": -1.0}))
    assert obs.adapter == "trtllm" and obs.queue_s is None and obs.prefill_s is None
    assert obs.decode_s == pytest.approx(1.5) and obs.derived == ("decode",) and obs.marks == ()


def test_trtllm_queue_equal_to_ttft_is_a_zero_prefill():
    obs = obs_of(span("llm_request", attrs={L + "time_to_first_token": 0.5, L + "e2e": 2.0, L + "time_in_queue": 0.5}))
    assert obs.prefill_s == 0.0


@pytest.mark.parametrize("attrs,reason", [
    ({L + "e2e": -1.0, L + "time_in_queue": 0.3}, "not_measured"),
])
def test_trtllm_unusable(attrs, reason):
    assert reason_of(span("llm_request", attrs=attrs)) == reason


@pytest.mark.parametrize("phase", ["time_in_model_prefill", "time_in_model_decode", "time_in_scheduler",
                                   "time_in_model_forward", "time_in_model_execute"])
def test_any_vllm_phase_key_means_vllm_not_trtllm(phase):
    obs = obs_of(span("llm_request", attrs={L + "e2e": 2.0, L + "time_in_queue": 0.3, L + phase: 0.1}))
    assert obs.adapter in ("vllm_v0", "vllm_v1") and obs.engine_kind == EngineKind.VLLM


def test_operation_model_server_span_by_its_attributes():
    trt = obs_of(span("chat m", attrs={L + "e2e": 2.0, L + "time_in_queue": 0.3}))
    assert trt.adapter == "trtllm"
    v = obs_of(span("chat m", attrs={L + "e2e": 2.0, L + "time_to_first_token": 0.2,
                                     "gen_ai.operation.name": "chat"}))
    assert v.adapter == "vllm_v0" and v.operation_name == "chat" and v.ttft_s == 0.2
    pre = obs_of(span("chat m", attrs={L + "e2e": 2.0, L + "time_in_model_prefill": 0.2}))
    assert pre.adapter == "vllm_v1"
    # SERVER, e2e, nothing of vLLM or trtllm: SGLang's shape
    assert obs_of(span("chat m", attrs={L + "e2e": 2.0})).adapter == "sglang"


# --- SGLang -----------------------------------------------------------------------------------------


def test_sglang_root_reads_every_key():
    spans, attrs = load("sglang")
    a = attrs["1111111111111111"]
    obs = obs_of(spans["1111111111111111"])
    assert (obs.engine_kind, obs.adapter, obs.provider_name) == (EngineKind.SGLANG, "sglang", "sglang")
    assert obs.ttft_s == a[L + "time_to_first_token"] and obs.e2e_s == a[L + "e2e"]
    assert obs.decode_s == a[L + "time_in_model_decode"] and obs.queue_s is None
    assert obs.prefill_s is None and obs.inference_s is None  # SGLang's "prefill" holds the queue
    assert obs.mark("dispatch_to_first_token_s") == a[L + "time_in_model_prefill"]
    assert obs.prompt_tokens == a["gen_ai.usage.prompt_tokens"]
    assert obs.completion_tokens == a["gen_ai.usage.completion_tokens"]
    assert obs.cached_tokens == a["gen_ai.usage.cached_tokens"] and obs.max_tokens == a["gen_ai.request.max_tokens"]
    assert obs.request_model == a["gen_ai.request.model"] and obs.response_model == a["gen_ai.response.model"]
    assert obs.finish_reason == "stop" and not obs.is_error and obs.error_type is None


def test_sglang_abort_is_not_an_error():
    spans, attrs = load("sglang")
    obs = obs_of(spans["2222222222222222"])
    assert obs.adapter == "sglang" and obs.finish_reason == "abort"
    assert obs.is_error is False and obs.error_type is None
    assert obs.completion_tokens == attrs["2222222222222222"]["gen_ai.usage.output_tokens"] == 0
    assert obs.marks == () and obs.ttft_s is None


def test_sglang_abort_with_error_status_stays_an_error():
    obs = obs_of(span("sglang Req 1", INTERNAL, {L + "e2e": 0.2, "gen_ai.response.finish_reasons": '["abort"]',
                                                "error.type": "Aborted"}, status=ERROR))
    assert obs.finish_reason == "abort" and obs.is_error is True and obs.error_type == "Aborted"


def test_sglang_error_by_module_attribute():
    spans, attrs = load("sglang")
    obs = obs_of(spans["3333333333333333"])
    assert obs.adapter == "sglang" and obs.e2e_s is None
    assert obs.is_error is True and obs.error_type == attrs["3333333333333333"]["error.type"]


def test_sglang_stage_span_is_a_part_read_without_attributes():
    spans, _ = load("sglang")
    obs, attrs = classify(spans["4444444444444444"])
    assert attrs == {}
    assert (obs.engine_kind, obs.adapter, obs.part) == (EngineKind.SGLANG, "sglang_stage", Part.SGLANG_STAGE)
    assert obs.mark("stage") == "prefill_forward"


SGLANG_STAGE_NAMES = [  # SGLang 0.5.23 RequestStage (tests/testdata/engines/sglang/README.md)
    "tokenize", "api_server_dispatch", "dpc_dispatch", "request_process", "prefill_waiting", "prefill_forward",
    "chunked_prefill", "decode_waiting", "decode_forward", "decode_loop", "prefill_prepare", "prefill_bootstrap",
    "prefill_transfer_kv_cache", "decode_prepare", "decode_bootstrap", "decode_transferred", "fake_output",
    "quick_finish"]


@pytest.mark.parametrize("stage", SGLANG_STAGE_NAMES)
def test_every_sglang_stage_is_a_part(stage):
    obs = obs_of(span(stage, INTERNAL))
    assert obs.part == Part.SGLANG_STAGE and obs.marks == ("stage", stage)


def test_stage_name_on_a_server_span_is_not_a_stage():
    obs, _ = classify(span("decode_loop", SERVER, {"x": 1}))
    assert obs is None


def test_sglang_non_streaming_without_metrics_has_no_ttft_or_decode():
    obs = obs_of(span("sglang Req 2", INTERNAL, {L + "e2e": 1.0, L + "time_to_first_token": 1.0,
                                                L + "time_in_model_decode": 0.0, "gen_ai.usage.output_tokens": 2}))
    assert obs.ttft_s is None and obs.decode_s is None and obs.completion_tokens == 2


@pytest.mark.parametrize("decode,tokens", [(0.0, 1), (0.0, None), (0.5, 9)])
def test_sglang_keeps_ttft_and_decode_otherwise(decode, tokens):
    attrs = {L + "e2e": 1.0, L + "time_to_first_token": 0.4, L + "time_in_model_decode": decode}
    if tokens is not None:
        attrs["gen_ai.usage.completion_tokens"] = tokens
    obs = obs_of(span("sglang Req 3", INTERNAL, attrs))
    assert obs.ttft_s == 0.4 and obs.decode_s == decode and obs.completion_tokens == tokens


def test_sglang_output_tokens_win_and_queue_is_read():
    obs = obs_of(span("sglang Req 4", INTERNAL, {L + "e2e": 1.0, L + "time_in_queue": 0.05,
                                                "gen_ai.usage.output_tokens": 5, "gen_ai.usage.completion_tokens": 6,
                                                "gen_ai.usage.input_tokens": 3, "gen_ai.usage.prompt_tokens": 4}))
    assert (obs.queue_s, obs.completion_tokens, obs.prompt_tokens) == (0.05, 5, 3)


def test_req_in_the_name_is_not_enough_without_sglang_keys():
    obs, _ = classify(span("my Req thing", INTERNAL, {"module": "other"}))
    assert obs is None
    assert classify(span("myReqthing", INTERNAL, {L + "e2e": 1.0}))[0] is None  # needs " Req " with spaces


# --- TGI ------------------------------------------------------------------------------------------------


def test_tgi_chat_handler():
    spans, attrs = load("tgi")
    obs = obs_of(spans["5555555555555555"])
    assert (obs.engine_kind, obs.adapter, obs.provider_name) == (EngineKind.TGI, "tgi", "tgi")
    assert obs.operation_name == "chat"
    # "1.85s", "1.5ms", "250.5ms", "1.5485s"
    assert obs.e2e_s == pytest.approx(1.85) and obs.preprocess_s == pytest.approx(0.0015)
    assert obs.queue_s == pytest.approx(0.2505) and obs.inference_s == pytest.approx(1.5485)
    assert not obs.is_error and obs.error_type is None
    assert obs.ttft_s is None and obs.decode_s is None and obs.prefill_s is None


def test_tgi_generate_handler_is_a_text_completion():
    spans, _ = load("tgi")
    obs = obs_of(spans["6666666666666666"])
    assert obs.operation_name == "text_completion"
    assert obs.e2e_s == pytest.approx(0.9) and obs.preprocess_s == 0.0 and obs.queue_s == pytest.approx(1e-4)


def test_tgi_failed_request_and_inner_span():
    spans, _ = load("tgi")
    failed = obs_of(spans["7777777777777777"])  # ERROR, no fields: TGI records them only on success
    assert failed.is_error is True and failed.error_type == "_OTHER" and failed.e2e_s is None
    inner, attrs = classify(spans["8888888888888888"])  # same name, no fields, no error: an inner span
    assert inner is None and attrs == {}


def test_tgi_error_with_fields_keeps_its_type():
    obs = obs_of(span("generate", INTERNAL, {"total_time": "2s", "error.type": "validation"}, status=ERROR))
    assert obs.is_error and obs.error_type == "validation" and obs.e2e_s == 2.0


@pytest.mark.parametrize("handler,operation", [("generate", "text_completion"), ("generate_stream", "text_completion"),
                                               ("chat_completions", "chat"), ("completions", "text_completion"),
                                               ("compat_generate", "text_completion")])
def test_every_tgi_handler(handler, operation):
    obs = obs_of(span(handler, INTERNAL, {"total_time": "10ms", "queue_time": "1ms"}))
    assert obs.adapter == "tgi" and obs.operation_name == operation and obs.e2e_s == pytest.approx(0.01)


@pytest.mark.parametrize("key", ["total_time", "validation_time", "queue_time", "inference_time"])
def test_unparsable_tgi_durations(key):
    attrs = {"total_time": "1s", key: "1.5 fortnights"}
    assert reason_of(span("generate", INTERNAL, attrs)) == "unparsable_duration"


def test_tgi_handler_name_with_e2e_is_not_tgi():
    obs = obs_of(span("generate", INTERNAL, {L + "e2e": 1.0, "total_time": "garbage"}))
    assert obs.adapter == "sglang"


# --- GenAI semconv ----------------------------------------------------------------------------------------


def test_genai_client_span_with_provider_fallback():
    spans, attrs = load("genai")
    a = attrs["9999999999999999"]
    obs = obs_of(spans["9999999999999999"])
    assert (obs.engine_kind, obs.adapter, obs.may_be_gateway) == (EngineKind.GENAI, "genai", True)
    assert obs.provider_name == a["gen_ai.system"]  # no gen_ai.provider.name: the older key
    assert obs.operation_name == a["gen_ai.operation.name"]
    assert obs.request_model == a["gen_ai.request.model"] and obs.response_model == a["gen_ai.response.model"]
    assert obs.prompt_tokens == a["gen_ai.usage.input_tokens"] and obs.completion_tokens == a["gen_ai.usage.output_tokens"]
    assert obs.max_tokens == a["gen_ai.request.max_tokens"]
    assert obs.finish_reason == a["gen_ai.response.finish_reasons"][0]
    assert obs.server_address == a["server.address"] and obs.server_port == str(a["server.port"])
    assert obs.ttft_s == a["gen_ai.server.time_to_first_token"]
    assert obs.e2e_s is None and not obs.is_error


def test_genai_internal_workflow_span():
    spans, attrs = load("genai")
    a = attrs["aaaaaaaaaaaaaaaa"]
    obs = obs_of(spans["aaaaaaaaaaaaaaaa"])
    assert obs.adapter == "genai" and obs.operation_name == "invoke_workflow"
    assert obs.provider_name == a["gen_ai.provider.name"]  # the semconv key wins over gen_ai.system
    assert obs.ttft_s == a["gen_ai.response.time_to_first_chunk"]  # the client's key wins
    assert obs.prompt_tokens == a["gen_ai.usage.prompt_tokens"]  # input_tokens absent: the older key
    assert obs.completion_tokens is None and obs.finish_reason is None and obs.server_address is None


def test_plain_internal_span_is_never_read():
    spans, _ = load("genai")
    obs, attrs = classify(spans["bbbbbbbbbbbbbbbb"])
    assert obs is None and attrs == {}


def test_genai_empty_provider_falls_back_and_none_without_either():
    obs = obs_of(span("chat m", CLIENT, {"gen_ai.operation.name": "chat", "gen_ai.provider.name": "",
                                         "gen_ai.system": "anthropic"}))
    assert obs.provider_name == "anthropic"
    assert obs_of(span("chat m", CLIENT, {"gen_ai.request.model": "m"})).provider_name is None


@pytest.mark.parametrize("key", ["gen_ai.operation.name", "gen_ai.request.model", "gen_ai.response.model"])
def test_any_genai_key_claims_a_client_span(key):
    obs = obs_of(span("call", CLIENT, {key: "x"}))
    assert obs.adapter == "genai"


def test_client_span_without_genai_keys_is_passed_through():
    obs, attrs = classify(span("GET /", CLIENT, {"http.method": "GET"}))
    assert obs is None and set(attrs) == {"http.method"}


def test_genai_error_status():
    obs = obs_of(span("chat m", CLIENT, {"gen_ai.operation.name": "chat", "error.type": "RateLimitError"},
                      status=ERROR))
    assert obs.is_error and obs.error_type == "RateLimitError"


@pytest.mark.parametrize("operation", ["chat", "text_completion", "embeddings", "generate_content", "execute_tool",
                                       "invoke_agent", "create_agent", "invoke_workflow", "retrieval"])
def test_internal_genai_spans_by_operation_name(operation):
    obs = obs_of(span(f"{operation} thing", INTERNAL, {"gen_ai.operation.name": operation}))
    assert obs.adapter == "genai" and obs.operation_name == operation
    assert obs_of(span(operation, INTERNAL, {"gen_ai.operation.name": operation})).adapter == "genai"


def test_litellm_internal_span_is_genai():
    obs = obs_of(span("litellm_request", INTERNAL, {"gen_ai.request.model": "gpt-4o", "gen_ai.system": "openai"}))
    assert obs.adapter == "genai" and obs.provider_name == "openai"


@pytest.mark.parametrize("name", ["llm_request", "http-request", "engine.generate", "prefill", "decode",
                                  "llm_d.pd_proxy.prefill", "llm_d.pd_proxy.decode"])
def test_internal_engine_names_are_read(name):
    """INTERNAL spans of these names are read (TGI's handler names: test_every_tgi_handler)."""
    obs = obs_of(span(name, INTERNAL, {"gen_ai.request.model": "m"}))
    assert obs.adapter == "genai" and obs.request_model == "m"


# --- Triton -----------------------------------------------------------------------------------------------


def test_triton_root():
    s = span("InferRequest", SERVER, {}, start_s=0.0, end_s=0.5,
             events=(("HTTP_RECV_END", 0.001), ("INFER_RESPONSE_COMPLETE", 0.3), ("INFER_RESPONSE_COMPLETE", 0.2),
                     ("HTTP_RECV_END", 0.002), ("INFER_RESPONSE_COMPLETE", 0.4)))
    obs = obs_of(s)
    assert (obs.engine_kind, obs.adapter, obs.provider_name) == (EngineKind.TRITON, "triton", "triton")
    assert obs.e2e_s == 0.5 and not obs.is_error and obs.error_type is None
    assert obs.marks == ("HTTP_RECV_END", T0 + 1_000_000, "first_response", T0 + 200_000_000, "responses", 3)


def test_triton_root_grpc_error_without_responses():
    obs = obs_of(span("InferRequest", SERVER, {}, end_s=0.1, events=(("GRPC_WAITREAD_END", 0.01),), status=ERROR))
    assert obs.is_error and obs.error_type == "_OTHER"
    assert obs.marks == ("GRPC_WAITREAD_END", T0 + 10_000_000)


def test_triton_root_zero_duration_and_invalid_times():
    assert obs_of(span("InferRequest", SERVER, {}, start_s=0.2, end_s=0.2)).e2e_s == 0.0
    assert reason_of(span("InferRequest", SERVER, {}, start_s=0.2, end_s=0.1)) == "invalid_span_times"
    assert reason_of(span("InferRequest", SERVER, {}, start_ns=0, end_ns=5)) == "invalid_span_times"


def test_triton_model_span():
    s = span("ensemble_model", SERVER, {"triton.model_name": "llama", "triton.trace_parent_id": "7"},
             events=(("REQUEST_START", 0.1), ("QUEUE_START", 0.11), ("IGNORED", 0.12), ("QUEUE_START", 0.13),
                     ("REQUEST_END", 0.5)))  # a repeated event: its first time counts
    obs = obs_of(s)
    assert (obs.engine_kind, obs.adapter, obs.part) == (EngineKind.TRITON, "triton_model", Part.TRITON_MODEL)
    assert obs.marks == ("model", "llama", "parent_id", "7", "REQUEST_START", T0 + 100_000_000,
                         "QUEUE_START", T0 + 110_000_000, "REQUEST_END", T0 + 500_000_000)


def test_triton_compute_span():
    s = span("compute", SERVER, {}, events=(("COMPUTE_START", 0.1), ("COMPUTE_INPUT_END", 0.2),
                                            ("COMPUTE_OUTPUT_START", 0.3), ("COMPUTE_END", 0.4)))
    obs = obs_of(s)
    assert (obs.adapter, obs.part) == ("triton_compute", Part.TRITON_COMPUTE)
    assert obs.marks == ("COMPUTE_START", T0 + 100_000_000, "COMPUTE_INPUT_END", T0 + 200_000_000,
                         "COMPUTE_OUTPUT_START", T0 + 300_000_000, "COMPUTE_END", T0 + 400_000_000)
    assert classify(span("compute", SERVER, {}, events=(("OTHER", 0.1),)))[0] is None
    assert classify(span("compute", SERVER, {}))[0] is None
    assert classify(span("compute", SERVER, {"a": 1}, events=(("COMPUTE_START", 0.1),)))[0] is None


# --- Dynamo ------------------------------------------------------------------------------------------------


def test_dynamo_root():
    s = span("http-request", INTERNAL, {"ttft_ms": 250.0, "avg_itl_ms": 12.5, "input_tokens": 40, "output_tokens": 9,
                                        "model": "dyn-m", "request.outcome": "success",
                                        "prefill_worker_id": "p1", "decode_worker_id": 42}, end_s=1.25)
    obs = obs_of(s)
    assert (obs.engine_kind, obs.adapter, obs.provider_name) == (EngineKind.DYNAMO, "dynamo", "dynamo")
    assert obs.ttft_s == pytest.approx(0.25) and obs.tpot_s == pytest.approx(0.0125)
    assert obs.e2e_s == 1.25
    assert (obs.prompt_tokens, obs.completion_tokens, obs.request_model) == (40, 9, "dyn-m")
    assert obs.finish_reason is None and not obs.is_error
    assert obs.marks == ("prefill_worker_id", "p1", "decode_worker_id", "42")


def test_dynamo_root_cancelled_without_timings():
    obs = obs_of(span("http-request", INTERNAL, {"request.outcome": "cancelled", "error.type": "x"}, status=ERROR))
    assert obs.finish_reason == "cancelled" and obs.ttft_s is None and obs.tpot_s is None and obs.marks == ()
    assert obs.is_error and obs.error_type == "x"


def test_dynamo_root_needs_its_keys():
    assert classify(span("http-request", INTERNAL, {"model": "m"}))[0] is None
    assert obs_of(span("http-request", INTERNAL, {"ttft_ms": 1.0})).adapter == "dynamo"


def test_dynamo_worker():
    obs = obs_of(span("engine.generate", INTERNAL, {"disagg_role": "prefill", "ttft_ms": 80.0, "finish_reason": "stop"}))
    assert (obs.engine_kind, obs.adapter, obs.part) == (EngineKind.DYNAMO, "dynamo_worker", Part.DYNAMO_WORKER)
    assert obs.marks == ("role", "prefill", "ttft_s", pytest.approx(0.08), "finish_reason", "stop")
    bare = obs_of(span("engine.generate", INTERNAL, {"disagg_role": "decode"}))
    assert bare.marks == ("role", "decode", "ttft_s", None, "finish_reason", None)
    assert classify(span("engine.generate", INTERNAL, {"x": "y"}))[0] is None


# --- llm-d ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [True, "true"])
def test_llmd_forward_request(value):
    obs = obs_of(span("forward_request", SERVER, {"llm_d.pd_proxy.disaggregation_used": value}))
    assert (obs.engine_kind, obs.adapter, obs.part) == (EngineKind.LLM_D, "llm-d", "")


@pytest.mark.parametrize("value", [False, "false", "yes"])
def test_llmd_forward_request_without_disaggregation(value):
    assert classify(span("forward_request", SERVER, {"llm_d.pd_proxy.disaggregation_used": value}))[0] is None
    assert classify(span("forward_request", SERVER, {"other": True}))[0] is None


def test_llmd_orchestration():
    obs = obs_of(span("gateway.request_orchestration", SERVER, {"target_model": "m-7b"}))
    assert (obs.adapter, obs.part, obs.marks) == ("llm-d_orchestration", Part.LLMD_ORCHESTRATION, ("target_model", "m-7b"))
    assert classify(span("gateway.request_orchestration", SERVER, {"x": 1}))[0] is None


@pytest.mark.parametrize("name,role", [("prefill", "prefill"), ("decode", "decode"),
                                       ("llm_d.pd_proxy.prefill", "prefill"), ("llm_d.pd_proxy.decode", "decode")])
def test_llmd_proxy_spans(name, role):
    obs = obs_of(span(name, INTERNAL, {"llm_d.pd_proxy.connector": "nixl"}))
    assert (obs.engine_kind, obs.adapter, obs.part, obs.marks) == (EngineKind.LLM_D, "llm-d_proxy", Part.LLMD_PROXY,
                                                                   ("role", role))
    assert classify(span(name, INTERNAL, {"x": 1}))[0] is None


def test_older_completion_token_key_is_the_fallback():
    genai = obs_of(span("chat m", CLIENT, {"gen_ai.operation.name": "chat", "gen_ai.usage.completion_tokens": 11}))
    assert genai.completion_tokens == 11
    trt = obs_of(span("llm_request", attrs={L + "e2e": 2.0, L + "kv_cache_transfer_time": 0.01,
                                            "gen_ai.usage.completion_tokens": 12}))
    assert trt.adapter == "trtllm" and trt.completion_tokens == 12


@pytest.mark.parametrize("text,seconds", [("250\u03bcs", 250e-6), ("250\u00b5s", 250e-6), ("250us", 250e-6),
                                          ("2.5ms", 2.5e-3), ("3s", 3.0), ("7ns", 7e-9)])
def test_tgi_duration_units(text, seconds):
    """Rust's Debug text writes the micro sign U+00B5; the Greek mu U+03BC and "us" are accepted too."""
    obs = obs_of(span("generate", INTERNAL, {"total_time": "4s", "queue_time": text}))
    assert obs.queue_s == pytest.approx(seconds, rel=1e-12)
