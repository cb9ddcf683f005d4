"""The traffic simulator: its plan is a pure function of its inputs, its spans are the engines' own
shapes, and otel-llm fed with them shows the distributions each scenario declares."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Sequence

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from otel_llm.cli import build_parser
from otel_llm_simulate.runner import RunResult, otlp_exporter_factory, run_plan
from otel_llm_simulate.scenarios import Plan, plan
from tests.support.otelllm import RunningServer, Scrape
from tests.support.workload import LATENCY_BUCKETS, TOKEN_BUCKETS, expected_cumulative

# Gateway-only traces (aborts, upstream errors) complete at decision_wait; 1 s keeps tests quick.
FAST_DECISIONS = {"processors": {"tail_sampling": {"decision_wait": "1s", "grace": "100ms"}}}
RATE, DURATION = 4.0, 30.0  # ~120 requests per scenario: enough for stable quantiles, sent in < 1 s
OK = ("stop", "length")
# The fleet's engines whose requests carry engine_kind="vllm": vLLM 0.33's span and its coming shape.
VLLM_ENGINES = ("vllm-v1", "vllm-next")


def make_plan(scenario: str, seed: int = 11, start_ns: int | None = None, **kwargs) -> Plan:
    start = time.time_ns() - round(DURATION * 1e9) if start_ns is None else start_ns
    return plan(scenario, seed=seed, rate=RATE, duration_s=DURATION, start_ns=start, **kwargs)


class Collect(SpanExporter):
    """Every exported span, shared by all the fleet's exporters."""

    def __init__(self, sink: list[ReadableSpan]) -> None:
        self.sink = sink

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.sink.extend(spans)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass


def emitted(p: Plan) -> tuple[list[ReadableSpan], RunResult]:
    sink: list[ReadableSpan] = []
    result = run_plan(p, lambda: Collect(sink), realtime=False)
    return sink, result


def span_key(span: ReadableSpan) -> tuple:
    ctx = span.get_span_context()
    return (ctx.trace_id, ctx.span_id, span.parent.span_id if span.parent else None, span.name, span.kind,
            span.start_time, span.end_time, tuple(sorted(span.attributes.items())),
            tuple(sorted(span.resource.attributes.items())), span.status.status_code)


def quantile(buckets: dict[str, float], q: float) -> float:
    """Prometheus ``histogram_quantile`` over one scrape's cumulative buckets."""
    bounds = sorted((float(le), count) for le, count in buckets.items())
    total = bounds[-1][1]
    assert total > 0, "empty histogram"
    rank = q * total
    lower_bound, lower_count = 0.0, 0.0
    for bound, count in bounds:
        if count >= rank:
            if bound == float("inf"):
                return lower_bound
            return lower_bound + (bound - lower_bound) * (rank - lower_count) / (count - lower_count)
        lower_bound, lower_count = bound, count
    raise AssertionError("unreachable")


def feed(make_server, p: Plan, protocol: str = "grpc") -> tuple[RunningServer, Scrape]:
    """A fresh otel-llm, ``p`` sent to it through the real exporters, scraped once every trace is assembled."""
    server = make_server(FAST_DECISIONS)
    port = server.grpc_port if protocol == "grpc" else server.http_port
    result = run_plan(p, otlp_exporter_factory(f"127.0.0.1:{port}", protocol), realtime=False)
    assert result.ok and result.requests_sent == len(p.requests), result
    records = len(p.requests) + len(p.client_legs())  # one server record per request, one client record per app call
    scrape = server.wait_until(
        lambda s: s.value("otel_llm_requests_assembled_total") >= records
        and s.value("otel_llm_traces_in_memory") == 0,
        what=f"{records} assembled requests and no pending trace",
    )
    # Exactly one request per planned request (and one client-side record per application call); the
    # simulator's spans are well-formed and on time.
    assert scrape.value("otel_llm_requests_assembled_total") == records
    assert scrape.value("otel_llm_requests_assembled_total", engine_kind="client") == len(p.client_legs())
    assert scrape.value("otel_llm_spans_malformed_total") == 0
    assert scrape.value("otel_llm_late_spans_total") == 0
    return server, scrape


