"""Issue 26, items 4 and 5: tokens and cost per allow-listed tenant, priced per model; SLO attainment
per model with the goodput recording rule and its alert. Real emitters' shapes, a real otel-llm,
the real Prometheus with the kit's rules file, and the config's refusals."""

from __future__ import annotations

import copy
import pathlib
import subprocess
import sys
import time
from typing import Any

import pytest

from otel_llm.config import ConfigError, config_from_dict
from otel_llm_simulate.emitters import RequestTiming, emit_tgi, emit_vllm_v1, engine_tracer_provider
from tests.support.captures import attribute, post, shifted, spans_of, trace_requests, earliest_start_ns
from tests.support.prometheus import PrometheusServer

RULES = pathlib.Path(__file__).resolve().parent.parent / "collector-config" / "alerts" / "llm_serving.yml"
TEAM_ALIAS = "metadata.user_api_key_team_alias"  # litellm/integrations/opentelemetry.py:1575-1580 (1.110.2)
END_USER = "metadata.user_api_key_end_user_id"  # METRIC_METADATA_KEYS, same file :192-207

# gpt-4o-mini's list price (USD per million tokens: input 0.15, cached input 0.075, output 0.60): the
# same figures LiteLLM's own cost map gives, and with them the capture's usage_object "cost": 7.65e-06
# for 23 input + 7 output tokens (tests/testdata/emitters/litellm_proxy_v1).
PRICES = {"gpt-4o-mini": {"input": 0.15, "output": 0.60, "cached_input": 0.075}}


def _prometheus(tmp_path: pathlib.Path, server: Any, rules: bool = False) -> PrometheusServer:
    # The scrape labels of collector-config/prometheus.yml's span job: the rules select source="spans".
    prom = PrometheusServer(tmp_path / "prom", [], scrape_interval="1s", rule_files=[RULES] if rules else [],
                            extra_scrape_configs=[{"job_name": "otel-llm-spans", "metrics_path": "/metrics",
                                                   "static_configs": [{
                                                       "targets": [server.metrics_url.removeprefix("http://")],
                                                       "labels": {"source": "spans"}}]}])
    prom.start()
    return prom


def _with_teams(teams: list[str | None]) -> list[Any]:
    """The LiteLLM proxy capture with a team alias on each ``litellm_request`` span that reports usage, in
    order, as LiteLLM stamps it when the virtual key belongs to a team (``_set_team_attributes_on_span``;
    the capture was made with the master key, so its alias is "", which LiteLLM itself treats as absent)."""
    requests = copy.deepcopy(trace_requests("litellm_proxy_v1"))
    pending = list(teams)
    for span in spans_of(requests):
        if span.name != "litellm_request" or not attribute(span, "gen_ai.usage.input_tokens"):
            continue
        team = pending.pop(0)
        for kv in span.attributes:
            if kv.key == TEAM_ALIAS and team is not None:
                kv.value.string_value = team
    assert not pending, "the capture has fewer requests with usage than teams given"
    return requests


def _value(result: list[dict], **labels: str) -> float:
    for row in result:
        if all(row["metric"].get(k) == v for k, v in labels.items()):
            return float(row["value"][1])
    raise AssertionError(f"no {labels} in {result}")


