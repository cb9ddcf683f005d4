"""Every engine shape of issue 14 through a running otel-llm: the fixtures of
``tests/support/engine_fixtures.py`` (built from the engines' source, FACTS.md) and SGLang 0.5.23's own
captures, POSTed as OTLP/HTTP, scraped from /metrics.

Expected values are computed here from each fixture's input timings (the timeline its docstring
states) or, for SGLang, from the captured stage spans themselves, never from otel-llm's code. Every
histogram of both namings is checked bucket by bucket; malformed and partial variants are counted in
``otel_llm_spans_malformed_total{reason}`` and in no histogram; an ensemble, a BLS model and every
disaggregated request count exactly once.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from otel_llm.processor.llm_metrics.digest import AttributeLimits, DigestSettings, digest_in_process
from otel_llm.processor.llm_metrics.requests import RecordSettings, records_of_trace
from otel_llm.processor.redaction.synthesis import kept_trace_request
from otel_llm.pdata.spans import PendingTrace
from tests.support import engine_fixtures as F
from tests.support.captures import earliest_start_ns, post, shifted
from tests.support.workload import (
    GENAI_DURATION_BUCKETS,
    GENAI_TPOT_BUCKETS,
    GENAI_TTFT_BUCKETS,
    LATENCY_BUCKETS,
    TOKEN_BUCKETS,
    TPOT_BUCKETS,
    TTFT_BUCKETS,
    expected_cumulative,
)

SGLANG = Path(__file__).parent / "testdata" / "engines" / "sglang"
SGLANG_CAPTURES = ["normal_stream", "normal_nonstream", "normal_nonstream_metrics", "abort_waiting", "abort_running",
                   "multi_tokenizer_router_traced", "multi_tokenizer_router_untraced"]
FAILED = {"abort", "error"}
OUTCOMES = {"stop": "stop", "length": "length", "abort": "abort"}


@dataclass
class Expected:
    """One request as the test derives it from its input."""

    model: str
    engine_kind: str
    service: str
    provider: str
    outcome: str = "unknown"
    ttft: float | None = None
    tpot: float | None = None
    e2e: float | None = None
    queue: float | None = None
    prefill: float | None = None
    decode: float | None = None
    inference: float | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    itl: list[float] = field(default_factory=list)
    segments: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # README (model_name.from_service_name, on by default): an engine's request whose spans name
        # no model is labelled with the service name its user set.
        if not self.model and self.engine_kind != "genai" and not self.service.startswith("unknown_service"):
            self.model = self.service


def _own_trace(req: ExportTraceServiceRequest, seed: str) -> ExportTraceServiceRequest:
    """The variants share their builders' default seeds: one trace id each, so each is one request."""
    trace = F.trace_id("variant:" + seed)
    for span in F.all_spans(req):
        span.trace_id = trace
    return req


def _with_service(req: ExportTraceServiceRequest, name: str) -> ExportTraceServiceRequest:
    for resource_spans in req.resource_spans:
        for kv in resource_spans.resource.attributes:
            if kv.key == "service.name":
                kv.value.string_value = name
    return req


# --- the cases, each with what it must give ---------------------------------------------------


def _vllm_case(name: str, *, model: str, pre: float, q: float, p: float, steps: tuple[float, ...], detok: float,
               finish: str = "stop", **kwargs) -> tuple[ExportTraceServiceRequest, Expected]:
    req = F.vllm_request_span(model=model, preprocess_s=pre, queue_s=q, prefill_s=p, decode_steps=steps,
                              detokenize_s=detok, finish_reasons=(finish,), seed=name, t0_ns=time.time_ns(), **kwargs)
    ttft = pre + q + p
    decode = sum(steps)
    completion = 1 + len(steps)
    token_events = kwargs.get("token_events", True)
    truncated = 2 * (1 + len(steps)) >= 128
    named = kwargs.get("span_name_style", "operation_model") == "operation_model"
    return req, Expected(
        model=model if named else "", engine_kind="vllm", service="vllm", provider="vllm", outcome=OUTCOMES[finish],
        ttft=ttft, e2e=ttft + decode + detok, queue=q, prefill=p, decode=decode, inference=p + decode,
        tpot=decode / (completion - 1), prompt_tokens=32, completion_tokens=completion,
        itl=list(steps) if token_events and not truncated else [],
        segments={"preprocess": pre, "queue": q, "prefill": p, "decode": decode, "postprocess": detok})


def _triton_case(name: str, *, protocol: str, first_response_s: float, streamed: bool
                 ) -> tuple[ExportTraceServiceRequest, Expected]:
    overhead, queue, inp, engine, out, release, send = 0.0003, 0.0023, 0.0004, 0.4123, 0.0002, 0.0003, 0.0004
    req = F.triton_request(model=name, protocol=protocol, overhead_s=overhead, queue_s=queue, input_s=inp,
                           engine_s=engine, output_s=out, release_s=release, send_s=send,
                           first_response_s=first_response_s, n_responses=12, seed=name, t0_ns=time.time_ns())
    _with_service(req, name)
    # The root starts at the end of the network read; REQUEST_START follows after ``overhead``.
    return req, Expected(
        model=name, engine_kind="triton", service=name, provider="triton",
        e2e=overhead + queue + inp + engine + out + release + send, queue=queue,
        ttft=overhead + first_response_s if streamed else None,
        segments={"preprocess": overhead, "queue": queue, "compute": inp + engine + out, "postprocess": release + send})


