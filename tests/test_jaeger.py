"""otel-llm's OTLP trace exporter into a real trace backend: Jaeger v1.76.0 (built by `make test`,
started by tests/support/jaeger.py on free loopback ports).

- every trace in otel-llm's embedded store is also in Jaeger (its query API, /api/traces/{id}),
  span for span, with the synthesized segment spans (queue / prefill / decode, attribute
  otel_llm.segment) as children of the engine span;
- a Jaeger outage (SIGTERM) and its return on the same port lose nothing: what otel-llm kept during
  the outage waits in its exporter's queue and is retried (Jaeger on badger here, so what it had
  before the outage is still there after it).
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

from otel_llm.exporter.store.sqlite import StoreReader
from tests.support.jaeger import JaegerProcess
from tests.support.otelllm import RunningServer
from tests.support.sampling_workload import send_sampling_workload

SEGMENTS = {"queue", "prefill", "decode"}  # every engine's; vLLM/TGI may add preprocess, inference, postprocess
ALL_SEGMENTS = SEGMENTS | {"preprocess", "inference", "postprocess"}
FAST_RETRY = {"initial_interval": "50ms", "max_interval": "500ms", "max_elapsed_time": "0s"}


def server_for(make_server, jaeger: JaegerProcess) -> RunningServer:
    return make_server({
        "processors": {"tail_sampling": {"decision_wait": "2s", "grace": "100ms"}},  # the default policies
        "exporters": {"otlp": {"endpoint": jaeger.grpc_endpoint, "retry_on_failure": FAST_RETRY,
                               "sending_queue": {"queue_size": 1000}}},
    })


def stored(server: RunningServer) -> dict[str, dict]:
    """{trace_id: {span_id: (name, parent_span_id, is_segment)}} of every trace in the embedded store."""
    server.service.store.flush()
    reader = StoreReader(Path(server.service.store.path))
    out: dict[str, dict] = {}
    with reader._connection() as connection:
        for trace_id, span_id, parent, name, attributes in connection.execute(
                "SELECT trace_id, span_id, parent_span_id, name, attributes FROM spans"):
            out.setdefault(trace_id, {})[span_id] = (name, parent or "", "otel_llm.segment" in (attributes or ""))
    return out


def settle(server: RunningServer, requests: int) -> None:
    server.wait_for_requests(requests, timeout_s=60)
    server.wait_until(lambda s: s.value("otel_llm_traces_in_memory") == 0, timeout_s=30, what="every trace decided")


def wait_in_jaeger(jaeger: JaegerProcess, traces: dict[str, dict], timeout_s: float = 60.0) -> dict[str, dict]:
    """Poll /api/traces/{id} until every trace is there with all its spans; returns Jaeger's traces."""
    found: dict[str, dict] = {}
    deadline = time.monotonic() + timeout_s
    while True:
        for trace_id, spans in traces.items():
            if trace_id in found:
                continue
            got = jaeger.trace(trace_id)
            if got is not None and len(got["spans"]) >= len(spans):
                found[trace_id] = got
        if len(found) == len(traces):
            return found
        if time.monotonic() > deadline:
            missing = sorted(set(traces) - set(found))
            raise AssertionError(f"{len(missing)} of {len(traces)} stored traces not (complete) in Jaeger after "
                                 f"{timeout_s}s, e.g. {missing[:3]}; Jaeger log:\n{jaeger.log_text()[-2000:]}")
        time.sleep(0.2)


def check_same_traces(stored_traces: dict[str, dict], in_jaeger: dict[str, dict]) -> Counter:
    """Span for span; segment spans under their engine span. Returns counts of what was checked."""
    seen: Counter = Counter()
    for trace_id, spans in stored_traces.items():
        got = in_jaeger[trace_id]
        by_id = {s["spanID"]: s for s in got["spans"]}
        assert set(by_id) == set(spans), (trace_id, sorted(set(spans) ^ set(by_id)))
        for span_id, (name, parent, is_segment) in spans.items():
            jspan = by_id[span_id]
            assert jspan["operationName"] == name
            parents = [r["spanID"] for r in jspan.get("references", []) if r["refType"] == "CHILD_OF"]
            assert parents == ([parent] if parent else []), (trace_id, span_id, parents, parent)
            if is_segment:
                tags = {t["key"]: t["value"] for t in jspan["tags"]}
                assert name in ALL_SEGMENTS and tags.get("otel_llm.segment") == name, (name, tags)
                engine = by_id[parent]
                assert engine["operationName"] not in ALL_SEGMENTS and "otel_llm.segment" not in {
                    t["key"] for t in engine["tags"]}
                seen[f"segment {name}"] += 1
            seen["spans"] += 1
        seen["traces"] += 1
    return seen


