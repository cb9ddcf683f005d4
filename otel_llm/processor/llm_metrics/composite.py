"""Requests whose numbers are spread over several spans of one trace (tests/testdata/engines/FACTS.md).

The adapters mark the spans (``EngineObservation.part``); here a request's root gathers its parts and
its segments are laid from the parts' own intervals and events, so each segment lasts exactly what
the engine's span says. What an engine does not measure is listed in ``segments_missing``, never
guessed; what is derived from other numbers, in ``segments_derived``.

- **SGLang**: the root ``" Req …"`` and its stage spans (queue = ``prefill_waiting``, prefill =
  ``prefill_forward``, decode = ``decode_forward`` or its ``decode_loop``s, preprocess = the
  tokenizer's stages, kv_transfer = the PD transfer stages). Without them (sglang#38210), only the
  root's attributes: ``time_in_model_prefill`` holds the queue, so one ``queue_and_prefill`` interval.
  Prefill/decode disaggregated: a prefill and a decode root with one ``bootstrap_room``, one request.
- **Triton**: ``InferRequest`` with its model spans and their ``compute`` children; an ensemble or a
  BLS request is one request. Compute is reported whole (for the TensorRT-LLM backend it is the
  executor's queue + prefill + decode): no prefill/decode split.
- **trtllm-serve** disaggregated: the context and generation servers' spans under one proxy.
- **Dynamo**: ``http-request`` with its workers' ``engine.generate`` spans.
- **llm-d**: the P/D sidecar's ``forward_request`` with its prefill/decode spans and the vLLM spans of
  both pods.
"""

from __future__ import annotations

from collections.abc import Iterable

from opentelemetry.proto.trace.v1.trace_pb2 import Status

from otel_llm.pdata.observation import EngineKind, MalformedSpan, Part
from otel_llm.pdata.records import Outcome, RequestRecord, Segment
from otel_llm.processor.llm_metrics.segments import build_segments, derive_timings
from otel_llm.pdata.spans import BufferedSpan, PendingTrace

_ERROR = Status.STATUS_CODE_ERROR
_new_tuple = tuple.__new__  # Segment(...) runs the named tuple's Python-level __new__; this is one C call
MAX_PARTS = 4096  # spans looked at below one root: a hostile trace stays cheap

QUEUE_AND_PREFILL = "queue_and_prefill"  # an interval that holds both, where the engine does not split it
KV_TRANSFER = "kv_transfer"
ABORTED_ERROR_TYPE = "aborted"  # an SGLang request aborted in the queue, whose root names no error
COMPUTE = "compute"
_PREPROCESS_STAGES = ("tokenize", "api_server_dispatch", "request_process")
_KV_STAGES = ("prefill_transfer_kv_cache", "decode_transferred")


def _seconds(span: BufferedSpan) -> float:
    if span.start_unix_ns <= 0 or span.end_unix_ns < span.start_unix_ns:
        raise MalformedSpan("invalid_span_times", "a part of the request ends before it starts")
    return (span.end_unix_ns - span.start_unix_ns) / 1e9


def _ns(seconds: float) -> int:
    return round(seconds * 1e9)


def descendants(trace: PendingTrace, root: BufferedSpan) -> list[BufferedSpan]:
    """Spans below ``root`` in ``trace``, breadth first, at most ``MAX_PARTS``."""
    children: dict[bytes, list[BufferedSpan]] = {}
    for span in trace.spans.values():
        parent = span.parent_span_id
        if parent:
            siblings = children.get(parent)  # not setdefault: that makes a list for every span
            if siblings is None:
                children[parent] = [span]
            else:
                siblings.append(span)
    found: list[BufferedSpan] = []
    frontier = [root]
    seen = {root.span_id}
    while frontier and len(found) < MAX_PARTS:
        following: list[BufferedSpan] = []
        for span in frontier:
            for child in children.get(span.span_id, ()):
                if child.span_id not in seen:
                    seen.add(child.span_id)
                    found.append(child)
                    following.append(child)
        frontier = following
    return found[:MAX_PARTS]