def test_litellm_team_tokens_and_cost_per_tenant_through_prometheus(make_server, tmp_path):
    server = make_server({"processors": {"llm_metrics": {
        "tenant": {"attributes": [TEAM_ALIAS, END_USER], "values": ["team-a", "team-b"]},
        "cost": {"currency": "USD", "prices": PRICES}}}})
    prom = _prometheus(tmp_path, server)
    try:
        requests = _with_teams(["team-a", "team-a", "intruder"])
        offset = time.time_ns() - earliest_start_ns(requests)
        for request in shifted(requests, offset):
            assert post(server, request) == 200
        # Every request of the capture that reported usage: 23 input and 7 output tokens each.
        usage = [(attribute(s, "gen_ai.usage.input_tokens"), attribute(s, "gen_ai.usage.output_tokens"))
                 for s in spans_of(requests) if s.name == "litellm_request" and attribute(s, "gen_ai.usage.input_tokens")]
        assert usage == [(23, 7)] * 3
        scrape = server.wait_until(lambda s: s.value("otel_llm_tenant_tokens_total") >= 3 * 30, what="tenant tokens")
        assert scrape.value("otel_llm_tenant_tokens_total", tenant="team-a", token_type="input") == 46
        assert scrape.value("otel_llm_tenant_tokens_total", tenant="team-a", token_type="output") == 14
        assert scrape.value("otel_llm_tenant_tokens_total", tenant="other", token_type="input") == 23
        assert scrape.value("otel_llm_tenant_tokens_total", tenant="team-b") == 0
        assert scrape.value("otel_llm_unpriced_tokens_total") == 0

        prom.wait_for('sum(otel_llm_tenant_tokens_total{source="spans"})', lambda r: bool(r) and float(r[0]["value"][1]) == 90)
        cost = prom.query('sum by (tenant, currency, model_name) (otel_llm_request_cost_total{source="spans"})')
        # 7.65e-06 USD per request: LiteLLM's own cost for the same usage at the same list price.
        assert _value(cost, tenant="team-a", currency="USD", model_name="gpt-4o-mini") == pytest.approx(2 * 7.65e-06, rel=1e-12)
        assert _value(cost, tenant="other", currency="USD") == pytest.approx(7.65e-06, rel=1e-12)
        assert {row["metric"]["tenant"] for row in cost} == {"team-a", "other"}
    finally:
        prom.stop()


def test_tokens_without_a_price_are_counted_never_priced(make_server, tmp_path):
    """vLLM V1 spans (emitted as vLLM 0.33 does) of a model missing from the price table, and of one
    priced for input only: their unpriced tokens are counted by type, only the priced ones cost."""
    server = make_server({"processors": {"llm_metrics": {
        "cost": {"currency": "EUR", "prices": {"llama": {"input": 2.0}}}}}})
    prom = _prometheus(tmp_path, server)
    try:
        now = time.time_ns()
        for service, prompt, completion in (("llama", 1000, 300), ("qwen", 400, 50)):
            provider = engine_tracer_provider("vllm-v1", server.exporter("grpc"), service_name=service)
            emit_vllm_v1(provider, RequestTiming(now - 10**9, 0.01, 0.02, 0.05, 0.5, prompt_tokens=prompt,
                                                 completion_tokens=completion), request_id=service)
            provider.force_flush()
        server.wait_for_requests(2)
        prom.wait_for('count(otel_llm_unpriced_tokens_total{source="spans"})', lambda r: bool(r) and float(r[0]["value"][1]) == 3)
        unpriced = prom.query('sum by (model_name, token_type) (otel_llm_unpriced_tokens_total{source="spans"})')
        assert _value(unpriced, model_name="llama", token_type="output") == 300
        assert _value(unpriced, model_name="qwen", token_type="input") == 400
        assert _value(unpriced, model_name="qwen", token_type="output") == 50
        cost = prom.query('otel_llm_request_cost_total{source="spans"}')
        assert len(cost) == 1  # qwen has no price: no cost series at all
        assert cost[0]["metric"]["model_name"] == "llama" and cost[0]["metric"]["currency"] == "EUR"
        assert float(cost[0]["value"][1]) == pytest.approx(1000 * 2.0 / 1e6, rel=1e-12)
        assert cost[0]["metric"].get("tenant", "") == ""  # no tenant configured: none made up
    finally:
        prom.stop()


SLO = {"default": {"ttft": "1s", "e2e": "2.5s", "target": 0.9},
       "models": {"qwen": {"e2e": "10s"}}}


def _vllm(server: Any, service: str, timings: list[tuple[float, float]], start_ns: int) -> None:
    """vLLM 0.33's ``llm_request`` spans with the given (ttft, e2e): queue 0, prefill = ttft."""
    provider = engine_tracer_provider("vllm-v1", server.exporter("grpc"), service_name=service)
    for i, (ttft, e2e) in enumerate(timings):
        emit_vllm_v1(provider, RequestTiming(start_ns + i * 10**6, 0.0, 0.0, ttft, e2e - ttft, prompt_tokens=10,
                                             completion_tokens=20), request_id=f"{service}-{start_ns}-{i}")
    provider.force_flush()