def test_every_stored_trace_is_in_jaeger_with_segments_under_the_engine_span(make_server, tmp_path):
    with JaegerProcess(tmp_path / "jaeger") as jaeger:
        server = server_for(make_server, jaeger)
        sent = send_sampling_workload(server.exporter("grpc"), requests=600, seed=7)
        settle(server, sent.total)
        traces = stored(server)
        assert len(traces) >= len(sent.errors) + len(sent.aborts) + len(sent.outliers) > 0
        server.wait_until(lambda s: s.value("otel_llm_exporter_queue_size") == 0, timeout_s=30, what="exported")
        seen = check_same_traces(traces, wait_in_jaeger(jaeger, traces))
        assert seen["traces"] == len(traces) and all(seen[f"segment {n}"] > 0 for n in SEGMENTS), seen
        telemetry = server.scrape()
        assert telemetry.value("otel_llm_exporter_failed_requests_total") == 0
        print(f"jaeger: {len(traces)} kept traces of {sent.total} requests, all in Jaeger: {dict(seen)}")


def test_jaeger_outage_and_return_lose_nothing(make_server, tmp_path):
    jaeger = JaegerProcess(tmp_path / "jaeger", storage="badger")
    jaeger.start()
    try:
        server = server_for(make_server, jaeger)
        exporter = server.exporter("grpc")
        first = send_sampling_workload(exporter, requests=300, seed=8)
        settle(server, first.total)
        before = stored(server)
        wait_in_jaeger(jaeger, before)

        assert jaeger.stop() == 0  # the outage
        second = send_sampling_workload(exporter, requests=300, seed=9)
        settle(server, first.total + second.total)
        server.wait_until(lambda s: s.value("otel_llm_exporter_failed_requests_total") >= 3
                          and s.value("otel_llm_exporter_queue_size") > 0, timeout_s=30,
                          what="kept traces queued and retried while Jaeger is down")
        during = {t: s for t, s in stored(server).items() if t not in before}
        assert during

        jaeger.start()  # the return, on the same ports and the same badger directory
        server.wait_until(lambda s: s.value("otel_llm_exporter_queue_size") == 0, timeout_s=60, what="queue drained")
        everything = stored(server)
        seen = check_same_traces(everything, wait_in_jaeger(jaeger, everything))
        telemetry = server.scrape()
        dropped = telemetry.value("otel_llm_exporter_dropped_spans_total")
        assert dropped == 0, dropped
        print(f"jaeger outage: {len(before)} traces before, {len(during)} kept during the outage, all {seen['traces']} "
              f"in Jaeger after its return ({seen['spans']} spans); otel-llm exporter failed attempts "
              f"{telemetry.value('otel_llm_exporter_failed_requests_total'):.0f}, retries "
              f"{telemetry.value('otel_llm_exporter_retries_total'):.0f}")
    finally:
        jaeger.stop()
        jaeger.kill()


def test_compose_jaeger_config_validates_with_our_jaeger_build(tmp_path):
    """collector-config/jaeger/jaeger.yaml (docker-compose.yml's Jaeger) is valid for the build the tests run."""
    import subprocess

    from tests.support.collector import peer_binary

    path = Path(__file__).resolve().parents[1] / "collector-config" / "jaeger" / "jaeger.yaml"
    done = subprocess.run([str(peer_binary("jaeger")), "validate", "--config", str(path)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-3000:]
    # The test config the fixture generates is valid too, and listens only on 127.0.0.1.
    jaeger = JaegerProcess(tmp_path)
    config = jaeger.config()
    endpoints: list[str] = []

    def walk(node: object) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "endpoint" and isinstance(value, str):
                    endpoints.append(value)
                walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(config)
    assert endpoints and all(e.startswith("127.0.0.1:") for e in endpoints), endpoints
    reader = config["service"]["telemetry"]["metrics"]["readers"][0]
    assert reader["pull"]["exporter"]["prometheus"]["host"] == "127.0.0.1"