def _parts(spans: Iterable[BufferedSpan], part: str) -> list[BufferedSpan]:
    return [s for s in spans if s.observation is not None and s.observation.part == part]


def _tail(record: RequestRecord, segments: list[Segment], end_ns: int) -> None:
    if segments:
        last = max(s.end_unix_ns for s in segments)
        if end_ns > last:
            segments.append(Segment("postprocess", last, end_ns))
    record.segments = tuple(segments)


def _tpot(record: RequestRecord) -> None:
    if record.decode_s is not None and record.completion_tokens is not None and record.completion_tokens > 1:
        record.tpot_s = record.decode_s / (record.completion_tokens - 1)
    else:
        record.tpot_s = None


# --- SGLang -------------------------------------------------------------------------------------


def sglang(record: RequestRecord, root: BufferedSpan, trace: PendingTrace) -> None:
    stages: dict[str, list[BufferedSpan]] = {}
    below = descendants(trace, root)
    if record.outcome == Outcome.UNKNOWN and any(span.status_code == _ERROR for span in below):
        # Aborted in the queue: the root has no finish reason; the scheduler's thread span is closed with
        # status ERROR ("have unclosed span, auto closed", trace.py:836-837).
        record.outcome = Outcome.ABORT
        record.error_type = record.error_type or ABORTED_ERROR_TYPE
    for span in below:  # _parts, inlined: a list and a setdefault per stage span cost more than the rest
        observed = span.observation
        if observed is not None and observed.part == Part.SGLANG_STAGE:
            name = str(observed.mark("stage"))
            same = stages.get(name)
            if same is None:
                stages[name] = [span]
            else:
                same.append(span)
    for spans in stages.values():
        if len(spans) > 1:  # most stages have one span
            spans.sort(key=lambda s: s.start_unix_ns)
    obs = root.observation
    assert obs is not None
    start = root.start_unix_ns
    end = start + _ns(record.e2e_s) if record.e2e_s is not None else root.end_unix_ns
    segments: list[Segment] = []
    missing: list[str] = []
    waiting, forward = stages.get("prefill_waiting"), stages.get("prefill_forward")
    pre = [s for name in _PREPROCESS_STAGES for s in stages.get(name, ())]
    if waiting and forward:
        if pre:
            pre_end = max(s.end_unix_ns for s in pre)
            pre_start = min(min(s.start_unix_ns for s in pre), start)
            if pre_end > pre_start:
                segments.append(_new_tuple(Segment, ("preprocess", pre_start, pre_end)))
        record.queue_s = sum(_seconds(s) for s in waiting)  # one per retraction
        segments.append(_new_tuple(Segment, ("queue", waiting[0].start_unix_ns, waiting[-1].end_unix_ns)))
        record.prefill_s = sum(_seconds(s) for s in forward)
        segments.append(_new_tuple(Segment, ("prefill", forward[0].start_unix_ns, forward[-1].end_unix_ns)))
    else:
        # Scheduler spans lost (sglang#38210), or a request aborted in the queue: the root's attributes only.
        record.queue_s = record.prefill_s = None
        missing += ["queue", "prefill"]
        dispatch_to_first = obs.mark("dispatch_to_first_token_s")
        ttft = record.ttft_s
        if ttft is not None and isinstance(dispatch_to_first, float) and 0.0 <= dispatch_to_first <= ttft:
            handoff = start + _ns(ttft - dispatch_to_first)
            if handoff > start:
                segments.append(_new_tuple(Segment, ("preprocess", start, handoff)))
            segments.append(_new_tuple(Segment, (QUEUE_AND_PREFILL, handoff, start + _ns(ttft))))
    decode_spans = stages.get("decode_forward") or stages.get("decode_loop")
    if decode_spans:
        record.decode_s = sum(_seconds(s) for s in decode_spans)
        segments.append(_new_tuple(Segment, ("decode", decode_spans[0].start_unix_ns, decode_spans[-1].end_unix_ns)))
    elif record.decode_s is not None and record.ttft_s is not None:
        first = start + _ns(record.ttft_s)
        segments.append(_new_tuple(Segment, ("decode", first, first + _ns(record.decode_s))))
    else:
        record.decode_s = None
        missing.append("decode")
    for name in _KV_STAGES:
        stage_spans = stages.get(name)
        if stage_spans:
            segments.append(_new_tuple(Segment, (KV_TRANSFER, stage_spans[0].start_unix_ns,
                                                  stage_spans[-1].end_unix_ns)))
            break
    record.inference_s = (record.prefill_s + record.decode_s
                          if record.prefill_s is not None and record.decode_s is not None else None)
    _tpot(record)
    segments.sort(key=lambda s: s.start_unix_ns)
    _tail(record, segments, end)
    record.segments_missing = tuple(missing)


