"""The built-in web view (issue 16), driven by a real headless Chromium (Debian's chromium and
chromium-driver, through Selenium) against a real otel-llm fed by the simulator and by OTel SDK
spans: every page loads without console errors, the overview's p99 is what a real Prometheus
computes from the same /metrics, the waterfall's bars are as long as the spans, filters and sorting
show what the API says, hostile span strings are text, and without the token there is no data.

Screenshots go to tests/artifacts/webview/ (gitignored). The README's docs/webview/*.png come from a
realistic run instead (no hostile payloads): docs/webview/make_screenshots.py."""

from __future__ import annotations

import dataclasses
import json
import math
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml
from opentelemetry import trace as otel_trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from otel_llm_simulate.emitters import RequestTiming, emit_gateway, emit_vllm_v1, engine_tracer_provider
from otel_llm_simulate.runner import otlp_exporter_factory, run_plan
from otel_llm_simulate.scenarios import plan
from tests.support import browser
from tests.support.otelllm import RunningServer, start_server
from tests.support.prometheus import PrometheusServer

pytestmark = pytest.mark.skipif(browser.available() is not None, reason=browser.available() or "")

ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = ROOT / "tests" / "artifacts" / "webview"
TOKEN = "s3cret-token-for-the-web-view"
XSS_NAME = '<img src=x onerror="window.__pwned=1;document.title=\'pwned\'">'
XSS_VALUE = "<script>window.__pwned=2;document.title='pwned'</script>"
XSS_MODEL = "<b>m</b><img src=y onerror=window.__pwned=3>"
POLICIES = [
    {"name": "errors", "type": "errors"},
    {"name": "slo", "type": "slo", "slo": {"thresholds": {"ttft": "1s", "e2e": "8s"}}},
    {"name": "baseline", "type": "probabilistic", "probabilistic": {"sampling_percentage": 100}},
]
WEB = {"snapshot_interval": "500ms", "history": "10m", "refresh_interval": "1s",
       "jaeger_url": "http://127.0.0.1:16686", "grafana_url": "http://127.0.0.1:3000"}


def _get(url: str, headers: dict[str, str] | None = None, data: bytes | None = None) -> tuple[int, dict[str, str], bytes]:
    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args: Any, **kwargs: Any) -> None:
            return None
    opener = urllib.request.build_opener(NoRedirect)
    request = urllib.request.Request(url, headers=headers or {}, data=data)
    try:
        with opener.open(request, timeout=10) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def _api(server: RunningServer, path: str) -> Any:
    status, _, body = _get(server.webview_url + path)
    assert status == 200, (path, status, body[:300])
    return json.loads(body)