def test_slo_attainment_counts_and_the_goodput_rule_and_alert_on_a_real_prometheus(make_server, tmp_path):
    server = make_server({"processors": {"llm_metrics": {"slo": SLO}}})
    prom = _prometheus(tmp_path, server, rules=True)
    try:
        start = time.time_ns() - 60 * 10**9
        # llama (default objectives, TTFT <= 1 s and e2e <= 2.5 s): met; e2e missed; TTFT missed.
        _vllm(server, "llama", [(0.5, 2.0), (0.5, 3.0), (1.5, 2.0)], start)
        # qwen (e2e <= 10 s by its override, TTFT <= 1 s from the default): met at e2e 5 s.
        _vllm(server, "qwen", [(0.5, 5.0)], start)
        # TGI's router spans carry no TTFT (research 4.1): a TTFT objective is not measured.
        tgi = engine_tracer_provider("tgi", server.exporter("grpc"), service_name="tgi-model")
        emit_tgi(tgi, RequestTiming(start, 0.001, 0.1, 0.2, 0.5))
        tgi.force_flush()
        scrape = server.wait_until(lambda s: s.value("otel_llm_slo_requests_total") >= 5, what="5 SLO requests")
        assert scrape.value("otel_llm_slo_requests_total", model_name="llama", slo="met") == 1
        assert scrape.value("otel_llm_slo_requests_total", model_name="llama", slo="missed") == 2
        assert scrape.value("otel_llm_slo_requests_total", model_name="qwen", slo="met") == 1
        assert scrape.value("otel_llm_slo_requests_total", model_name="tgi-model", slo="unmeasured") == 1
        assert scrape.value("otel_llm_slo_requests_total", model_name="tgi-model", slo="met") == 0
        assert scrape.value("otel_llm_slo_target_ratio", model_name="llama") == 0.9

        # Phase 2, once Prometheus has phase 1: llama 3 met, 1 missed. Over the rate window only
        # phase 2 grows, so the goodput rule reads 3 / 4 and the alert (target 0.9) is pending.
        prom.wait_for('sum(otel_llm_slo_requests_total{model_name="llama"})', lambda r: bool(r) and float(r[0]["value"][1]) == 3)
        _vllm(server, "llama", [(0.2, 1.0), (0.3, 2.5 - 0.25), (0.9, 2.4), (0.4, 9.0)], start + 10**9)
        server.wait_until(lambda s: s.value("otel_llm_slo_requests_total", model_name="llama") == 7, what="phase 2")
        ratio = prom.wait_for('llm:slo_attainment:ratio_rate5m{model_name="llama"}',
                              lambda r: bool(r) and abs(float(r[0]["value"][1]) - 0.75) < 1e-9, timeout_s=60)
        assert float(ratio[0]["value"][1]) == pytest.approx(0.75, abs=1e-9)
        alerts = prom.wait_for('ALERTS{alertname="LLMSloAttainmentBelowTarget"}', lambda r: bool(r), timeout_s=60)
        assert [(a["metric"]["model_name"], a["metric"]["alertstate"]) for a in alerts] == [("llama", "pending")]
        # qwen did not grow in the window (no rate: no ratio); tgi-model has only unmeasured requests.
        assert prom.query('llm:slo_attainment:ratio_rate5m{model_name="qwen"} >= 0') == []
        assert prom.query('llm:slo_attainment:ratio_rate5m{model_name="tgi-model"} >= 0') == []
    finally:
        prom.stop()


# --- config refusals ------------------------------------------------------------------------------

def _load(llm_metrics: dict[str, Any]) -> Any:
    return config_from_dict({"processors": {"llm_metrics": llm_metrics}})