def _sglang_stages(trace: PendingTrace, root: BufferedSpan) -> tuple[dict[str, list[BufferedSpan]], bool]:
    """The stage spans below an SGLang root by stage name (each list by start), and whether a thread span
    below it was closed with status ERROR (an abort while queued)."""
    below = descendants(trace, root)
    stages: dict[str, list[BufferedSpan]] = {}
    for span in _parts(below, Part.SGLANG_STAGE):
        assert span.observation is not None
        stages.setdefault(str(span.observation.mark("stage")), []).append(span)
    for spans in stages.values():
        if len(spans) > 1:  # most stages have one span
            spans.sort(key=lambda s: s.start_unix_ns)
    return stages, any(span.status_code == _ERROR for span in below)


_PD_PREFILL_PRE = ("tokenize", "api_server_dispatch", "prefill_prepare", "prefill_bootstrap")


def sglang_disaggregated(record: RequestRecord, decode_root: BufferedSpan, prefill_root: BufferedSpan,
                         trace: PendingTrace) -> None:
    """One PD-disaggregated SGLang request from its two roots (tests/support/engine_fixtures.py
    ``sglang_pd_request``): the record is the decode root's (the answer: first token, tokens, finish reason,
    model); queue and prefill are the prefill server's ``prefill_waiting`` / ``prefill_forward``; the KV
    transfer is the prefill server's ``prefill_transfer_kv_cache``; the decode server's ``decode_waiting`` is
    its ``decode_queue`` and its ``decode_forward`` the decode. Its ``decode_transferred`` is not used: it
    waits for the prefill server's whole queue and prefill, so it is no transfer time. Starts with whichever
    server received the request first."""
    d_obs, p_obs = decode_root.observation, prefill_root.observation
    assert d_obs is not None and p_obs is not None
    p_stages, p_error = _sglang_stages(trace, prefill_root)
    d_stages, d_error = _sglang_stages(trace, decode_root)
    if record.outcome == Outcome.UNKNOWN and (p_error or d_error):
        record.outcome = Outcome.ABORT
        record.error_type = record.error_type or ABORTED_ERROR_TYPE
    start = min(decode_root.start_unix_ns, prefill_root.start_unix_ns)
    d_start = decode_root.start_unix_ns
    end = d_start + _ns(record.e2e_s) if record.e2e_s is not None else decode_root.end_unix_ns
    record.start_unix_ns = start
    record.e2e_s = (end - start) / 1e9
    if record.ttft_s is not None:
        record.ttft_s = (d_start + _ns(record.ttft_s) - start) / 1e9
    segments: list[Segment] = []
    missing: list[str] = []
    pre = [s for name in _PD_PREFILL_PRE for s in p_stages.get(name, ())]
    if pre:
        pre_end = max(s.end_unix_ns for s in pre)
        if pre_end > start:
            segments.append(Segment("preprocess", start, pre_end))
    waiting, forward = p_stages.get("prefill_waiting"), p_stages.get("prefill_forward")
    record.queue_s = record.prefill_s = None
    if waiting and forward:
        record.queue_s = sum(_seconds(s) for s in waiting)
        segments.append(Segment("queue", waiting[0].start_unix_ns, waiting[-1].end_unix_ns))
        record.prefill_s = sum(_seconds(s) for s in forward)
        segments.append(Segment("prefill", forward[0].start_unix_ns, forward[-1].end_unix_ns))
    else:
        missing += ["queue", "prefill"]  # the prefill server's scheduler spans are lost (sglang#38210)
    kv = p_stages.get("prefill_transfer_kv_cache")
    if kv:
        segments.append(Segment(KV_TRANSFER, kv[0].start_unix_ns, kv[-1].end_unix_ns))
    else:
        missing.append(KV_TRANSFER)
    d_waiting = d_stages.get("decode_waiting")
    if d_waiting:
        segments.append(Segment("decode_queue", d_waiting[0].start_unix_ns, d_waiting[-1].end_unix_ns))
    decode_spans = d_stages.get("decode_forward") or d_stages.get("decode_loop")
    if decode_spans:
        record.decode_s = sum(_seconds(s) for s in decode_spans)
        segments.append(Segment("decode", decode_spans[0].start_unix_ns, decode_spans[-1].end_unix_ns))
    else:
        record.decode_s = None
        missing.append("decode")
    record.inference_s = (record.prefill_s + record.decode_s
                          if record.prefill_s is not None and record.decode_s is not None else None)
    if record.prompt_tokens is None:
        record.prompt_tokens = p_obs.prompt_tokens
    if p_obs.cached_tokens:  # the prefix cache is the prefill server's
        record.cached_tokens = p_obs.cached_tokens
    _tpot(record)
    segments.sort(key=lambda s: s.start_unix_ns)
    _tail(record, segments, end)
    record.segments_missing = tuple(missing)


