"""The web view and the metrics port against an unauthenticated client: a deep span chain, a
start time in 2262, password guessing, a lowercase ``bearer``, secrets in the effective config,
and the headers of every answer."""

from __future__ import annotations

import json
import logging
import os
import time
import urllib.error
import urllib.request
from typing import Any

import pytest

from otel_llm.config import ConfigError, config_from_dict
from otel_llm.extension.webview.status import MASK, mask
from tests.support.otelllm import RunningServer
from tests.support.payloads import vllm_batch
from tests.test_bad_input import grpc_raw

TOKEN = "s3cret-token-for-the-web-view"
KEEP_ALL = {"processors": {"tail_sampling": {"policies": [
    {"name": "baseline", "type": "probabilistic", "probabilistic": {"sampling_percentage": 100}}]}}}
YEAR_2262_NS = 9_200_000_000_000_000_000  # 2261-07-21: within a signed 64-bit nanosecond time


def _get(url: str, headers: dict[str, str] | None = None, data: bytes | None = None) -> tuple[int, Any, bytes]:
    request = urllib.request.Request(url, headers=headers or {}, data=data)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.headers, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers, exc.read()


def _stored(server: RunningServer, count: int) -> None:
    deadline = time.monotonic() + 60
    while True:
        server.service.store.flush()
        status, _, body = _get(server.metrics_url + "/api/traces?limit=500&until=9223372036854775807")
        if status == 200 and len(json.loads(body)["traces"]) >= count:
            return
        assert time.monotonic() < deadline, f"{count} traces not stored in 60 s"
        time.sleep(0.1)


def test_a_parent_chain_of_1200_spans_renders(make_server):
    """Before: the trace API walked parents recursively: a ~1 000-span chain raised RecursionError
    (a 500). The walk is iterative: every span is there, in order, with its depth."""
    server = make_server(KEEP_ALL)
    request = vllm_batch(1)
    spans = request.resource_spans[0].scope_spans[0].spans
    engine = spans[0]
    trace_id = engine.trace_id
    parent = b""
    for i in range(1200):
        span = spans.add()
        span.trace_id, span.span_id, span.parent_span_id = trace_id, os.urandom(8), parent
        span.name, span.kind = f"hop-{i}", 1
        span.start_time_unix_nano = engine.start_time_unix_nano - 10**6
        span.end_time_unix_nano = engine.end_time_unix_nano + 10**6
        parent = span.span_id
    engine.parent_span_id = parent
    grpc_raw(server, request.SerializeToString())
    _stored(server, 1)
    status, _, body = _get(server.webview_url + f"/api/ui/trace/{trace_id.hex()}")
    assert status == 200, body[:300]
    ordered = json.loads(body)["spans"]
    hops = [s for s in ordered if s["name"].startswith("hop-")]
    assert [s["name"] for s in hops] == [f"hop-{i}" for i in range(1200)]
    assert [s["depth"] for s in hops] == list(range(1200))
    assert next(s for s in ordered if s["name"] == "llm_request")["depth"] == 1200


def test_a_start_time_in_2262_pins_neither_list(make_server):
    """Before: a request that claims to start in 2262 topped the Requests list and /api/traces
    forever and passed "last 5 m". Lists without an explicit ``until`` end 10 minutes past now;
    the request is still there for an explicit ``until``."""
    server = make_server(KEEP_ALL)
    grpc_raw(server, vllm_batch(1, model="from-2262", start_ns=YEAR_2262_NS).SerializeToString())
    grpc_raw(server, vllm_batch(1, model="now").SerializeToString())
    _stored(server, 2)
    since = time.time_ns() - 5 * 60 * 10**9
    for path in ("/api/ui/requests", f"/api/ui/requests?since={since}"):
        rows = json.loads(_get(server.webview_url + path)[2])["rows"]
        assert [r["model"] for r in rows] == ["now"], path
    for path in ("/api/traces", f"/api/traces?since={since}"):
        rows = json.loads(_get(server.metrics_url + path)[2])["traces"]
        assert [r["model"] for r in rows] == ["now"], path
    rows = json.loads(_get(server.metrics_url + "/api/traces?until=9223372036854775807")[2])["traces"]
    assert [r["model"] for r in rows] == ["from-2262", "now"]


def test_failed_logins_are_throttled_logged_and_counted(make_server, caplog):
    """Before: /login took 536 guesses a second, none logged or counted. Ten wrong tokens from one
    address in a minute, then it is answered 429 with Retry-After (even with the right token),
    each failure logged, both counted."""
    server = make_server({"exporters": {"prometheus": {"auth": {"bearer_token": TOKEN}}},
                          "extensions": {"webview": {"auth": {"bearer_token": TOKEN}}}})
    caplog.set_level(logging.WARNING, logger="otel_llm.extension.webview.web")
    login = server.webview_url + "/login"
    statuses = [_get(login, data=f"token=guess-{i}".encode())[0] for i in range(10)]
    assert statuses == [401] * 10
    status, headers, _ = _get(login, data=f"token={TOKEN}".encode())
    assert status == 429 and 1 <= int(headers["Retry-After"]) <= 60
    assert sum("failed login from 127.0.0.1" in r.getMessage() for r in caplog.records) == 10
    status, _, body = _get(server.metrics_url + "/metrics", {"Authorization": f"Bearer {TOKEN}"})
    text = body.decode()
    assert 'otel_llm_webview_login_failures_total{reason="wrong_token"} 10.0' in text
    assert 'otel_llm_webview_login_failures_total{reason="throttled"} 1.0' in text


