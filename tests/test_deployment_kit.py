"""The deployment kit (collector-config/, docker-compose.yml, Dockerfile) checked with the real tools.

- promtool (Debian's prometheus package) checks the Prometheus config and rules and runs the rule
  unit tests; docker-compose parses the compose file; otel-llm validates its own config.
- The dashboard JSON is what collector-config/grafana/generate.py (Grafana Foundation SDK) writes.
- The files agree with each other: every mounted file exists, the Collector resolves the name the
  replicas answer to on the port they listen on, Prometheus scrapes the port they serve, Grafana's
  exemplar link points at the Tempo data source, every `vllm:` selector names its `source`.
- A real Prometheus, loaded with the rules and the scrape jobs of collector-config/prometheus.yml,
  scrapes two otel-llm replicas fed a trace-id-sharded load (plus a stand-in for vLLM's own /metrics
  and DCGM): every dashboard query returns data, every rule evaluates, the histograms summed over
  the two replicas equal those of a third replica fed the whole load, and the stored exemplars
  name (in the label Grafana links to Tempo) traces that the exposing replica received.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import re
import shutil
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml
from opentelemetry import trace
from opentelemetry.propagate import inject
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.trace import SpanKind

from otel_llm.config import load_config, split_endpoint
from otel_llm_simulate.clients import ClientCall, emit_app_client
from otel_llm_simulate.emitters import (
    RequestTiming,
    SamplingParams,
    emit_gateway,
    emit_sglang,
    emit_vllm_v1,
    engine_tracer_provider,
)
from tests.support.exposition import StaticExposition
from tests.support.prometheus import PrometheusServer

ROOT = Path(__file__).resolve().parents[1]
KIT = ROOT / "collector-config"
COMPOSE = ROOT / "docker-compose.yml"
PROMETHEUS_YML = KIT / "prometheus.yml"
RULES = KIT / "alerts" / "llm_serving.yml"
RULE_TESTS = KIT / "alerts" / "llm_serving_test.yml"
OTEL_LLM_YAML = KIT / "otel-llm.yaml"
COLLECTOR_YAML = KIT / "otelcol-loadbalancer.yaml"
TEMPO_YAML = KIT / "tempo.yaml"
DATASOURCES = KIT / "grafana" / "provisioning" / "datasources" / "datasources.yaml"
DASHBOARD_PROVIDERS = KIT / "grafana" / "provisioning" / "dashboards" / "dashboards.yaml"
DASHBOARD = KIT / "grafana" / "dashboards" / "llm-serving.json"

ROW_ORDER = ("latency", "client", "throughput", "saturation", "resource", "cost", "lora", "alerts", "accounting")
# Panels that read Prometheus' ALERTS or Alertmanager's own metrics: the sharded-replica test below has
# no firing alert and no Alertmanager, so there they must evaluate but may be empty; tests/test_alerting.py
# runs them on a Prometheus wired to a real Alertmanager, where each returns data.
ALERTING_METRICS = re.compile(r"\b(ALERTS|alertmanager_\w+)\b")
GENERATOR = KIT / "grafana" / "generate.py"
DASHBOARD_VARIABLES = {"$__rate_interval": "5m", "$__interval": "15s", "$__range": "1h",
                       "$model": ".*", "$engine": ".*", "$gpu": ".*", "$gpu_hourly_cost": "2.5"}


def _load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"`{name}` is not installed; `make services` installs Debian's prometheus and docker-compose")
    return path


def _run(cmd: Sequence[str], cwd: Path = ROOT, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(cmd), cwd=cwd, capture_output=True, text=True, timeout=timeout)


def _rules() -> list[dict[str, Any]]:
    return [rule for group in _load_yaml(RULES)["groups"] for rule in group["rules"]]


def _alerts() -> list[dict[str, Any]]:
    return [rule for rule in _rules() if "alert" in rule]


def _dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text(encoding="utf-8"))


def _dashboard_targets() -> list[tuple[str, dict[str, Any]]]:
    return [(panel["title"], target) for panel in _dashboard()["panels"] for target in panel.get("targets", [])]


def substitute_variables(query: str) -> str:
    """Grafana's `$var` / `${var}` / `${var:format}` replaced the way a user's "All" selection would."""

    def replace(match: re.Match[str]) -> str:
        name = "$" + (match.group(1) or match.group(2))
        if name not in DASHBOARD_VARIABLES:
            raise AssertionError(f"dashboard variable {name} has no test substitute (query: {query})")
        return DASHBOARD_VARIABLES[name]

    return re.sub(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)", replace, query)


# ------------------------------------------------------------------------------------------------
# promtool


def test_promtool_check_config_accepts_prometheus_yml_and_its_rules():
    result = _run([_tool("promtool"), "check", "config", str(PROMETHEUS_YML)])
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 rule files found" in result.stdout + result.stderr


def test_promtool_check_rules_passes_with_lint():
    result = _run([_tool("promtool"), "check", "rules", str(RULES)])
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_rule_unit_tests_pass():
    result = _run([_tool("promtool"), "test", "rules", RULE_TESTS.name], cwd=RULE_TESTS.parent, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout + result.stderr


def test_unit_tests_make_every_alert_fire_and_stay_silent():
    tests = _load_yaml(RULE_TESTS)["tests"]
    fired: dict[str, set[str]] = defaultdict(set)  # alert -> priorities seen firing ("" without one)
    silent: set[str] = set()
    for case in tests:
        for check in case.get("alert_rule_test", []):
            name = check["alertname"]
            if check.get("exp_alerts"):
                for alert in check["exp_alerts"]:
                    fired[name].add(str(alert["exp_labels"].get("priority", "")))
            else:
                silent.add(name)
    names = {alert["alert"] for alert in _alerts()}
    assert names - set(fired) == set(), "alerts never made to fire"
    assert names - silent == set(), "alerts never checked to stay silent"
    for name in {a["alert"] for a in _alerts() if a["labels"].get("slo", "").startswith("ttft-")}:
        assert fired[name] >= {"interactive", "batch"}, f"{name} must be shown firing for both priorities"


def test_every_alert_has_for_severity_and_runbook():
    alerts = _alerts()
    assert len({a["alert"] for a in alerts}) >= 17
    for alert in alerts:
        assert alert.get("for"), f"{alert['alert']}: no `for:`"
        assert alert["labels"]["severity"] in ("page", "ticket"), alert["alert"]
        assert len(alert["annotations"].get("runbook", "")) > 40, f"{alert['alert']}: no runbook"
        assert alert["annotations"].get("summary"), alert["alert"]
    assert {a["labels"]["severity"] for a in alerts} == {"page", "ticket"}


def test_ttft_burn_rate_alerts_follow_the_sre_workbook_per_priority():
    # (long window, short window) -> (burn factor, severity), Google SRE workbook ch. 5.
    tiers = {("1h", "5m"): (14.4, "page"), ("6h", "30m"): (6, "page"),
             ("1d", "2h"): (3, "ticket"), ("3d", "6h"): (1, "ticket")}
    budgets = {"interactive": 0.01, "batch": 0.05}
    seen = set()
    for alert in _alerts():
        slo = alert["labels"].get("slo", "")
        if not slo.startswith("ttft-"):
            continue
        priority = slo.removeprefix("ttft-")
        long_w, short_w = alert["labels"]["long_window"], alert["labels"]["short_window"]
        factor, severity = tiers[(long_w, short_w)]
        assert alert["labels"]["severity"] == severity, alert
        expr = " ".join(alert["expr"].split())
        for window in (long_w, short_w):
            term = f'llm:ttft_slo_errors:ratio_rate{window}{{priority="{priority}"}}'
            assert f"{term} > ({factor:g} * {budgets[priority]:g})" in expr, (alert["alert"], priority, expr)
        seen.add((long_w, short_w, priority))
    assert seen == {(lw, sw, p) for (lw, sw) in tiers for p in budgets}
    # The SLI uses each priority's own threshold, an exact vLLM TTFT bucket bound.
    sli = {r["labels"]["priority"]: r["expr"] for r in _rules()
           if r.get("record") == "llm:ttft_slo_errors:ratio_rate1h"}
    assert 'le="1.0"' in sli["interactive"] and 'le="10.0"' in sli["batch"]


def _vllm_selectors(expr: str) -> list[tuple[str, str | None]]:
    return [(m.group(1), m.group(2)) for m in re.finditer(r"(vllm:[A-Za-z0-9_:]+)(\{[^}]*\})?", expr)]


def test_every_vllm_selector_names_its_source():
    """Span-derived and engine-native series share the vllm: names; an unfiltered one double counts."""
    exprs = [(rule.get("record") or rule.get("alert"), rule["expr"]) for rule in _rules()]
    exprs += [(title, target["expr"]) for title, target in _dashboard_targets()]
    checked = 0
    for where, expr in exprs:
        for name, matchers in _vllm_selectors(expr):
            assert matchers and re.search(r'\bsource="(spans|engine)"', matchers), (
                f"{where}: {name} without a source matcher in {expr}")
            checked += 1
    assert checked > 60


# ------------------------------------------------------------------------------------------------
# otel-llm config, compose, Grafana provisioning


def test_otel_llm_config_validates_with_the_cli():
    result = _run([sys.executable, "-m", "otel_llm", "validate", str(OTEL_LLM_YAML)])
    assert result.returncode == 0, result.stdout + result.stderr
    config = load_config(OTEL_LLM_YAML)
    # The SLO rules split on this dimension; the values must be the ones the rules filter on.
    dims = {d.name: d for d in config.processors.llm_metrics.dimensions}
    assert dims["priority"].attribute == "llm.priority"
    assert set(dims["priority"].values) == {"interactive", "batch"}


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    """`docker-compose config`: the compose file as docker-compose itself resolves it."""
    result = _run([_tool("docker-compose"), "-f", str(COMPOSE), "config"])
    assert result.returncode == 0, result.stderr
    return yaml.safe_load(result.stdout)


def test_docker_compose_config_parses():
    result = _run([_tool("docker-compose"), "-f", str(COMPOSE), "config", "-q"])
    assert result.returncode == 0, result.stderr


def _binds(service: dict[str, Any]) -> dict[str, Path]:
    """container path -> host path for the bind mounts of a resolved compose service."""
    out = {}
    for volume in service.get("volumes", []):
        if isinstance(volume, dict):
            if volume.get("type") == "bind":
                out[volume["target"]] = Path(volume["source"])
            continue
        source, target, *_ = volume.split(":")
        if source.startswith("/"):
            out[target] = Path(source)
    return out


def _mounted(service: dict[str, Any], container_path: str) -> Path:
    """The host file that a container path reads, through a file or a directory bind mount."""
    for target, source in sorted(_binds(service).items(), key=lambda kv: -len(kv[0])):
        if container_path == target:
            return source
        if container_path.startswith(target.rstrip("/") + "/"):
            return source / container_path[len(target.rstrip("/")) + 1:]
    raise AssertionError(f"{container_path} is not mounted into the service (binds: {_binds(service)})")


def _flag(command: Sequence[str], *names: str) -> str:
    for i, arg in enumerate(command):
        for name in names:
            if arg == name:
                return command[i + 1]
            if arg.startswith(name + "="):
                return arg.split("=", 1)[1]
    raise AssertionError(f"none of {names} in {command}")


def test_every_file_the_compose_mounts_exists(compose):
    services = compose["services"]
    binds = [(name, target, source) for name, svc in services.items() for target, source in _binds(svc).items()]
    mounted = {source for _, _, source in binds}
    assert {OTEL_LLM_YAML, COLLECTOR_YAML, PROMETHEUS_YML, RULES.parent, TEMPO_YAML, DATASOURCES.parent,
            DASHBOARD_PROVIDERS.parent, DASHBOARD.parent} <= mounted, mounted
    for name, target, source in binds:
        assert source.exists(), f"{name}: {source} (mounted at {target}) does not exist"
        assert ROOT in source.parents, f"{name}: {source} is outside the repository"
    for name, svc in services.items():
        if "build" in svc:
            assert (Path(svc["build"]["context"]) / "Dockerfile").is_file(), name


def test_compose_topology_agrees_with_the_configs(compose):
    services = compose["services"]
    otel_llm = load_config(OTEL_LLM_YAML)
    grpc_port = split_endpoint(otel_llm.receivers.otlp.protocols.grpc.endpoint)[1]
    metrics_port = split_endpoint(otel_llm.exporters.prometheus.endpoint)[1]

    # Two or more otel-llm replicas, each running the mounted otel-llm.yaml, all answering to one DNS alias.
    replicas = {n: s for n, s in services.items() if s.get("command", [])[:1] == ["serve"]}
    assert len(replicas) >= 2, replicas.keys()
    aliases = set.intersection(*(set(s["networks"]["default"]["aliases"]) for s in replicas.values()))
    for svc in replicas.values():
        assert _mounted(svc, _flag(svc["command"], "--config")) == OTEL_LLM_YAML

    # Collector: receives OTLP, routes by trace id over DNS to that alias and the replicas' gRPC port.
    otelcol = services["otelcol"]
    # Our own Collector build (collector-config/otelcol-llm-front/, the one the tests run), built by compose.
    assert otelcol["image"].startswith("otel-llm-front:")
    assert (Path(otelcol["build"]["context"]) / "Dockerfile").is_file()
    assert Path(otelcol["build"]["context"]).resolve() == (OTEL_LLM_YAML.parent / "otelcol-llm-front").resolve()
    assert _mounted(otelcol, _flag(otelcol["command"], "--config")) == COLLECTOR_YAML
    collector = _load_yaml(COLLECTOR_YAML)
    lb = collector["exporters"]["load_balancing"]
    assert lb["routing_key"] == "traceID"
    assert lb["resolver"]["dns"]["hostname"] in aliases
    assert int(lb["resolver"]["dns"]["port"]) == grpc_port
    assert collector["service"]["pipelines"]["traces"]["exporters"] == ["load_balancing"]
    assert collector["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"] == "0.0.0.0:4317"

    # The simulated fleet sends to the Collector.
    simulator = services["simulator"]["command"]
    assert simulator[0] == "simulate"
    host, port = _flag(simulator, "--endpoint").rsplit(":", 1)
    assert host in services and int(port) == 4317

    # Prometheus: stores exemplars, loads the mounted config and rules, scrapes the alias on the metrics port.
    prometheus = services["prometheus"]
    assert "--enable-feature=exemplar-storage" in prometheus["command"]
    config_path = _flag(prometheus["command"], "--config.file")
    assert _mounted(prometheus, config_path) == PROMETHEUS_YML
    prom_config = _load_yaml(PROMETHEUS_YML)
    for rule_file in prom_config["rule_files"]:
        assert _mounted(prometheus, str(Path(config_path).parent / rule_file)).resolve() == RULES
    jobs = {job["job_name"]: job for job in prom_config["scrape_configs"]}
    spans_sd = jobs["otel-llm-spans"]["dns_sd_configs"][0]
    assert spans_sd["names"][0] in aliases and spans_sd["port"] == metrics_port

    # Tempo receives the replicas' kept traces.
    tempo = services["tempo"]
    assert _mounted(tempo, _flag(tempo["command"], "-config.file")) == TEMPO_YAML
    tempo_config = _load_yaml(TEMPO_YAML)
    tempo_grpc = tempo_config["distributor"]["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"]
    exporter = otel_llm.exporters.otlp
    assert exporter is not None, "otel-llm.yaml exports no traces to Tempo"
    tempo_host, tempo_port = split_endpoint(exporter.endpoint)
    assert tempo_host == "tempo" and tempo_port == split_endpoint(tempo_grpc)[1]
    tempo_volumes = [v.split(":")[1] for v in tempo.get("volumes", []) if isinstance(v, str) and not v.startswith("/")]
    for path in (tempo_config["storage"]["trace"]["wal"]["path"], tempo_config["storage"]["trace"]["local"]["path"]):
        assert any(path.startswith(v + "/") for v in tempo_volumes), f"{path} is not on a volume"

    # Grafana: provisioning and dashboards mounted where the provider looks.
    grafana = services["grafana"]
    provider_path = _load_yaml(DASHBOARD_PROVIDERS)["providers"][0]["options"]["path"]
    assert _mounted(grafana, provider_path + "/" + DASHBOARD.name) == DASHBOARD
    assert _mounted(grafana, "/etc/grafana/provisioning/datasources/" + DATASOURCES.name) == DATASOURCES
    assert _mounted(grafana, "/etc/grafana/provisioning/dashboards/" + DASHBOARD_PROVIDERS.name) == DASHBOARD_PROVIDERS


def test_grafana_datasources_link_exemplars_to_tempo():
    sources = {s["uid"]: s for s in _load_yaml(DATASOURCES)["datasources"]}
    prometheus = next(s for s in sources.values() if s["type"] == "prometheus")
    assert prometheus["url"] == "http://prometheus:9090"
    (link,) = prometheus["jsonData"]["exemplarTraceIdDestinations"]
    assert link["name"] == "trace_id"  # the exemplar label otel-llm writes
    assert sources[link["datasourceUid"]]["type"] == "tempo"
    tempo_port = _load_yaml(TEMPO_YAML)["server"]["http_listen_port"]
    assert sources[link["datasourceUid"]]["url"] == f"http://tempo:{tempo_port}"


def test_dashboard_structure():
    dashboard = _dashboard()
    sources = {s["uid"] for s in _load_yaml(DATASOURCES)["datasources"]}
    rows = [p["title"].split()[0].lower() for p in dashboard["panels"] if p["type"] == "row"]
    assert tuple(rows) == ROW_ORDER
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert {"model", "engine", "gpu", "gpu_hourly_cost"} <= set(variables)
    assert variables["gpu_hourly_cost"]["type"] == "constant"
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))

    row = None
    latency_with_exemplars = 0
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            row = panel["title"].split()[0].lower()
            continue
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] in sources, panel["title"]
        exprs = " ".join(t["expr"] for t in panel["targets"])
        reads_span_histogram = re.search(r'histogram_quantile\(.*_bucket\{source="spans"', exprs)
        if row == "latency" and reads_span_histogram:
            assert any(t.get("exemplar") for t in panel["targets"]), f"{panel['title']}: exemplars off"
            latency_with_exemplars += 1
    assert latency_with_exemplars >= 10
    # Both namings side by side for TTFT, TPOT and e2e.
    titles = " | ".join(p["title"] for p in dashboard["panels"])
    for needle in ("vllm:time_to_first_token_seconds", "gen_ai_server_time_to_first_token_seconds",
                   "vllm:request_time_per_output_token_seconds", "gen_ai_server_time_per_output_token_seconds",
                   "vllm:e2e_request_latency_seconds", "gen_ai_server_request_duration_seconds"):
        assert any(needle + "_bucket" in t["expr"] for _, t in _dashboard_targets()), needle
    assert "Goodput" in titles and "$ per 1k" in titles
    # The seed checklist's rows: LoRA adapter mix and alert volume.
    exprs = " ".join(t["expr"] for _, t in _dashboard_targets())
    assert 'vllm:lora_requests_info{source="engine"' in exprs
    for needle in ('ALERTS{alertstate="firing"}', "alertmanager_notifications_total", "[30d]"):
        assert needle in exprs, needle
    assert any(p["title"].startswith("Fired without action") for p in dashboard["panels"])


def test_dashboard_json_is_what_the_foundation_sdk_generator_writes():
    """collector-config/grafana/generate.py (Grafana Foundation SDK) is the dashboard's source; the
    committed JSON is its output, byte for byte."""
    pytest.importorskip("grafana_foundation_sdk", reason="pip install -e '.[test]' installs grafana-foundation-sdk")
    result = _run([sys.executable, str(GENERATOR), "--out", "-"], timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout == DASHBOARD.read_text(encoding="utf-8"), (
        "llm-serving.json differs from what generate.py writes: edit generate.py and run it")


# ------------------------------------------------------------------------------------------------
# A real Prometheus over two trace-id-sharded replicas


MODEL = "meta-llama/Llama-3.1-8B-Instruct"
DIRECT = "llama-3.1-70b-instruct"  # no gateway: named by otel-llm.yaml's service.name mapping
DEEPSEEK = "deepseek-ai/DeepSeek-R1-Distill-Qwen-7B"
REQUESTS_PER_ROUND = 44  # see send_round
ADAPTER = "sql-lora"  # collector-config/otel-llm.yaml's lora_adapters: on MODEL
CLIENT_CALLS_PER_ROUND = 6  # the application in front of the 6 SGLang requests that were not aborted


def shard_of(trace_id: int, shards: int = 2) -> int:
    """A stable hash of the trace id, as the Collector's load_balancing exporter routes (traceID)."""
    digest = hashlib.blake2b(trace_id.to_bytes(16, "big"), digest_size=8).digest()
    return int.from_bytes(digest, "big") % shards