@pytest.mark.parametrize("llm_metrics, where, says", [
    ({"cost": {"currency": "USD", "prices": {"m": {"input": -0.5}}}}, "processors.llm_metrics.cost.prices.m.input",
     "must not be negative"),
    ({"cost": {"currency": "USD", "prices": {"m": {"output": 1, "outptu": 2}}}},
     "processors.llm_metrics.cost.prices.m.outptu", "unknown key"),
    ({"cost": {"prices": {"m": {"input": 1}}}}, "processors.llm_metrics.cost.currency", "required"),
    ({"cost": {"currency": "USD"}}, "processors.llm_metrics.cost.prices", "required with cost.currency"),
    ({"cost": {"currency": "dollars", "prices": {"m": {"input": 1}}}}, "processors.llm_metrics.cost.currency",
     "ISO 4217"),
    ({"cost": {"currency": "USD", "prices": {"m": {}}}}, "processors.llm_metrics.cost.prices.m", "at least one"),
    ({"tenant": {"attributes": [TEAM_ALIAS]}}, "processors.llm_metrics.tenant.values", "allow-list"),
    ({"tenant": {"values": ["a"]}}, "processors.llm_metrics.tenant.attributes", "required"),
    ({"tenant": {"attributes": [TEAM_ALIAS], "values": ["a"], "other": ""}}, "processors.llm_metrics.tenant.other",
     "must not be empty"),
    ({"tenant": {"attribute": TEAM_ALIAS}}, "processors.llm_metrics.tenant.attribute", "unknown key"),
    ({"tenant": {"attributes": [TEAM_ALIAS], "values": ["a"]},
      "dimensions": [{"name": "tenant", "attribute": "x", "values": ["a"]}]},
     "processors.llm_metrics.dimensions[0].name", "tenant"),
    ({"slo": {"default": {"ttft": "0s"}}}, "processors.llm_metrics.slo.default.ttft", "positive"),
    ({"slo": {"default": {"e2e": -1}}}, "processors.llm_metrics.slo.default.e2e", "negative"),
    ({"slo": {"default": {"e2e": "2s", "target": 1.5}}}, "processors.llm_metrics.slo.default.target", "(0, 1]"),
    ({"slo": {"default": {"target": 0.9}}}, "processors.llm_metrics.slo.default.target", "at least one objective"),
    ({"slo": {"models": {"m": {}}}}, "processors.llm_metrics.slo.models.m", "at least one"),
    ({"slo": {"models": {"m": {"ttft": "1s", "p99": "2s"}}}}, "processors.llm_metrics.slo.models.m.p99", "unknown key"),
])
def test_config_refuses_with_the_path_and_the_reason(llm_metrics, where, says):
    with pytest.raises(ConfigError) as info:
        _load(llm_metrics)
    assert where in str(info.value)
    assert says in str(info.value)


def test_config_accepts_a_full_tenant_cost_and_slo_block_and_merges_overrides():
    config = _load({"tenant": {"attributes": [TEAM_ALIAS, "http.request.header.x-tenant"], "values": ["a", "b"]},
                    "cost": {"currency": "USD", "prices": PRICES},
                    "slo": SLO})
    slo = config.processors.llm_metrics.slo
    qwen, llama = slo.objectives_for("qwen"), slo.objectives_for("llama")
    assert (qwen.ttft, qwen.e2e, qwen.target) == (1.0, 10.0, 0.9)
    assert (llama.ttft, llama.e2e, llama.tpot) == (1.0, 2.5, None)