def vllm_values(p: Plan, attr: str) -> list[float]:
    """What the vLLM engines reported for successful requests, from the plan."""
    return [getattr(r.timing, attr) for r in p.requests if r.engine in VLLM_ENGINES and r.outcome in OK]


# --- (1) the plan is a pure function ------------------------------------------------------------


def test_same_inputs_give_the_same_plan_and_a_new_seed_another():
    start = 1_700_000_000_000_000_000
    a, b = make_plan("burst", seed=5, start_ns=start), make_plan("burst", seed=5, start_ns=start)
    assert a == b and len(a.requests) > 50
    other = make_plan("burst", seed=6, start_ns=start)
    assert [r.request_id for r in other.requests] != [r.request_id for r in a.requests]
    assert {r.request_id for r in other.requests}.isdisjoint(r.request_id for r in a.requests if r.request_id)
    assert {m.id_seed for m in other.members}.isdisjoint(m.id_seed for m in a.members)
    # The start time only shifts the clock: same requests, same durations, timestamps moved by the shift.
    shifted = make_plan("burst", seed=5, start_ns=start + 123_456_789)
    assert [(r.request_id, r.outcome, r.timing and r.timing.e2e_s) for r in shifted.requests] == \
        [(r.request_id, r.outcome, r.timing and r.timing.e2e_s) for r in a.requests]
    assert all(s.send_at_ns - r.send_at_ns == 123_456_789 for s, r in zip(shifted.requests, a.requests, strict=True))


def test_plan_is_a_window_of_consistent_requests():
    p = make_plan("errors", start_ns=10**18)
    assert abs(len(p.requests) - RATE * DURATION) < 0.3 * RATE * DURATION  # Poisson around rate x duration
    for r in p.requests:
        assert p.start_ns <= r.send_at_ns < p.window_end_ns  # every request ends inside the window
        if r.client is not None:  # the application's span ends last
            assert r.send_at_ns == r.client.call.end_ns
        elif r.gateway is not None:
            assert r.send_at_ns == r.gateway.end_ns
        if r.gateway is not None:
            if r.timing is not None:  # the engine span nests inside its gateway span
                assert r.gateway.start_ns < r.timing.arrival_unix_ns and r.timing.end_unix_ns < r.gateway.end_ns
        if r.outcome in OK:
            t = r.timing
            assert t is not None and t.completion_tokens <= r.params.max_tokens
            assert (r.outcome == "length") == (t.completion_tokens == r.params.max_tokens)
        if r.engine == "vllm-v1" and r.outcome in ("abort", "error"):
            assert r.timing is None and r.gateway is not None  # vLLM emits no span for them
    # Prefill grows with the prompt, decode with the output (per model, over many requests).
    ok = [r for r in p.requests if r.model == "llama-3.1-8b-instruct" and r.outcome in OK]
    longest = max(ok, key=lambda r: r.timing.prompt_tokens)
    shortest = min(ok, key=lambda r: r.timing.prompt_tokens)
    assert longest.timing.prefill_s > shortest.timing.prefill_s
    most = max(ok, key=lambda r: r.timing.completion_tokens)
    fewest = min(ok, key=lambda r: r.timing.completion_tokens)
    assert most.timing.decode_s > fewest.timing.decode_s


def test_burst_builds_a_queue_in_the_plan_itself():
    steady, burst = make_plan("steady"), make_plan("burst")
    # 3x the rate for 30 % of the window (the queue holds some of it past the window end).
    assert len(burst.requests) > 1.1 * len(steady.requests)
    assert burst.slots == steady.slots  # same fleet, provisioned for the same rate
    q = sorted(vllm_values(burst, "queue_s"))
    assert q[int(0.9 * len(q))] > 2.0
    s = sorted(vllm_values(steady, "queue_s"))
    assert s[int(0.9 * len(s))] < 0.05  # steady: hardly anyone waits


# --- the spans: real SDK output, deterministic ------------------------------------------------