class TraceShardingExporter(SpanExporter):
    """Sends each span to the replica its trace id hashes to, and every span to the reference replica."""

    def __init__(self, shards: Sequence[SpanExporter], reference: SpanExporter) -> None:
        self.shards = list(shards)
        self.reference = reference
        self.traces_per_shard: list[set[int]] = [set() for _ in shards]

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        by_shard: dict[int, list[ReadableSpan]] = defaultdict(list)
        for span in spans:
            index = shard_of(span.context.trace_id, len(self.shards))
            by_shard[index].append(span)
            self.traces_per_shard[index].add(span.context.trace_id)
        results = [self.shards[i].export(group) for i, group in by_shard.items()]
        results.append(self.reference.export(spans))
        ok = all(r is SpanExportResult.SUCCESS for r in results)
        return SpanExportResult.SUCCESS if ok else SpanExportResult.FAILURE

    def shutdown(self) -> None:  # the replicas' own exporters are shut down by their servers
        pass


def _timing(now_ns: int, i: int, ttft: float, tpot: float, completion: int = 40) -> RequestTiming:
    queue, prefill = ttft * 0.5, ttft * 0.4
    return RequestTiming(arrival_unix_ns=now_ns - (30 - i % 10) * 10**9, preprocess_s=ttft - queue - prefill,
                         queue_s=queue, prefill_s=prefill, decode_s=tpot * (completion - 1),
                         postprocess_s=0.002, prompt_tokens=200 + 37 * i, completion_tokens=completion)


