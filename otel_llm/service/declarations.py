"""What the native engine is built from, as data: the configuration and Python's declarations (the
shape table, the metric namings, the sampler's policies, the accounting's families, redaction's
rules) written as one JSON document, which ``rust/engine/src/declaration.rs`` compiles into the
engine's ``EngineConfig``. Each section is written from the very objects the Python reference
builds for the same configuration (``record_settings``, ``recorder_of``, ``build_policies``'
config, ``redaction_of``, ``digest_settings``), so the two implementations cannot be configured
apart: a setting read here is a setting both read.

Floats are written as their ``repr`` (read back bit for bit); the engine's differential corpora
(``rust/engine/tests/data/*``) use the same forms.
"""

from __future__ import annotations

import sys
from typing import Any

from otel_llm.processor.llm_metrics import segments
from otel_llm.processor.llm_metrics.adapters import shapes
from otel_llm.processor.llm_metrics.config import LlmMetricsProcessor
from otel_llm.processor.llm_metrics.digest import digest_settings
from otel_llm.processor.llm_metrics.metrics import definitions as d
from otel_llm.processor.llm_metrics.metrics.accounting import AccountingSettings, Objectives
from otel_llm.processor.llm_metrics.requests import RecordSettings
from otel_llm.processor.llm_metrics.stage import accounting_settings, record_settings, recorder_of
from otel_llm.processor.redaction.config import STATUS_MESSAGE_KEY, RedactionProcessor
from otel_llm.processor.redaction.stage import redaction_of
from otel_llm.processor.redaction.synthesis import ERROR_TYPE_KEY, Redaction
from otel_llm.processor.tail_sampling.config import (
    PolicyConfig, ProbabilisticPolicyConfig, SlowestPolicyConfig, TailSamplingProcessor, open_calls_per_sender)

# ``RateLimit``'s and ``SlowestPolicy``'s own bound on the models they keep apart.
MAX_MODELS = 1000


def number(value: float | None) -> str | None:
    return None if value is None else repr(float(value))


def floats(values: tuple[float, ...] | list[float]) -> list[str]:
    return [repr(float(v)) for v in values]


# --- records --------------------------------------------------------------------------------------

def record_settings_json(settings: RecordSettings, first_token_events: list[str]) -> dict[str, Any]:
    return {
        "resource_model_rules": [[rule.attribute, rule.values] for rule in settings.resource_model_rules],
        "default_model": settings.default_model,
        "default_operation": settings.default_operation,
        "model_from_service_name": settings.model_from_service_name,
        "edge_ttft_attributes": list(settings.edge_ttft_attributes),
        "first_token_events": first_token_events,
        "dimensions": [[dim.name, dim.attribute, sorted(dim.allowed), dim.other] for dim in settings.dimensions],
        "tenant": ([list(settings.tenant.attributes), sorted(settings.tenant.allowed), settings.tenant.other]
                   if settings.tenant else None),
        "max_latency_s": repr(settings.max_latency_s),
        "lora_adapters": settings.lora_adapters,
        "compensated_sum": sys.version_info >= (3, 12),  # CPython 3.12's sum() of floats compensates
    }


# --- metrics --------------------------------------------------------------------------------------

def _number_value(value: int | float | None) -> Any:
    if value is None:
        return None
    if isinstance(value, (bool, int)):
        return {"int": int(value)}
    return {"float": repr(float(value))}


def value_json(value: Any, counter_name: str = "") -> Any:
    if isinstance(value, d.Field):
        return {"field": value.name}
    if isinstance(value, d.Constant):
        return {"constant": _number_value(value.value)}
    if isinstance(value, d.Difference):
        return {"difference": [value.minuend, value.subtrahend]}
    if isinstance(value, d.Ratio):
        return {"ratio": [value.numerator, value.denominator,
                          None if value.offset is None else repr(float(value.offset))]}
    if isinstance(value, d.UnlessAtMost):
        return {"unless_at_most": [value.name, value.guard, value.limit]}
    if isinstance(value, d.IfSet):
        return {"if_set": [value.field, value_json(value.then)]}
    raise TypeError(f"{counter_name}: a value not declared as data: {value!r}")