def _hostile_trace(server: RunningServer) -> str:
    """A gateway (model name hostile) in front of vLLM (without OTEL_SERVICE_NAME: the gateway's model is
    its label), with an app span whose name and attribute values carry markup that would run if it
    were ever parsed as HTML."""
    exporter = server.exporter("http")
    provider = TracerProvider(resource=Resource.create({"service.name": "gw<svg onload=window.__pwned=4>"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    engine = engine_tracer_provider("vllm-v1", server.exporter("grpc"))
    start = time.time_ns() - 3 * 10**9
    timing = RequestTiming(start + 10**7, 0.01, 0.05, 0.1, decode_s=0.5, prompt_tokens=10, completion_tokens=20)
    holder: dict[str, str] = {}

    def engine_call(headers: dict[str, str]) -> None:
        ctx = emit_vllm_v1(engine, timing, request_id="xss", traceparent_headers=headers)
        holder["trace_id"] = f"{ctx.trace_id:032x}"
        tracer = provider.get_tracer("app")
        with tracer.start_as_current_span(XSS_NAME, kind=otel_trace.SpanKind.INTERNAL,
                                          attributes={"app.note": XSS_VALUE, "app.other": XSS_NAME}):
            pass

    emit_gateway(provider, start_unix_ns=start, end_unix_ns=start + 10**9, model=XSS_MODEL, engine_call=engine_call)
    provider.force_flush()
    engine.force_flush()
    return holder["trace_id"]


def _waterfall_trace(server: RunningServer) -> str:
    """A gateway 2 s long around a vLLM request of known segments: 0.2 s preprocess, 0.3 s queue,
    0.25 s prefill, 1.0 s decode."""
    gateway = TracerProvider(resource=Resource.create({"service.name": "edge-gw"}))
    gateway.add_span_processor(SimpleSpanProcessor(server.exporter("grpc")))
    engine = engine_tracer_provider("vllm-v1", server.exporter("grpc"), service_name="vllm-wf")
    start = time.time_ns() - 5 * 10**9
    timing = RequestTiming(start + 3 * 10**8, 0.2, 0.3, 0.25, decode_s=1.0, prompt_tokens=50, completion_tokens=51)
    holder: dict[str, str] = {}

    def engine_call(headers: dict[str, str]) -> None:
        ctx = emit_vllm_v1(engine, timing, request_id="wf", traceparent_headers=headers)
        holder["trace_id"] = f"{ctx.trace_id:032x}"

    emit_gateway(gateway, start_unix_ns=start, end_unix_ns=start + 2 * 10**9, model="wf-model", engine_call=engine_call)
    gateway.force_flush()
    engine.force_flush()
    return holder["trace_id"]


def _run_over_intervals(the_plan: Any, server: RunningServer, parts: int = 8, pause_s: float = 0.3) -> int:
    """Send ``the_plan`` in ``parts`` batches ``pause_s`` apart, so its requests are measured over
    several snapshot intervals (the charts' points) rather than all inside one. Each batch gets
    its own id seeds: the same seed again would repeat the first batch's trace and span ids."""
    order = the_plan.send_order()
    size = math.ceil(len(order) / parts)
    sent = 0
    for part in range(parts):
        chunk = tuple(order[part * size:(part + 1) * size])
        if not chunk:
            break
        members = tuple(dataclasses.replace(m, id_seed=m.id_seed + 7919 * part) for m in the_plan.members)
        result = run_plan(dataclasses.replace(the_plan, requests=chunk, members=members),
                          otlp_exporter_factory(f"127.0.0.1:{server.grpc_port}", "grpc"), realtime=False)
        assert not result.spans_failed
        sent += result.requests_sent
        time.sleep(pause_s)
    return sent


@pytest.fixture(scope="module")
def fleet(tmp_path_factory) -> Any:
    """One server, fed once: the simulator's steady fleet (with errors and aborts) in eight batches
    over a few seconds (several consecutive 500 ms snapshot intervals), the waterfall trace and the
    hostile trace; every trace decided and stored before the tests look."""
    tmp = tmp_path_factory.mktemp("webview")
    server = start_server(str(tmp / "store"), {
        "processors": {"tail_sampling": {"policies": POLICIES, "decision_wait": "2s"},
                       # the hostile trace's app.* text is shown (as text): the user allowed those keys
                       "redaction": {"allowed_keys": ["exception.stacktrace", "app.*"]}},
        "extensions": {"webview": WEB},
    })
    # Besides the plain job, this instance scraped as the shipped Prometheus config scrapes otel-llm
    # (source="spans") and as it scrapes vLLM's own /metrics (source="engine"; the same vllm: names):
    # the cards' PromQL must select the first only.
    target = server.metrics_url.removeprefix("http://")
    shipped = yaml.safe_load((ROOT / "collector-config" / "prometheus.yml").read_text(encoding="utf-8"))
    relabel = {job["job_name"]: job["relabel_configs"] for job in shipped["scrape_configs"] if "relabel_configs" in job}
    prometheus = PrometheusServer(tmp / "prom", [target], scrape_interval="1s", extra_scrape_configs=[
        {"job_name": job, "static_configs": [{"targets": [target]}], "relabel_configs": relabel[job]}
        for job in ("otel-llm-spans", "vllm-engine")])
    prometheus.start()
    try:
        the_plan = plan("errors", seed=16, rate=6.0, duration_s=20.0, start_ns=time.time_ns() - 20 * 10**9,
                        max_requests=120)
        sent = _run_over_intervals(the_plan, server)
        assert sent >= 100
        waterfall = _waterfall_trace(server)
        hostile = _hostile_trace(server)
        server.wait_until(lambda s: s.value("otel_llm_traces_in_memory") == 0
                          and s.value("otel_llm_requests_assembled_total") >= sent, 30,
                          "every trace decided")
        assert server.service.store is not None and server.service.store.flush(10)
        yield {"server": server, "prometheus": prometheus, "waterfall": waterfall, "hostile": hostile,
               "sent": sent}
    finally:
        prometheus.stop()
        server.stop()


@pytest.fixture(scope="module")
def driver() -> Any:
    d = browser.chromium()
    yield d
    d.quit()


def _open(driver: Any, url: str, loads: int = 1) -> None:
    driver.get(url)
    browser.poll(lambda: int(driver.find_element("css selector", "body").get_attribute("data-loaded") or 0) >= loads,
                 15, f"{url} to load its data")


def _shot(driver: Any, name: str) -> None:
    browser.screenshot(driver, ARTIFACTS / f"{name}.png")


def _css(driver: Any, selector: str) -> list[Any]:
    return driver.find_elements("css selector", selector)


def test_every_page_loads_without_console_errors(fleet, driver):
    server = fleet["server"]
    base = server.webview_url
    browser.console_errors(driver)  # drop anything from before
    _open(driver, base + "/?window=start")
    groups = _css(driver, "section.group")
    assert len(groups) >= 3, "one card per model x engine"
    assert any(g.get_attribute("data-model") == "llama-3.1-8b-instruct" for g in groups)
    assert _css(driver, "svg.chart path.line"), "time-series charts are drawn"
    assert _css(driver, "svg.chart line.slo"), "the ttft/e2e SLO thresholds are drawn in"
    assert "vllm:time_to_first_token_seconds_bucket" in driver.page_source
    assert "gen_ai_server_time_to_first_token_seconds_bucket" in driver.page_source
    _shot(driver, "overview")
    _open(driver, base + "/ui/requests")
    assert len(_css(driver, "#rows tr.row")) == 50
    _shot(driver, "requests")
    _open(driver, base + f"/ui/trace/{fleet['waterfall']}")
    assert len(_css(driver, ".bar")) >= 6  # gateway, engine, 4 segments
    links = {a.text: a.get_attribute("href") for a in _css(driver, ".links a")}
    assert links["Open in Jaeger"] == f"http://127.0.0.1:16686/trace/{fleet['waterfall']}"
    assert links["Open in Grafana"].startswith("http://127.0.0.1:3000/explore?left=")
    policy = driver.find_element("css selector", 'dd[data-field="sampling policy"]').text
    assert policy in ("errors", "slo", "baseline")
    assert driver.find_element("css selector", 'dd[data-field="model source"]').text not in ("", "—")
    _shot(driver, "trace")
    _open(driver, base + "/ui/status")
    text = driver.find_element("id", "status").text
    for needed in ("otel_llm_traces_in_memory", "otel_llm_store_size_bytes", "running", "Trace store"):
        assert needed in text, needed
    assert {s.get_attribute("data-section") for s in _css(driver, "section.telemetry")} >= {"intake", "sampling", "store"}
    assert '"tail_sampling"' in driver.find_element("id", "config").text
    _shot(driver, "status")
    assert browser.console_errors(driver) == []


def _served_groups(server: RunningServer) -> set[tuple[str, str]]:
    """(model_name, engine_kind) of every vllm:request_success_total series that counted requests."""
    out = set()
    for (name, labels), value in server.scrape().samples.items():
        if name == "vllm:request_success_total" and value > 0:
            d = dict(labels)
            out.add((d.get("model_name", ""), d.get("engine_kind", "")))
    return out


def test_overview_has_a_card_per_served_model_and_engine_only(fleet, driver):
    """A card is a (model, engine) that served requests: never a pair made up from another family's
    labels (the gen_ai families' ``gen_ai_provider_name`` is empty on a gateway-only record and
    names another engine than ``engine_kind`` for some), never a card with 0 requests or a "?"."""
    server = fleet["server"]
    served = _served_groups(server)
    data = _api(server, "/api/ui/overview?window=start")
    assert {(g["model"], g["engine"]) for g in data["groups"]} == served
    assert all(g["requests"] > 0 for g in data["groups"])
    _open(driver, server.webview_url + "/?window=start")
    cards = driver.execute_script(
        "return [...document.querySelectorAll('section.group')].map(c => [c.dataset.model, c.dataset.engine,"
        " c.querySelector('h2').textContent, Number(c.querySelector('[data-stat=requests]').dataset.value)])")
    assert {(model, engine) for model, engine, _, _ in cards} == served
    for model, engine, title, requests in cards:
        assert requests > 0, (model, engine)
        assert not title.rstrip().endswith("?"), title
        assert title.split()[-1] == engine or (not engine and title == model), title


def test_latency_charts_draw_each_interval_with_observations(fleet, driver):
    """The fleet was measured over several snapshot intervals: the small latency charts draw a line
    through the per-interval p50/p95/p99 (not only the SLO line), with gaps where an interval saw
    no request."""
    server = fleet["server"]
    data = _api(server, "/api/ui/overview?window=start")
    group = max((g for g in data["groups"] if g["model"] == "llama-3.1-8b-instruct"), key=lambda g: g["requests"])
    for key in ("ttft", "e2e"):
        p99 = group["series"][key]["p99"]
        assert len(p99) == len(group["series"]["t"])
        assert sum(v is not None for v in p99) >= 2, (key, p99)
        assert all(v is None or v > 0 for v in p99)
    _open(driver, server.webview_url + "/?window=start")

    def points(key: str, series: str) -> int:
        d = driver.execute_script(
            "const card = [...document.querySelectorAll('section.group')].find(c => c.dataset.model === arguments[0]"
            " && c.dataset.engine === arguments[1]);"
            "const path = card && card.querySelector(`svg.chart[data-metric=\"${arguments[2]}\"]"
            " path.line[data-series=\"${arguments[3]}\"]`);"
            "return path ? path.getAttribute('d') : '';", group["model"], group["engine"], key, series)
        return len([c for c in d if c in "ML"])

    for key in ("ttft", "e2e"):
        for series in ("p50", "p95", "p99"):
            assert points(key, series) >= 2, f"{key} {series}: a line through at least two intervals"
    assert _css(driver, "svg.chart line.slo"), "the SLO thresholds are still drawn in"
    assert browser.console_errors(driver) == []


def test_overview_p99_equals_prometheus(fleet, driver):
    server, prometheus = fleet["server"], fleet["prometheus"]
    families = {"ttft": "vllm:time_to_first_token_seconds", "e2e": "vllm:e2e_request_latency_seconds",
                "queue": "vllm:request_queue_time_seconds"}
    total = server.scrape().value("vllm:e2e_request_latency_seconds_count")
    prometheus.wait_for('sum(vllm:e2e_request_latency_seconds_count{job="otel-llm"})',
                        lambda r: bool(r) and float(r[0]["value"][1]) == total, timeout_s=20)
    _open(driver, server.webview_url + "/?window=start")
    checked = 0
    for key, family in families.items():
        result = prometheus.query(
            f'histogram_quantile(0.99, sum by (le, model_name, engine_kind) ({family}_bucket{{job="otel-llm"}}))')
        for series in result:
            want = float(series["value"][1])
            if math.isnan(want):
                continue
            model, engine = series["metric"].get("model_name", ""), series["metric"].get("engine_kind", "")

            def cell() -> float | None:
                for card in _css(driver, "section.group"):
                    if card.get_attribute("data-model") == model and card.get_attribute("data-engine") == engine:
                        value = card.find_element("css selector", f'tr[data-metric="{key}"] td[data-quantile="p99"]')
                        return float(value.get_attribute("data-value"))
                return None
            got = browser.poll(lambda: (v := cell()) is not None and math.isclose(v, want, rel_tol=1e-9) and v,
                               10, f"{key} p99 of {model}/{engine} to be {want}")
            assert math.isclose(got, want, rel_tol=1e-9)
            checked += 1
    assert checked >= 6
    # the same numbers from the JSON API, with the window (not yet 5 minutes old: everything)
    data = _api(server, "/api/ui/overview?window=5m")
    assert sum(g["requests"] for g in data["groups"]) == pytest.approx(
        server.scrape().value("vllm:request_success_total"))


def test_the_cards_promql_selects_otel_llms_series_only(fleet, driver):
    """Each card's PromQL, as the page shows it, selects ``source="spans"``: in a Prometheus that
    scrapes otel-llm as collector-config/prometheus.yml does, and vLLM's own /metrics too, exactly the
    series otel-llm exposed; without the selector the engine's scrape of the same names adds in."""
    server, prometheus = fleet["server"], fleet["prometheus"]
    prometheus.wait_for('count(vllm:request_success_total{source="engine"})', lambda r: bool(r), timeout_s=20)
    _open(driver, server.webview_url + "/?window=start")
    shown = driver.execute_script(
        "return [...document.querySelectorAll('section.group')].map(c => [c.dataset.model, c.dataset.engine,"
        " [...c.querySelectorAll('p.promql code, td.names code')].map(e => e.textContent)])")
    assert len(shown) >= 3
    for model, engine, queries in shown:
        assert all('{source="spans", ' in q for q in queries), queries
        rate = next(q for q in queries if q.startswith("sum(rate(vllm:request_success_total{"))  # the request rate
        selector = rate[rate.index("{"):rate.index("}") + 1]
        card = prometheus.query(f"count(vllm:request_success_total{selector})")
        spans_job = prometheus.query(f'count(vllm:request_success_total{{job="otel-llm-spans", '
                                     f'model_name={json.dumps(model)}, engine_kind={json.dumps(engine)}}})')
        assert card and card[0]["value"][1] == spans_job[0]["value"][1], (model, engine)
    everything = prometheus.query('count(vllm:request_success_total{model_name="llama-3.1-8b-instruct"})')
    spans_only = prometheus.query('count(vllm:request_success_total{source="spans", model_name="llama-3.1-8b-instruct"})')
    assert float(everything[0]["value"][1]) > float(spans_only[0]["value"][1])


def test_waterfall_bar_widths_are_proportional_to_span_durations(fleet, driver):
    server = fleet["server"]
    _open(driver, server.webview_url + f"/ui/trace/{fleet['waterfall']}")
    trace = _api(server, f"/api/ui/trace/{fleet['waterfall']}")
    total = trace["end_unix_nano"] - trace["start_unix_nano"]
    rows = _css(driver, ".span-row")
    assert len(rows) == len(trace["spans"])
    measured = []
    for row, span in zip(rows, trace["spans"]):
        assert row.get_attribute("data-span-id") == span["span_id"]
        bar = row.find_element("css selector", ".bar")
        track = row.find_element("css selector", ".wf-track")
        duration = span["end_time_unix_nano"] - span["start_time_unix_nano"]
        width, track_width = bar.rect["width"], track.rect["width"]
        assert width == pytest.approx(track_width * duration / total, abs=1.5), span["name"]
        left = bar.rect["x"] - track.rect["x"]
        assert left == pytest.approx(track_width * (span["start_time_unix_nano"] - trace["start_unix_nano"]) / total,
                                     abs=1.5), span["name"]
        measured.append((span.get("segment"), width, duration))
    segments = {seg: (w, d) for seg, w, d in measured if seg}
    assert set(segments) >= {"preprocess", "queue", "prefill", "decode"}
    # decode (1.0 s) is four times prefill (0.25 s) on the screen too
    assert segments["decode"][0] / segments["prefill"][0] == pytest.approx(4.0, rel=0.03)
    colours = {seg: row.find_element("css selector", ".bar").value_of_css_property("background-color")
               for row, (seg, _, _) in zip(rows, measured) if seg}
    assert len(set(colours.values())) == len(colours), f"one colour per segment: {colours}"
    # the time axis: round values, every label on one line (none wraps at the right edge)
    ticks = driver.execute_script("return [...document.querySelectorAll('.wf-axis .tick')].map(t => "
                                  "[t.textContent, t.getBoundingClientRect().height, t.getClientRects().length])")
    assert [t[0] for t in ticks] == ["0", "500 ms", "1 s", "1.5 s", "2 s"], ticks
    assert all(height == ticks[0][1] and rects == 1 for _, height, rects in ticks), ticks


def _rows(driver: Any) -> list[str]:
    return driver.execute_script("return [...document.querySelectorAll('#rows tr.row')].map(r => r.dataset.traceId)")


def _column(driver: Any, selector: str, attribute: str | None = None) -> list[str]:
    """One read of the table (a live refresh may replace it between two WebDriver calls)."""
    return driver.execute_script(
        "return [...document.querySelectorAll(arguments[0])].map(c => arguments[1] ? c.getAttribute(arguments[1])"
        " : c.textContent)", selector, attribute)


def _wait_rows(driver: Any, want: list[str], what: str) -> None:
    browser.poll(lambda: _rows(driver) == want, 10, f"rows {what} as the API says")


def test_filters_and_sorting_change_rows_as_the_api_says(fleet, driver):
    from selenium.webdriver.support.ui import Select

    server = fleet["server"]
    api = lambda query: [r["trace_id"] for r in _api(server, "/api/ui/requests?limit=50&" + query)["rows"]]  # noqa: E731
    _open(driver, server.webview_url + "/ui/requests")
    _wait_rows(driver, api(""), "newest first")
    # sort by TTFT: a click on the header, largest first; again: smallest first
    driver.find_element("css selector", 'th[data-sort="ttft"] a').click()
    want = api("sort=ttft&order=desc")
    _wait_rows(driver, want, "by TTFT, largest first")
    values = [float(v) for v in _column(driver, '#rows td[data-col="ttft"]', "data-value") if v]
    assert values == sorted(values, reverse=True) and len(values) > 10
    driver.find_element("css selector", 'th[data-sort="ttft"] a').click()
    _wait_rows(driver, api("sort=ttft&order=asc"), "by TTFT, smallest first")
    assert _rows(driver) != want
    # filter by model and outcome (options come from the store)
    browser.poll(lambda: len(Select(driver.find_element("id", "f-model")).options) > 3, 10, "model options")
    Select(driver.find_element("id", "f-model")).select_by_value("llama-3.1-8b-instruct")
    _wait_rows(driver, api("sort=ttft&order=asc&model=llama-3.1-8b-instruct"), "of one model")
    assert set(_column(driver, "#rows tr.row td:nth-child(2)")) == {"llama-3.1-8b-instruct"}
    Select(driver.find_element("id", "f-model")).select_by_value("")
    Select(driver.find_element("id", "f-outcome")).select_by_value("error")
    errors = api("sort=ttft&order=asc&outcome=error")
    assert errors, "the errors scenario keeps failed requests"
    _wait_rows(driver, errors, "that failed")
    assert set(_column(driver, "#rows td.outcome")) == {"error"}
    Select(driver.find_element("id", "f-outcome")).select_by_value("")
    Select(driver.find_element("id", "f-policy")).select_by_value("slo")
    _wait_rows(driver, api("sort=ttft&order=asc&policy=slo"), "kept by the slo policy")
    Select(driver.find_element("id", "f-policy")).select_by_value("")
    # sort by e2e through the form, then page on
    Select(driver.find_element("id", "f-sort")).select_by_value("e2e")
    Select(driver.find_element("id", "f-order")).select_by_value("desc")
    _wait_rows(driver, api("sort=e2e&order=desc"), "by e2e")
    driver.find_element("id", "next").click()
    second = api("sort=e2e&order=desc&offset=50")
    assert second and not set(second) & set(api("sort=e2e&order=desc"))
    _wait_rows(driver, second, "of the second page")
    # every row links to its trace
    assert _column(driver, "#rows a.trace-link", "href")[0].endswith("/ui/trace/" + second[0])
    assert browser.console_errors(driver) == []


def test_hostile_span_strings_render_as_text_and_run_nothing(fleet, driver):
    server = fleet["server"]
    hostile = fleet["hostile"]
    driver.get("about:blank")
    browser.console_errors(driver)
    for url, literal in ((f"/ui/trace/{hostile}", XSS_NAME), ("/?window=start", XSS_MODEL),
                         ("/ui/requests?model=" + urllib.request.quote(XSS_MODEL), XSS_MODEL)):
        _open(driver, server.webview_url + url, loads=2)  # a live refresh too: re-rendered data stays text
        page_text = driver.find_element("id", "main").text
        assert literal in page_text, url
        assert driver.execute_script("return window.__pwned") is None, url
        assert driver.title.startswith("otel-llm · "), url
        assert driver.execute_script("return document.querySelectorAll('main img, main script, main [onerror], main [onload]').length") == 0
        if "trace" in url:
            for row in _css(driver, ".span-row"):
                if XSS_NAME in row.text:
                    row.click()
                    break
            else:
                raise AssertionError("the hostile span has its row")
            browser.poll(lambda: XSS_VALUE in driver.find_element("id", "span-detail").text, 5, "attributes as text")
            assert driver.execute_script("return window.__pwned") is None
            assert "gw<svg onload=window.__pwned=4>" in driver.find_element("id", "main").text
    assert browser.console_errors(driver) == []
    # the headers that make the browser refuse inline script and content sniffing
    status, headers, _ = _get(server.webview_url + "/")
    assert status == 200
    assert "default-src 'self'" in headers["Content-Security-Policy"]
    assert "unsafe-inline" not in headers["Content-Security-Policy"]
    assert headers["X-Content-Type-Options"] == "nosniff"


def test_wrong_or_missing_token_gets_no_data(tmp_path, driver):
    server = start_server(str(tmp_path / "store"), {
        "exporters": {"prometheus": {"auth": {"bearer_token": TOKEN}}},
        "extensions": {"webview": {"auth": {"bearer_token": TOKEN}, "refresh_interval": "1s"}}})
    try:
        engine = engine_tracer_provider("vllm-v1", server.exporter("grpc"), service_name="secret-model")
        emit_vllm_v1(engine, RequestTiming(time.time_ns() - 10**9, 0.01, 0.1, 0.2, decode_s=0.3,
                                           prompt_tokens=5, completion_tokens=6), request_id="a")
        base = server.webview_url
        for path in ("/api/ui/overview", "/api/ui/requests", "/api/ui/status", "/api/ui/filters", "/api/ui/meta"):
            for headers in ({}, {"Authorization": "Bearer wrong"}, {"Cookie": "otel_llm_session=forged"}):
                status, _, body = _get(base + path, headers)
                assert status == 401 and b"secret-model" not in body and b"otel_llm" not in body.replace(
                    b"otel_llm_session", b""), (path, headers, body)
            status, _, _ = _get(base + path, {"Authorization": f"Bearer {TOKEN}"})
            assert status == 200, path
        for page in ("/", "/ui/requests", "/ui/status"):
            status, headers, _ = _get(base + page)
            assert status == 303 and headers["Location"] == "/login", page
        status, headers, body = _get(base + "/login", data=b"token=wrong")
        assert status == 401 and "Set-Cookie" not in headers and b'name="token"' in body
        # the browser: the login form, a cookie-less fetch that fails, then a real login
        driver.delete_all_cookies()
        driver.get(base + "/")
        browser.poll(lambda: driver.current_url.endswith("/login"), 10, "the redirect to /login")
        assert driver.find_element("id", "token").get_attribute("type") == "password"
        assert driver.execute_script("return document.cookie") == ""
        status = driver.execute_async_script(
            "const done = arguments[arguments.length - 1];"
            "fetch('/api/ui/requests', {credentials: 'omit'}).then(r => done(r.status), e => done(String(e)));")
        assert status == 401
        driver.find_element("id", "token").send_keys("wrong")
        driver.find_element("css selector", "#login button").click()
        browser.poll(lambda: "Wrong token" in driver.find_element("id", "message").text, 10, "the refusal")
        assert driver.get_cookie("otel_llm_session") is None
        driver.find_element("id", "token").send_keys(TOKEN)
        driver.find_element("css selector", "#login button").click()
        browser.poll(lambda: driver.current_url == base + "/", 10, "the overview after the login")
        browser.poll(lambda: int(driver.find_element("css selector", "body").get_attribute("data-loaded") or 0) >= 1,
                     10, "the overview's data")
        cookie = driver.get_cookie("otel_llm_session")
        assert cookie["httpOnly"] is True and cookie["sameSite"] == "Strict" and TOKEN not in cookie["value"]
        assert driver.execute_script("return document.cookie") == ""  # not readable by script
        status = driver.execute_async_script(
            "const done = arguments[arguments.length - 1];"
            "Promise.all([fetch('/api/ui/requests').then(r => r.status),"
            " fetch('/api/ui/requests', {credentials: 'omit'}).then(r => r.status)]).then(done);")
        assert status == [200, 401]
        _, _, body = _get(base + "/api/ui/meta", {"Cookie": f"otel_llm_session={cookie['value']}"})
        assert json.loads(body)["auth"] is True
        # the cookie is not a bearer token for the other APIs, and logging out ends the session
        assert _get(server.metrics_url + "/api/traces", {"Cookie": f"otel_llm_session={cookie['value']}"})[0] == 401
        driver.find_element("css selector", "#logout button").click()
        browser.poll(lambda: driver.current_url.endswith("/login"), 10, "the login form after logging out")
        assert _get(base + "/api/ui/meta", {"Cookie": f"otel_llm_session={cookie['value']}"})[0] == 401
    finally:
        driver.delete_all_cookies()
        server.stop()


def test_web_view_options_are_validated_and_it_runs_only_when_listed(tmp_path):
    from otel_llm.config import ConfigError, config_from_dict

    for bad, where in (({"jaeger_url": "javascript:alert(1)"}, "jaeger_url"),
                       ({"grafana_url": 'http://g/"><script>'}, "grafana_url"),
                       ({"snapshot_interval": "0s"}, "snapshot_interval"),
                       ({"history": "1s", "snapshot_interval": "10s"}, "history"),
                       ({"colour": "red"}, "colour")):
        with pytest.raises(ConfigError, match=f"extensions.webview.{where}"):
            config_from_dict({"extensions": {"webview": bad}})
    with pytest.raises(ConfigError, match="exporters.prometheus.web: the web view is an extension now"):
        config_from_dict({"exporters": {"prometheus": {"web": {}}}})  # an old config: a clear error
    # Listed in service.extensions or not running; the metrics port never serves it.
    server = start_server(str(tmp_path / "store"), {"service": {"extensions": []}})
    try:
        assert server.service.webview is None
        for path in ("/", "/ui/requests", "/api/ui/meta", "/static/app.js", "/login"):
            assert _get(server.metrics_url + path)[0] in (401, 404), path
        assert _get(server.metrics_url + "/metrics")[0] == 200
    finally:
        server.stop()


def test_history_windows_subtract_snapshots(fleet):
    """A window's counts are the newest minus the snapshot at its start: traffic sent after a
    snapshot is all a window shorter than the time since then sees."""
    from otel_llm.extension.webview.history import Snapshot
    from otel_llm.extension.webview.overview import overview

    server = fleet["server"]
    web = server.service.webview.webview
    history = web.history
    everything = overview(history, server.service.config, "start")
    # pretend the last snapshot was taken 10 minutes ago: a 5 m window subtracts it
    latest = history.take()
    old = Snapshot(latest.time - 600, dict(latest.histograms), dict(latest.outcomes))
    with history._lock:
        saved = list(history._ring)
        history._ring.clear()
        history._ring.append(old)
    try:
        recent = overview(history, server.service.config, "5m")
    finally:
        with history._lock:
            history._ring.clear()
            history._ring.extend(saved)
    assert sum(g["requests"] for g in everything["groups"]) >= fleet["sent"] * 0.5
    assert sum(g["requests"] for g in recent["groups"]) == 0
    assert all(g["metrics"]["ttft"]["p99"] is None for g in recent["groups"] if "ttft" in g["metrics"])


def test_cards_show_per_service_what_was_refused_or_not_measurable(tmp_path, driver):
    """Issue 23: a card said "102 requests, 0.00 % errors" while 26 of its 128 spans had been refused.
    Each card now lists, per service behind it, the spans refused and the intervals not measurable;
    a service whose every span was refused has no card, so it is listed on its own."""
    from tests.test_bad_input import _with_service, grpc_raw, vllm_request_proto

    server = start_server(str(tmp_path / "store"), {"extensions": {"webview": WEB}})
    try:
        # two clocks (postprocess -0.1 s): measured, postprocess not measurable; TTFT after e2e: refused
        grpc_raw(server, _with_service(vllm_request_proto(decode=2.2), "two-clocks").SerializeToString())
        grpc_raw(server, _with_service(vllm_request_proto(ttft=3.0), "two-clocks").SerializeToString())
        grpc_raw(server, _with_service(vllm_request_proto(ttft=3.0), "<b>gone</b>").SerializeToString())
        server.wait_until(lambda s: s.value("otel_llm_requests_assembled_total") == 1
                          and s.value("otel_llm_spans_malformed_total") == 2, what="one measured, two refused")
        data = _api(server, "/api/ui/overview?window=start")
        (card,) = data["groups"]
        assert (card["model"], card["requests"]) == ("two-clocks", 1)
        assert card["unmeasured"] == {"two-clocks": {"not_measurable_postprocess": 1, "inconsistent_latency": 1}}
        assert data["unmeasured_elsewhere"] == {"<b>gone</b>": {"inconsistent_latency": 1}}
        _open(driver, server.webview_url + "/?window=start")
        shown = driver.execute_script(
            "return [...document.querySelectorAll('p.unmeasured')].map(p => [p.closest('section').dataset.model || '',"
            " p.dataset.service, p.dataset.refused, p.textContent])")
        assert sorted(shown) == [
            ["", "<b>gone</b>", "1", "service <b>gone</b>: 1 spans refused (inconsistent_latency 1)"],
            ["two-clocks", "two-clocks", "1",
             "service two-clocks: 1 spans refused (inconsistent_latency 1) · not measurable: postprocess 1"]]
        assert not _css(driver, "p.unmeasured b")  # the hostile name is text, not markup
    finally:
        server.stop()