def _ensemble_case() -> tuple[ExportTraceServiceRequest, Expected]:
    steps = (("preprocessing", 0.0005, 0.003), ("tensorrt_llm", 0.0021, 0.4012), ("postprocessing", 0.0003, 0.002))
    req = F.triton_ensemble(ensemble="ens", steps=steps, first_response_s=0.0707, seed="ens", t0_ns=time.time_ns())
    _with_service(req, "triton-ensemble")
    recv, ens_start = 0.0005, 0.0008  # the builder's timeline
    cursor = ens_start + 0.0001
    intervals = {}
    for model, q, c in steps:
        intervals[model] = (cursor, cursor + q, cursor + q + c)  # request start, compute start, compute end
        cursor = cursor + q + c + 0.0002 + 0.0001
    send_end = cursor + 0.0004
    rs, cs, ce = intervals["tensorrt_llm"]
    return req, Expected(
        model="ens", engine_kind="triton", service="triton-ensemble", provider="triton",
        e2e=send_end - recv, queue=cs - rs, ttft=ens_start + 0.0707 - recv,
        segments={"preprocess": rs - recv, "queue": cs - rs, "compute": ce - cs, "postprocess": send_end - ce})


def _bls_case() -> tuple[ExportTraceServiceRequest, Expected]:
    child_s = 0.3011
    req = F.triton_bls(children=2, child_engine_s=child_s, seed="bls", t0_ns=time.time_ns())
    _with_service(req, "triton-bls")
    recv = 0.0005
    req_start = recv + 0.0003
    c_start = req_start + 0.001
    cursor = c_start + 0.002
    for _ in range(2):
        cursor = cursor + 0.001 + child_s + 0.0002 + 0.001
    c_end = cursor
    send_end = c_end + 0.0002 + 0.0004
    # One HTTP response after the final batch: unary, no TTFT.
    return req, Expected(
        model="tensorrt_llm_bls", engine_kind="triton", service="triton-bls", provider="triton",
        e2e=send_end - recv, queue=c_start - req_start,
        segments={"preprocess": req_start - recv, "queue": c_start - req_start, "compute": c_end - c_start,
                  "postprocess": send_end - c_end})


def _trtllm_cases() -> list[tuple[ExportTraceServiceRequest, Expected]]:
    q, ttft, e2e = 0.0151, 0.0812, 0.6123
    single = F.trtllm_serve_span(queue_s=q, ttft_s=ttft, e2e_s=e2e, seed="trt-a", service="trtllm-a",
                                 t0_ns=time.time_ns())
    # prefill and decode are derived (ttft - queue, e2e - ttft); inference = their sum.
    single_expected = Expected(
        model="", engine_kind="trtllm", service="trtllm-a", provider="trtllm", outcome="stop", ttft=ttft, e2e=e2e,
        queue=q, prefill=ttft - q, decode=e2e - ttft, inference=e2e - q, tpot=(e2e - ttft) / 31, prompt_tokens=64,
        completion_tokens=32, segments={"queue": q, "prefill": ttft - q, "decode": e2e - ttft})
    ctx_ttft, gen_q, kv, gen_e2e = 0.0903, 0.0041, 0.0123, 0.5012
    disagg = F.trtllm_serve_disaggregated(ctx_ttft_s=ctx_ttft, gen_queue_s=gen_q, kv_transfer_s=kv,
                                          gen_e2e_s=gen_e2e, seed="trt-d", t0_ns=time.time_ns())
    ctx_start, gen_start = 0.001, 0.001 + ctx_ttft + 0.002
    gen_ttft = gen_q + kv + 0.001
    disagg_expected = Expected(
        model="", engine_kind="trtllm", service="trtllm-serve-gen", provider="trtllm", outcome="stop",
        ttft=gen_start + gen_ttft - ctx_start, e2e=gen_start + gen_e2e - ctx_start, queue=0.006,
        prefill=ctx_ttft - 0.006, decode=gen_e2e - gen_ttft, tpot=(gen_e2e - gen_ttft) / 31, prompt_tokens=64,
        completion_tokens=32,
        segments={"queue": 0.006, "prefill": ctx_ttft - 0.006, "kv_transfer": kv, "decode": gen_e2e - gen_ttft})
    partial = F.trtllm_serve_span(not_measured=("gen_ai.latency.time_to_first_token",), seed="trt-c",
                                  service="trtllm-c", t0_ns=time.time_ns())
    # −1 = not measured: no TTFT and nothing derived from it; e2e and queue still measured.
    partial_expected = Expected(model="", engine_kind="trtllm", service="trtllm-c", provider="trtllm", outcome="stop",
                                e2e=0.6, queue=0.015, prompt_tokens=64, completion_tokens=32)
    return [(single, single_expected), (disagg, disagg_expected), (partial, partial_expected)]