def _per_step(per_step: Any) -> str | None:
    if per_step is None:
        return None
    if not isinstance(per_step, d.Field):
        raise TypeError(f"a per-step value not declared as a field: {per_step!r}")
    return per_step.name


def naming_json(naming: d.Naming) -> dict[str, Any]:
    labels = naming.labels
    if not isinstance(labels, d.Fields):
        raise TypeError(f"{naming.key}: labels not declared as fields")
    return {
        "key": naming.key,
        "side": naming.side,
        "label_names": list(naming.label_names),
        "labels": [[n.first, n.fallback] if isinstance(n, d.Either) else n for n in labels.names],
        "schema_url": naming.schema_url,
        "histograms": [{
            "name": h.name, "unit": h.unit, "description": h.description, "buckets": floats(h.buckets),
            "value": value_json(h.value), "success_only": h.success_only,
            "fixed_label": list(h.fixed_label) if h.fixed_label else None,
            "per_step": _per_step(h.per_step),
            "buckets_by_model": [[model, floats(bounds)] for model, bounds in h.buckets_by_model],
        } for h in naming.histograms],
        "counters": [{
            "name": c.name, "unit": c.unit, "description": c.description, "value": value_json(c.value, c.name),
            "by_outcome": c.by_outcome, "fixed_label": list(c.fixed_label) if c.fixed_label else None,
        } for c in naming.counters],
    }


def metrics_spec_json(namings: list[d.Naming], dimensions: tuple[str, ...], series_limit: int,
                      series_limit_bytes: int, max_label_value_bytes: int,
                      exponential: tuple[int, int] | None) -> dict[str, Any]:
    segment = d.SEGMENT_METRIC
    return {
        "namings": [naming_json(n) for n in namings],
        "segments": {"name": segment.name, "unit": segment.unit, "description": segment.description,
                     "buckets": floats(segment.buckets)},
        "dimension_names": list(dimensions),
        "series_limit": series_limit,
        "series_limit_bytes": series_limit_bytes,
        "max_label_value_bytes": max_label_value_bytes,
        "exponential": list(exponential) if exponential else None,
    }


def objectives_json(objectives: Objectives | None) -> dict[str, Any] | None:
    if objectives is None:
        return None
    return {"ttft_s": number(objectives.ttft_s), "tpot_s": number(objectives.tpot_s),
            "e2e_s": number(objectives.e2e_s), "target": number(objectives.target)}


def accounting_settings_json(settings: AccountingSettings) -> dict[str, Any]:
    return {
        "tokens": settings.tokens, "currency": settings.currency,
        "prices": {model: {"input": number(p.input), "output": number(p.output), "cached_input": number(p.cached_input)}
                   for model, p in settings.prices.items()},
        "default_objectives": objectives_json(settings.default_objectives),
        "objectives_by_model": {m: objectives_json(o) for m, o in settings.objectives_by_model.items()},
    }


def accounting_specs_json() -> dict[str, Any]:
    return {"families": [spec.name for spec in d.ACCOUNTING_METRICS],
            "specs": {spec.name: {"description": spec.description, "label_names": list(spec.label_names)}
                      for spec in d.ACCOUNTING_METRICS}}


# --- sampling and redaction ----------------------------------------------------------------------

def policy_json(policy: PolicyConfig) -> dict[str, Any]:
    out: dict[str, Any] = {"name": policy.name, "type": policy.type}
    if policy.type == "slo":
        assert policy.slo is not None
        out["thresholds"] = {m: number(v) for m, v in policy.slo.thresholds.items()}
        out["per_model"] = {model: {m: number(v) for m, v in limits.items()}
                            for model, limits in policy.slo.per_model.items()}
    elif policy.type == "slowest":
        slowest = policy.slowest or SlowestPolicyConfig()
        out.update(metrics=list(slowest.metrics), quantile=number(slowest.quantile), window=number(slowest.window))
    elif policy.type == "probabilistic":
        out["sampling_percentage"] = number((policy.probabilistic or ProbabilisticPolicyConfig()).sampling_percentage)
    return out


