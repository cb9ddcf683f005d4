"""The metrics reference is complete: a real ``otel-llm serve`` with every feature that adds metric
families on (both namings in each GenAI conventions version, tenants, cost, SLO objectives, LoRA
adapters, a dimension, the intake log, every exporter, the web view), fed the simulator's fleet
(every engine shape, gateways, LiteLLM proxies, the app tier's client spans, errors and aborts), is
scraped, and every family on its ``/metrics`` and every value of its ``segment`` label must be in
``docs/reference/`` (generated from the declarations by ``make docs``)."""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from otel_llm_simulate.runner import otlp_exporter_factory, run_plan
from otel_llm_simulate.scenarios import plan
from tests.support.otelllm import ServerProcess
from tests.support.ports import free_port

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tools.gen_docs import EVERY_METRIC_FEATURE  # noqa: E402

REFERENCE = ROOT / "docs" / "reference"
# A reference row: "| `declared` | `exposed` | histogram |" (the namings) or "| `exposed` | counter |".
_ROW = re.compile(r"^\| (?:`[^`]+` \| )?`([^`]+)` \| (histogram|counter|gauge) \|", re.M)
# What the reference named nowhere before it was generated from every declaration (issue 51's list).
ONCE_MISSING = ("vllm:prompt_tokens_cached_total", "vllm:request_prefill_kv_computed_tokens",
                "vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_draft_tokens_total",
                "vllm:spec_decode_num_accepted_tokens_total", "otel_llm_prompt_tokens_cached_total",
                "otel_llm_prompt_tokens_computed_total", "otel_llm_prompt_tokens_cache_write_total",
                "otel_llm_request_prefix_cache_hit_ratio", "otel_llm_request_spec_decode_acceptance_length",
                "otel_llm_series_bytes", "otel_llm_webview_login_failures_total")


def referenced() -> tuple[set[str], set[str]]:
    """The families the reference pages list (as exposed: a counter with ``_total``) and the values
    of ``segment`` its table lists."""
    pages = "".join((REFERENCE / page).read_text(encoding="utf-8") for page in ("metrics.md", "self-telemetry.md"))
    start = pages.find("| `segment` | the interval |")
    segments_table = pages[start:pages.index("\n\n", start)] if start >= 0 else ""
    return {name for name, _ in _ROW.findall(pages)}, set(re.findall(r"^\| `([a-z_]+)` \|", segments_table, re.M))


def exposed(text: str) -> tuple[set[str], set[str]]:
    """The families of an exposition as the reference names them, and the values of ``segment``."""
    families, segments = set(), set()
    for family in text_string_to_metric_families(text):
        families.add(family.name + "_total" if family.type == "counter" else family.name)
        segments.update(s.labels["segment"] for s in family.samples if "segment" in s.labels)
    # The text format gives a prometheus_client counter's creation time a gauge family of its own,
    # ``<name>_created``: part of that counter (the reference says so once).
    return {f for f in families if not (f.endswith("_created") and f.removesuffix("_created") + "_total" in families)}, \
        segments


def test_the_row_pattern_reads_both_layouts():
    text = ("| `vllm:x` | `vllm:x_total` | counter | `{token}` |\n| `otel_llm_y` | gauge | `state` | ... |\n"
            "| `gen_ai.z` | `gen_ai_z_seconds` | histogram | `s` |\n| `segment` | the interval |\n")
    assert {m[0] for m in _ROW.findall(text)} == {"vllm:x_total", "otel_llm_y", "gen_ai_z_seconds"}


@pytest.mark.parametrize("gen_ai_version", ["1.41", "0.1"])
def test_every_family_an_instance_with_every_feature_exposes_is_in_the_reference(tmp_path, gen_ai_version):
    closed = f"127.0.0.1:{free_port()}"  # the exporters' backend: nothing listens (their failures are counted)
    features = {**EVERY_METRIC_FEATURE,
                "namings": {**EVERY_METRIC_FEATURE["namings"], "gen_ai_version": gen_ai_version}}
    server = ServerProcess(tmp_path, {
        "receivers": {"otlp": {"intake_log": {}}},
        "processors": {"llm_metrics": features, "tail_sampling": {"decision_wait": "2s", "grace": "200ms"}},
        "exporters": {"otlp": {"endpoint": closed, "retry_on_failure": {"enabled": False}},
                      "otlphttp": {"endpoint": f"http://{closed}", "retry_on_failure": {"enabled": False}},
                      "otlp_metrics": {"endpoint": closed, "interval": "1s"},
                      "debug": {}},
        "extensions": {"webview": {"auth": {"bearer_token": "a-token-for-the-reference-test"}}},
        "service": {"shutdown_grace": "2s"},
    })
    server.start()
    try:
        the_plan = plan("errors", seed=51, rate=20.0, duration_s=20.0, start_ns=time.time_ns() - 20 * 10**9,
                        max_requests=400)
        result = run_plan(the_plan, otlp_exporter_factory(f"127.0.0.1:{server.grpc_port}", "grpc"), realtime=False)
        assert not result.spans_failed and result.requests_sent >= 300
        scrape = server.wait_until(lambda s: s.value("otel_llm_traces_in_memory") == 0
                                   and s.value("otel_llm_requests_assembled_total") >= result.requests_sent,
                                   60, "every trace decided")
    finally:
        assert server.stop() == 0
    families, segments = exposed(scrape.text)
    # The instance exposes what issue 51 found missing, and the accounting and client families.
    assert set(ONCE_MISSING) <= families
    assert {"otel_llm_tenant_tokens_total", "otel_llm_request_cost_total", "otel_llm_slo_requests_total",
            "otel_llm_intake_log_fsyncs_total", "otel_llm_exporter_failed_requests_total",
            "otel_llm_metrics_exporter_queue_size", "otel_llm_debug_exporter_logged_traces_total"} <= families
    client = "gen_ai_client_inference_duration_seconds" if gen_ai_version == "0.1" \
        else "gen_ai_client_operation_duration_seconds"
    assert client in families
    assert {"preprocess", "queue", "prefill", "decode", "postprocess"} <= segments
    in_reference, segments_in_reference = referenced()
    missing = sorted(families - in_reference)
    assert not missing, (f"{len(missing)} of the {len(families)} families on /metrics are not in docs/reference/ "
                         f"(declare them, then run `make docs`): {', '.join(missing)}")
    assert segments <= segments_in_reference, f"segment values not in the reference: {sorted(segments - segments_in_reference)}"