def test_validate_command_names_the_negative_price(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("processors:\n  llm_metrics:\n    cost:\n      currency: USD\n      prices:\n"
                      "        llama: {input: 1.0, output: -3}\n")
    out = subprocess.run([sys.executable, "-m", "otel_llm", "validate", str(config)], capture_output=True, text=True)
    assert out.returncode == 2
    assert "processors.llm_metrics.cost.prices.llama.output" in out.stderr + out.stdout


# --- the web view's per-model cards ----------------------------------------------------------------

def test_webview_cards_show_slo_attainment_and_cost_as_the_metrics_say(make_server):
    """The overview API and the page a real Chromium draws: the card of a model with objectives and
    prices shows its attainment and its cost by tenant; a model without a price shows unpriced tokens."""
    import json
    import urllib.request

    from tests.support import browser

    server = make_server({"processors": {"llm_metrics": {
        "slo": {"default": {"e2e": "2.5s"}},
        "cost": {"currency": "USD", "prices": {"llama": {"input": 1.0, "output": 4.0}}}}}})
    start = time.time_ns() - 30 * 10**9
    _vllm(server, "llama", [(0.1, 1.0), (0.1, 2.0), (0.1, 3.0), (0.1, 2.4)], start)  # 3 met, 1 missed
    _vllm(server, "qwen", [(0.1, 9.0)], start)  # missed; no price
    server.wait_until(lambda s: s.value("otel_llm_slo_requests_total") == 5, what="5 SLO requests")
    with urllib.request.urlopen(server.webview_url + "/api/ui/overview?window=start", timeout=30) as response:
        data = json.loads(response.read())
    cards = {g["model"]: g for g in data["groups"]}
    llama, qwen = cards["llama"], cards["qwen"]
    assert llama["slo_attainment"] == {"met": 3, "missed": 1, "unmeasured": 0, "ratio": 0.75}
    # 4 requests of 10 prompt and 20 output tokens (_vllm): 40 * 1.0 + 80 * 4.0 per million.
    assert llama["cost"]["currencies"]["USD"]["total"] == pytest.approx((40 * 1.0 + 80 * 4.0) / 1e6, rel=1e-12)
    assert llama["cost"]["currencies"]["USD"]["by_tenant"] == {"": pytest.approx(360 / 1e6, rel=1e-12)}
    assert qwen["slo_attainment"]["ratio"] == 0.0
    assert qwen["cost"] == {"currencies": {}, "unpriced_tokens": {"input": 10, "output": 20}}
    # The objective "SLO met" counts against is the one each row shows; no slo sampling policy keeps anything.
    assert llama["objectives"] == {"e2e": 2.5} and llama["slo"] == {}

    if browser.available() is not None:
        pytest.skip(browser.available() or "no browser")
    driver = browser.chromium()
    try:
        driver.get(server.webview_url + "/?window=start")
        browser.poll(lambda: int(driver.find_element("css selector", "body").get_attribute("data-loaded") or 0) >= 1,
                     15, "the overview to load")
        stats = driver.execute_script(
            "const out = {}; for (const c of document.querySelectorAll('section.group')) {"
            " const s = {}; for (const e of c.querySelectorAll('[data-stat]')) s[e.dataset.stat] = e.dataset.value;"
            " s.text = (c.querySelector('p.accounting') || {}).textContent || ''; out[c.dataset.model] = s; } return out")
        assert float(stats["llama"]["slo_attainment"]) == 0.75
        assert float(stats["llama"]["cost_USD"]) == pytest.approx(360 / 1e6, rel=1e-12)
        assert "3 met, 1 missed, 0 unmeasured" in stats["llama"]["text"]
        assert float(stats["qwen"]["unpriced_tokens"]) == 30
        rows = driver.execute_script(
            "const c = [...document.querySelectorAll('section.group')].find(c => c.dataset.model === 'llama');"
            " return Object.fromEntries([...c.querySelectorAll('tr[data-metric]')].map(r => [r.dataset.metric,"
            " [r.querySelector('[data-objective]').dataset.objective, r.querySelector('[data-kept-above]').textContent]]))")
        assert rows["e2e"] == ["2.5", "—"] and rows["ttft"] == ["", "—"], rows
        assert "unpriced tokens (no price configured): input 10, output 20" in stats["qwen"]["text"]
        assert browser.console_errors(driver) == []
    finally:
        driver.quit()


# --- a tenant from a request header a gateway records -----------------------------------------------

# OTel Python's HTTP server instrumentations record a captured request header
# (OTEL_INSTRUMENTATION_HTTP_CAPTURE_HEADERS_SERVER_REQUEST=x-tenant-id) as a string array under
# ``http.request.header.x_tenant_id`` (opentelemetry-util-http 0.66b2, normalise_request_header_name).
HEADER = "http.request.header.x_tenant_id"


def test_a_header_the_gateway_span_records_names_the_tenant_of_the_engine_request(make_server):
    from tests.test_cardinality_and_dimensions import _requests_behind_gateways

    server = make_server({"processors": {"llm_metrics": {
        "tenant": {"attributes": [TEAM_ALIAS, HEADER], "values": ["acme", "globex"]}}}})
    _requests_behind_gateways(server, HEADER, [["acme"], ["acme"], ["globex"], ["initech"], None])
    scrape = server.wait_for_requests(5)
    tokens = "otel_llm_tenant_tokens_total"
    # _timing(): 100 prompt and 11 output tokens per request (tests/test_cardinality_and_dimensions.py).
    assert scrape.value(tokens, tenant="acme", token_type="input") == 200
    assert scrape.value(tokens, tenant="globex", token_type="output") == 11
    assert scrape.value(tokens, tenant="other", token_type="input") == 100  # off the allow-list
    assert scrape.value(tokens, tenant="", token_type="input") == 100  # no header: no tenant made up
    assert scrape.value(tokens) == 5 * 111
    # Without a price table there is no cost counter and nothing "unpriced".
    assert "otel_llm_request_cost_total{" not in scrape.text and "otel_llm_unpriced_tokens_total{" not in scrape.text


def test_a_client_call_served_by_an_engine_is_counted_once_with_the_callers_tenant(make_server):
    """An application's (or LiteLLM's) GenAI CLIENT span naming the team, calling vLLM with its
    traceparent: the engine's tokens carry the caller's tenant, and the client side, which reports
    the same usage, is not counted again."""
    from opentelemetry.propagate import inject
    from opentelemetry.trace import SpanKind

    server = make_server({"processors": {"llm_metrics": {
        "tenant": {"attributes": [TEAM_ALIAS], "values": ["acme"]},
        "cost": {"currency": "USD", "prices": {"llama": {"input": 1.0, "output": 1.0}}}}}})
    engine = engine_tracer_provider("vllm-v1", server.exporter("grpc"), service_name="llama")
    app = engine_tracer_provider("app", server.exporter("grpc"), service_name="app")
    timing = RequestTiming(time.time_ns(), 0.01, 0.1, 0.2, 1.0, prompt_tokens=100, completion_tokens=11)
    with app.get_tracer("openai-app").start_as_current_span(
            "chat llama", kind=SpanKind.CLIENT, start_time=timing.arrival_unix_ns - 10**6,
            attributes={"gen_ai.operation.name": "chat", "gen_ai.request.model": "llama", "gen_ai.system": "openai",
                        "gen_ai.usage.input_tokens": 100, "gen_ai.usage.output_tokens": 11,
                        TEAM_ALIAS: "acme"}, end_on_exit=False) as call:
        headers: dict[str, str] = {}
        inject(headers)
        emit_vllm_v1(engine, timing, request_id="joined", traceparent_headers=headers)
        call.end(end_time=timing.end_unix_ns + 10**6)
    engine.force_flush()
    app.force_flush()
    scrape = server.wait_until(lambda s: s.value("otel_llm_requests_assembled_total") >= 2, what="both sides")
    assert scrape.value("otel_llm_requests_assembled_total", engine_kind="client") == 1  # the call was joined
    assert scrape.value("otel_llm_tenant_tokens_total", model_name="llama", tenant="acme", token_type="input") == 100
    assert scrape.value("otel_llm_tenant_tokens_total") == 111  # once, not once per side
    assert scrape.value("otel_llm_request_cost_total", tenant="acme") == pytest.approx(111 / 1e6, rel=1e-12)


def test_accounting_series_are_capped_like_every_family(make_server):
    """series_limit holds for the SLO counter too: past it, requests are counted in the overflow
    series (never lost), and the overflow is reported per metric."""
    server = make_server({"processors": {"llm_metrics": {"series_limit": 2, "slo": {"default": {"e2e": "2.5s"}}}}})
    start = time.time_ns() - 10**9
    for i in range(4):
        _vllm(server, f"model-{i}", [(0.1, 1.0)], start)
    scrape = server.wait_until(lambda s: s.value("otel_llm_slo_requests_total") == 4, what="4 SLO requests")
    assert len([ls for ls in scrape.label_sets("otel_llm_slo_requests_total") if "model_name" in ls]) == 2
    assert scrape.value("otel_llm_slo_requests_total", otel_metric_overflow="true") == 2
    assert scrape.value("otel_llm_series_overflow_total", metric="otel_llm_slo_requests") == 2