def sampler_json(config: TailSamplingProcessor) -> dict[str, Any]:
    """``TailSampler``'s policies and rate limit (its ``applies_to`` defaulting as it does)."""
    rate = config.rate_limit
    exempt = {p.name for p in config.policies if p.type == "errors"}
    applies_to = rate.applies_to or [p.name for p in config.policies if p.name not in exempt]
    return {"policies": [policy_json(p) for p in config.policies],
            "traces_per_second": number(rate.traces_per_second),
            "per_model_traces_per_second": number(rate.per_model_traces_per_second),
            "applies_to": list(applies_to), "max_models": MAX_MODELS}


def redaction_json(redaction: Redaction) -> dict[str, Any]:
    return {"key_prefixes": list(redaction.key_prefixes), "key_patterns": list(redaction.key_patterns),
            "event_names": sorted(redaction.event_names), "max_free_text_bytes": redaction.max_free_text_bytes,
            "allowed_keys": sorted(redaction.allowed_keys), "allowed_patterns": list(redaction.allowed_patterns),
            "metadata_keys": None if redaction.metadata_keys is None else sorted(redaction.metadata_keys),
            "url_keys": sorted(redaction.url_keys), "status_message_key": STATUS_MESSAGE_KEY,
            "error_type_key": ERROR_TYPE_KEY}


# --- the whole -----------------------------------------------------------------------------------

def engine_declaration(processors: dict[str, object], *, write_kept: bool, shards: int = 1,
                       clock_start_s: float = 0.0, exponential: tuple[int, int] | None = None) -> dict[str, Any]:
    """The engine's configuration for a traces pipeline's ``processors`` (name -> config, as
    ``graph.Pipeline`` takes them). ``write_kept``: the pipeline has kept-trace consumers;
    ``exponential``: ``(max_size, max_scale)`` where the Prometheus exporter keeps native histograms.

    Raises ``ValueError`` for a pipeline the engine does not run (no ``llm_metrics``: Python's
    chain builds no records then, which the engine does not mirror)."""
    metrics = processors.get("llm_metrics")
    if not isinstance(metrics, LlmMetricsProcessor):
        raise ValueError("the native engine runs pipelines with llm_metrics; this one has none")
    redaction = processors.get("redaction")
    if not isinstance(redaction, RedactionProcessor):
        raise ValueError("every traces pipeline has redaction")
    sampling = processors.get("tail_sampling")
    buffer = sampling if isinstance(sampling, TailSamplingProcessor) else TailSamplingProcessor()
    digest = digest_settings(metrics, redaction)
    recorder = recorder_of(metrics)
    accounting = accounting_settings(metrics)
    made_accounting = recorder.accounting is not None
    return {
        "table": shapes.declaration(),
        "ingest": {"max_attributes": digest.limits.max_attributes, "max_value_bytes": digest.limits.max_value_bytes,
                   "max_latency_s": repr(float(digest.max_latency_s)),
                   "max_tokens": segments.MAX_TOKENS_PER_REQUEST,
                   "abs_tolerance_s": repr(segments.ABS_TOLERANCE_S), "rel_tolerance": repr(segments.REL_TOLERANCE)},
        "assembly": {"decision_wait_s": repr(float(buffer.decision_wait)), "grace_s": repr(float(buffer.grace)),
                     "max_open_call_wait_s": repr(float(buffer.max_open_call_wait)),
                     "max_open_calls_per_sender": open_calls_per_sender(buffer),
                     "max_traces": buffer.num_traces, "max_spans_per_trace": buffer.max_spans_per_trace,
                     "decided_cache_size": buffer.decision_cache_size},
        "records": record_settings_json(record_settings(metrics), sorted(digest.first_token_events)),
        "sampler": sampler_json(sampling) if isinstance(sampling, TailSamplingProcessor) else None,
        "metrics": metrics_spec_json([bound.naming for bound in recorder.namings], recorder.dimension_names,
                                     metrics.series_limit, metrics.series_limit_mib * 1024 * 1024,
                                     metrics.max_label_value_bytes, exponential),
        "accounting": ({"settings": accounting_settings_json(accounting), **accounting_specs_json()}
                       if made_accounting else None),
        "redaction": redaction_json(redaction_of(redaction)),
        "write_kept": write_kept,
        "shards": shards,
        "clock_start_s": repr(float(clock_start_s)),
    }
