"""Sending a ``Plan``: one TracerProvider per fleet process, real OTLP exporters, real-time pacing.

Every fleet member (the gateway, the application tier, the LiteLLM proxy, each model's engine) gets
the provider its process would build (``engine_tracer_provider``: resource, id generator seeded from
the plan, BatchSpanProcessor) and its own exporter, as separate processes have. Requests are
emitted in send order, each when its last span ends (``--fast``: at once), so the span ids that
the seeded generators hand out — and with them the whole output — are a function of the plan alone.
A request from the application tier is emitted outside in: the app's CLIENT span, its httpx POST,
then what it calls (the gateway, the LiteLLM proxy or the engine) with the traceparent it got.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Final
from urllib.parse import urlsplit

from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from otel_llm_simulate.clients import emit_app_client, emit_litellm_proxy
from otel_llm_simulate.emitters import (
    emit_dynamo,
    emit_gateway,
    emit_llmd,
    emit_sglang,
    emit_tgi,
    emit_triton,
    emit_trtllm_serve,
    emit_vllm_next,
    emit_vllm_v1,
    engine_tracer_provider,
)
from otel_llm_simulate.scenarios import (
    APP_MEMBER,
    GATEWAY_MEMBER,
    GATEWAY_ROUTE,
    OUTCOMES,
    PROXY_MEMBER,
    Plan,
    PlannedRequest,
)

_CALLERS = frozenset({GATEWAY_MEMBER, APP_MEMBER, PROXY_MEMBER})

__all__ = ["ExporterFactory", "RunResult", "format_summary", "otlp_exporter_factory", "run_plan"]

ExporterFactory = Callable[[], SpanExporter]

# BatchSpanProcessor silently drops spans once its queue (2048 by default) is full, which --fast
# would cause in a moment. Flushing a provider synchronously once this many spans are waiting
# keeps every span; the batches the exporter sends are still the SDK's.
FLUSH_AT_PENDING_SPANS: Final = 1024
# Consecutive failed exports, with none ever succeeding, after which the endpoint is taken as
# unreachable and the run stops instead of timing out batch after batch.
UNREACHABLE_AFTER_FAILURES: Final = 3
PROGRESS_EVERY_S: Final = 10.0


def otlp_exporter_factory(endpoint: str, protocol: str, timeout_s: float = 10.0) -> ExporterFactory:
    """OTLP exporters as engines configure them: gRPC ``insecure=True``, or HTTP/protobuf to ``/v1/traces``.

    ``endpoint`` is ``host:port``; a URL is accepted too (for HTTP, a URL with a path is used as is).
    """
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter

        target = endpoint.removeprefix("http://").removeprefix("grpc://").rstrip("/")
        return lambda: GrpcExporter(endpoint=target, insecure=True, timeout=timeout_s)
    if protocol == "http":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter

        url = endpoint if "://" in endpoint else f"http://{endpoint}"
        if urlsplit(url).path in ("", "/"):
            url = url.rstrip("/") + "/v1/traces"  # what OTEL_EXPORTER_OTLP_ENDPOINT appends too
        return lambda: HttpExporter(endpoint=url, timeout=timeout_s)
    raise ValueError(f"unknown protocol {protocol!r}; expected grpc or http")


class _Tally:
    """Span accounting of one provider: ended (handed to the processor) vs exported vs failed."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.ended = 0
        self.exported = 0
        self.failed = 0
        self.failed_exports = 0
        self.successful_exports = 0

    def pending(self) -> int:
        with self._lock:
            return self.ended - self.exported - self.failed


class _CountingExporter(SpanExporter):
    def __init__(self, inner: SpanExporter, tally: _Tally) -> None:
        self._inner = inner
        self._tally = tally

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        try:
            result = self._inner.export(spans)
        except Exception:  # an exporter bug must count as a failure, not kill the BSP worker
            result = SpanExportResult.FAILURE
        with self._tally._lock:
            if result is SpanExportResult.SUCCESS:
                self._tally.exported += len(spans)
                self._tally.successful_exports += 1
            else:
                self._tally.failed += len(spans)
                self._tally.failed_exports += 1
        return result

    def shutdown(self) -> None:
        self._inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self._inner.force_flush(timeout_millis)


class _EndCounter(SpanProcessor):
    """Counts spans as they end, so spans the BatchSpanProcessor dropped show up as a difference."""

    def __init__(self, tally: _Tally) -> None:
        self._tally = tally

    def on_end(self, span: ReadableSpan) -> None:
        with self._tally._lock:
            self._tally.ended += 1


@dataclass
class _Member:
    provider: TracerProvider
    tally: _Tally