def _dynamo_cases() -> list[tuple[ExportTraceServiceRequest, Expected]]:
    pre, route, prefill, kv, decode, out = 0.003, 0.001, 0.080, 0.010, 0.400, 40
    agg = F.dynamo_request(model="dyn-agg", seed="dyn-a", preprocess_s=pre, route_s=route, prefill_s=prefill,
                           decode_s=decode, output_tokens=out, t0_ns=time.time_ns())
    ttft = pre + route + prefill
    e2e = ttft + decode + 0.001
    w_start = pre + route  # the worker: engine.generate from +0.2 ms to its end - 0.6 ms; ttft_ms = prefill
    eg_start, eg_end = w_start + 0.0002, e2e - 0.0006
    agg_expected = Expected(
        model="dyn-agg", engine_kind="dynamo", service="dynamo-frontend", provider="dynamo", outcome="stop",
        ttft=ttft, e2e=e2e, tpot=decode / (out - 1), decode=eg_end - (eg_start + prefill), prompt_tokens=48,
        completion_tokens=out,
        segments={"preprocess": eg_start, "queue_and_prefill": prefill, "decode": eg_end - (eg_start + prefill),
                  "postprocess": e2e - eg_end})
    dis = F.dynamo_request(model="dyn-dis", disaggregated=True, seed="dyn-d", preprocess_s=pre, route_s=route,
                           prefill_s=prefill, kv_transfer_s=kv, decode_s=decode, output_tokens=out,
                           t0_ns=time.time_ns())
    ttft = pre + route + prefill + kv + route
    e2e = ttft + decode + 0.001
    p_start = pre + route
    p_eg = (p_start + 0.0002, p_start + prefill - 0.0001)
    d_start = p_start + prefill + route
    d_eg = (d_start + 0.0002, e2e - 0.0006)
    first = d_eg[0] + kv + 0.0005  # the decode worker's ttft_ms
    dis_expected = Expected(
        model="dyn-dis", engine_kind="dynamo", service="dynamo-frontend", provider="dynamo", outcome="stop",
        ttft=ttft, e2e=e2e, tpot=decode / (out - 1), decode=d_eg[1] - first, prompt_tokens=48, completion_tokens=out,
        segments={"preprocess": p_eg[0], "queue_and_prefill": p_eg[1] - p_eg[0], "kv_transfer": first - p_eg[1],
                  "decode": d_eg[1] - first, "postprocess": e2e - d_eg[1]})
    return [(agg, agg_expected), (dis, dis_expected)]


def _llmd_cases() -> list[tuple[ExportTraceServiceRequest, Expected]]:
    epp, prefill, coord, decode = 0.004, 0.120, 0.002, 0.700
    side = epp + 0.0005
    p_start = side + 0.0003
    p_end = p_start + prefill
    d_start = p_end + coord
    d_end = d_start + decode
    gw_end = d_end + 0.0005 + 0.0003
    out = []
    for seed, connector in (("llmd-a", "nixlv2"), ("llmd-b", "mooncake")):
        req = F.llmd_disaggregated(model=seed, connector=connector, epp_s=epp, prefill_s=prefill,
                                   coordinator_s=coord, decode_s=decode, seed=seed, t0_ns=time.time_ns())
        # The prefill pod's vLLM: preprocess 2 ms, queue 3 ms, prefill = prefill - 7 ms, no decode step.
        pv_q, pv_p = 0.003, prefill - 0.007
        # The decode pod's: preprocess 2 ms, queue 4 ms, "prefill" (the KV load) 10 ms, 20 steps.
        dv_start, dv_q, dv_p, dv_decode = d_start + 0.0002, 0.004, 0.010, decode - 0.020
        first = dv_start + 0.002 + dv_q + dv_p
        out.append((req, Expected(
            model=seed, engine_kind="llm-d", service="llm-d-disagg-sidecar", provider="vllm", outcome="stop",
            ttft=first, e2e=gw_end, queue=pv_q + dv_q, prefill=pv_p, decode=dv_decode,
            inference=pv_p + dv_p + dv_decode, tpot=dv_decode / 20, prompt_tokens=32, completion_tokens=21,
            segments={"routing": p_start, "queue": pv_q, "prefill": pv_p, "decode_queue": dv_q, "kv_transfer": dv_p,
                      "decode": dv_decode, "postprocess": gw_end - (first + dv_decode)})))
    bare = F.llmd_disaggregated(model="llmd-c", vllm_spans=False, epp_s=epp, prefill_s=prefill, coordinator_s=coord,
                                decode_s=decode, seed="llmd-c", t0_ns=time.time_ns())
    out.append((bare, Expected(
        model="llmd-c", engine_kind="llm-d", service="llm-d-disagg-sidecar", provider="", e2e=gw_end,
        prefill=prefill, decode=decode,
        segments={"routing": p_start, "prefill": prefill, "coordination": coord, "decode": decode,
                  "postprocess": gw_end - d_end})))
    return out


def _capture(name: str) -> list[ExportTraceServiceRequest]:
    req = ExportTraceServiceRequest()
    req.ParseFromString((SGLANG / f"{name}.binpb").read_bytes())
    return [req]


def _dur(span) -> float:
    return (span.end_time_unix_nano - span.start_time_unix_nano) / 1e9


