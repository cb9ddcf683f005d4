"""Long calls and client-side facts, on the completion chain with the assembler's clock scaled:
a stream many times longer than ``decision_wait`` (its HTTP span first, the engine span at the end,
the GenAI client span last) is held and measured joined; a GenAI client span that still comes
after its trace was decided is measured like a late engine span; an error's type comes from the
exception event; a client span that does not cover its engine's request gives no overhead, counted."""

from __future__ import annotations

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

from otel_llm.pdata.records import Side
from otel_llm.processor.tail_sampling.config import PolicyConfig, ProbabilisticPolicyConfig, TailSamplingProcessor
from tests.support.engine_fixtures import event, make_span, resource_spans, span_id, trace_id, vllm_request_span
from tests.unit.service.test_chain import Collecting, default_processors, pipeline, sample

DECISION_WAIT = 10.0
STREAM_S = 20.0  # twice the default decision_wait; the clock below is scaled, so minutes cost nothing


def sampling(max_open_call_wait: float) -> TailSamplingProcessor:
    return TailSamplingProcessor(
        decision_wait=DECISION_WAIT, grace=0.0, max_open_call_wait=max_open_call_wait,
        policies=[PolicyConfig(name="all", type="probabilistic", probabilistic=ProbabilisticPolicyConfig(100.0))])


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Call:
    """One streamed chat call: the GenAI client span (root), its HTTP span, the engine's span."""

    def __init__(self, seed: str, stream_s: float = STREAM_S, client_s: float | None = None,
                 error: str | None = None) -> None:
        self.trace, self.genai_id, self.http_id = trace_id(seed), span_id(f"{seed}-genai"), span_id(f"{seed}-http")
        self.engine = vllm_request_span(parent=(self.trace, self.http_id), seed=seed, request_id=f"req-{seed}",
                                        decode_steps=(stream_s / 8,) * 7)
        engine_span = self.engine.resource_spans[0].scope_spans[0].spans[0]
        self.engine_e2e_s = (engine_span.end_time_unix_nano - engine_span.start_time_unix_nano) / 1e9
        start = engine_span.start_time_unix_nano - 2_000_000
        end = start + int((client_s if client_s is not None else self.engine_e2e_s + 0.004) * 1e9)
        self.client_s = (end - start) / 1e9
        attrs = {"gen_ai.operation.name": "chat", "gen_ai.system": "openai", "gen_ai.request.model": "m",
                 "gen_ai.response.model": "m", "gen_ai.usage.input_tokens": 32, "gen_ai.usage.output_tokens": 8,
                 "gen_ai.response.finish_reasons": ["stop"]}
        events = []
        status = Status.STATUS_CODE_UNSET
        if error:  # Logfire's shape: no error.type, the exception event names the class
            attrs = {k: v for k, v in attrs.items() if not k.startswith(("gen_ai.usage", "gen_ai.response"))}
            events = [event("exception", end, {"exception.type": error, "exception.message": "Error code: 429"})]
            status = Status.STATUS_CODE_ERROR
        genai = make_span("Chat Completion with {request_data[model]!r}", trace=self.trace, sid=self.genai_id,
                          parent=None, kind=Span.SPAN_KIND_CLIENT, start_ns=start, end_ns=end, attrs=attrs,
                          events=events, status_code=status)
        # The HTTP span ends when the response headers arrive, long before the stream does.
        http = make_span("POST", trace=self.trace, sid=self.http_id, parent=self.genai_id, kind=Span.SPAN_KIND_CLIENT,
                         start_ns=start + 1_000_000, end_ns=start + 50_000_000,
                         attrs={"http.request.method": "POST", "http.response.status_code": 200})
        app = {"service.name": "app"}
        self.http = ExportTraceServiceRequest(resource_spans=[resource_spans(app, "opentelemetry.instrumentation.httpx", [http])])
        self.genai = ExportTraceServiceRequest(resource_spans=[resource_spans(app, "logfire", [genai])])


def chain_with_clock(max_open_call_wait: float):
    store = Collecting()
    chain, registry = pipeline(default_processors(sampling(max_open_call_wait)), [store])
    clock = Clock()
    chain.assembler._clock = clock  # the assembler's clock, scaled: seconds cost nothing
    return chain, registry, store, clock


def client_records(store: Collecting) -> list:
    return [r for kept in store.kept for r in kept.records if r.side == Side.CLIENT]


