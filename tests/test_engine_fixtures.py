"""Sanity tests for the engine fact base (issue 14).

* every builder in ``tests/support/engine_fixtures.py`` yields a well-formed OTLP request
  whose span / event / attribute names are documented in ``tests/testdata/engines/FACTS.md``;
* the timing parameters come out where the source code says they do;
* the SGLang captures (real SGLang 0.5.23 tracing code) hold the spans and the numbers
  ``tests/testdata/engines/sglang/README.md`` documents.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
)
from opentelemetry.proto.trace.v1.trace_pb2 import Status

from tests.support import engine_fixtures as F

ENGINES = Path(__file__).parent / "testdata" / "engines"
FACTS = (ENGINES / "FACTS.md").read_text()
SGLANG = ENGINES / "sglang"

# Span names that are data (model names, "{operation} {model}", "<METHOD> <path>").
DYNAMIC_NAMES = {
    "chat Qwen/Qwen3-0.6B",
    "llm_d.pd_proxy.POST /v1/chat/completions",
    "postprocessing",
    "tensorrt_llm_bls",
    # SGLang PD: f"{role} Req {rid[:8]}" (observability/trace.py:564-569) and thread spans named with host and pid
    # (entrypoints/http_server.py:325-330, managers/scheduler.py:6352-6357), FACTS.md gives the patterns.
    "prefill Req 9f2c4e1a", "decode Req 2b7e0d93",
    "PrefillTokenizer(host:5e1f0c0f | pid:5101)", "DecodeTokenizer(host:5e1f0c0f | pid:6101)",
    "Prefill Scheduler [TP 0] (host:5e1f0c0f | pid:5102)", "Decode Scheduler [TP 0] (host:5e1f0c0f | pid:6102)",
}
# Fixtures whose roots have a parent otel-llm never receives: the caller's (router's) span, whose
# traceparent SGLang's tokenizers extract (managers/tokenizer_manager.py:3805-3815).
EXTERNAL_PARENTS = {"sglang_pd_request": bytes.fromhex("00f067aa0ba902b7")}


def _names(req: ExportTraceServiceRequest) -> tuple[set[str], set[str], set[str]]:
    spans, events, keys = set(), set(), set()
    for s in F.all_spans(req):
        spans.add(s.name)
        keys.update(a.key for a in s.attributes)
        for e in s.events:
            events.add(e.name)
            keys.update(a.key for a in e.attributes)
    return spans, events, keys


def _by_name(req, name):
    return [s for s in F.all_spans(req) if s.name == name]


def _one(req, name):
    found = _by_name(req, name)
    assert len(found) == 1, (name, len(found))
    return found[0]


def _ev(span, name, i=0):
    return [e for e in span.events if e.name == name][i].time_unix_nano


def _s(a_ns, b_ns):
    return (b_ns - a_ns) / 1e9


ALL_BUILT = {name: builder() for name, builder in F.BUILDERS.items()}
ALL_BUILT["dynamo_request_disagg"] = F.dynamo_request(disaggregated=True)
ALL_BUILT["llmd_mooncake"] = F.llmd_disaggregated(connector="mooncake")
ALL_BUILT["vllm_llm_request_old_keys"] = F.vllm_request_span(span_name_style="llm_request",
                                                             token_keys="old")
ALL_BUILT["trtllm_serve_disaggregated"] = F.trtllm_serve_disaggregated()


@pytest.mark.parametrize("name", sorted(ALL_BUILT))
def test_builder_output_is_well_formed(name):
    req = ALL_BUILT[name]
    assert isinstance(req, ExportTraceServiceRequest)
    again = ExportTraceServiceRequest()
    again.ParseFromString(req.SerializeToString())
    assert again == req
    spans = F.all_spans(req)
    assert spans
    ids = {s.span_id for s in spans}
    assert len(ids) == len(spans), "span ids must be unique"
    traces = {s.trace_id for s in spans}
    assert len(traces) == 1, "one request = one trace"
    for s in spans:
        assert len(s.trace_id) == 16 and len(s.span_id) == 8
        assert s.end_time_unix_nano >= s.start_time_unix_nano, s.name
        assert s.kind in (F.SERVER, F.CLIENT, F.INTERNAL)
        if s.parent_span_id and s.parent_span_id != EXTERNAL_PARENTS.get(name):
            assert s.parent_span_id in ids, f"{s.name}: dangling parent"
    for r in req.resource_spans:
        assert any(a.key == "service.name" for a in r.resource.attributes)


@pytest.mark.parametrize("name", sorted(ALL_BUILT))
def test_builder_names_are_documented_in_facts(name):
    spans, events, keys = _names(ALL_BUILT[name])
    missing = [n for n in sorted((spans - DYNAMIC_NAMES) | events | keys)
               if f"`{n}`" not in FACTS]
    assert not missing, f"not in FACTS.md: {missing}"


# ---------------------------------------------------------------------------
# vLLM
# ---------------------------------------------------------------------------
def test_vllm_renamed_span_and_token_events():
    steps = (0.010, 0.020, 0.015)
    req = F.vllm_request_span(decode_steps=steps, preprocess_s=0.004, queue_s=0.02,
                              prefill_s=0.05, detokenize_s=0.001)
    span = _one(req, "chat Qwen/Qwen3-0.6B")
    a = F.span_attrs(span)
    assert span.kind == F.SERVER
    assert a["gen_ai.operation.name"] == "chat"
    assert a["gen_ai.request.model"] == "Qwen/Qwen3-0.6B"
    assert a["gen_ai.usage.input_tokens"] == 32 and a["gen_ai.usage.output_tokens"] == 4
    assert "gen_ai.usage.prompt_tokens" not in a
    assert a["gen_ai.usage.cache_read.input_tokens"] == 16
    assert json.loads(a["gen_ai.response.finish_reasons"]) == ["stop"]
    assert a["gen_ai.latency.time_to_first_token"] == pytest.approx(0.074)
    assert a["gen_ai.latency.e2e"] == pytest.approx(0.074 + 0.045 + 0.001)
    gen = [e for e in span.events if e.name == "token_generated"]
    sched = [e for e in span.events if e.name == "token_scheduled"]
    assert len(gen) == len(sched) == 4
    # first token_generated = exact first-token time = span start + ttft
    assert _s(span.start_time_unix_nano, gen[0].time_unix_nano) == pytest.approx(0.074)
    itl = [_s(gen[i].time_unix_nano, gen[i + 1].time_unix_nano) for i in range(3)]
    assert itl == pytest.approx(list(steps))
    ga = {x.key: F.attr_value(x.value) for x in gen[0].attributes}
    assert set(ga) == {"new_token_ids", "iter_waiting_size", "iter_total_tokens_count"}
    assert isinstance(ga["new_token_ids"], list)


def test_vllm_variants():
    old = F.span_attrs(_one(F.vllm_request_span(span_name_style="llm_request", token_keys="old",
                                                finish_reasons_as="array"), "llm_request"))
    assert "gen_ai.operation.name" not in old and old["gen_ai.usage.prompt_tokens"] == 32
    assert old["gen_ai.response.finish_reasons"] == ["stop"]
    hidden = _one(F.vllm_request_span(hide_token_ids=True), "chat Qwen/Qwen3-0.6B")
    assert all("new_token_ids" not in {a.key for a in e.attributes} for e in hidden.events)
    capped = _one(F.vllm_request_span(decode_steps=(0.001,) * 200), "chat Qwen/Qwen3-0.6B")
    assert len(capped.events) == 128


# ---------------------------------------------------------------------------
# Triton
# ---------------------------------------------------------------------------
def test_triton_trtllm_model_timings():
    req = F.triton_request(queue_s=0.002, engine_s=0.4, first_response_s=0.06)
    root = _one(req, "InferRequest")
    model = _one(req, "tensorrt_llm")
    compute = _one(req, "compute")
    assert {s.kind for s in (root, model, compute)} == {F.SERVER}
    assert model.parent_span_id == root.span_id and compute.parent_span_id == model.span_id
    assert [e.name for e in model.events] == ["REQUEST_START", "QUEUE_START", "REQUEST_END"]
    assert [e.name for e in compute.events] == ["COMPUTE_START", "COMPUTE_INPUT_END",
                                                "COMPUTE_OUTPUT_START", "COMPUTE_END"]
    a = F.span_attrs(model)
    assert a == {"triton.model_name": "tensorrt_llm", "triton.model_version": 1,
                 "triton.trace_id": 1, "triton.trace_parent_id": 0}
    assert _s(_ev(model, "QUEUE_START"), _ev(compute, "COMPUTE_START")) == pytest.approx(0.002)
    assert _s(_ev(compute, "COMPUTE_INPUT_END"), _ev(compute, "COMPUTE_OUTPUT_START")) == pytest.approx(0.4)
    assert _s(_ev(model, "REQUEST_START"), _ev(root, "INFER_RESPONSE_COMPLETE")) == pytest.approx(0.06)
    assert [e.name for e in root.events] == ["GRPC_WAITREAD_START", "GRPC_WAITREAD_END",
                                             "INFER_RESPONSE_COMPLETE", "GRPC_SEND_START",
                                             "GRPC_SEND_END"]
    # the scope is triton-server
    assert req.resource_spans[0].scope_spans[0].scope.name == "triton-server"


def test_triton_http_generate_stream_has_one_event_per_response():
    root = _one(F.triton_request(protocol="http", n_responses=12), "InferRequest")
    assert sum(e.name == "INFER_RESPONSE_COMPLETE" for e in root.events) == 12
    assert [e.name for e in root.events][:2] == ["HTTP_RECV_START", "HTTP_RECV_END"]
    # HTTP_RECV_START is captured before the trace (and its root span) exists
    assert root.events[0].time_unix_nano < root.start_time_unix_nano


def test_triton_ensemble_is_one_request_with_nested_models():
    req = F.triton_ensemble()
    root = _one(req, "InferRequest")
    ens = _one(req, "ensemble")
    assert ens.parent_span_id == root.span_id
    for m in ("preprocessing", "tensorrt_llm", "postprocessing"):
        s = _one(req, m)
        assert s.parent_span_id == ens.span_id
        assert F.span_attrs(s)["triton.trace_parent_id"] == F.span_attrs(ens)["triton.trace_id"]
    computes = _by_name(req, "compute")
    assert len(computes) == 3 and all(c.parent_span_id != ens.span_id for c in computes)


def test_triton_bls_children_nest_under_bls_model():
    req = F.triton_bls(children=2)
    bls = _one(req, "tensorrt_llm_bls")
    kids = _by_name(req, "tensorrt_llm")
    assert len(kids) == 2 and all(k.parent_span_id == bls.span_id for k in kids)
    assert len(_by_name(req, "InferRequest")) == 1


# ---------------------------------------------------------------------------
# trtllm-serve
# ---------------------------------------------------------------------------
def test_trtllm_serve_keys_and_not_measured():
    a = F.span_attrs(_one(F.trtllm_serve_span(kv_cache_transfer_s=0.01), "llm_request"))
    assert a["gen_ai.latency.kv_cache_transfer_time"] == 0.01
    assert a["gen_ai.response.finish_reasons"] == ["stop"]
    assert "gen_ai.latency.time_in_model_prefill" not in a
    bad = F.span_attrs(_one(F.MALFORMED_VARIANTS["trtllm_all_not_measured"](), "llm_request"))
    assert all(bad[k] == -1 for k in ("gen_ai.latency.time_to_first_token", "gen_ai.latency.e2e",
                                      "gen_ai.latency.time_in_queue",
                                      "gen_ai.latency.kv_cache_transfer_time"))


def test_trtllm_disaggregated_events():
    req = F.trtllm_serve_disaggregated(kv_transfer_s=0.012)
    proxy = _one(req, "openai_chat_completion")
    assert [e.name for e in proxy.events] == ["ctx_server.selected", "gen_server.selected"]
    workers = _by_name(req, "llm_request")
    assert len(workers) == 2 and all(w.parent_span_id == proxy.span_id for w in workers)
    gen = [w for w in workers if "gen_ai.latency.kv_cache_transfer_time" in F.span_attrs(w)][0]
    assert _s(_ev(gen, "kv_cache_transfer_start"), _ev(gen, "kv_cache_transfer_end")) == pytest.approx(0.012)


# ---------------------------------------------------------------------------
# Dynamo
# ---------------------------------------------------------------------------
def test_dynamo_chain_and_units():
    req = F.dynamo_request(preprocess_s=0.003, route_s=0.001, prefill_s=0.08, decode_s=0.4)
    root = _one(req, "http-request")
    route = _one(req, "router.route_request")
    hp = _one(req, "handle_payload")
    eg = _one(req, "engine.generate")
    assert (root.kind, route.kind, hp.kind) == (F.INTERNAL, F.CLIENT, F.SERVER)
    assert route.parent_span_id == root.span_id and hp.parent_span_id == route.span_id
    assert eg.parent_span_id == hp.span_id
    ra = F.span_attrs(route)
    assert ra == {"request.attempt": "0", "migration.is_retry": "false", "request.outcome": "success"}
    assert F.span_attrs(root)["ttft_ms"] == pytest.approx(84.0)  # milliseconds
    assert F.span_attrs(eg)["disagg_role"] == "agg"


def test_dynamo_disaggregated_two_workers_one_request():
    req = F.dynamo_request(disaggregated=True)
    assert len(_by_name(req, "http-request")) == 1
    assert len(_by_name(req, "router.route_request")) == 2
    egs = {F.span_attrs(s)["disagg_role"]: s for s in _by_name(req, "engine.generate")}
    assert set(egs) == {"prefill", "decode"}
    assert [l.span_id for l in egs["decode"].links] == [egs["prefill"].span_id]
    services = {F.attr_value(a.value) for r in req.resource_spans for a in r.resource.attributes
                if a.key == "service.name"}
    assert {"dynamo-frontend", "dynamo-prefill", "dynamo-decode"} <= services


# ---------------------------------------------------------------------------
# llm-d
# ---------------------------------------------------------------------------
def test_llmd_nixlv2_decode_is_child_of_prefill():
    req = F.llmd_disaggregated(prefill_s=0.12, decode_s=0.7, coordinator_s=0.002)
    fwd = _one(req, "forward_request")
    pre = _one(req, "prefill")
    dec = _one(req, "decode")
    assert pre.parent_span_id == fwd.span_id and dec.parent_span_id == pre.span_id
    assert fwd.kind == F.SERVER and pre.kind == dec.kind == F.INTERNAL
    d = F.span_attrs(dec)
    assert d["llm_d.pd_proxy.prefill_duration_ms"] == 120.0
    assert d["llm_d.pd_proxy.decode_duration_ms"] == 700.0
    assert d["llm_d.pd_proxy.coordinator_overhead_ms"] == 2.0
    vllm = _by_name(req, "llm_request")
    assert len(vllm) == 2 and all(v.kind == F.SERVER for v in vllm)
    assert len(_by_name(req, "gateway.request")) == 1


def test_llmd_mooncake_uses_prefixed_names():
    req = F.llmd_disaggregated(connector="mooncake")
    assert _one(req, "llm_d.pd_proxy.decode").parent_span_id == _one(req, "forward_request").span_id
    assert not _by_name(req, "prefill")


# ---------------------------------------------------------------------------
# malformed / partial
# ---------------------------------------------------------------------------
def test_malformed_variants_build_and_differ():
    for name, make in F.MALFORMED_VARIANTS.items():
        req = make()
        assert F.all_spans(req), name
    model = _one(F.MALFORMED_VARIANTS["triton_missing_queue_start"](), "tensorrt_llm")
    assert "QUEUE_START" not in [e.name for e in model.events]
    req = F.MALFORMED_VARIANTS["triton_compute_before_queue"]()
    assert _ev(_one(req, "compute"), "COMPUTE_START") < _ev(_one(req, "tensorrt_llm"), "QUEUE_START")
    span = _one(F.MALFORMED_VARIANTS["vllm_token_events_out_of_order"](), "chat Qwen/Qwen3-0.6B")
    gen = [e.time_unix_nano for e in span.events if e.name == "token_generated"]
    assert gen != sorted(gen)
    assert not _by_name(F.MALFORMED_VARIANTS["triton_missing_compute_span"](), "compute")


# ---------------------------------------------------------------------------
# SGLang captures
# ---------------------------------------------------------------------------
ROOT_RE = re.compile(r"^(prefill|decode)? Req [0-9a-f]{1,8}$")
SCHEDULER_STAGES = ["request_process", "prefill_waiting", "prefill_forward", "decode_waiting",
                    "decode_forward", "decode_loop"]


def _capture(name):
    req = ExportTraceServiceRequest()
    req.ParseFromString((SGLANG / f"{name}.binpb").read_bytes())
    return req


def _dur_ms(span):
    return (span.end_time_unix_nano - span.start_time_unix_nano) / 1e6


def _root(req):
    roots = [s for s in F.all_spans(req) if ROOT_RE.match(s.name)]
    assert len(roots) == 1
    return roots[0]


def _thread(req, label):
    found = [s for s in F.all_spans(req) if F.span_attrs(s).get("thread_label") == label]
    assert len(found) == 1, label
    return found[0]


CAPTURES = ["normal_stream", "normal_nonstream", "normal_nonstream_metrics", "abort_waiting", "abort_running",
            "multi_tokenizer_router_traced", "multi_tokenizer_router_untraced"]


@pytest.mark.parametrize("name", CAPTURES)
def test_sglang_capture_shape(name):
    req = _capture(name)
    spans = F.all_spans(req)
    assert all(s.kind == F.INTERNAL for s in spans)
    assert {ss.scope.name for r in req.resource_spans for ss in r.scope_spans} == {"sglang server"}
    root = _root(req)
    assert root.name.startswith(" Req ")  # unified mode: empty role -> leading space
    assert F.span_attrs(root)["module"] == "sglang::request"
    names = {s.name for s in spans}
    assert {"tokenize", "api_server_dispatch"} <= names
    ids = {s.span_id for s in spans}
    for s in spans:
        if s is not root and s.name in SCHEDULER_STAGES + ["tokenize", "api_server_dispatch"]:
            assert s.parent_span_id in ids
    if name == "multi_tokenizer_router_untraced":
        assert not names & set(SCHEDULER_STAGES)  # sglang#38210: scheduler spans lost
        assert not any(n.startswith("Scheduler") for n in names)
    elif name == "abort_waiting":
        assert "prefill_waiting" not in names and "request_process" in names
    else:
        assert set(SCHEDULER_STAGES) <= names


def test_sglang_normal_stream_numbers_match_readme():
    req = _capture("normal_stream")
    root = _root(req)
    a = F.span_attrs(root)
    one = lambda n: [s for s in F.all_spans(req) if s.name == n]  # noqa: E731
    tok = _thread(req, "Tokenizer")
    # README table, to the microsecond
    assert round(_dur_ms(root), 3) == 97.273
    assert round(a["gen_ai.latency.time_to_first_token"] * 1e3, 3) == 54.661
    assert round(a["gen_ai.latency.time_in_model_prefill"] * 1e3, 3) == 50.706
    assert round(_dur_ms(one("prefill_waiting")[0]), 3) == 30.399
    assert round(_dur_ms(one("prefill_forward")[0]), 3) == 17.368
    assert round(_dur_ms(one("decode_forward")[0]), 3) == 42.697
    assert round(_dur_ms(tok), 3) == 3.955
    # definitions: e2e == root span; ttft - prefill == created -> dispatch finish (thread span)
    assert a["gen_ai.latency.e2e"] * 1e9 == pytest.approx(
        root.end_time_unix_nano - root.start_time_unix_nano, abs=1000)
    assert (a["gen_ai.latency.time_to_first_token"] - a["gen_ai.latency.time_in_model_prefill"]
            ) * 1e9 == pytest.approx(_dur_ms(tok) * 1e6, abs=1000)
    # time_in_model_prefill contains the queue: it spans request_process+waiting+forward
    stages = sum(_dur_ms(one(n)[0]) for n in ("request_process", "prefill_waiting", "prefill_forward"))
    assert a["gen_ai.latency.time_in_model_prefill"] * 1e3 > stages
    assert len(one("decode_loop")) == 8
    assert [F.span_attrs(s)["decode_ct"] for s in sorted(one("decode_loop"),
            key=lambda s: s.start_time_unix_nano)] == list(range(8))
    # the client's traceparent parents the root and keeps its 128-bit trace id
    assert root.trace_id.hex() == "0af7651916cd43dd8448eb211c80319c"
    assert root.parent_span_id.hex() == "b7ad6b7169203331"
    assert json.loads(a["gen_ai.response.finish_reasons"]) == ["length"]
    assert a["gen_ai.usage.completion_tokens"] == 9
    assert "gen_ai.latency.time_in_queue" not in a


def test_sglang_nonstream_without_metrics_has_ttft_equal_e2e():
    a = F.span_attrs(_root(_capture("normal_nonstream")))
    assert a["gen_ai.latency.time_to_first_token"] == a["gen_ai.latency.e2e"]
    assert a["gen_ai.latency.time_in_model_decode"] == 0
    root = _root(_capture("normal_nonstream"))
    assert root.trace_id[:8] == b"\0" * 8  # SGLang's 64-bit trace ids


def test_sglang_nonstream_with_metrics_uses_scheduler_prefill_finish():
    req = _capture("normal_nonstream_metrics")
    root = _root(req)
    a = F.span_attrs(root)
    pf = [s for s in F.all_spans(req) if s.name == "prefill_forward"][0]
    pw = [s for s in F.all_spans(req) if s.name == "prefill_waiting"][0]
    assert a["gen_ai.latency.time_to_first_token"] * 1e9 == pytest.approx(
        pf.end_time_unix_nano - root.start_time_unix_nano, abs=1000)
    observed = dict((k, v) for k, v in json.loads(
        (SGLANG / "normal_nonstream_metrics.metrics.json").read_text())["observed_seconds"])
    assert observed["queue_time"] * 1e9 == pytest.approx(
        pw.end_time_unix_nano - pw.start_time_unix_nano, abs=1000)
    assert observed["prefill_forward"] * 1e9 == pytest.approx(
        pf.end_time_unix_nano - pf.start_time_unix_nano, abs=1000)


def test_sglang_aborts():
    req = _capture("abort_waiting")
    a = F.span_attrs(_root(req))
    assert set(k for k in a if k.startswith("gen_ai.")) == {
        "gen_ai.latency.e2e", "gen_ai.latency.time_in_model_inference"}
    sched = _thread(req, "Scheduler")
    assert sched.status.code == Status.StatusCode.STATUS_CODE_ERROR
    assert F.span_attrs(sched)["reason"] == "have unclosed span, auto closed"
    ra = F.span_attrs(_root(_capture("abort_running")))
    assert json.loads(ra["gen_ai.response.finish_reasons"]) == ["abort"]


def test_sglang_summary_lists_every_capture():
    summary = json.loads((SGLANG / "summary.json").read_text())
    assert sorted(summary) == sorted(CAPTURES)
    for v in summary.values():
        assert v["paths"] == ["/v1/traces"] and v["content_types"] == ["application/x-protobuf"]