@dataclass
class RunResult:
    sent: Counter[tuple[str, str, str]] = field(default_factory=Counter)  # (engine, model, outcome)
    sent_indices: set[int] = field(default_factory=set)  # PlannedRequest.index of each request sent
    # application calls sent, by path: "direct", "litellm", "gateway", "no propagation"; and joined ones
    client_calls: Counter[str] = field(default_factory=Counter)
    client_calls_joined: int = 0
    spans_ended: int = 0
    spans_exported: int = 0
    spans_failed: int = 0
    failed_exports: int = 0
    interrupted: bool = False
    unreachable: bool = False
    elapsed_s: float = 0.0

    @property
    def requests_sent(self) -> int:
        return sum(self.sent.values())

    @property
    def spans_dropped(self) -> int:
        return max(self.spans_ended - self.spans_exported - self.spans_failed, 0)

    @property
    def ok(self) -> bool:
        return self.spans_failed == 0 and self.spans_dropped == 0 and not self.unreachable


def _emit(members: dict[str, _Member], request: PlannedRequest) -> None:
    timing = request.timing
    engine_provider = members[request.model].provider

    def engine_call(headers: dict[str, str] | None) -> None:
        if timing is None:
            return
        finish = request.outcome if request.outcome in ("stop", "length") else "stop"
        engine = request.engine
        if engine == "vllm-v1":
            emit_vllm_v1(engine_provider, timing, request_id=request.request_id, params=request.params,
                         traceparent_headers=headers)
        elif engine == "vllm-next":
            emit_vllm_next(engine_provider, timing, model=request.model, request_id=request.request_id,
                           finish_reason=finish, traceparent_headers=headers)
        elif engine == "sglang":
            emit_sglang(engine_provider, timing, rid=request.request_id, model=request.model,
                        finish_reason=finish, params=request.params, traceparent_headers=headers,
                        aborted=request.outcome == "abort")
        elif engine == "tgi":
            # Behind an OpenAI-style gateway TGI serves /v1/chat/completions.
            emit_tgi(engine_provider, timing, handler="chat_completions", stream=request.stream,
                     params=request.params, traceparent_headers=headers, success=request.outcome != "error")
        elif engine == "triton":
            emit_triton(engine_provider, timing, model=request.model, streaming=request.stream)
        elif engine == "triton-ensemble":
            emit_triton(engine_provider, timing, model="tensorrt_llm", ensemble=request.model,
                        streaming=request.stream)
        elif engine == "trtllm":
            emit_trtllm_serve(engine_provider, timing, request_id=request.request_id, finish_reason=finish,
                              traceparent_headers=headers)
        elif engine == "dynamo":
            emit_dynamo(engine_provider, members[f"{request.model}/prefill"].provider,
                        members[f"{request.model}/decode"].provider, timing, model=request.model,
                        kv_transfer_s=request.kv_transfer_s, finish_reason=finish)
        elif engine == "llm-d":
            emit_llmd(engine_provider, members[f"{request.model}/sidecar"].provider,
                      members[f"{request.model}/prefill"].provider, members[f"{request.model}/decode"].provider,
                      timing, model=request.model, kv_load_s=request.kv_transfer_s, finish_reason=finish)
        else:
            raise ValueError(f"the simulator has no emitter for engine {request.engine!r}")

    gateway = request.gateway

    def through_gateway(headers: dict[str, str] | None) -> None:
        assert gateway is not None
        emit_gateway(
            members[GATEWAY_MEMBER].provider,
            start_unix_ns=gateway.start_ns,
            end_unix_ns=gateway.end_ns,
            model=request.model,
            route=GATEWAY_ROUTE,
            # No engine span, no engine call: the gateway span then has no child, which is all an
            # abort (or an unreachable upstream) leaves behind.
            engine_call=engine_call if timing is not None else None,
            status_error=gateway.status_error,
            ttft_s=gateway.ttft_s,
            traceparent_headers=headers,
        )

    def through_proxy(headers: dict[str, str] | None) -> None:
        assert request.proxy is not None and timing is not None
        emit_litellm_proxy(
            members[PROXY_MEMBER].provider, request.proxy, model=request.model, caller_headers=headers,
            upstream_call=engine_call, stream=request.stream, params=request.params,
            upstream_response_model=request.model, response_id=request.request_id or None,
            input_tokens=timing.prompt_tokens, output_tokens=timing.completion_tokens,
            finish_reason=request.outcome, call_id=_call_id(request),
        )

    client = request.client
    upstream = through_gateway if gateway is not None else engine_call
    if client is None:
        upstream(None)
        return
    if client.via == "litellm":
        upstream = through_proxy
    emit_app_client(members[APP_MEMBER].provider, client.call, propagate=client.propagates, upstream_call=upstream)


def _call_id(request: PlannedRequest) -> str:
    """LiteLLM's litellm.call_id is a uuid4; derived from the request so runs stay reproducible."""
    return str(uuid.uuid5(uuid.NAMESPACE_OID, f"otel-llm-sim/litellm/{request.index}/{request.request_id}"))