def _sglang_expected(name: str) -> Expected:
    """SGLang's own definitions (sglang/README.md): queue = prefill_waiting, prefill = prefill_forward,
    decode = decode_forward; ttft/e2e from the root; without stage spans queue/prefill are missing."""
    spans = F.all_spans(_capture(name)[0])
    root = next(s for s in spans if F.span_attrs(s).get("module") == "sglang::request")
    a = F.span_attrs(root)
    by: dict[str, list] = {}
    for s in spans:
        by.setdefault(s.name, []).append(s)
    reasons = json.loads(a.get("gen_ai.response.finish_reasons", "[]"))
    outcome = OUTCOMES.get(reasons[0], "unknown") if reasons else (
        "abort" if any(s.status.code == 2 for s in spans) else "unknown")
    completion = a.get("gen_ai.usage.completion_tokens")
    e = Expected(model=a.get("gen_ai.response.model", ""), engine_kind="sglang", service="sglang", provider="sglang",
                 outcome=outcome, e2e=a["gen_ai.latency.e2e"], prompt_tokens=a.get("gen_ai.usage.prompt_tokens"),
                 completion_tokens=completion)
    ttft = a.get("gen_ai.latency.time_to_first_token")
    attr_decode = a.get("gen_ai.latency.time_in_model_decode")
    if not (attr_decode == 0 and completion and completion > 1):
        e.ttft = ttft
    if "prefill_waiting" in by:
        e.queue = sum(_dur(s) for s in by["prefill_waiting"])
        e.prefill = sum(_dur(s) for s in by["prefill_forward"])
        e.decode = sum(_dur(s) for s in by["decode_forward"])
        e.inference = e.prefill + e.decode
        e.segments = {"queue": e.queue, "prefill": e.prefill, "decode": e.decode}
    elif ttft is not None:
        e.decode = attr_decode
        e.segments = {"queue_and_prefill": a["gen_ai.latency.time_in_model_prefill"], "decode": attr_decode}
    if e.decode is not None and completion and completion > 1:
        e.tpot = e.decode / (completion - 1)
    return e


# The PD fixture's timeline (F.sglang_pd_request defaults), in seconds from t0; both servers receive at t0.
PD = {"tokenize": 0.0030, "dispatch": 0.0004, "p_prepare": 0.0008, "p_bootstrap": 0.0060, "p_waiting": 0.0250,
      "p_forward": 0.0400, "kv": 0.0090, "d_prepare": 0.0007, "d_bootstrap": 0.0050, "d_waiting": 0.0030,
      "step": 0.011, "steps": 9, "return": 0.0015}


def _sglang_pd_case() -> tuple[ExportTraceServiceRequest, Expected]:
    d = PD
    handoff = d["tokenize"] + d["dispatch"]
    p_queued = handoff + d["p_prepare"] + d["p_bootstrap"]  # the prefill server's waiting queue
    p_done = p_queued + d["p_waiting"] + d["p_forward"]
    kv_done = p_done + d["kv"]
    d_forward = kv_done + 0.0002 + d["d_waiting"]  # KV arrived (+0.2 ms), then the decode side's queue
    decode = d["steps"] * d["step"]
    first = d_forward + d["step"] + d["return"]
    e2e = d_forward + decode + d["return"]
    req = F.sglang_pd_request(model="sglang-pd", t0_ns=time.time_ns())
    return req, Expected(
        model="sglang-pd", engine_kind="sglang", service="sglang-decode", provider="sglang", outcome="stop",
        ttft=first, e2e=e2e, queue=d["p_waiting"], prefill=d["p_forward"], decode=decode,
        inference=d["p_forward"] + decode, tpot=decode / d["steps"], prompt_tokens=420,
        completion_tokens=d["steps"] + 1,
        segments={"preprocess": p_queued, "queue": d["p_waiting"], "prefill": d["p_forward"], "kv_transfer": d["kv"],
                  "decode_queue": d["d_waiting"], "decode": decode, "postprocess": d["return"]})


def _cases() -> list[tuple[list[ExportTraceServiceRequest], Expected]]:
    cases: list[tuple[ExportTraceServiceRequest, Expected]] = [
        _vllm_case("vllm-new", model="m-vllm-new", pre=0.0042, q=0.0213, p=0.0517, steps=(0.0121, 0.0302, 0.0153),
                   detok=0.0011),
        _vllm_case("vllm-old", model="unused", pre=0.0042, q=0.0234, p=0.0456, steps=(0.0101,) * 5, detok=0.0012,
                   finish="length", span_name_style="llm_request", token_keys="old", finish_reasons_as="array",
                   token_events=False),
        _vllm_case("vllm-long", model="m-vllm-long", pre=0.0042, q=0.0213, p=0.0517, steps=(0.0011,) * 200,
                   detok=0.0011, token_keys="both"),
        _triton_case("trt-grpc-stream", protocol="grpc_stream", first_response_s=0.0612, streamed=True),
        _triton_case("trt-http-stream", protocol="http", first_response_s=0.0612, streamed=True),
        # The only response comes after the final batch: a unary call, no TTFT.
        _triton_case("trt-grpc-unary", protocol="grpc", first_response_s=0.0023 + 0.0004 + 0.4123 + 0.0001,
                     streamed=False),
        _ensemble_case(),
        _bls_case(),
        *_trtllm_cases(),
        *_dynamo_cases(),
        *_llmd_cases(),
        _sglang_pd_case(),
    ]
    out = [([req], expected) for req, expected in cases]
    for name in SGLANG_CAPTURES:
        requests = _capture(name)
        out.append((shifted(requests, time.time_ns() - earliest_start_ns(requests)), _sglang_expected(name)))
    return out