def test_a_stream_longer_than_decision_wait_is_held_and_measured_joined():
    chain, registry, store, clock = chain_with_clock(max_open_call_wait=600.0)
    call = Call("long")
    chain.buffer(call.http.SerializeToString())  # at the first byte
    clock.now += DECISION_WAIT + 0.5
    assert chain.assembler.tick() == 0  # not decided early: its GenAI parent is still open
    assert chain.assembler.held_traces == 1
    assert sample(registry, "otel_llm_traces_held_open_calls") == 1
    clock.now += STREAM_S
    chain.buffer(call.engine.SerializeToString())  # the engine's span, at the stream's end
    assert chain.assembler.tick() == 0
    chain.buffer(call.genai.SerializeToString())  # the GenAI client span, last
    assert chain.assembler.tick() == 1
    chain.shutdown(timeout_s=5)

    assert len(store.kept) == 1 and sample(registry, "otel_llm_late_spans_total") == 0
    (server,) = [r for r in store.kept[0].records if r.side == Side.SERVER]
    assert server.engine_kind == "vllm" and server.joined_span_id == call.genai_id
    assert server.outcome == "stop"  # the finish reason the client saw (vLLM V1 reports none)
    assert server.client_overhead_s is not None
    assert abs(server.client_overhead_s - (call.client_s - call.engine_e2e_s)) < 1e-6
    assert sample(registry, "otel_llm_traces_completed_total", reason="ready") == 1
    assert sample(registry, "otel_llm_requests_assembled_total", engine_kind="vllm", outcome="stop") == 1
    assert chain.assembler.held_traces == 0


def test_a_held_trace_is_decided_at_its_limit():
    chain, registry, store, clock = chain_with_clock(max_open_call_wait=60.0)
    call = Call("limit")
    chain.buffer(call.http.SerializeToString())  # and nothing else ever comes
    clock.now += 59.0
    assert chain.assembler.tick() == 0
    clock.now += 2.0
    assert chain.assembler.tick() == 1
    assert sample(registry, "otel_llm_traces_completed_total", reason="max_open_call_wait") == 1
    assert chain.recorder is not None and chain.recorder.requests_recorded == 0
    chain.shutdown(timeout_s=5)


def test_once_its_engine_span_came_a_trace_waits_decision_wait_for_the_caller():
    chain, registry, store, clock = chain_with_clock(max_open_call_wait=600.0)
    call = Call("no-caller")
    chain.buffer(call.http.SerializeToString())
    clock.now += STREAM_S
    chain.buffer(call.engine.SerializeToString())  # the GenAI client span never comes
    clock.now += DECISION_WAIT - 0.5
    assert chain.assembler.tick() == 0
    clock.now += 1.0
    assert chain.assembler.tick() == 1
    assert sample(registry, "otel_llm_traces_completed_total", reason="decision_wait") == 1
    assert chain.recorder is not None and chain.recorder.requests_recorded == 1  # the engine, alone
    chain.shutdown(timeout_s=5)


def test_a_genai_client_span_after_its_trace_was_decided_is_measured_once():
    chain, registry, store, clock = chain_with_clock(max_open_call_wait=0.0)  # no holding: decided at decision_wait
    call = Call("late")
    chain.buffer(call.http.SerializeToString())
    chain.buffer(call.engine.SerializeToString())
    clock.now += DECISION_WAIT + 0.5
    assert chain.assembler.tick() == 1
    assert chain.recorder is not None and chain.recorder.requests_recorded == 1  # the engine span
    chain.buffer(call.genai.SerializeToString())  # late: measured on the client side
    assert sample(registry, "otel_llm_late_spans_total") == 1
    assert chain.recorder.requests_recorded == 2
    (late,) = client_records(store)
    assert late.e2e_s is not None and abs(late.e2e_s - call.client_s) < 1e-9
    assert late.completion_tokens == 8 and late.prompt_tokens == 32
    chain.buffer(call.genai.SerializeToString())  # the same span again: not measured twice
    assert chain.recorder.requests_recorded == 2
    chain.shutdown(timeout_s=5)


def test_the_exception_event_names_the_error_type():
    chain, registry, store, clock = chain_with_clock(max_open_call_wait=600.0)
    call = Call("error", error="openai.RateLimitError")
    chain.buffer(call.genai.SerializeToString())  # no engine span: the call failed at the client
    clock.now += DECISION_WAIT + 0.5
    assert chain.assembler.tick() == 1
    chain.shutdown(timeout_s=5)
    (record,) = client_records(store)
    assert record.outcome == "error" and record.error_type == "RateLimitError"


def test_a_client_span_shorter_than_its_engine_request_gives_no_overhead():
    """Logfire v2 streaming: the counted span ends when create() returns, before the stream does."""
    chain, registry, store, clock = chain_with_clock(max_open_call_wait=600.0)
    call = Call("short", client_s=0.02)
    assert call.client_s < call.engine_e2e_s
    for part in (call.http, call.engine, call.genai):
        chain.buffer(part.SerializeToString())
    assert chain.assembler.tick() == 1
    chain.shutdown(timeout_s=5)
    (server,) = [r for r in store.kept[0].records if r.side == Side.SERVER]
    assert server.joined_span_id == call.genai_id
    assert server.client_overhead_s is None  # not measurable: never a made-up 0
    assert sample(registry, "otel_llm_values_rejected_total", reason="negative_client_overhead") == 1