def _accounting_attributes(timing: RequestTiming, i: int) -> dict[str, int]:
    """What a gateway in front of vLLM 0.32 can copy onto its span from the response (LiteLLM's semconv
    keys for usage.prompt_tokens_details; the speculative_decoding keys otel-llm reads, see the
    llm_metrics README): a quarter of the prompt cached, 5 % written, 3 steps of 4 draft tokens."""
    return {"gen_ai.usage.cache_read.input_tokens": timing.prompt_tokens // 4,
            "gen_ai.usage.cache_creation.input_tokens": timing.prompt_tokens // 20,
            "vllm.metrics.speculative_decoding.num_accepted_draft_tokens": 6 + i % 4,
            "vllm.metrics.speculative_decoding.num_draft_tokens": 12,
            "vllm.metrics.speculative_decoding.num_spec_steps": 3}


def send_round(exporter: SpanExporter, round_no: int) -> None:
    """One round of a mixed fleet: 44 requests (24 llama behind a gateway with priority, 2 on llama's LoRA
    adapter, 8 vLLM without a gateway, 8 SGLang of which 2 aborted, 2 gateway errors that never reached
    an engine), and the 6 SGLang requests that completed called by an instrumented application (client
    side)."""
    now = time.time_ns()
    seed = 1000 * round_no
    gateway = engine_tracer_provider("gateway", exporter, seed=seed + 1)
    # llama's vLLM started as docs/engines/vllm.md says: its service name is the model it serves.
    llama = engine_tracer_provider("vllm-v1", exporter, service_name=MODEL, seed=seed + 2)
    direct = engine_tracer_provider("vllm-v1", exporter, service_name="vllm-llama-70b", seed=seed + 3)
    sglang = engine_tracer_provider("sglang", exporter, seed=seed + 4)
    app = engine_tracer_provider("app", exporter, seed=seed + 5)
    tracer = gateway.get_tracer("llm-gateway")
    for i in range(24):
        priority = "interactive" if i % 3 else "batch"
        timing = _timing(now, i, ttft=0.05 + 0.04 * i if priority == "interactive" else 1.5 + 0.2 * i, tpot=0.02)
        attributes: dict[str, Any] = {"gen_ai.operation.name": "chat", "gen_ai.request.model": MODEL,
                                      "llm.priority": priority, "http.route": "/v1/chat/completions",
                                      # as LiteLLM's proxy stamps a team key's alias (otel-llm.yaml's tenant)
                                      "metadata.user_api_key_team_alias": "search" if i % 2 else "support"}
        if i % 4 == 0:  # the gateway copied vLLM's usage details and per-request metrics onto its span
            attributes.update(_accounting_attributes(timing, i))
        span = tracer.start_span("POST /v1/chat/completions", kind=SpanKind.SERVER,
                                 start_time=timing.arrival_unix_ns - 3_000_000, attributes=attributes)
        headers: dict[str, str] = {}
        inject(headers, context=trace.set_span_in_context(span))
        emit_vllm_v1(llama, timing, request_id=f"llama-{round_no}-{i}", traceparent_headers=headers,
                     params=SamplingParams(max_tokens=512))
        span.end(end_time=timing.end_unix_ns + 9_000_000)
    for i in range(2):  # a LoRA adapter on llama's engine, slow (no goodput), the gateway's request model
        timing = _timing(now, i, ttft=1.6 + 0.1 * i, tpot=0.02)
        span = tracer.start_span("POST /v1/chat/completions", kind=SpanKind.SERVER,
                                 start_time=timing.arrival_unix_ns - 3_000_000,
                                 attributes={"gen_ai.operation.name": "chat", "gen_ai.request.model": ADAPTER,
                                             "http.route": "/v1/chat/completions", **_accounting_attributes(timing, i)})
        headers = {}
        inject(headers, context=trace.set_span_in_context(span))
        emit_vllm_v1(llama, timing, request_id=f"lora-{round_no}-{i}", traceparent_headers=headers)
        span.end(end_time=timing.end_unix_ns + 9_000_000)
    for i in range(8):
        emit_vllm_v1(direct, _timing(now, i, ttft=0.08 + 0.05 * i, tpot=0.015), request_id=f"direct-{round_no}-{i}")
    for i in range(8):
        timing = _timing(now, i, ttft=0.2 + 0.1 * i, tpot=0.03)

        def engine_call(headers: dict[str, str] | None, timing: RequestTiming = timing, i: int = i) -> None:
            emit_sglang(sglang, timing, rid=f"{round_no:04x}{i:04x}cafe", model=DEEPSEEK,
                        finish_reason="length" if i % 2 else "stop", aborted=i in (3, 6), traceparent_headers=headers)

        if i in (3, 6):
            engine_call(None)
            continue
        # openai-v2 + httpx in the application: its CLIENT span, the traceparent reaching SGLang.
        ms = 1_000_000
        emit_app_client(app, ClientCall(
            start_ns=timing.arrival_unix_ns - 3 * ms, end_ns=timing.end_unix_ns + 4 * ms,
            http_start_ns=timing.arrival_unix_ns - 2 * ms, http_end_ns=timing.end_unix_ns + 2 * ms,
            request_model=DEEPSEEK, stream=False, params=SamplingParams(max_tokens=512), response_model=DEEPSEEK,
            input_tokens=timing.prompt_tokens, output_tokens=timing.completion_tokens,
            finish_reason="length" if i % 2 else "stop"), upstream_call=engine_call)
    for i in range(2):
        start = now - 5 * 10**9
        emit_gateway(gateway, start_unix_ns=start, end_unix_ns=start + 50_000_000, model=MODEL, status_error=True)
    for provider in (gateway, llama, direct, sglang, app):
        provider.shutdown()