MALFORMED = {  # variant -> the reason it is counted under
    "triton_missing_queue_start": "missing_event",
    "triton_missing_compute_end": "missing_event",
    "triton_missing_compute_span": "missing_span",
    "triton_compute_before_queue": "out_of_order_events",
    "triton_response_before_request": "out_of_order_events",
    "trtllm_all_not_measured": "not_measured",
    "vllm_token_events_out_of_order": "out_of_order_events",
    "vllm_missing_first_token_event": "missing_event",
    "vllm_negative_queue": "negative_latency",
    "dynamo_negative_ttft": "negative_latency",
    "dynamo_missing_worker": "missing_span",
    "llmd_missing_decode": "missing_span",
}
# The variants' label sets (their builders' defaults), which no good case uses.
MALFORMED_LABELS = [
    {"engine_kind": "triton", "service_name": "triton-inference-server"},
    {"engine_kind": "trtllm", "service_name": "trtllm-serve"},
    {"engine_kind": "vllm", "model_name": "Qwen/Qwen3-0.6B"},
    {"engine_kind": "dynamo", "model_name": "Qwen/Qwen3-0.6B"},
    {"engine_kind": "llm-d", "model_name": "meta-llama/Llama-3.1-8B-Instruct"},
]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    from tests.support.otelllm import start_server

    server = start_server(str(tmp_path_factory.mktemp("store")),
                          {"processors": {"tail_sampling": {"decision_wait": "2s", "grace": "100ms"}}})
    try:
        cases = _cases()
        for requests, _ in cases:
            for request in requests:
                assert post(server, request) == 200
        for name in MALFORMED:
            assert post(server, _own_trace(F.MALFORMED_VARIANTS[name](), name)) == 200
        malformed_total = len(MALFORMED)
        scrape = server.wait_until(
            lambda s: s.value("otel_llm_requests_assembled_total") >= len(cases)
            and s.value("otel_llm_spans_malformed_total") >= malformed_total,
            what="every case assembled and every variant counted")
        yield server, [e for _, e in cases], scrape
    finally:
        server.stop()


VLLM_HISTOGRAMS = [
    ("vllm:time_to_first_token_seconds", "ttft", TTFT_BUCKETS, True),
    ("vllm:request_time_per_output_token_seconds", "tpot", TPOT_BUCKETS, True),
    ("vllm:e2e_request_latency_seconds", "e2e", LATENCY_BUCKETS, False),
    ("vllm:request_queue_time_seconds", "queue", LATENCY_BUCKETS, False),
    ("vllm:request_prefill_time_seconds", "prefill", LATENCY_BUCKETS, False),
    ("vllm:request_decode_time_seconds", "decode", LATENCY_BUCKETS, False),
    ("vllm:request_inference_time_seconds", "inference", LATENCY_BUCKETS, False),
    ("vllm:request_prompt_tokens", "prompt_tokens", TOKEN_BUCKETS, False),
    ("vllm:request_generation_tokens", "completion_tokens", TOKEN_BUCKETS, False),
    ("vllm:inter_token_latency_seconds", "itl", TPOT_BUCKETS, False),
]
GENAI_HISTOGRAMS = [
    ("gen_ai_server_time_to_first_token_seconds", "ttft", GENAI_TTFT_BUCKETS, True),
    ("gen_ai_server_time_per_output_token_seconds", "tpot", GENAI_TPOT_BUCKETS, True),
    ("gen_ai_server_request_duration_seconds", "e2e", GENAI_DURATION_BUCKETS, False),
]


def _values(expected: list[Expected], field_: str, success_only: bool) -> list[float]:
    out: list[float] = []
    for e in expected:
        if success_only and e.outcome in FAILED:
            continue
        value = getattr(e, field_)
        if isinstance(value, list):
            out += value
        elif value is not None:
            out.append(float(value))
    return out


def _groups(expected: list[Expected], key) -> dict[tuple, list[Expected]]:
    groups: dict[tuple, list[Expected]] = {}
    for e in expected:
        groups.setdefault(key(e), []).append(e)
    return groups


@pytest.mark.parametrize("metric,field_,bounds,success_only", VLLM_HISTOGRAMS, ids=[m[0] for m in VLLM_HISTOGRAMS])
def test_vllm_naming_exact_buckets(fleet, metric, field_, bounds, success_only):
    _, expected, scrape = fleet
    for (model, kind, service), group in _groups(expected, lambda e: (e.model, e.engine_kind, e.service)).items():
        labels = {"model_name": model, "engine_kind": kind, "service_name": service}
        values = _values(group, field_, success_only)
        got = scrape.buckets(metric, **labels)
        if not values:
            assert got == {}, (metric, labels, "the engine does not report it: no series")
            continue
        assert got == expected_cumulative(values, bounds), (metric, labels)
        assert scrape.value(metric + "_sum", **labels) == pytest.approx(sum(values), rel=1e-6, abs=1e-6), labels


@pytest.mark.parametrize("metric,field_,bounds,success_only", GENAI_HISTOGRAMS, ids=[m[0] for m in GENAI_HISTOGRAMS])
def test_genai_naming_exact_buckets(fleet, metric, field_, bounds, success_only):
    _, expected, scrape = fleet
    for (provider, model), group in _groups(expected, lambda e: (e.provider, e.model)).items():
        labels = {"gen_ai_provider_name": provider, "gen_ai_request_model": model}
        values = _values(group, field_, success_only)
        got = scrape.buckets(metric, **labels)
        if not values:
            assert got == {}, (metric, labels)
            continue
        assert got == expected_cumulative(values, bounds), (metric, labels)