# --- Triton -------------------------------------------------------------------------------------


def _event(span: BufferedSpan, name: str) -> int:
    assert span.observation is not None
    value = span.observation.mark(name)
    if not isinstance(value, int) or value <= 0:
        raise MalformedSpan("missing_event", f"{name} missing")
    return value


def triton(record: RequestRecord, root: BufferedSpan, trace: PendingTrace) -> None:
    below = descendants(trace, root)
    models = _parts(below, Part.TRITON_MODEL)
    if not models:
        raise MalformedSpan("missing_span", "InferRequest without a model span")
    computes = {s.parent_span_id: s for s in _parts(below, Part.TRITON_COMPUTE)}
    top = next((m for m in models if m.parent_span_id == root.span_id), models[0])
    serving = top
    if top.span_id not in computes:
        # An ensemble has no compute of its own: its composing model that computed longest serves it.
        with_compute = [m for m in models if m.span_id in computes]
        if not with_compute:
            raise MalformedSpan("missing_span", "no model of the request has a compute span")
        serving = max(with_compute, key=lambda m: computes[m.span_id].end_unix_ns - computes[m.span_id].start_unix_ns)
    compute = computes[serving.span_id]
    request_start = _event(top, "REQUEST_START")
    queue_start = _event(serving, "QUEUE_START")
    times = [_event(serving, "REQUEST_START"), queue_start]
    times += [_event(compute, n) for n in ("COMPUTE_START", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START", "COMPUTE_END")]
    times.append(_event(serving, "REQUEST_END"))
    if any(b < a for a, b in zip(times, times[1:])):
        raise MalformedSpan("out_of_order_events", "Triton timestamps out of order")
    compute_start, output_start, compute_end = times[2], times[4], times[5]
    obs = root.observation
    assert obs is not None
    first = obs.mark("first_response")
    received = obs.mark("HTTP_RECV_END") or obs.mark("GRPC_WAITREAD_END") or root.start_unix_ns
    assert isinstance(received, int)
    record.ttft_s = None
    if isinstance(first, int):
        if first < request_start or first < received:
            raise MalformedSpan("out_of_order_events", "INFER_RESPONSE_COMPLETE before the request started")
        responses = obs.mark("responses")
        # Streaming (gRPC stream, HTTP generate_stream): the first response precedes the final batch,
        # or there are several. A unary response is the whole answer: no TTFT.
        if (isinstance(responses, int) and responses > 1) or first < output_start:
            record.ttft_s = (first - received) / 1e9
    record.queue_s = (compute_start - queue_start) / 1e9
    record.prefill_s = record.decode_s = record.inference_s = record.tpot_s = None
    assert top.observation is not None
    name = top.observation.mark("model")
    if isinstance(name, str) and name:
        # Behind a gateway the request model is the gateway's; the label is still what Triton ran.
        if not record.request_model:
            record.request_model = name
        if not record.model:
            record.model, record.model_source = name, "span:triton.model_name"
    segments = []
    if queue_start > root.start_unix_ns:
        segments.append(Segment("preprocess", root.start_unix_ns, queue_start))
    segments.append(Segment("queue", queue_start, compute_start))
    segments.append(Segment(COMPUTE, compute_start, compute_end))
    _tail(record, segments, root.end_unix_ns)
    record.segments_missing = ("prefill", "decode")


# --- trtllm-serve disaggregated -----------------------------------------------------------------


def trtllm_disaggregated(record: RequestRecord, gen: BufferedSpan, ctx: BufferedSpan) -> None:
    """One request from the context server's span (queue, prefill) and the generation server's (KV
    transfer, first token, decode)."""
    c, g = ctx.observation, gen.observation
    assert c is not None and g is not None
    start = ctx.start_unix_ns
    record.start_unix_ns = start
    gen_start = gen.start_unix_ns
    segments: list[Segment] = []
    record.queue_s, record.prefill_s = c.queue_s, c.prefill_s
    if c.queue_s is not None:
        segments.append(Segment("queue", start, start + _ns(c.queue_s)))
        if c.ttft_s is not None:
            segments.append(Segment("prefill", start + _ns(c.queue_s), start + _ns(c.ttft_s)))
    kv = g.mark("kv_transfer_s")
    if isinstance(kv, float):
        kv_start = gen_start + _ns(g.queue_s or 0.0)
        segments.append(Segment(KV_TRANSFER, kv_start, kv_start + _ns(kv)))
    gen_end = gen_start + _ns(g.e2e_s) if g.e2e_s is not None else gen.end_unix_ns
    record.e2e_s = (gen_end - start) / 1e9
    record.ttft_s = None
    record.decode_s = g.decode_s
    if g.ttft_s is not None:
        first = gen_start + _ns(g.ttft_s)
        record.ttft_s = (first - start) / 1e9
        segments.append(Segment("decode", first, gen_end))
    record.inference_s = None
    if record.prompt_tokens is None:
        record.prompt_tokens = c.prompt_tokens
    _tpot(record)
    segments.sort(key=lambda s: s.start_unix_ns)
    record.segments = tuple(segments)
    record.segments_derived = tuple(sorted(set(c.derived) | set(g.derived)))
    record.segments_missing = () if isinstance(kv, float) else (KV_TRANSFER,)


# --- Dynamo -------------------------------------------------------------------------------------


def _engine_below(worker: BufferedSpan | None, trace: PendingTrace, engines: list[BufferedSpan]
                  ) -> tuple[BufferedSpan, dict[str, Segment]] | None:
    """The engine's own span (e.g. vLLM's) under a Dynamo worker, with its segments."""
    if worker is None:
        return None
    for span in engines:
        if span.observation is not None and any(a.span_id == worker.span_id for a in trace.ancestors(span)):
            return span, _by_name(build_segments(span.start_unix_ns, derive_timings(span.observation, float("inf"))))
    return None


def dynamo(record: RequestRecord, root: BufferedSpan, trace: PendingTrace,
           engines: list[BufferedSpan] | None = None) -> str | None:
    """Returns the finish reason the (decode) worker reported, if any. ``engines``: the engines' own
    spans in the trace; one under a worker gives that worker's queue/prefill/decode (FACTS.md)."""
    obs = root.observation
    assert obs is not None
    workers: dict[str, BufferedSpan] = {}
    finish: str | None = None
    for span in _parts(descendants(trace, root), Part.DYNAMO_WORKER):
        assert span.observation is not None
        workers.setdefault(str(span.observation.mark("role")), span)
    disaggregated = obs.mark("prefill_worker_id") is not None or obs.mark("decode_worker_id") is not None
    start, end = root.start_unix_ns, root.end_unix_ns
    segments: list[Segment] = []
    missing = ["queue", "prefill"]
    record.queue_s = record.prefill_s = record.inference_s = None
    record.decode_s = None
    first_worker: BufferedSpan | None
    if disaggregated:
        prefill, decode = workers.get("prefill"), workers.get("decode")
        if prefill is None or decode is None:
            raise MalformedSpan("missing_span", "disaggregated Dynamo request without both workers' spans")
        first_worker = prefill
    else:
        decode = workers.get("agg")
        prefill = None
        first_worker = decode
    if first_worker is not None and first_worker.start_unix_ns > start:
        segments.append(Segment("preprocess", start, first_worker.start_unix_ns))  # + routing
    if prefill is not None:
        segments.append(Segment(QUEUE_AND_PREFILL, prefill.start_unix_ns, prefill.end_unix_ns))
    if decode is not None:
        assert decode.observation is not None
        worker_ttft = decode.observation.mark("ttft_s")
        if isinstance(worker_ttft, float) and worker_ttft >= 0:
            first = decode.start_unix_ns + _ns(worker_ttft)
            if prefill is not None:
                segments.append(Segment(KV_TRANSFER, prefill.end_unix_ns, first))
            else:
                segments.append(Segment(QUEUE_AND_PREFILL, decode.start_unix_ns, first))
            segments.append(Segment("decode", first, decode.end_unix_ns))
            record.decode_s = (decode.end_unix_ns - first) / 1e9
        else:
            missing.append("decode")
            if prefill is not None:
                missing.append(KV_TRANSFER)
        reason = decode.observation.mark("finish_reason")
        if isinstance(reason, str) and reason:
            finish = reason
    else:
        missing.append("decode")
    if engines:
        _dynamo_engine_segments(record, segments, missing, trace, engines, prefill or decode,
                                decode if prefill is not None else None)
    segments.sort(key=lambda s: s.start_unix_ns)
    _tail(record, segments, end)
    record.segments_missing = tuple(missing)
    return finish


def _dynamo_engine_segments(record: RequestRecord, segments: list[Segment], missing: list[str], trace: PendingTrace,
                            engines: list[BufferedSpan], first: BufferedSpan | None,
                            decode_worker: BufferedSpan | None) -> None:
    """Queue and prefill from the engine span under the first (prefill or aggregated) worker, decode
    from the one under the decode worker (or the same one)."""
    head = _engine_below(first, trace, engines)
    if head is not None:
        own = head[1]
        if "queue" in own and "prefill" in own:
            segments[:] = [s for s in segments if s.name != QUEUE_AND_PREFILL]
            segments += [own["queue"], own["prefill"]]
            record.queue_s, record.prefill_s = own["queue"].duration_s, own["prefill"].duration_s
            missing[:] = [m for m in missing if m not in ("queue", "prefill")]
    tail = _engine_below(decode_worker, trace, engines) if decode_worker is not None else head
    if tail is not None and "decode" in tail[1]:
        segments[:] = [s for s in segments if s.name != "decode"]
        segments.append(tail[1]["decode"])
        record.decode_s = tail[1]["decode"].duration_s
        if decode_worker is not None and "queue" in tail[1]:
            segments.append(Segment("decode_queue", tail[1]["queue"].start_unix_ns, tail[1]["queue"].end_unix_ns))
        missing[:] = [m for m in missing if m != "decode"]
    if record.prefill_s is not None and record.decode_s is not None:
        record.inference_s = record.prefill_s + record.decode_s


# --- llm-d --------------------------------------------------------------------------------------


def _by_name(segments: Iterable[Segment]) -> dict[str, Segment]:
    return {s.name: s for s in segments}


def llmd(record: RequestRecord, root: BufferedSpan, trace: PendingTrace, edge: BufferedSpan | None,
         engines: list[BufferedSpan]) -> str | None:
    """Returns the finish reason the decode pod's vLLM reported, if any."""
    finish: str | None = None
    spans = list(trace.spans.values())  # one request per gateway trace
    proxies: dict[str, BufferedSpan] = {}
    for span in _parts(spans, Part.LLMD_PROXY):
        assert span.observation is not None
        proxies.setdefault(str(span.observation.mark("role")), span)
    prefill, decode = proxies.get("prefill"), proxies.get("decode")
    if prefill is None or decode is None:
        raise MalformedSpan("missing_span", "disaggregated llm-d request without its prefill and decode spans")
    for span in _parts(spans, Part.LLMD_ORCHESTRATION):
        assert span.observation is not None
        model = span.observation.mark("target_model")
        if isinstance(model, str) and model and not record.request_model:
            record.request_model = model
            if not record.model:
                record.model, record.model_source = model, "gateway:target_model"
    base = edge or root
    start, end = base.start_unix_ns, base.end_unix_ns
    record.start_unix_ns = start
    record.e2e_s = (end - start) / 1e9
    segments: list[Segment] = []
    if prefill.start_unix_ns > start:
        segments.append(Segment("routing", start, prefill.start_unix_ns))
    pod_prefill = pod_decode = None
    for span in engines:
        chain = {a.span_id for a in trace.ancestors(span)}
        if decode.span_id in chain:
            pod_decode = pod_decode or span
        elif prefill.span_id in chain:
            pod_prefill = pod_prefill or span
    record.ttft_s = record.queue_s = record.prefill_s = record.decode_s = record.inference_s = None
    missing: list[str] = []
    if pod_prefill is not None and pod_decode is not None:
        p_obs, d_obs = pod_prefill.observation, pod_decode.observation
        assert p_obs is not None and d_obs is not None
        pt, dt = derive_timings(p_obs, float("inf")), derive_timings(d_obs, float("inf"))
        ps = _by_name(build_segments(pod_prefill.start_unix_ns, pt))
        ds = _by_name(build_segments(pod_decode.start_unix_ns, dt))
        for name, source in (("queue", ps.get("queue")), ("prefill", ps.get("prefill")),
                             ("decode_queue", ds.get("queue")), (KV_TRANSFER, ds.get("prefill")),
                             ("decode", ds.get("decode"))):
            if source is not None:
                segments.append(Segment(name, source.start_unix_ns, source.end_unix_ns))
            elif name in ("queue", "prefill", "decode"):
                missing.append(name)
        if pt.queue_s is not None or dt.queue_s is not None:
            record.queue_s = (pt.queue_s or 0.0) + (dt.queue_s or 0.0)
        record.prefill_s, record.decode_s = pt.prefill_s, dt.decode_s
        if dt.ttft_s is not None:
            record.ttft_s = (pod_decode.start_unix_ns + _ns(dt.ttft_s) - start) / 1e9
        if record.prefill_s is not None and record.decode_s is not None and dt.prefill_s is not None:
            record.inference_s = record.prefill_s + dt.prefill_s + record.decode_s
        record.prompt_tokens = d_obs.prompt_tokens if d_obs.prompt_tokens is not None else p_obs.prompt_tokens
        record.completion_tokens = d_obs.completion_tokens
        record.provider_name = d_obs.provider_name or record.provider_name
        finish = d_obs.finish_reason
        for obs in (d_obs, p_obs):
            model = obs.response_model or obs.request_model
            if model and not record.model:
                record.model, record.model_source, record.request_model = model, "span:gen_ai.request.model", model
    else:
        # The proxy's own view: its prefill and decode calls, the coordination between; no first token.
        segments.append(Segment("prefill", prefill.start_unix_ns, prefill.end_unix_ns))
        if decode.start_unix_ns > prefill.end_unix_ns:
            segments.append(Segment("coordination", prefill.end_unix_ns, decode.start_unix_ns))
        segments.append(Segment("decode", decode.start_unix_ns, decode.end_unix_ns))
        record.prefill_s, record.decode_s = _seconds(prefill), _seconds(decode)
        missing.append("queue")
    _tpot(record)
    segments.sort(key=lambda s: s.start_unix_ns)
    _tail(record, segments, end)
    record.segments_missing = tuple(missing)
    return finish


COMPOSITE_KINDS = frozenset({EngineKind.SGLANG, EngineKind.TRITON, EngineKind.DYNAMO, EngineKind.LLM_D})
