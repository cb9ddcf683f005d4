"""Generates collector-config/grafana/dashboards/llm-serving.json with Grafana's Foundation SDK.

The dashboard is code: edit the panels here, then regenerate (a build-time step; the SDK is a
development dependency, users who only import the dashboard need nothing but the JSON):

    .venv/bin/pip install grafana-foundation-sdk
    .venv/bin/python collector-config/grafana/generate.py           # rewrites the JSON
    .venv/bin/python collector-config/grafana/generate.py --check   # exit 1 if the JSON is stale

tests/test_deployment_kit.py regenerates it and fails when the committed JSON differs, so the two
cannot drift. The SDK's typed builders emit the panel/field/option JSON in Grafana's own schema.

Conventions (checked by tests/test_deployment_kit.py): every `vllm:` selector names its `source`
("spans" = otel-llm, "engine" = vLLM's own /metrics); the latency row's span-derived p99 targets
carry exemplars; row titles start with the row's key (Latency, Client, Throughput, ...).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grafana_foundation_sdk.builders import common as common_b
from grafana_foundation_sdk.builders import dashboard as dash_b
from grafana_foundation_sdk.builders import prometheus as prom_b
from grafana_foundation_sdk.builders import stat as stat_b
from grafana_foundation_sdk.builders import table as table_b
from grafana_foundation_sdk.builders import timeseries as ts_b
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common as common_m
from grafana_foundation_sdk.models import dashboard as dash_m
from grafana_foundation_sdk.models import prometheus as prom_m

OUT = Path(__file__).resolve().parent / "dashboards" / "llm-serving.json"
PROMETHEUS = dash_m.DataSourceRef(type_val="prometheus", uid="prometheus")  # provisioning/datasources uid
GRID_WIDTH = 24


# ------------------------------------------------------------------------------------------------
# Building blocks: one definition per panel kind, so every panel of a kind looks alike.


@dataclass
class Query:
    expr: str
    legend: str
    exemplar: bool = False
    table: bool = False  # instant query, table format (table panels)


def q(expr: str, legend: str = "", *, exemplar: bool = False, table: bool = False) -> Query:
    return Query(expr, legend, exemplar, table)


@dataclass
class Panel:
    kind: str  # timeseries | stat | table
    id: int
    title: str
    unit: str
    description: str
    queries: list[Query]
    w: int
    h: int
    steps: list[tuple[str, float | None]] = field(default_factory=lambda: [("green", None)])
    stacked: bool = False
    hide_columns: tuple[str, ...] = ()
    rename: dict[str, str] = field(default_factory=dict)


@dataclass
class Row:
    id: int
    title: str
    panels: list[Panel]


def row(id: int, title: str, panels: list[Panel]) -> Row:
    return Row(id, title, panels)


def timeseries_panel(id: int, title: str, unit: str, description: str, queries: list[Query], *,
                     w: int = 12, h: int = 8, stacked: bool = False) -> Panel:
    return Panel("timeseries", id, title, unit, description, queries, w, h, stacked=stacked)


def stat_panel(id: int, title: str, unit: str, description: str, queries: list[Query], *,
               w: int = 6, h: int = 4, steps: list[tuple[str, float | None]] | None = None) -> Panel:
    return Panel("stat", id, title, unit, description, queries, w, h, steps=steps or [("green", None)])


def table_panel(id: int, title: str, unit: str, description: str, queries: list[Query], *,
                w: int = 12, h: int = 8, hide_columns: tuple[str, ...] = ("Time",),
                rename: dict[str, str] | None = None) -> Panel:
    return Panel("table", id, title, unit, description, queries, w, h, hide_columns=hide_columns,
                 rename=rename or {})



# ------------------------------------------------------------------------------------------------
# The rows and panels, top to bottom.

ROWS = [
    row(1, 'Latency (span-derived: every request, every engine; click an exemplar dot for the trace in Tempo)', [
        stat_panel(
            2, 'TTFT p95, 5m', 's',
            'Recording rule llm:ttft_seconds:p95_5m, the same series LLMTTFTP95High alerts on.',
            [
                q('max by (model_name) (llm:ttft_seconds:p95_5m{model_name=~"$model", engine_kind=~"$engine"})', '{{model_name}}'),
            ], steps=[('green', None), ('yellow', 1), ('red', 2)]),
        stat_panel(
            3, 'TPOT p95, 5m', 's',
            'Recording rule llm:tpot_seconds:p95_5m (LLMTPOTHigh).',
            [
                q('max by (model_name) (llm:tpot_seconds:p95_5m{model_name=~"$model", engine_kind=~"$engine"})', '{{model_name}}'),
            ], steps=[('green', None), ('yellow', 0.1), ('red', 0.15)]),
        stat_panel(
            4, 'TTFT SLO burn rate, 1h (interactive)', 'x',
            'Share of interactive requests with TTFT > 1 s over the last hour, divided by the 1 % error budget. 14.4 pages (with the 5 m window).',
            [
                q('llm:ttft_slo_errors:ratio_rate1h{model_name=~"$model", priority="interactive"} / 0.01', '{{model_name}}'),
            ], steps=[('green', None), ('yellow', 1), ('orange', 6), ('red', 14.4)]),
        stat_panel(
            5, 'TTFT SLO burn rate, 1h (batch)', 'x',
            'Share of batch requests with TTFT > 10 s over the last hour, divided by the 5 % error budget.',
            [
                q('llm:ttft_slo_errors:ratio_rate1h{model_name=~"$model", priority="batch"} / 0.05', '{{model_name}}'),
            ], steps=[('green', None), ('yellow', 1), ('orange', 6), ('red', 14.4)]),
        timeseries_panel(
            6, 'Time to first token - vllm: naming', 's',
            'vllm:time_to_first_token_seconds{source="spans"}: same name and buckets as vLLM\'s own metric, computed from spans for vLLM, SGLang and gateway-reported TTFT. Successful requests only.',
            [
                q('histogram_quantile(0.5, sum by (le, model_name) (rate(vllm:time_to_first_token_seconds_bucket{source="spans", model_name=~"$model", engine_kind=~"$engine"}[$__rate_interval])))', 'p50 {{model_name}}'),
                q('histogram_quantile(0.95, sum by (le, model_name) (rate(vllm:time_to_first_token_seconds_bucket{source="spans", model_name=~"$model", engine_kind=~"$engine"}[$__rate_interval])))', 'p95 {{model_name}}'),
                q('histogram_quantile(0.99, sum by (le, model_name) (rate(vllm:time_to_first_token_seconds_bucket{source="spans", model_name=~"$model", engine_kind=~"$engine"}[$__rate_interval])))', 'p99 {{model_name}}', exemplar=True),
            ]),
        timeseries_panel(
            7, 'Time to first token - gen_ai naming', 's',
            'gen_ai.server.time_to_first_token (OTel GenAI semconv) - the migration target of the panel on the left.',
            [
                q('histogram_quantile(0.5, sum by (le, gen_ai_request_model) (rate(gen_ai_server_time_to_first_token_seconds_bucket{source="spans", gen_ai_request_model=~"$model", gen_ai_provider_name=~"$engine"}[$__rate_interval])))', 'p50 {{gen_ai_request_model}}'),
                q('histogram_quantile(0.95, sum by (le, gen_ai_request_model) (rate(gen_ai_server_time_to_first_token_seconds_bucket{source="spans", gen_ai_request_model=~"$model", gen_ai_provider_name=~"$engine"}[$__rate_interval])))', 'p95 {{gen_ai_request_model}}'),
                q('histogram_quantile(0.99, sum by (le, gen_ai_request_model) (rate(gen_ai_server_time_to_first_token_seconds_bucket{source="spans", gen_ai_request_model=~"$model", gen_ai_provider_name=~"$engine"}[$__rate_interval])))', 'p99 {{gen_ai_request_model}}', exemplar=True),
            ]),
        timeseries_panel(
            8, 'Time per output token - vllm: naming', 's',
            "Per request: decode time / (output tokens - 1), vLLM's request_time_per_output_token semantics.",
            [
                q('histogram_quantile(0.5, sum by (le, model_name) (rate(vllm:request_time_per_output_token_seconds_bucket{source="spans", model_name=~"$model", engine_kind=~"$engine"}[$__rate_interval])))', 'p50 {{model_name}}'),
                q('histogram_quantile(0.95, sum by (le, model_name) (rate(vllm:request_time_per_output_token_seconds_bucket{source="spans", model_name=~"$model", engine_kind=~"$engine"}[$__rate_interval])))', 'p95 {{model_name}}'),
                q('histogram_quantile(0.99, sum by (le, model_name) (rate(vllm:request_time_per_output_token_seconds_bucket{source="spans", model_name=~"$model", engine_kind=~"$engine"}[$__rate_interval])))', 'p99 {{model_name}}', exemplar=True),
            ]),
        timeseries_panel(
            9, 'Time per output token - gen_ai naming', 's',
            '',
            [
                q('histogram_quantile(0.5, sum by (le, gen_ai_request_model) (rate(gen_ai_server_time_per_output_token_seconds_bucket{source="spans", gen_ai_request_model=~"$model", gen_ai_provider_name=~"$engine"}[$__rate_interval])))', 'p50 {{gen_ai_request_model}}'),
                q('histogram_quantile(0.95, sum by (le, gen_ai_request_model) (rate(gen_ai_server_time_per_output_token_seconds_bucket{source="spans", gen_ai_request_model=~"$model", gen_ai_provider_name=~"$engine"}[$__rate_interval])))', 'p95 {{gen_ai_request_model}}'),
                q('histogram_quantile(0.99, sum by (le, gen_ai_request_model) (rate(gen_ai_server_time_per_output_token_seconds_bucket{source="spans", gen_ai_request_model=~"$model", gen_ai_provider_name=~"$engine"}[$__rate_interval])))', 'p99 {{gen_ai_request_model}}', exemplar=True),
            ]),
        timeseries_panel(
            10, 'Inter-token latency per engine step (engine-native)', 's',
            'vllm:inter_token_latency_seconds{source="engine"} from vLLM\'s own /metrics: one observation per decode step, so it shows streaming stalls a per-request TPOT averages away. No span counterpart.',
            [
                q('histogram_quantile(0.5, sum by (le, model_name) (rate(vllm:inter_token_latency_seconds_bucket{source="engine", model_name=~"$model", engine_kind=~"$engine"}[$__rate_interval])))', 'p50 {{model_name}}'),
                q('histogram_quantile(0.99, sum by (le, model_name) (rate(vllm:inter_token_latency_seconds_bucket{source="engine", model_name=~"$model", engine_kind=~"$engine"}[$__rate_interval])))', 'p99 {{model_name}}'),
            ]),
        timeseries_panel(
            11, 'End-to-end latency - vllm: naming', 's',
            '',
            [
                q('histogram_quantile(0.5, sum by (le, model_name) (rate(vllm:e2e_request_latency_seconds_bucket{source="spans", model_name=~"$model", engine_kind=~"$engine"}[$__rate_interval])))', 'p50 {{model_name}}'),
                q('histogram_quantile(0.95, sum by (le, model_name) (rate(vllm:e2e_request_latency_seconds_bucket{source="spans", model_name=~"$model", engine_kind=~"$engine"}[$__rate_interval])))', 'p95 {{model_name}}'),
                q('histogram_quantile(0.99, sum by (le, model_name) (rate(vllm:e2e_request_latency_seconds_bucket{source="spans", model_name=~"$model", engine_kind=~"$engine"}[$__rate_interval])))', 'p99 {{model_name}}', exemplar=True),
            ]),
        timeseries_panel(
            12, 'Request duration - gen_ai naming', 's',
            '',
            [
                q('histogram_quantile(0.5, sum by (le, gen_ai_request_model) (rate(gen_ai_server_request_duration_seconds_bucket{source="spans", gen_ai_request_model=~"$model", gen_ai_provider_name=~"$engine"}[$__rate_interval])))', 'p50 {{gen_ai_request_model}}'),
                q('histogram_quantile(0.95, sum by (le, gen_ai_request_model) (rate(gen_ai_server_request_duration_seconds_bucket{source="spans", gen_ai_request_model=~"$model", gen_ai_provider_name=~"$engine"}[$__rate_interval])))', 'p95 {{gen_ai_request_model}}'),
                q('histogram_quantile(0.99, sum by (le, gen_ai_request_model) (rate(gen_ai_server_request_duration_seconds_bucket{source="spans", gen_ai_request_model=~"$model", gen_ai_provider_name=~"$engine"}[$__rate_interval])))', 'p99 {{gen_ai_request_model}}', exemplar=True),
            ]),
        timeseries_panel(
            13, 'Queue time', 's',
            'Waiting in the engine scheduler before the first prefill step.',
            [
                q('histogram_quantile(0.5, sum by (le, model_name) (rate(vllm:request_queue_time_seconds_bucket{source="spans", model_name=~"$model", engine_kind=~"$engine"}[$__rate_interval])))', 'p50 {{model_name}}'),
                q('histogram_quantile(0.95, sum by (le, model_name) (rate(vllm:request_queue_time_seconds_bucket{source="spans", model_name=~"$model", engine_kind=~"$engine"}[$__rate_interval])))', 'p95 {{model_name}}'),
                q('histogram_quantile(0.99, sum by (le, model_name) (rate(vllm:request_queue_time_seconds_bucket{source="spans", model_name=~"$model", engine_kind=~"$engine"}[$__rate_interval])))', 'p99 {{model_name}}', exemplar=True),
            ], w=8),
        timeseries_panel(
            14, 'Prefill time', 's',
            '',
            [
                q('histogram_quantile(0.5, sum by (le, model_name) (rate(vllm:request_prefill_time_seconds_bucket{source="spans", model_name=~"$model", engine_kind=~"$engine"}[$__rate_interval])))', 'p50 {{model_name}}'),
                q('histogram_quantile(0.95, sum by (le, model_name) (rate(vllm:request_prefill_time_seconds_bucket{source="spans", model_name=~"$model", engine_kind=~"$engine"}[$__rate_interval])))', 'p95 {{model_name}}'),
                q('histogram_quantile(0.99, sum by (le, model_name) (rate(vllm:request_prefill_time_seconds_bucket{source="spans", model_name=~"$model", engine_kind=~"$engine"}[$__rate_interval])))', 'p99 {{model_name}}', exemplar=True),
            ], w=8),
        timeseries_panel(
            15, 'Decode time', 's',
            '',
            [
                q('histogram_quantile(0.5, sum by (le, model_name) (rate(vllm:request_decode_time_seconds_bucket{source="spans", model_name=~"$model", engine_kind=~"$engine"}[$__rate_interval])))', 'p50 {{model_name}}'),
                q('histogram_quantile(0.95, sum by (le, model_name) (rate(vllm:request_decode_time_seconds_bucket{source="spans", model_name=~"$model", engine_kind=~"$engine"}[$__rate_interval])))', 'p95 {{model_name}}'),
                q('histogram_quantile(0.99, sum by (le, model_name) (rate(vllm:request_decode_time_seconds_bucket{source="spans", model_name=~"$model", engine_kind=~"$engine"}[$__rate_interval])))', 'p99 {{model_name}}', exemplar=True),
            ], w=8),
        timeseries_panel(
            16, 'Request segments p95 (all engines)', 's',
            'otel_llm_request_segment_seconds: preprocess, queue, prefill, decode, postprocess for every engine kind.',
            [
                q('histogram_quantile(0.95, sum by (le, segment) (rate(otel_llm_request_segment_seconds_bucket{source="spans", model_name=~"$model", engine_kind=~"$engine"}[$__rate_interval])))', 'p95 {{segment}}', exemplar=True),
            ]),
        timeseries_panel(
            17, 'Gateway overhead', 's',
            "Edge gateway span duration minus the engine's e2e latency (LLMGatewayOverheadHigh).",
            [
                q('histogram_quantile(0.5, sum by (le, model_name) (rate(otel_llm_gateway_overhead_seconds_bucket{source="spans", model_name=~"$model", engine_kind=~"$engine"}[$__rate_interval])))', 'p50 {{model_name}}'),
                q('histogram_quantile(0.95, sum by (le, model_name) (rate(otel_llm_gateway_overhead_seconds_bucket{source="spans", model_name=~"$model", engine_kind=~"$engine"}[$__rate_interval])))', 'p95 {{model_name}}'),
                q('histogram_quantile(0.99, sum by (le, model_name) (rate(otel_llm_gateway_overhead_seconds_bucket{source="spans", model_name=~"$model", engine_kind=~"$engine"}[$__rate_interval])))', 'p99 {{model_name}}', exemplar=True),
            ]),
    ]),
    row(41, "Client vs server (the callers' GenAI CLIENT spans beside the server side)", [
        timeseries_panel(
            42, 'Client-observed vs server e2e duration p95, per model', 's',
            "gen_ai_client_operation_duration_seconds (semconv v1.41.0; gen_ai_client_inference_duration_seconds with namings.gen_ai_version 0.1) (the caller's CLIENT span, from the applications that report one) next to gen_ai_server_request_duration_seconds (every request, server side). Both gen_ai naming; the gap is network, gateways and their queues.",
            [
                q('histogram_quantile(0.95, sum by (le, gen_ai_request_model) (rate(gen_ai_client_operation_duration_seconds_bucket{source="spans", gen_ai_request_model=~"$model"}[$__rate_interval]) or rate(gen_ai_client_inference_duration_seconds_bucket{source="spans", gen_ai_request_model=~"$model"}[$__rate_interval])))', 'client p95 {{gen_ai_request_model}}', exemplar=True),
                q('histogram_quantile(0.95, sum by (le, gen_ai_request_model) (rate(gen_ai_server_request_duration_seconds_bucket{source="spans", gen_ai_request_model=~"$model", gen_ai_provider_name=~"$engine"}[$__rate_interval])))', 'server p95 {{gen_ai_request_model}}', exemplar=True),
            ]),
        timeseries_panel(
            43, 'Client-observed overhead vs gateway overhead p95, per model', 's',
            "otel_llm_client_overhead_seconds (joined client span duration minus the engine's e2e: what the caller waited outside the engine) next to otel_llm_gateway_overhead_seconds (edge gateway span minus engine e2e).",
            [
                q('histogram_quantile(0.95, sum by (le, model_name) (rate(otel_llm_client_overhead_seconds_bucket{source="spans", model_name=~"$model", engine_kind=~"$engine"}[$__rate_interval])))', 'client overhead p95 {{model_name}}', exemplar=True),
                q('histogram_quantile(0.95, sum by (le, model_name) (rate(otel_llm_gateway_overhead_seconds_bucket{source="spans", model_name=~"$model", engine_kind=~"$engine"}[$__rate_interval])))', 'gateway overhead p95 {{model_name}}', exemplar=True),
            ]),
    ]),
    row(18, 'Throughput', [
        timeseries_panel(
            19, 'Tokens per second', 'short',
            '',
            [
                q('sum by (model_name) (rate(vllm:generation_tokens_total{source="spans", model_name=~"$model", engine_kind=~"$engine"}[$__rate_interval]))', 'generated {{model_name}}'),
                q('sum by (model_name) (rate(vllm:prompt_tokens_total{source="spans", model_name=~"$model", engine_kind=~"$engine"}[$__rate_interval]))', 'prompt {{model_name}}'),
            ]),
        timeseries_panel(
            20, 'Goodput: generated tokens/s while TTFT and TPOT SLOs hold', 'short',
            "llm:goodput_tokens:rate5m counts a model's tokens only while its TTFT p95 <= 1 s and TPOT p95 <= 100 ms (TPOT stands in for ITL: spans have no per-step latency).",
            [
                q('sum by (model_name) (llm:goodput_tokens:rate5m{model_name=~"$model", engine_kind=~"$engine"})', 'goodput {{model_name}}'),
                q('sum by (model_name) (llm:generation_tokens:rate5m{model_name=~"$model", engine_kind=~"$engine"})', 'all {{model_name}}'),
            ]),
        timeseries_panel(
            21, 'Requests per second by outcome', 'reqps',
            'finished_reason from spans: stop|length (SGLang, gateways, max_tokens reached), abort (client gave up, no engine span), error (status ERROR), unknown (vLLM V1 reports no reason).',
            [
                q('sum by (finished_reason) (rate(vllm:request_success_total{source="spans", model_name=~"$model", engine_kind=~"$engine"}[$__rate_interval]))', '{{finished_reason}}'),
            ], stacked=True),
        timeseries_panel(
            22, 'Error and abort ratio', 'percentunit',
            'LLMRequestErrorRatioHigh pages above 5 % errors; aborts above 10 % open a ticket.',
            [
                q('llm:request_outcome:ratio_rate5m{model_name=~"$model", finished_reason=~"error|abort"}', '{{finished_reason}} {{model_name}}'),
            ]),
        timeseries_panel(
            23, 'Tokens per request (p50 / p95)', 'short',
            '',
            [
                q('histogram_quantile(0.5, sum by (le) (rate(vllm:request_prompt_tokens_bucket{source="spans", model_name=~"$model", engine_kind=~"$engine"}[$__rate_interval])))', 'prompt p50'),
                q('histogram_quantile(0.95, sum by (le) (rate(vllm:request_prompt_tokens_bucket{source="spans", model_name=~"$model", engine_kind=~"$engine"}[$__rate_interval])))', 'prompt p95'),
                q('histogram_quantile(0.5, sum by (le) (rate(vllm:request_generation_tokens_bucket{source="spans", model_name=~"$model", engine_kind=~"$engine"}[$__rate_interval])))', 'generated p50'),
                q('histogram_quantile(0.95, sum by (le) (rate(vllm:request_generation_tokens_bucket{source="spans", model_name=~"$model", engine_kind=~"$engine"}[$__rate_interval])))', 'generated p95'),
            ]),
        timeseries_panel(
            24, 'Requests/s: span-derived vs engine-native (migration cross-check)', 'reqps',
            'The same requests counted twice, once per source: never sum across `source`.',
            [
                q('sum by (model_name) (rate(vllm:e2e_request_latency_seconds_count{source="spans", model_name=~"$model", engine_kind=~"$engine"}[$__rate_interval]))', 'spans {{model_name}}'),
                q('sum by (model_name) (rate(vllm:e2e_request_latency_seconds_count{source="engine", model_name=~"$model", engine_kind=~"$engine"}[$__rate_interval]))', 'engine {{model_name}}'),
            ]),
    ]),
    row(25, 'Saturation (engine-native vllm: series, source="engine")', [
        timeseries_panel(
            26, 'KV cache usage', 'percentunit',
            'LLMKVCacheSaturated above 95 % for 15 min.',
            [
                q('max by (model_name, instance) (vllm:kv_cache_usage_perc{source="engine", model_name=~"$model", engine_kind=~"$engine"})', '{{model_name}} {{instance}}'),
            ], w=8),
        timeseries_panel(
            27, 'Queue depth', 'short',
            '',
            [
                q('sum by (model_name) (vllm:num_requests_waiting{source="engine", model_name=~"$model", engine_kind=~"$engine"})', 'waiting {{model_name}}'),
                q('sum by (model_name) (vllm:num_requests_running{source="engine", model_name=~"$model", engine_kind=~"$engine"})', 'running {{model_name}}'),
            ], w=8),
        timeseries_panel(
            28, 'Preemptions per second', 'short',
            '',
            [
                q('sum by (model_name) (rate(vllm:num_preemptions_total{source="engine", model_name=~"$model", engine_kind=~"$engine"}[$__rate_interval]))', '{{model_name}}'),
            ], w=8),
        timeseries_panel(
            29, 'Prefix-cache hit ratio', 'percentunit',
            '',
            [
                q('sum by (model_name) (rate(vllm:prefix_cache_hits_total{source="engine", model_name=~"$model", engine_kind=~"$engine"}[$__rate_interval])) / sum by (model_name) (rate(vllm:prefix_cache_queries_total{source="engine", model_name=~"$model", engine_kind=~"$engine"}[$__rate_interval]))', '{{model_name}}'),
            ], w=8),
        timeseries_panel(
            30, 'Speculative decoding acceptance', 'percentunit',
            '',
            [
                q('sum by (model_name) (rate(vllm:spec_decode_num_accepted_tokens_total{source="engine", model_name=~"$model", engine_kind=~"$engine"}[$__rate_interval])) / sum by (model_name) (rate(vllm:spec_decode_num_draft_tokens_total{source="engine", model_name=~"$model", engine_kind=~"$engine"}[$__rate_interval]))', '{{model_name}}'),
            ], w=8),
        timeseries_panel(
            31, 'otel-llm: traces buffered and spans accepted, per replica', 'short',
            'Trace-id routing should spread load evenly over the replicas.',
            [
                q('sum by (instance) (otel_llm_traces_in_memory{source="spans"})', 'in memory {{instance}}'),
                q('sum by (instance) (rate(otel_llm_receiver_accepted_spans_total{source="spans"}[$__rate_interval]))', 'spans/s {{instance}}'),
            ], w=8),
    ]),
    row(32, 'Resource (DCGM)', [
        timeseries_panel(
            33, 'GPU utilization vs tensor-core activity', 'percentunit',
            'GPU_UTIL only says a kernel was running; tensor-pipe activity says how much of the GPU did math.',
            [
                q('avg by (Hostname, gpu) (DCGM_FI_DEV_GPU_UTIL{source="dcgm", gpu=~"$gpu"}) / 100', 'util {{Hostname}}/{{gpu}}'),
                q('avg by (Hostname, gpu) (DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{source="dcgm", gpu=~"$gpu"})', 'tensor {{Hostname}}/{{gpu}}'),
            ], w=8),
        timeseries_panel(
            34, 'SM activity and tensor-parallel spread', 'percentunit',
            'A lagging rank holds every TP step back (LLMTensorParallelImbalance > 25 %).',
            [
                q('DCGM_FI_PROF_SM_ACTIVE{source="dcgm", gpu=~"$gpu"}', '{{Hostname}}/{{gpu}}'),
                q('llm:gpu_sm_active:spread', 'spread {{Hostname}} {{pod}}'),
            ], w=8),
        timeseries_panel(
            35, 'HBM used', 'percentunit',
            'vLLM pre-allocates gpu_memory_utilization (0.9); > 97 % is an alert.',
            [
                q('DCGM_FI_DEV_FB_USED{source="dcgm", gpu=~"$gpu"} / (DCGM_FI_DEV_FB_USED{source="dcgm", gpu=~"$gpu"} + DCGM_FI_DEV_FB_FREE{source="dcgm", gpu=~"$gpu"})', '{{Hostname}}/{{gpu}}'),
            ], w=8),
    ]),
    row(36, 'Cost ($gpu_hourly_cost per GPU-hour, GPUs selected by $gpu)', [
        stat_panel(
            37, '$ per 1k generated tokens', 'currencyUSD',
            '',
            [
                q('($gpu_hourly_cost * count(DCGM_FI_DEV_GPU_UTIL{source="dcgm", gpu=~"$gpu"}) / 3600) / sum(rate(vllm:generation_tokens_total{source="spans", model_name=~"$model", engine_kind=~"$engine"}[$__rate_interval])) * 1000', 'generated'),
            ], h=6),
        stat_panel(
            38, '$ per 1k tokens (prompt + generated)', 'currencyUSD',
            '',
            [
                q('($gpu_hourly_cost * count(DCGM_FI_DEV_GPU_UTIL{source="dcgm", gpu=~"$gpu"}) / 3600) / (sum(rate(vllm:generation_tokens_total{source="spans", model_name=~"$model", engine_kind=~"$engine"}[$__rate_interval])) + sum(rate(vllm:prompt_tokens_total{source="spans", model_name=~"$model", engine_kind=~"$engine"}[$__rate_interval]))) * 1000', 'all tokens'),
            ], h=6),
        stat_panel(
            39, '$ per 1k goodput tokens', 'currencyUSD',
            'Cost of the tokens served within SLO; no value while no model meets its SLOs.',
            [
                q('($gpu_hourly_cost * count(DCGM_FI_DEV_GPU_UTIL{source="dcgm", gpu=~"$gpu"}) / 3600) / sum(llm:goodput_tokens:rate5m{model_name=~"$model", engine_kind=~"$engine"}) * 1000', 'goodput'),
            ], h=6),
        stat_panel(
            40, 'GPU spend per hour', 'currencyUSD',
            '',
            [
                q('$gpu_hourly_cost * count(DCGM_FI_DEV_GPU_UTIL{source="dcgm", gpu=~"$gpu"})', '$/h'),
            ], h=6),
    ]),
]

# ------------------------------------------------------------------------------------------------
# Rows added with the Alertmanager configuration (issue 18).

ROWS += [
    row(44, 'LoRA adapters (engine-native vllm:lora_requests_info, source="engine")', [
        table_panel(
            45, 'LoRA adapters per engine, now', '',
            'vllm:lora_requests_info (vLLM started with --enable-lora): one series per combination of the labels '
            'running_lora_adapters and waiting_lora_adapters (comma-separated adapter names) and max_lora (adapter '
            'slots); its value is the time vLLM last set it. Old combinations stay exposed with old times, so '
            'topk by (instance) keeps each engine\'s current one. The series has no model_name: $model does not '
            'apply. vLLM warns it is unreliable with data parallelism > 1.',
            [
                q('topk by (instance) (1, vllm:lora_requests_info{source="engine", engine_kind=~"$engine"}) * 1000',
                  table=True),
            ],
            w=24, h=6, hide_columns=("Time", "__name__", "job", "source"),
            rename={"running_lora_adapters": "running adapters", "waiting_lora_adapters": "waiting for a slot",
                    "max_lora": "max_lora (slots)", "Value": "updated"}),
        timeseries_panel(
            46, 'Engines per running adapter set', 'short',
            'How many engines run each set of adapters (running_lora_adapters of each engine\'s current '
            'vllm:lora_requests_info series; empty = base model only). The mix shifting over time is adapter churn: '
            'every switch loads weights into a LoRA slot.',
            [
                q('count by (running_lora_adapters) (topk by (instance) (1, vllm:lora_requests_info{source="engine", engine_kind=~"$engine"}))',
                  '{{running_lora_adapters}}'),
            ], stacked=True),
        timeseries_panel(
            47, 'Engines with requests waiting for an adapter', 'short',
            'Engines whose scheduler holds requests for adapters that are not loaded (waiting_lora_adapters not '
            'empty): all max_lora slots are taken. Persistently non-empty means max_lora is too small for the '
            'adapter mix, or adapters should be split across engines.',
            [
                q('count by (waiting_lora_adapters) (topk by (instance) (1, vllm:lora_requests_info{source="engine", engine_kind=~"$engine"}) '
                  'unless vllm:lora_requests_info{source="engine", waiting_lora_adapters=""})',
                  '{{waiting_lora_adapters}}'),
            ]),
    ]),
    row(48, 'Alerts (Prometheus ALERTS, Alertmanager: volume is a metric too)', [
        timeseries_panel(
            49, 'Alerts firing by severity', 'short',
            'Prometheus\' ALERTS series for every rule (alerts/llm_serving.yml): firing, and pending (condition '
            'true, `for:` not yet elapsed). Pages should be rare; a page line that is rarely zero is alert fatigue.',
            [
                q('count by (severity) (ALERTS{alertstate="firing"})', 'firing {{severity}}'),
                q('count by (severity) (ALERTS{alertstate="pending"})', 'pending {{severity}}'),
            ]),
        timeseries_panel(
            50, 'Notifications sent by Alertmanager, per hour', 'short',
            'alertmanager_notifications_total (and _failed_total) by integration, increase over 1 h: what '
            'actually reached a pager, chat or ticket system (resolved notices included). "Held back" is '
            'alertmanager_alerts{state="suppressed"}: alerts inhibited (a leading ticket folded into its '
            'model\'s symptom page) or silenced right now. Needs Prometheus to scrape Alertmanager.',
            [
                q('sum by (integration) (increase(alertmanager_notifications_total[1h])) > 0', 'sent {{integration}}'),
                q('sum(increase(alertmanager_notifications_failed_total[1h]))', 'failed (all integrations)'),
                q('sum(alertmanager_alerts{state="suppressed"})', 'held back (inhibited or silenced)'),
            ]),
        table_panel(
            51, 'Fired in the last 30 days', '',
            'Alert series (one per alert name and label set, e.g. per model) that fired at least once in the '
            'last 30 days, counted by alert name. Reads 30 days of ALERTS: keep Prometheus retention >= 30 d.',
            [
                q('sort_desc(count by (alertname, severity, tier) (max_over_time(ALERTS{alertstate="firing"}[30d])))',
                  table=True),
            ], rename={"Value": "series fired"}),
        table_panel(
            52, 'Fired without action, 30 days (approximation)', '',
            'Alertmanager records no acknowledgement (your pager does) and exposes silences only as a count '
            '(alertmanager_silences), so "without action" is approximated as: fired in the last 30 days and '
            'resolved on its own (not firing now). An alert that keeps showing here and never shows up in the '
            'pager\'s acknowledgements or the ticket queue is a candidate to demote (page -> ticket) or delete.',
            [
                q('sort_desc(count by (alertname, severity, tier) (max_over_time(ALERTS{alertstate="firing"}[30d]) '
                  'unless ALERTS{alertstate="firing"}))', table=True),
            ], rename={"Value": "series self-resolved"}),
    ]),
]


# Per-request accounting (issue 26): what each request's spans report, nothing where they are silent.

ACCOUNTING_SEL = 'source="spans", model_name=~"$model", engine_kind=~"$engine"'
ROWS += [
    row(90, 'Accounting per request (span-derived: prefix cache, speculative decoding, LoRA adapters)', [
        timeseries_panel(
            91, 'Prefix-cache hit ratio per model', 'percentunit',
            'Token-weighted: llm:prompt_cache_hit_ratio:ratio_rate5m = cached / (cached + computed) prompt tokens of '
            'the requests whose spans report cache reads (engine span, or the gateway / client span that got vLLM\'s '
            'usage.prompt_tokens_details). The per-request median is a different number: long prompts weigh more in '
            'the ratio. Requests that report nothing are in neither.',
            [
                q('llm:prompt_cache_hit_ratio:ratio_rate5m{model_name=~"$model"}', 'tokens {{model_name}}'),
                q('histogram_quantile(0.5, sum by (le, model_name) (rate(otel_llm_request_prefix_cache_hit_ratio_bucket{'
                  + ACCOUNTING_SEL + '}[$__rate_interval])))', 'per-request p50 {{model_name}}'),
            ]),
        timeseries_panel(
            92, 'Prompt tokens/s: cached, computed, written to cache', 'short',
            'otel_llm_prompt_tokens_cached / _computed (prompt minus cached) of the requests that report cache reads; '
            '_cache_write where a span reports cache writes (semconv cache_creation / cache_write).',
            [
                q('sum by (model_name) (rate(otel_llm_prompt_tokens_cached_total{' + ACCOUNTING_SEL
                  + '}[$__rate_interval]))', 'cached {{model_name}}'),
                q('sum by (model_name) (rate(otel_llm_prompt_tokens_computed_total{' + ACCOUNTING_SEL
                  + '}[$__rate_interval]))', 'computed {{model_name}}'),
                q('sum by (model_name) (rate(otel_llm_prompt_tokens_cache_write_total{' + ACCOUNTING_SEL
                  + '}[$__rate_interval]))', 'cache write {{model_name}}'),
            ], stacked=False),
        timeseries_panel(
            93, 'Speculative decoding: mean acceptance length, pooled vs per request', 'short',
            'Tokens per verify step, bonus token included. Pooled (llm:spec_decode_acceptance_length:pooled_rate5m) '
            '= 1 + accepted draft tokens / steps over all requests, vLLM\'s /metrics definition; per-request mean = '
            'the unweighted mean of each request\'s 1 + accepted / steps (otel_llm_request_spec_decode_acceptance_length). '
            'They can disagree (vllm #42508). Only requests whose spans carry vLLM\'s per-request '
            'speculative_decoding numbers are counted.',
            [
                q('llm:spec_decode_acceptance_length:pooled_rate5m{model_name=~"$model"}', 'pooled {{model_name}}'),
                q('sum by (model_name) (rate(otel_llm_request_spec_decode_acceptance_length_sum{' + ACCOUNTING_SEL
                  + '}[$__rate_interval])) / sum by (model_name) (rate(otel_llm_request_spec_decode_acceptance_length_count{'
                  + ACCOUNTING_SEL + '}[$__rate_interval]))', 'per-request mean {{model_name}}'),
            ]),
        timeseries_panel(
            94, 'Speculative decoding: draft acceptance rate', 'percentunit',
            'Accepted / proposed draft tokens of the requests that report them (vLLM\'s draft_acceptance_rate, pooled).',
            [
                q('sum by (model_name) (rate(vllm:spec_decode_num_accepted_tokens_total{' + ACCOUNTING_SEL
                  + '}[$__rate_interval])) / sum by (model_name) (rate(vllm:spec_decode_num_draft_tokens_total{'
                  + ACCOUNTING_SEL + '}[$__rate_interval]))', '{{model_name}}'),
            ]),
        timeseries_panel(
            95, 'Requests/s per LoRA adapter', 'reqps',
            'Requests naming an adapter listed in processors.llm_metrics.lora_adapters (requested or served model), '
            'under the adapter\'s base model. The adapter requests\' other series carry the adapter\'s name as model_name.',
            [
                q('sum by (model_name, adapter) (rate(otel_llm_adapter_requests_total{' + ACCOUNTING_SEL
                  + '}[$__rate_interval]))', '{{adapter}} ({{model_name}})'),
            ], stacked=True),
        timeseries_panel(
            96, 'Tokens/s per LoRA adapter', 'short',
            '',
            [
                q('sum by (adapter) (rate(otel_llm_adapter_prompt_tokens_total{' + ACCOUNTING_SEL
                  + '}[$__rate_interval]))', 'prompt {{adapter}}'),
                q('sum by (adapter) (rate(otel_llm_adapter_generation_tokens_total{' + ACCOUNTING_SEL
                  + '}[$__rate_interval]))', 'generated {{adapter}}'),
            ]),
    ]),
]


# ------------------------------------------------------------------------------------------------
# Issue 26: SLO attainment per model (processors.llm_metrics.slo) in the latency row, and tokens and
# cost per tenant (processors.llm_metrics.tenant, .cost) in the cost row.

_LATENCY_ROW = next(r for r in ROWS if r.id == 1)
_COST_ROW = next(r for r in ROWS if r.id == 36)
_LATENCY_ROW.panels += [
    timeseries_panel(
        60, 'SLO attainment: requests meeting every objective / measured (otel_llm_slo_requests_total)', 'percentunit',
        'met / (met + missed) per model over 5 m (llm:slo_attainment:ratio_rate5m), against the configured '
        'target (dashed: llm:slo_target:ratio). A request meets its SLO when every objective of '
        'processors.llm_metrics.slo (TTFT, TPOT, e2e) is met; a failed request misses it.',
        [
            q('llm:slo_attainment:ratio_rate5m{model_name=~"$model"}', 'attainment {{model_name}}'),
            q('llm:slo_target:ratio{model_name=~"$model"}', 'target {{model_name}}'),
        ]),
    timeseries_panel(
        61, 'SLO requests/s by outcome (met, missed, unmeasured)', 'reqps',
        'unmeasured: no objective exceeded, but the spans did not report a configured quantity (an engine '
        'without TTFT): in neither side of the attainment ratio.',
        [
            q('sum by (model_name, slo) (llm:slo_requests:rate5m{model_name=~"$model"})', '{{model_name}} {{slo}}'),
        ], stacked=True),
]
_COST_ROW.panels += [
    timeseries_panel(
        62, 'Token cost per tenant per hour (otel_llm_request_cost_total, priced per model)', 'none',
        'The price table of processors.llm_metrics.cost (per million input, cached-input and output tokens) '
        'applied to each request\'s tokens, by tenant (processors.llm_metrics.tenant: allow-listed, the rest '
        '"other", none reported ""). In the configured currency (legend). Unpriced tokens are never priced: '
        'see the panel beside.',
        [
            q('sum by (tenant, currency) (rate(otel_llm_request_cost_total{source="spans", model_name=~"$model"}[$__rate_interval])) * 3600',
              '{{tenant}} ({{currency}}/h)'),
        ], w=8, stacked=True),
    timeseries_panel(
        63, 'Tokens/s per tenant (otel_llm_tenant_tokens_total)', 'short',
        'input = prompt tokens not read from a cache; cached_input; output.',
        [
            q('sum by (tenant, token_type) (rate(otel_llm_tenant_tokens_total{source="spans", model_name=~"$model"}[$__rate_interval]))',
              '{{tenant}} {{token_type}}'),
        ], w=8, stacked=True),
    timeseries_panel(
        64, 'Unpriced tokens/s (a model or token type without a price)', 'short',
        'Tokens of models (or token types) missing from processors.llm_metrics.cost.prices: counted, not '
        'priced, so the cost panel\'s gap shows here.',
        [
            q('sum by (model_name, token_type) (rate(otel_llm_unpriced_tokens_total{source="spans", model_name=~"$model"}[$__rate_interval]))',
              '{{model_name}} {{token_type}}'),
        ], w=8),
]


# ------------------------------------------------------------------------------------------------
# Variables


def query_variable(name: str, query: str, description: str) -> dash_b.QueryVariable:
    return (dash_b.QueryVariable(name).label(name).description(description).datasource(PROMETHEUS)
            .query(query).refresh(dash_m.VariableRefresh.ON_TIME_RANGE_CHANGED)
            .include_all(True).multi(True).all_value(".*").sort(dash_m.VariableSort.ALPHABETICAL_ASC)
            .current(dash_m.VariableOption(selected=True, text=["All"], value=["$__all"])))


VARIABLES = [
    query_variable("model", 'label_values(vllm:e2e_request_latency_seconds_count{source="spans"}, model_name)',
                   "model_name on the vllm: series (gen_ai_request_model on the gen_ai ones)"),
    query_variable("engine", 'label_values(vllm:e2e_request_latency_seconds_count{source="spans"}, engine_kind)',
                   "engine_kind: vllm|sglang|tgi|triton|trtllm|dynamo|llm-d|genai, the engine kinds with "
                   "span-derived requests (gen_ai_provider_name on the gen_ai series, where llm-d's requests "
                   "are vllm)"),
    query_variable("gpu", 'label_values(DCGM_FI_DEV_GPU_UTIL{source="dcgm"}, gpu)',
                   "DCGM gpu index; also scopes the cost panels"),
    dash_b.ConstantVariable("gpu_hourly_cost").label("$ per GPU-hour").value("2.5")
    .description("Price of one GPU-hour in USD; edit to your contract."),
]


# ------------------------------------------------------------------------------------------------
# Assembly


def _target(query: Query, ref_id: str) -> prom_b.Dataquery:
    target = (prom_b.Dataquery().expr(query.expr).legend_format(query.legend).ref_id(ref_id)
              .exemplar(query.exemplar).datasource(PROMETHEUS))
    if query.table:
        return target.instant().format(prom_m.PromQueryFormat.TABLE)
    return target.range()


def _thresholds(steps: list[tuple[str, float | None]]) -> dash_b.ThresholdsConfig:
    return dash_b.ThresholdsConfig().mode(dash_m.ThresholdsMode.ABSOLUTE).steps(
        [dash_m.Threshold(color=color, value=value) for color, value in steps])


def _panel(panel: Panel, grid: dash_m.GridPos) -> Any:
    if panel.kind == "timeseries":
        builder = (ts_b.Panel().min(0).draw_style(common_m.GraphDrawStyle.LINE).line_width(1)
                   .fill_opacity(10 if panel.stacked else 0).show_points(common_m.VisibilityMode.NEVER)
                   .span_nulls(False)
                   .legend(common_b.VizLegendOptions().display_mode(common_m.LegendDisplayMode.TABLE)
                           .placement(common_m.LegendPlacement.BOTTOM).show_legend(True).calcs(["lastNotNull", "max"]))
                   .tooltip(common_b.VizTooltipOptions().mode(common_m.TooltipDisplayMode.MULTI)
                            .sort(common_m.SortOrder.DESCENDING)))
        if panel.stacked:
            builder = builder.stacking(common_b.StackingConfig().mode(common_m.StackingMode.NORMAL).group("A"))
    elif panel.kind == "stat":
        builder = (stat_b.Panel().thresholds(_thresholds(panel.steps))
                   .reduce_options(common_b.ReduceDataOptions().calcs(["lastNotNull"]).fields("").values(False))
                   .color_mode(common_m.BigValueColorMode.BACKGROUND).graph_mode(common_m.BigValueGraphMode.AREA)
                   .text_mode(common_m.BigValueTextMode.VALUE_AND_NAME))
    elif panel.kind == "table":
        builder = table_b.Panel().show_header(True).with_transformation(dash_m.DataTransformerConfig(
            id_val="organize", options={"excludeByName": {c: True for c in panel.hide_columns},
                                        "renameByName": panel.rename}))
        if panel.rename.get("Value") == "updated":  # overrides match the name after the organize rename
            builder = builder.override_by_name("updated", [dash_m.DynamicConfigValue(id_val="unit", value="dateTimeFromNow")])
    else:
        raise ValueError(panel.kind)
    builder = (builder.id(panel.id).title(panel.title).description(panel.description).datasource(PROMETHEUS)
               .grid_pos(grid).targets([_target(query, chr(ord("A") + i)) for i, query in enumerate(panel.queries)]))
    if panel.unit:
        builder = builder.unit(panel.unit)
    return builder


def build() -> dict[str, Any]:
    dashboard = (
        dash_b.Dashboard("LLM serving").uid("otel-llm-serving")
        .description('Span-derived LLM serving metrics from otel-llm (source="spans") next to the engines\' own '
                     'vllm: series (source="engine") and DCGM. Every vllm: query filters on source: the same names '
                     'come from both, and summing across sources double counts.')
        .tags(["llm", "otel-llm", "vllm", "slo"]).timezone("browser").editable()
        .tooltip(dash_m.DashboardCursorSync.CROSSHAIR).refresh("30s").time("now-3h", "now").version(1)
        .link(dash_b.DashboardLink("Tempo: slow and failed requests").type(dash_m.DashboardLinkType.LINK)
              .url("/explore").icon("external link"))
        # No annotation list: the SDK's schema has no `builtIn` flag, and Grafana adds its built-in
        # "Annotations & Alerts" entry to every dashboard that lacks one.
    )
    for variable in VARIABLES:
        dashboard = dashboard.with_variable(variable)
    # Layout: rows stacked; a row's panels left to right, wrapping before the 24-column edge.
    y = 0
    for r in ROWS:
        dashboard = dashboard.with_row(dash_b.Row(r.title).id(r.id).grid_pos(dash_m.GridPos(h=1, w=GRID_WIDTH, x=0, y=y)))
        y += 1
        x, line_h = 0, 0
        for panel in r.panels:
            if x + panel.w > GRID_WIDTH:
                x, y, line_h = 0, y + line_h, 0
            dashboard = dashboard.with_panel(_panel(panel, dash_m.GridPos(h=panel.h, w=panel.w, x=x, y=y)))
            x += panel.w
            line_h = max(line_h, panel.h)
        y += line_h
    return json.loads(json.dumps(dashboard.build(), cls=JSONEncoder))


def render() -> str:
    return json.dumps(build(), indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the committed JSON is not what this generates")
    parser.add_argument("--out", default=str(OUT), help="where to write (default: the committed JSON; - = stdout)")
    args = parser.parse_args(argv)
    text = render()
    if args.out == "-":
        sys.stdout.write(text)
        return 0
    args.out = Path(args.out)
    if args.check:
        if not args.out.exists() or args.out.read_text(encoding="utf-8") != text:
            print(f"{args.out} is stale: run {Path(__file__).name} to regenerate it", file=sys.stderr)
            return 1
        return 0
    args.out.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