def test_same_plan_sends_identical_spans_and_ids():
    p = make_plan("aborts", start_ns=1_700_000_000_000_000_000)
    first, result = emitted(p)
    second, _ = emitted(p)
    assert sorted(map(span_key, first)) == sorted(map(span_key, second))
    assert result.spans_ended == result.spans_exported == len(first) and result.spans_dropped == 0
    other, _ = emitted(make_plan("aborts", seed=12, start_ns=1_700_000_000_000_000_000))
    assert {s.context.trace_id for s in other}.isdisjoint(s.context.trace_id for s in first)

    # One trace per request (plus one per application call that propagates nothing); engines behind
    # the gateway are children of its SERVER span, those the application calls (directly or through
    # the LiteLLM proxy, which forwards the caller's traceparent) children of its httpx POST span.
    traces = {s.context.trace_id for s in first}
    assert len(traces) == p.traces() > len(p.requests)
    by_id = {s.context.span_id: s for s in first}
    # vLLM 0.33's spans: those of the vllm-v1 processes (trtllm-serve's span and llm-d's pods are named so too).
    vllm_services = {m.service_name for m in p.members if m.engine == "vllm-v1"}
    vllm = [s for s in first if s.name == "llm_request" and s.resource.attributes["service.name"] in vllm_services]
    assert len(vllm) == sum(1 for r in p.requests if r.engine == "vllm-v1" and r.timing is not None)
    parents = Counter()
    for span in vllm:
        parent = by_id[span.parent.span_id]
        assert parent.context.trace_id == span.context.trace_id
        parents[parent.name] += 1
        assert "gen_ai.response.model" not in span.attributes  # vLLM V1 never names its model
    vllm_requests = [r for r in p.requests if r.engine == "vllm-v1" and r.timing is not None]
    assert parents == {
        "POST /v1/chat/completions": sum(1 for r in vllm_requests if r.gateway is not None),
        "POST": sum(1 for r in vllm_requests if r.client is not None and r.client.via in ("direct", "litellm")),
    }
    assert {s.attributes["gen_ai.request.id"] for s in vllm} == {
        r.request_id for r in p.requests if r.engine == "vllm-v1" and r.timing is not None}
    # SGLang's own traces (no gateway) have 64-bit trace ids, as its id generator makes them.
    direct_sglang = [s for s in first if s.name == " Req " + s.attributes.get("rid", "")[:8] and s.parent is None]
    assert direct_sglang and all(s.context.trace_id < 2**64 for s in direct_sglang)
    # Aborts of vLLM/TGI requests leave a gateway span and nothing else in their trace.
    gateway_only = Counter(s.context.trace_id for s in first)
    aborted = [r for r in p.requests if r.outcome == "abort" and r.timing is None]
    assert aborted and sum(1 for n in gateway_only.values() if n == 1) >= len(aborted)


def test_realtime_sends_each_request_when_it_ends():
    start = time.time_ns()
    p = plan("steady", seed=3, rate=6.0, duration_s=1.5, start_ns=start)
    assert p.requests
    lags: list[float] = []
    sink: list[ReadableSpan] = []
    result = run_plan(p, lambda: Collect(sink), on_sent=lambda r: lags.append((time.time_ns() - r.send_at_ns) / 1e9))
    assert len(lags) == len(p.requests) == result.requests_sent
    assert min(lags) >= 0  # never before the span's end time: no span ends in the future
    assert max(lags) < 0.5  # and promptly then
    assert result.elapsed_s < 1.5 + 1.0  # bounded by the window, then it stops by itself


def test_stop_event_ends_a_realtime_run_early():
    p = plan("steady", seed=3, rate=5.0, duration_s=60.0, start_ns=time.time_ns())
    stop = threading.Event()
    threading.Timer(0.3, stop.set).start()
    result = run_plan(p, lambda: Collect([]), stop=stop)
    assert result.interrupted and result.requests_sent < len(p.requests) and result.elapsed_s < 5


# --- (2) otel-llm fed with each scenario shows what the scenario declares -----------------------