def test_segments_exact_buckets(fleet):
    _, expected, scrape = fleet
    for (model, kind, service), group in _groups(expected, lambda e: (e.model, e.engine_kind, e.service)).items():
        labels = {"model_name": model, "engine_kind": kind, "service_name": service}
        names = {name for e in group for name in e.segments}
        seen = {dict(ls)["segment"] for ls in (frozenset(x.items()) for x in scrape.label_sets(
            "otel_llm_request_segment_seconds_count")) if labels.items() <= dict(ls).items()}
        if kind != "sglang":  # SGLang's preprocess/postprocess are checked in test_sglang_segments_*
            assert seen == names, (labels, seen, names)
        for name in names:
            values = [e.segments[name] for e in group if name in e.segments]
            got = scrape.buckets("otel_llm_request_segment_seconds", segment=name, **labels)
            assert got == expected_cumulative(values, TTFT_BUCKETS), (labels, name)
            assert scrape.value("otel_llm_request_segment_seconds_sum", segment=name, **labels) == pytest.approx(
                sum(values), abs=1e-6 * len(values)), (labels, name)


def test_every_request_counted_once(fleet):
    _, expected, scrape = fleet
    for kind, group in _groups(expected, lambda e: (e.engine_kind,)).items():
        assert scrape.value("otel_llm_requests_assembled_total", engine_kind=kind[0]) == len(group), kind
        assert scrape.value("vllm:e2e_request_latency_seconds_count", engine_kind=kind[0]) == len(group), kind
    for outcome in ("stop", "length", "abort", "unknown"):
        for (model, kind, service), group in _groups(expected, lambda e: (e.model, e.engine_kind, e.service)).items():
            assert scrape.value("vllm:request_success_total", finished_reason=outcome, model_name=model,
                                engine_kind=kind, service_name=service) == sum(e.outcome == outcome for e in group)


def test_malformed_variants_counted_never_measured(fleet):
    _, _, scrape = fleet
    reasons: dict[str, int] = {}
    for reason in MALFORMED.values():
        reasons[reason] = reasons.get(reason, 0) + 1
    for reason, count in reasons.items():
        assert scrape.value("otel_llm_spans_malformed_total", reason=reason) == count, reason
    assert scrape.value("otel_llm_spans_malformed_total") == len(MALFORMED)
    for labels in MALFORMED_LABELS:
        for metric, *_ in VLLM_HISTOGRAMS:
            assert scrape.value(metric + "_count", **labels) == 0, (metric, labels)
        assert scrape.value("otel_llm_request_segment_seconds_count", **labels) == 0, labels


def test_engine_kinds_and_providers_are_the_facts_values(fleet):
    _, _, scrape = fleet
    kinds = {ls["engine_kind"] for ls in scrape.label_sets("vllm:e2e_request_latency_seconds_count")}
    assert kinds == {"vllm", "sglang", "triton", "trtllm", "dynamo", "llm-d"}
    providers = {ls["gen_ai_provider_name"] for ls in scrape.label_sets("gen_ai_server_request_duration_seconds_count")}
    assert providers == {"vllm", "sglang", "triton", "trtllm", "dynamo", ""}


# --- SGLang captures, to the microsecond, without the server -----------------------------------


SETTINGS = DigestSettings(AttributeLimits(128, 4096), 86400.0, ("gen_ai.request.model", "gen_ai.response.model"),
                          frozenset())


def _records(requests: list[ExportTraceServiceRequest]):
    traces: dict[bytes, PendingTrace] = {}
    buffered = []
    for request in requests:
        spans, counts = digest_in_process(request, SETTINGS)
        assert not counts.malformed
        buffered += spans
    for span in buffered:
        traces.setdefault(span.trace_id, PendingTrace(span.trace_id, 0.0)).spans[span.span_id] = span
    if not traces:
        return None, []
    (trace,) = traces.values()
    malformed: list[str] = []
    records = records_of_trace(trace, RecordSettings(), malformed)
    assert not malformed
    return trace, records


@pytest.mark.parametrize("name", [n for n in SGLANG_CAPTURES if n not in ("abort_waiting",
                                                                          "multi_tokenizer_router_untraced")])
def test_sglang_segments_are_its_stage_spans(name):
    spans = F.all_spans(_capture(name)[0])
    by: dict[str, list] = {}
    for s in spans:
        by.setdefault(s.name, []).append(s)
    _, (record,) = _records(_capture(name))
    segments = {s.name: s for s in record.segments}
    for segment, stage in (("queue", "prefill_waiting"), ("prefill", "prefill_forward"), ("decode", "decode_forward")):
        (span,) = by[stage]
        assert (segments[segment].start_unix_ns, segments[segment].end_unix_ns) == (
            span.start_time_unix_nano, span.end_time_unix_nano), segment
    assert round(record.queue_s * 1e6) == round(_dur(by["prefill_waiting"][0]) * 1e6)
    assert round(record.prefill_s * 1e6) == round(_dur(by["prefill_forward"][0]) * 1e6)
    assert round(record.decode_s * 1e6) == round(_dur(by["decode_forward"][0]) * 1e6)
    # preprocess: the tokenizer's stages up to the waiting queue (tokenize + dispatch + request_process).
    tokenize, process = by["tokenize"][0], by["request_process"][0]
    assert (segments["preprocess"].start_unix_ns, segments["preprocess"].end_unix_ns) == (
        tokenize.start_time_unix_nano, process.end_time_unix_nano)
    assert record.segments_missing == ()