def vllm_engine_metrics(t: float) -> str:
    """vLLM's native names and labels (model_name, engine), including names the spans also produce."""
    labels = f'model_name="{MODEL}",engine="0"'
    n = 1000 + int(20 * t)  # many more requests than the test sends: double counting would show
    lines = [
        f"vllm:num_requests_waiting{{{labels}}} 3", f"vllm:num_requests_running{{{labels}}} 12",
        f"vllm:kv_cache_usage_perc{{{labels}}} 0.42",
        f"vllm:num_preemptions_total{{{labels}}} {int(t)}",
        f"vllm:prefix_cache_queries_total{{{labels}}} {1000 * n}",
        f"vllm:prefix_cache_hits_total{{{labels}}} {400 * n}",
        f"vllm:spec_decode_num_draft_tokens_total{{{labels}}} {50 * n}",
        f"vllm:spec_decode_num_accepted_tokens_total{{{labels}}} {35 * n}",
        f'vllm:request_success_total{{{labels},finished_reason="stop"}} {n}',
        f"vllm:generation_tokens_total{{{labels}}} {300 * n}", f"vllm:prompt_tokens_total{{{labels}}} {900 * n}",
        # LoRA (vLLM's labels, no model_name): an older adapter combination still exposed, and the current one.
        f'vllm:lora_requests_info{{max_lora="4",running_lora_adapters="sql-lora",waiting_lora_adapters=""}} '
        f"{time.time() - 600:.3f}",
        f'vllm:lora_requests_info{{max_lora="4",running_lora_adapters="sql-lora,chat-lora",'
        f'waiting_lora_adapters="summarize-lora"}} {time.time():.3f}',
    ]
    for name, bounds in (("vllm:inter_token_latency_seconds", ("0.025", "0.05")),
                         ("vllm:time_to_first_token_seconds", ("0.5", "1.0")),
                         ("vllm:e2e_request_latency_seconds", ("5.0", "10.0"))):
        lines.append(f'{name}_bucket{{{labels},le="{bounds[0]}"}} {n // 2}')
        for le in (*bounds[1:], "+Inf"):
            lines.append(f'{name}_bucket{{{labels},le="{le}"}} {n}')
        lines += [f"{name}_count{{{labels}}} {n}", f"{name}_sum{{{labels}}} {0.5 * n}"]
    return "\n".join(lines) + "\n"