def test_burst_raises_queue_time_and_ttft_percentiles(make_server):
    steady, burst = make_plan("steady"), make_plan("burst")
    _, s_scrape = feed(make_server, steady)
    _, b_scrape = feed(make_server, burst)
    s_queue = s_scrape.buckets("vllm:request_queue_time_seconds", engine_kind="vllm")
    b_queue = b_scrape.buckets("vllm:request_queue_time_seconds", engine_kind="vllm")
    # The histograms are exactly the plan's numbers...
    assert s_queue == expected_cumulative(vllm_values(steady, "queue_s"), LATENCY_BUCKETS)
    assert b_queue == expected_cumulative(vllm_values(burst, "queue_s"), LATENCY_BUCKETS)
    # ... and the burst shows: a queue builds, time to first token climbs.
    assert quantile(s_queue, 0.9) <= 0.3  # steady: all but a few never wait (first bucket)
    assert quantile(b_queue, 0.9) > 2.0 and quantile(b_queue, 0.9) > 5 * quantile(s_queue, 0.9)
    s_ttft = s_scrape.buckets("vllm:time_to_first_token_seconds")
    b_ttft = b_scrape.buckets("vllm:time_to_first_token_seconds")
    assert quantile(b_ttft, 0.9) > 3 * quantile(s_ttft, 0.9)
    assert quantile(b_ttft, 0.5) > 2 * quantile(s_ttft, 0.5)
    s_wait = s_scrape.buckets("otel_llm_request_segment_seconds", segment="queue")
    b_wait = b_scrape.buckets("otel_llm_request_segment_seconds", segment="queue")
    assert quantile(b_wait, 0.75) > 5 * quantile(s_wait, 0.75)


def test_long_prompts_raise_prompt_tokens_and_prefill(make_server):
    steady, long = make_plan("steady"), make_plan("long-prompts")
    _, s_scrape = feed(make_server, steady, protocol="http")
    _, l_scrape = feed(make_server, long, protocol="http")
    s_tokens = s_scrape.buckets("vllm:request_prompt_tokens", engine_kind="vllm")
    l_tokens = l_scrape.buckets("vllm:request_prompt_tokens", engine_kind="vllm")
    assert l_tokens == expected_cumulative(vllm_values(long, "prompt_tokens"), TOKEN_BUCKETS)
    assert quantile(l_tokens, 0.5) > 5 * quantile(s_tokens, 0.5)
    assert quantile(l_tokens, 0.9) > 5 * quantile(s_tokens, 0.9)
    s_prefill = s_scrape.buckets("otel_llm_request_segment_seconds", engine_kind="vllm", segment="prefill")
    l_prefill = l_scrape.buckets("otel_llm_request_segment_seconds", engine_kind="vllm", segment="prefill")
    assert quantile(l_prefill, 0.5) > 3 * quantile(s_prefill, 0.5)
    assert quantile(l_scrape.buckets("vllm:time_to_first_token_seconds"), 0.5) > \
        2 * quantile(s_scrape.buckets("vllm:time_to_first_token_seconds"), 0.5)


def test_aborts_are_counted_as_abort(make_server):
    p = make_plan("aborts")
    _, scrape = feed(make_server, p)
    aborts = [r for r in p.requests if r.outcome == "abort"]
    assert len(aborts) > 0.15 * len(p.requests)
    assert scrape.value("vllm:request_success_total", finished_reason="abort") == len(aborts)
    assert scrape.value("otel_llm_requests_assembled_total", outcome="abort") == len(aborts)
    # Gateway spans with nothing below them (vLLM, TGI) vs SGLang's own aborted trace.
    gateway_only = sum(1 for r in aborts if r.timing is None)
    assert gateway_only > 0
    assert scrape.value("vllm:request_success_total", finished_reason="abort", engine_kind="genai") == gateway_only
    assert scrape.value("vllm:request_success_total", finished_reason="abort", engine_kind="sglang") == \
        len(aborts) - gateway_only
    # An abort is no success: TTFT only counts the requests that completed.
    completed = sum(1 for r in p.requests if r.outcome in OK)
    assert scrape.value("vllm:time_to_first_token_seconds_count") == \
        sum(1 for r in p.requests if r.outcome in OK and r.engine != "tgi")  # TGI reports no TTFT
    assert scrape.value("vllm:request_success_total") == len(p.requests) and completed < len(p.requests)