def test_sglang_normal_stream_numbers():
    """The issue's report, the other way round: 30.399 ms queue and 17.368 ms prefill, not 3.955 / 50.706."""
    _, (record,) = _records(_capture("normal_stream"))
    assert round(record.queue_s * 1e3, 3) == 30.399
    assert round(record.prefill_s * 1e3, 3) == 17.368
    assert round(record.decode_s * 1e3, 3) == 42.697
    assert round(record.ttft_s * 1e3, 3) == 54.661
    assert round(record.e2e_s * 1e3, 3) == 97.273


def test_sglang_without_scheduler_spans_says_what_is_missing():
    trace, (record,) = _records(_capture("multi_tokenizer_router_untraced"))
    assert record.queue_s is None and record.prefill_s is None and record.inference_s is None
    assert record.segments_missing == ("queue", "prefill")
    names = [s.name for s in record.segments]
    assert "queue" not in names and "prefill" not in names and "queue_and_prefill" in names
    root = next(s for s in F.all_spans(_capture("multi_tokenizer_router_untraced")[0])
                if F.span_attrs(s).get("module") == "sglang::request")
    a = F.span_attrs(root)
    (segment,) = [s for s in record.segments if s.name == "queue_and_prefill"]
    assert segment.duration_s == pytest.approx(a["gen_ai.latency.time_in_model_prefill"], abs=1e-9)
    # the synthesized spans and the enriched root say it
    request, _ = kept_trace_request(list(trace.spans.values()), [record], "p", "")
    enriched = next(s for s in F.all_spans(request) if s.span_id == record.span_id)
    assert F.span_attrs(enriched)["otel_llm.segments_missing"] == "queue,prefill"
    assert {s.name for s in F.all_spans(request)} >= {"queue_and_prefill", "decode"}


def test_sglang_nonstream_without_metrics_reports_no_ttft():
    _, (record,) = _records(_capture("normal_nonstream"))
    assert record.ttft_s is None  # ttft == e2e there: the final output, not a first token
    assert record.decode_s is not None and record.decode_s > 0


def test_sglang_abort_in_queue():
    _, (record,) = _records(_capture("abort_waiting"))
    assert record.outcome == "abort"
    assert record.segments_missing == ("queue", "prefill", "decode")
    assert record.queue_s is None and record.prefill_s is None


# --- the other shapes, at record level ---------------------------------------------------------


def test_triton_reports_compute_whole():
    _, (record,) = _records([F.triton_request()])
    assert record.engine_kind == "triton" and record.segments_missing == ("prefill", "decode")
    assert record.prefill_s is None and record.decode_s is None
    assert [s.name for s in record.segments] == ["preprocess", "queue", "compute", "postprocess"]


def test_triton_behind_a_gateway_is_labelled_with_the_model_it_ran():
    """A gateway names the model its caller asked for; the record's label is what Triton ran
    (``triton.model_name``), the gateway's name its request model."""
    trace, gateway_sid = F.trace_id("triton-gw"), F.span_id("triton-gw")
    gateway = F.request(F.resource_spans({"service.name": "llm-gateway"}, "gateway", [F.make_span(
        "POST /v2/models/generate", trace=trace, sid=gateway_sid, parent=None, kind=F.SERVER,
        start_ns=F.T0_NS - 1_000_000, end_ns=F.T0_NS + 2_000_000_000,
        attrs={"gen_ai.operation.name": "chat", "gen_ai.request.model": "chat-default"})]))
    _, (record,) = _records([gateway, F.triton_request(parent=(trace, gateway_sid))])
    assert (record.model, record.model_source, record.request_model) == \
        ("tensorrt_llm", "span:triton.model_name", "chat-default")

def test_trtllm_marks_derived_segments():
    _, (record,) = _records([F.trtllm_serve_span()])
    assert record.segments_derived == ("prefill", "decode")


def test_vllm_token_events_give_exact_ttft_and_steps():
    steps = (0.0121, 0.0302, 0.0153)
    _, (record,) = _records([F.vllm_request_span(decode_steps=steps, preprocess_s=0.004, queue_s=0.02,
                                                 prefill_s=0.05)])
    assert record.ttft_s == pytest.approx(0.074, abs=1e-9)
    assert record.itl_s == pytest.approx(steps, abs=1e-9)
    assert record.cached_tokens == 16
    assert record.outcome == "stop" and record.model == "Qwen/Qwen3-0.6B"


def test_parts_alone_make_no_request_and_plain_spans_are_not_read():
    from otel_llm.processor.llm_metrics.adapters.engines import classify

    lone = F.make_span("tokenize", trace=F.trace_id("lone"), sid=F.span_id("lone"), parent=None, kind=F.INTERNAL,
                       start_ns=F.T0_NS, end_ns=F.T0_NS + 1000)
    obs, _ = classify(lone)
    assert obs is not None and obs.part  # an SGLang stage, read only from an SGLang root
    _, records = _records([F.request(F.resource_spans({"service.name": "app"}, "app", [lone]))])
    assert records == []
    plain = F.make_span("render", trace=F.trace_id("p"), sid=F.span_id("p"), parent=None, kind=F.INTERNAL,
                        start_ns=F.T0_NS, end_ns=F.T0_NS + 1000, attrs={"a": 1})
    assert classify(plain) == (None, {})  # no attribute map built for a plain application span