def dcgm_metrics(t: float) -> str:
    lines = []
    for gpu, sm in enumerate((0.8, 0.8, 0.8, 0.5)):
        labels = (f'gpu="{gpu}",UUID="GPU-0000000{gpu}",device="nvidia{gpu}",'
                  f'modelName="NVIDIA H100 80GB HBM3",Hostname="node-1"')
        lines += [f"DCGM_FI_DEV_GPU_UTIL{{{labels}}} 97", f"DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{{{labels}}} 0.41",
                  f"DCGM_FI_PROF_SM_ACTIVE{{{labels}}} {sm}", f"DCGM_FI_DEV_FB_USED{{{labels}}} 72000",
                  f"DCGM_FI_DEV_FB_FREE{{{labels}}} 9559"]
    return "\n".join(lines) + "\n"


def scrape_jobs(targets: dict[str, list[str]]) -> list[dict[str, Any]]:
    """collector-config/prometheus.yml's jobs (relabeling included) with service discovery replaced."""
    jobs = []
    for job in _load_yaml(PROMETHEUS_YML)["scrape_configs"]:
        if job["job_name"] not in targets:
            continue
        job = copy.deepcopy(job)
        for key in ("dns_sd_configs", "static_configs", "scrape_interval", "scrape_timeout"):
            job.pop(key, None)
        job["static_configs"] = [{"targets": targets[job["job_name"]]}]
        jobs.append(job)
    assert {j["job_name"] for j in jobs} == set(targets)
    return jobs