def run_plan(
    plan: Plan,
    exporter_factory: ExporterFactory,
    *,
    realtime: bool = True,
    stop: threading.Event | None = None,
    progress: Callable[[str], None] | None = None,
    on_sent: Callable[[PlannedRequest], None] | None = None,
    clock_ns: Callable[[], int] = time.time_ns,
) -> RunResult:
    """Send ``plan``'s spans. Real time: each request when its ``send_at`` arrives on ``clock_ns``
    (the plan's timestamps are wall-clock); otherwise as fast as possible. ``on_sent`` is called
    after each request's spans were handed to the SDK. Returns what was sent."""
    stop = stop or threading.Event()
    started = time.monotonic()
    members: dict[str, _Member] = {}
    for m in plan.members:
        tally = _Tally()
        provider = engine_tracer_provider(
            m.kind, _CountingExporter(exporter_factory(), tally), service_name=m.service_name,
            process_id=m.process_id, simple=False, seed=m.id_seed,
        )
        provider.add_span_processor(_EndCounter(tally))
        members[m.name] = _Member(provider, tally)

    result = RunResult()
    next_progress = started + PROGRESS_EVERY_S
    order = plan.send_order()
    try:
        for request in order:
            if realtime:
                # Loop: Event.wait runs on the monotonic clock, the plan on the wall clock; never
                # send a span before the wall clock has reached its end time.
                while (delay_ns := request.send_at_ns - clock_ns()) > 0 and not stop.is_set():
                    stop.wait(delay_ns / 1e9)
            if stop.is_set():
                break
            _emit(members, request)
            result.sent[(request.engine, request.model, request.outcome)] += 1
            result.sent_indices.add(request.index)
            if request.client is not None:
                result.client_calls[request.client.via if request.client.propagates else "no propagation"] += 1
                result.client_calls_joined += request.client.joined
            if on_sent is not None:
                on_sent(request)
            for member in members.values():
                if member.tally.pending() >= FLUSH_AT_PENDING_SPANS:
                    member.provider.force_flush()
            if _unreachable(members):
                result.unreachable = True
                break
            if progress is not None and time.monotonic() >= next_progress:
                next_progress += PROGRESS_EVERY_S
                progress(f"{result.requests_sent}/{len(order)} requests sent, "
                         f"{sum(m.tally.exported for m in members.values())} spans exported")
    finally:
        result.interrupted = stop.is_set()
        for member in members.values():
            member.provider.shutdown()  # flushes what is queued, then shuts the exporter down
        for member in members.values():
            result.spans_ended += member.tally.ended
            result.spans_exported += member.tally.exported
            result.spans_failed += member.tally.failed
            result.failed_exports += member.tally.failed_exports
        result.elapsed_s = time.monotonic() - started
    return result


def _unreachable(members: dict[str, _Member]) -> bool:
    successes = sum(m.tally.successful_exports for m in members.values())
    failures = sum(m.tally.failed_exports for m in members.values())
    return successes == 0 and failures >= UNREACHABLE_AFTER_FAILURES


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def format_summary(plan: Plan, result: RunResult) -> str:
    """Requests by engine/model/outcome (with the TTFT the plan gave them), spans, failures."""
    outcome_cols = "".join(f"{o:>8}" for o in OUTCOMES)
    lines = [f"{'engine':<15} {'model':<24}{outcome_cols}{'total':>8}   planned TTFT p50 / p99"]
    for member in plan.members:
        if member.name in _CALLERS or member.role:
            continue
        engine, model = member.engine or member.kind, member.name
        counts = [result.sent[(engine, model, o)] for o in OUTCOMES]
        ttfts = [r.timing.ttft_s for r in plan.requests
                 if r.model == model and r.outcome in ("stop", "length") and r.timing is not None]
        ttft = f"{_quantile(ttfts, 0.5):7.3f}s / {_quantile(ttfts, 0.99):.3f}s" if ttfts else "-"
        lines.append(f"{engine:<15} {model:<24}" + "".join(f"{c:>8}" for c in counts) + f"{sum(counts):>8}   {ttft}")
    totals = [sum(v for (_, _, o), v in result.sent.items() if o == outcome) for outcome in OUTCOMES]
    lines.append(f"{'all':<15} {'':<24}" + "".join(f"{c:>8}" for c in totals) + f"{sum(totals):>8}")
    # What otel-llm counts per engine_kind for what was sent (requests_assembled_total, server side): an
    # ensemble, a disaggregated request once; aborts and failures only the gateway saw are "genai".
    sent_kinds = Counter(r.engine_kind for r in plan.requests if r.index in result.sent_indices)
    lines.append("server requests by engine_kind: "
                 + ", ".join(f"{kind} {n}" for kind, n in sorted(sent_kinds.items())))
    if result.client_calls:
        calls = sum(result.client_calls.values())
        paths = ", ".join(f"{via} {n}" for via, n in sorted(result.client_calls.items()))
        lines.append(f"app tier (client spans): {calls} calls ({paths}), {result.client_calls_joined} joined "
                     "to an engine span")
    lines.append(
        f"requests: {result.requests_sent} sent of {len(plan.requests)} planned; "
        f"spans: {result.spans_exported} sent, {result.spans_failed} failed "
        f"({result.failed_exports} failed exports), {result.spans_dropped} dropped; {result.elapsed_s:.1f}s"
    )
    if result.unreachable:
        lines.append("stopped: every export failed, the endpoint looks unreachable")
    elif result.interrupted:
        lines.append("stopped early: interrupted")
    return "\n".join(lines)