def test_dynamo_with_engine_spans_under_its_workers():
    """vLLM spans under each worker's engine.generate (PR ai-dynamo/dynamo#9543): queue and prefill from the
    prefill worker's, decode from the decode worker's; still one request."""
    req = F.dynamo_request(disaggregated=True, seed="dyn-engines")
    spans = F.all_spans(req)
    workers = {F.span_attrs(s)["disagg_role"]: s for s in spans if s.name == "engine.generate"}
    trace = spans[0].trace_id
    steps = (0.0101,) * 39
    for role, queue, prefill, decode in (("prefill", 0.0031, 0.0702, ()), ("decode", 0.0022, 0.0083, steps)):
        worker = workers[role]
        req.resource_spans.extend(F.vllm_request_span(
            span_name_style="llm_request", token_keys="old", token_events=False, preprocess_s=0.001, queue_s=queue,
            prefill_s=prefill, decode_steps=decode, detokenize_s=0.001, parent=(trace, worker.span_id),
            t0_ns=worker.start_time_unix_nano + 100_000, seed="dyn-engines:" + role).resource_spans)
    _, (record,) = _records([req])
    assert record.engine_kind == "dynamo" and record.segments_missing == ()
    assert record.queue_s == pytest.approx(0.0031, abs=1e-9) and record.prefill_s == pytest.approx(0.0702, abs=1e-9)
    assert record.decode_s == pytest.approx(sum(steps), abs=1e-9)
    names = [s.name for s in record.segments]
    assert names == ["preprocess", "queue", "prefill", "kv_transfer", "decode_queue", "decode", "postprocess"]
    assert record.ttft_s == pytest.approx(0.095)  # the frontend's ttft_ms


# --- SGLang prefill/decode disaggregation: two roots, one request ---------------------------------


def test_sglang_pd_is_one_request_with_segments_from_both_servers():
    req = F.sglang_pd_request()
    spans = {(s.name, F.span_attrs(s).get("thread_label")): s for s in F.all_spans(req)}
    by_name: dict[str, list] = {}
    for s in F.all_spans(req):
        by_name.setdefault(s.name, []).append(s)
    roots = [s for s in F.all_spans(req) if F.span_attrs(s).get("module") == "sglang::request"]
    assert sorted(s.name.split(" Req ")[0] for s in roots) == ["decode", "prefill"] and spans
    _, records = _records([req])
    (record,) = records  # not one per server
    decode_root = next(s for s in roots if s.name.startswith("decode "))
    assert record.span_id == decode_root.span_id and record.engine_kind == "sglang"
    assert (record.model, record.outcome, record.completion_tokens, record.prompt_tokens) == ("qwen3-8b", "stop",
                                                                                            PD["steps"] + 1, 420)
    assert record.cached_tokens == 128  # the prefill server's prefix cache
    segments = {s.name: s for s in record.segments}
    # Each segment is exactly a stage span of the server that ran it.
    for segment, stage, server in (("queue", "prefill_waiting", "prefill"), ("prefill", "prefill_forward", "prefill"),
                                   ("kv_transfer", "prefill_transfer_kv_cache", "prefill"),
                                   ("decode_queue", "decode_waiting", "decode"),
                                   ("decode", "decode_forward", "decode")):
        (span,) = by_name[stage]
        assert F.span_attrs(next(s for s in F.all_spans(req) if s.span_id == span.parent_span_id))[
            "thread_label"] == ("Prefill Scheduler" if server == "prefill" else "Decode Scheduler")
        assert (segments[segment].start_unix_ns, segments[segment].end_unix_ns) == (
            span.start_time_unix_nano, span.end_time_unix_nano), segment
    assert round(record.queue_s * 1e6) == round(PD["p_waiting"] * 1e6)
    assert round(record.prefill_s * 1e6) == round(PD["p_forward"] * 1e6)
    assert round(record.decode_s * 1e6) == round(PD["steps"] * PD["step"] * 1e6)
    # decode_transferred waits for the prefill server's queue and prefill: it is not the KV transfer.
    (transferred,) = by_name["decode_transferred"]
    assert segments["kv_transfer"].duration_s == pytest.approx(PD["kv"], abs=1e-9)
    assert _dur(transferred) > PD["p_waiting"] + PD["p_forward"]
    assert record.segments_missing == ()


def test_sglang_pd_roots_pair_only_by_bootstrap_room():
    a = F.sglang_pd_request(seed="pd-a")
    b = F.sglang_pd_request(seed="pd-b", room=0x1111)  # another request of the same trace (another room)
    for s in F.all_spans(b):
        s.trace_id = F.all_spans(a)[0].trace_id
    # b's decode root against a's prefill root: different rooms, so a and b are two requests.
    _, records = _records([a, b])
    assert len(records) == 2
    # Without a room nothing pairs: each root is a request (what SGLang shows without a PD router).
    _, unpaired = _records([F.sglang_pd_request(room=None)])
    assert len(unpaired) == 2


def test_sglang_pd_without_the_prefill_schedulers_spans_says_what_is_missing():
    req = F.drop_spans(F.sglang_pd_request(), ["prefill_waiting", "prefill_forward", "prefill_transfer_kv_cache"])
    _, (record,) = _records([req])
    assert record.queue_s is None and record.prefill_s is None
    assert record.segments_missing == ("queue", "prefill", "kv_transfer")
    assert round(record.decode_s * 1e6) == round(PD["steps"] * PD["step"] * 1e6)