def _values(result: list[dict[str, Any]]) -> list[float]:
    return [float(r["value"][1]) for r in result]


def _has_finite(result: list[dict[str, Any]]) -> bool:
    return any(math.isfinite(v) for v in _values(result))


def _by_labels(result: list[dict[str, Any]]) -> dict[tuple[tuple[str, str], ...], float]:
    return {tuple(sorted(r["metric"].items())): float(r["value"][1]) for r in result}


def _metric_names(expr: str) -> set[str]:
    return set(re.findall(r"[A-Za-z_:][A-Za-z0-9_:]*", expr))


def test_dashboard_and_rules_on_a_real_prometheus_over_sharded_replicas(make_server, tmp_path):
    processors = copy.deepcopy(_load_yaml(OTEL_LLM_YAML)["processors"])
    processors["tail_sampling"].update({"decision_wait": "3s", "grace": "100ms"})
    replicas = [make_server({"processors": processors}) for _ in range(2)]
    reference = make_server({"processors": processors})
    engine, dcgm = StaticExposition(vllm_engine_metrics), StaticExposition(dcgm_metrics)
    address = lambda server: server.metrics_url.removeprefix("http://")  # noqa: E731
    prom = PrometheusServer(
        tmp_path / "prom", [address(reference)],  # helper's own job "otel-llm": no `source` label at all
        rule_files=[RULES], exemplars=True,
        extra_scrape_configs=scrape_jobs({"otel-llm-spans": [address(r) for r in replicas],
                                          "vllm-engine": [engine.address], "dcgm": [dcgm.address]}))
    prom.start()
    try:
        sharding = TraceShardingExporter([r.exporter("grpc") for r in replicas], reference.exporter("grpc"))
        assembled = "sum(otel_llm_requests_assembled_total{job=%r})"
        for round_no in (1, 2):
            # Round 2 starts once Prometheus has seen round 1, so every counter has a rate.
            send_round(sharding, round_no)
            expected = (REQUESTS_PER_ROUND + CLIENT_CALLS_PER_ROUND) * round_no
            for job in ("otel-llm-spans", "otel-llm"):
                prom.wait_for(assembled % job, lambda r: bool(r) and _values(r)[0] == expected, timeout_s=30)
        assert all(sharding.traces_per_shard), "the trace-id hash sent every trace to one replica"

        # -- sharding: both replicas took traffic, and their sum is exactly the unsharded replica.
        per_replica = prom.query('sum by (instance) (otel_llm_requests_assembled_total{job="otel-llm-spans"})')
        assert len(per_replica) == 2 and all(v > 0 for v in _values(per_replica)), per_replica
        for metric, by in (("vllm:time_to_first_token_seconds_bucket", "le, model_name, priority"),
                           ("vllm:e2e_request_latency_seconds_bucket", "le, model_name, engine_kind, priority"),
                           ("vllm:request_success_total", "finished_reason, model_name, engine_kind"),
                           ("gen_ai_server_request_duration_seconds_bucket", "le, gen_ai_request_model, error_type"),
                           ("otel_llm_gateway_overhead_seconds_bucket", "le, model_name, priority")):
            sharded = _by_labels(prom.query(f'sum by ({by}) ({metric}{{job="otel-llm-spans"}})'))
            single = _by_labels(prom.query(f'sum by ({by}) ({metric}{{job="otel-llm"}})'))
            assert sharded and sharded == single, f"{metric}: sum over replicas != one replica"
        ttft = _by_labels(prom.query('sum by (model_name, priority) '
                                     '(vllm:time_to_first_token_seconds_count{source="spans"})'))
        # Gateway joins survived sharding: llama's model name and priority come from the gateway span.
        assert ttft.get((("model_name", MODEL), ("priority", "interactive"))) == 32, ttft
        assert ttft.get((("model_name", MODEL), ("priority", "batch"))) == 16, ttft

        # -- source label: span-derived and engine-native vllm: series never mix.
        spans_count = prom.query(f'sum(vllm:e2e_request_latency_seconds_count{{source="spans", model_name="{MODEL}"}})')
        # 24 llama, 2 on its LoRA adapter (labelled with the model llama's vLLM serves, as its own /metrics
        # labels them) and 2 gateway errors per round
        assert _values(spans_count) == [48 + 4 + 4]
        everything = prom.query(f'sum(vllm:e2e_request_latency_seconds_count{{model_name="{MODEL}"}})')
        assert _values(everything)[0] > 1000, "the engine's own series should be there too"

        # -- every recording and alerting rule evaluates without error.
        def rules_healthy() -> list[dict[str, Any]]:
            deadline = time.monotonic() + 20
            while True:
                rules = [r for g in prom.rules() for r in g["rules"]]
                if all(r["health"] != "unknown" for r in rules) or time.monotonic() > deadline:
                    return rules
                time.sleep(0.2)

        rules = rules_healthy()
        assert len(rules) == len(_rules())
        broken = [(r["name"], r["health"], r.get("lastError")) for r in rules if r["health"] != "ok"]
        assert broken == []

        # -- goodput: the direct vLLM (TTFT <= 0.43 s, TPOT 15 ms) and SGLang are within both SLOs;
        # llama's batch traffic (TTFT 1.5 s and up) pushes its TTFT p95 over 1 s: none of its tokens count.
        goodput = prom.wait_for("llm:goodput_tokens:rate5m", bool, timeout_s=20)
        assert {r["metric"]["model_name"] for r in goodput} == {DIRECT, DEEPSEEK}, goodput

        # -- every dashboard query (and every variable) returns data; span-derived ones a real number.
        span_names = {r["metric"]["__name__"] for r in prom.query('group by (__name__) ({job="otel-llm-spans"})')}
        span_rules: set[str] = set()
        for rule in _rules():  # recording rules built (transitively) on span-derived series; file order suffices
            if "record" in rule and _metric_names(rule["expr"]) & (span_names | span_rules):
                span_rules.add(rule["record"])
        span_derived = 0
        for title, target in _dashboard_targets():
            query = substitute_variables(target["expr"])
            names = _metric_names(query)
            reads_spans = bool(names & (span_names | span_rules))
            span_derived += reads_spans
            if ALERTING_METRICS.search(query):
                prom.query(query)  # valid PromQL that evaluates; data is checked in tests/test_alerting.py
                continue
            result = prom.wait_for(query, _has_finite if reads_spans else bool, timeout_s=20)
            assert result, f"{title}: {query}"
        assert span_derived >= 45, span_derived
        for variable in _dashboard()["templating"]["list"]:
            if variable["type"] == "query":
                selector, label = re.fullmatch(r"label_values\((.*), (\w+)\)", variable["query"]).groups()
                assert prom.query(f"group by ({label}) ({selector})"), variable["name"]
        assert prom.targets_up()

        # -- exemplars (OpenMetrics scrape, exemplar storage on) name the trace in the label Grafana
        # links to Tempo, and point at a trace the replica exposing them actually received.
        prometheus_source = next(d for d in _load_yaml(DATASOURCES)["datasources"] if d["type"] == "prometheus")
        link = prometheus_source["jsonData"]["exemplarTraceIdDestinations"][0]["name"]
        replica_of = {address(r): i for i, r in enumerate(replicas)}
        series = prom.query_exemplars('{source="spans"}', time.time() - 600, time.time() + 60)
        exemplars = [(s["seriesLabels"], e) for s in series for e in s["exemplars"]]
        assert exemplars, "no exemplars on the span-derived histograms"
        for labels, exemplar in exemplars:
            trace_id = int(exemplar["labels"][link], 16)
            assert trace_id in sharding.traces_per_shard[replica_of[labels["instance"]]], (labels, exemplar)
    finally:
        prom.stop()
        engine.stop()
        dcgm.stop()


def test_the_image_copies_every_package_the_project_installs():
    """`pip install .` in the image installs what the build context has: a package pyproject.toml
    lists but the Dockerfile does not copy is silently missing (the compose demo runs `simulate`)."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    patterns = project["tool"]["setuptools"]["packages"]["find"]["include"]
    packages = {p.parent.name for p in ROOT.glob("*/__init__.py")
                if any(p.parent.name == pattern.rstrip("*") for pattern in patterns)}
    assert {"otel_llm", "otel_llm_simulate"} <= packages
    copied = {line.split()[1] for line in (ROOT / "Dockerfile").read_text(encoding="utf-8").splitlines()
              if line.startswith("COPY ")}
    assert packages <= copied, f"not copied into the image: {sorted(packages - copied)}"