@pytest.mark.parametrize("scheme", ["Bearer", "bearer", "BEARER"])
def test_the_bearer_scheme_is_case_insensitive(make_server, scheme):
    """Before: ``bearer <token>`` was refused; the scheme is case-insensitive (RFC 9110), the token is not."""
    server = make_server({"exporters": {"prometheus": {"auth": {"bearer_token": TOKEN}}}})
    assert _get(server.metrics_url + "/metrics", {"Authorization": f"{scheme} {TOKEN}"})[0] == 200
    assert _get(server.metrics_url + "/metrics", {"Authorization": f"{scheme} {TOKEN.upper()}"})[0] == 401
    assert _get(server.metrics_url + "/metrics", {"Authorization": f"Basic {TOKEN}"})[0] == 401


def test_validate_refuses_a_whitespace_only_token():
    with pytest.raises(ConfigError, match="whitespace"):
        config_from_dict({"exporters": {"prometheus": {"auth": {"bearer_token": "   \t"}}}})


def test_status_page_masks_passwords_in_urls_and_api_key_values(make_server):
    """Before: ``https://user:password@host`` and a key named ``api-key`` were shown as they are."""
    assert mask({"api-key": "k1", "X-API-KEY": "k2", "private_key": "k3", "endpoint": "https://u:hunter2@t:4318",
                 "url": "http://t/?api_key=k4&region=eu", "model": "a?b"}) == {
        "api-key": MASK, "X-API-KEY": MASK, "private_key": MASK, "endpoint": f"https://u:{MASK}@t:4318",
        "url": f"http://t/?api_key={MASK}&region=eu", "model": "a?b"}
    server = make_server({"exporters": {"otlphttp": {"endpoint": "https://svc:hunter2@127.0.0.1:9/otlp"}},
                         "service": {"pipelines": {"traces": {"receivers": ["otlp"],
                                                              "processors": ["llm_metrics", "tail_sampling",
                                                                             "redaction"],
                                                              "exporters": ["store", "prometheus", "otlphttp"]}}}})
    status, _, body = _get(server.webview_url + "/api/ui/status")
    assert status == 200
    assert b"hunter2" not in body
    assert f"https://svc:{MASK}@127.0.0.1:9/otlp" in json.loads(body)["config"]["exporters"]["otlphttp"]["endpoint"]


def test_api_and_metrics_carry_nosniff_and_no_store(server: RunningServer):
    """Before: /api/traces and /metrics had none of the web view's headers."""
    for path in ("/api/traces", "/metrics", "/api/traces/00ff", "/healthz", "/nothing-here", "/ui/requests"):
        _, headers, _ = _get(server.metrics_url + path)
        assert headers["X-Content-Type-Options"] == "nosniff", path
        assert headers["Cache-Control"] == "no-store", path
    _, headers, _ = _get(server.webview_url + "/static/app.js")
    assert headers["Cache-Control"] == "max-age=60"
    assert len([k for k in headers.keys() if k.lower() == "cache-control"]) == 1


class _ManyGroups:
    """A collector with ``groups`` (model, engine) pairs of every latency family and the outcome counter."""

    def __init__(self, groups: int) -> None:
        self.groups = groups

    def collect(self):  # noqa: ANN201
        from prometheus_client.metrics_core import CounterMetricFamily, HistogramMetricFamily

        from otel_llm.extension.webview.history import LATENCY_METRICS

        for _, _, name, _ in LATENCY_METRICS:
            family = HistogramMetricFamily(name.removesuffix("_seconds"), "h", labels=["model_name", "engine_kind"],
                                           unit="seconds")
            for g in range(self.groups):
                family.add_metric([f"model-{g}", "vllm"], [(str(b), float(i)) for i, b in
                                                           enumerate([0.1 * k for k in range(1, 21)] + ["+Inf"])],
                                  sum_value=1.0)
            yield family
        outcomes = CounterMetricFamily("vllm:request_success", "c", labels=["model_name", "engine_kind",
                                                                           "finished_reason"])
        for g in range(self.groups):
            outcomes.add_metric([f"model-{g}", "vllm", "stop"], 5.0)
        yield outcomes


def test_the_snapshot_history_is_bounded_in_memory():
    """Before: 2 000 (model, engine) groups grew the parent 45 -> 416 MiB through the snapshot
    history (a snapshot of every group every interval, kept for the whole history). The ring now
    has a byte budget: past it the older half is thinned (its first kept, so every window still
    has a base); here 30 snapshots of 500 groups stay within an 8 MiB budget."""
    from prometheus_client import CollectorRegistry

    from otel_llm.extension.webview.history import History, snapshot_bytes

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_ManyGroups(520))
    budget = 8 * 1024 * 1024
    history = History(registry, 10.0, 3600.0, budget_bytes=budget)
    unbounded = History(registry, 10.0, 3600.0, budget_bytes=1 << 62)
    first = None
    for i in range(30):
        history.record()
        if first is None:
            first = history.snapshots()[0]
        if i < 10:
            unbounded.record()
    ring = history.snapshots()
    one = snapshot_bytes(ring[-1])
    assert len(ring[-1].histograms) == 500 * len({n for n, _ in ring[-1].histograms})  # MAX_GROUPS per family
    assert history.ring_bytes <= budget and sum(snapshot_bytes(s) for s in ring) == history.ring_bytes
    assert ring[0] is first  # the oldest is kept: "last 1 h" still subtracts a snapshot from its start
    assert unbounded.ring_bytes >= 10 * one > budget  # without the budget: linear in the snapshots
    print(f"\n500 groups: {one / 1024:.0f} KiB a snapshot; 30 snapshots in {history.ring_bytes / 2**20:.1f} MiB "
          f"({len(ring)} kept) instead of {30 * one / 2**20:.0f} MiB (the default budget: 64 MiB)")