# --- by construction: no family and no segment outside the declarations ------------------------------

_FAMILY_BUILDERS = {"Counter", "Gauge", "Histogram", "Summary", "Info", "Enum", "Metric", "CounterMetricFamily",
                    "GaugeMetricFamily", "HistogramMetricFamily", "SummaryMetricFamily", "InfoMetricFamily",
                    "GaugeHistogramMetricFamily", "StateSetMetricFamily", "UnknownMetricFamily"}


def literal_named_families(source: str) -> list[str]:
    """Calls in ``source`` that build a metric family from a name written there (a string or an
    f-string), rather than from a declaration."""
    import ast

    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], (ast.Constant, ast.JoinedStr)):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
            if name in _FAMILY_BUILDERS:
                found.append(f"line {node.lineno}: {name}({ast.unparse(node.args[0])}, ...)")
    return found


def test_no_metric_family_is_named_outside_a_declaration():
    """A family built from a name written at the call (``Counter("otel_llm_x", ...)``) would reach
    /metrics without a reference row: every one is a ``TelemetryFamily`` or a span-derived spec."""
    assert literal_named_families('Counter("otel_llm_x", "doc", registry=r)\nGauge(f"otel_llm_{n}", "d")\n'
                                  'SPEC.counter(registry)\nMetric(spec.name, spec.description, "counter")\n') == [
        'line 1: Counter(\'otel_llm_x\', ...)', "line 2: Gauge(f'otel_llm_{n}', ...)"]
    offenders = {str(path.relative_to(ROOT)): found for path in sorted((ROOT / "otel_llm").rglob("*.py"))
                 if (found := literal_named_families(path.read_text(encoding="utf-8")))}
    assert not offenders, f"declare these as TelemetryFamily (otel_llm/internal/telemetry.py): {offenders}"


def segment_names_in_code() -> set[str]:
    """Every segment name the Python and the Rust code build a segment with, found by a text search."""
    from otel_llm.processor.llm_metrics import composite

    constants = {name: value for name, value in vars(composite).items() if isinstance(value, str)}
    names: set[str] = set()
    for path in (ROOT / "otel_llm").rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        names.update(re.findall(r'Segment\(\s*"(\w+)"', text))
        names.update(re.findall(r'_new_tuple\(Segment, \("(\w+)"', text))
        names.update(constants[c] for c in re.findall(r"Segment\(([A-Z_]+),", text) if c in constants)
        names.update(re.findall(r'\(\s*"(\w+)", (?:ps|ds)\.get\(', text))  # llm-d's table of pod segments
        names.update(constants[c] for c in re.findall(r"\(([A-Z_]+), (?:ps|ds)\.get\(", text) if c in constants)
    for path in (ROOT / "rust" / "src").glob("*.rs"):
        names.update(re.findall(r'segments\.push\(\("(\w+)"', path.read_text(encoding="utf-8")))
    # The compiled core's segments named by a rule's Python string (``rules.kv_transfer``): the composite
    # module's constant of that name.
    rules = re.findall(r'segments\.push\(\("", Some\(rules\.(\w+)\.bind', (ROOT / "rust" / "src" / "records.rs").read_text(encoding="utf-8"))
    names.update(constants[rule.upper()] for rule in rules)
    return names - {""}


def test_every_segment_the_code_builds_is_declared():
    from otel_llm.processor.llm_metrics.metrics.definitions import SEGMENT_NAMES

    found = segment_names_in_code()
    assert {"preprocess", "decode_queue", "coordination", "inference", "kv_transfer", "compute",
            "queue_and_prefill", "routing"} <= found, "the search no longer finds what the code builds"
    assert found <= set(SEGMENT_NAMES), f"add these to SEGMENT_NAMES (definitions.py): {sorted(found - set(SEGMENT_NAMES))}"