def test_errors_are_counted_as_error(make_server):
    p = make_plan("errors")
    _, scrape = feed(make_server, p, protocol="http")
    errors = Counter(r.engine for r in p.requests if r.outcome == "error")
    assert sum(errors.values()) > 0.08 * len(p.requests) and errors["tgi"] > 0 and errors["vllm-v1"] > 0
    # An application in front of a failing request sees the error too: on the client side only.
    client_errors = sum(1 for c in p.client_legs() if not c.call.ok)
    assert client_errors > 0
    assert scrape.value("otel_llm_requests_assembled_total", outcome="error") == sum(errors.values()) + client_errors
    assert scrape.value("otel_llm_requests_assembled_total", outcome="error", engine_kind="client") == client_errors
    assert scrape.value("vllm:request_success_total", finished_reason="error") == sum(errors.values())
    # TGI marks its own span ERROR; every other engine's failures are the gateway's 5xx span (the plan
    # gives them no engine timing).
    assert scrape.value("vllm:request_success_total", finished_reason="error", engine_kind="tgi") == errors["tgi"]
    via_gateway = sum(1 for r in p.requests if r.outcome == "error" and r.timing is None)
    assert via_gateway == sum(errors.values()) - errors["tgi"]
    assert scrape.value("vllm:request_success_total", finished_reason="error", engine_kind="genai") == via_gateway
    assert scrape.value("gen_ai_server_request_duration_seconds_count", error_type="500") == via_gateway
    # Whatever the engine, a failure lands in the duration families like a success: TGI's failed
    # handler span has no total_time, so its own duration is the request's (issue 11).
    failed_durations = scrape.value("gen_ai_server_request_duration_seconds_count") - \
        scrape.value("gen_ai_server_request_duration_seconds_count", error_type="")
    assert failed_durations == sum(errors.values())
    assert scrape.value("vllm:e2e_request_latency_seconds_count", engine_kind="tgi") == \
        sum(1 for r in p.requests if r.engine == "tgi")


# --- (3) the CLI as users run it -----------------------------------------------------------------


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "otel_llm", "simulate", *args], capture_output=True, text=True,
                          timeout=60)


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_cli_fast_run_reaches_the_server(make_server, protocol):
    server = make_server(FAST_DECISIONS)
    port = server.grpc_port if protocol == "grpc" else server.http_port
    start_s = time.time() - 20
    args = ["--endpoint", f"127.0.0.1:{port}", "--protocol", protocol, "--rate", "3", "--duration", "20s",
            "--seed", "21", "--scenario", "aborts", "--fast", "--start", repr(start_s)]
    result = run_cli(*args)
    assert result.returncode == 0, result.stdout + result.stderr
    expected = plan("aborts", seed=21, rate=3.0, duration_s=20.0, start_ns=round(start_s * 1e9))
    n = len(expected.requests)
    calls = len(expected.client_legs())
    assert f"requests: {n} sent of {n} planned" in result.stdout
    assert f"app tier (client spans): {calls} calls" in result.stdout
    scrape = server.wait_until(
        lambda s: s.value("otel_llm_requests_assembled_total") >= n + calls
        and s.value("otel_llm_traces_in_memory") == 0,
        what=f"{n} requests and {calls} client calls")
    assert scrape.value("otel_llm_requests_assembled_total") == n + calls
    assert scrape.value("otel_llm_requests_assembled_total", engine_kind="client") == calls
    assert scrape.value("otel_llm_requests_assembled_total", outcome="abort") == \
        sum(1 for r in expected.requests if r.outcome == "abort")
    assert scrape.value("otel_llm_receiver_accepted_spans_total", protocol=protocol) > n


def test_cli_exits_nonzero_when_exports_fail():
    import socket

    with socket.socket() as s:  # a port that was free a moment ago: nothing listens there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    result = run_cli("--endpoint", f"127.0.0.1:{port}", "--rate", "2", "--duration", "5s", "--seed", "1",
                     "--fast", "--export-timeout", "1s")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "0 sent" in result.stdout and "failed" in result.stdout


def test_cli_arguments():
    parser = build_parser()
    args = parser.parse_args(["simulate", "--duration", "2m", "--rate", "0.5", "--models", "a,b", "c"])
    assert args.duration == 120.0 and args.rate == 0.5
    for bad in (["--duration", "soon"], ["--rate", "0"], ["--scenario", "nope"]):
        with pytest.raises(SystemExit):
            parser.parse_args(["simulate", *bad])
    result = run_cli("--models", "no-such-model", "--fast")
    assert result.returncode == 2 and "no-such-model" in result.stderr
