"""``/api/ui/overview``: per (model, engine), over a window, request rate, error and abort ratio and
p50/p95/p99 of each latency family, plus small time series, the model's objectives
(``processors.llm_metrics.slo``: what "SLO met" counts), the tail-sampling ``slo`` policy's
thresholds (which traces it keeps) and the selector the cards' PromQL takes."""

from __future__ import annotations

import math
from typing import Any

from otel_llm.extension.webview.history import (LATENCY_METRICS, Group, History, Snapshot, delta, finite, groups_of,
                                                 outcome_delta)
from otel_llm.extension.webview.history import ADAPTER_REQUESTS, counter_delta
from otel_llm.extension.webview.quantile import quantile_of_counts

WINDOWS: dict[str, float | None] = {"5m": 300.0, "15m": 900.0, "1h": 3600.0, "start": None}
# The label the shipped scrape configs give otel-llm's series (collector-config/prometheus.yml, the
# Helm chart's monitors): with the engines' own /metrics scraped too, the same vllm: names count the
# same requests twice without it. /metrics itself has no such label: Prometheus adds it.
SOURCE_SELECTOR = 'source="spans"'

QUANTILES = (0.5, 0.95, 0.99)
MAX_POINTS = 120


def objectives(config: Any, model: str) -> dict[str, float]:
    """``model``'s objectives of ``processors.llm_metrics.slo`` (ttft, tpot, e2e; the default's where
    it has no entry): the thresholds its "SLO met" counts against."""
    slo = getattr(getattr(getattr(config, "processors", None), "llm_metrics", None), "slo", None)
    if slo is None:
        return {}
    mine = slo.objectives_for(model)
    return {key: value for key in ("ttft", "tpot", "e2e") if (value := getattr(mine, key)) is not None}


def slo_thresholds(config: Any) -> tuple[dict[str, float], dict[str, dict[str, float]]]:
    """The tail-sampling ``slo`` policies' thresholds (a request above one keeps its trace): the
    strictest limit per metric over every such policy, and per-model overrides."""
    overall: dict[str, float] = {}
    per_model: dict[str, dict[str, float]] = {}
    sampling = getattr(getattr(config, "processors", None), "tail_sampling", None)
    for policy in getattr(sampling, "policies", None) or []:
        slo = getattr(policy, "slo", None)
        if getattr(policy, "type", "") != "slo" or slo is None:
            continue
        for metric, limit in slo.thresholds.items():
            overall[metric] = min(limit, overall.get(metric, limit))
        for model, limits in slo.per_model.items():
            mine = per_model.setdefault(model, {})
            for metric, limit in limits.items():
                mine[metric] = min(limit, mine.get(metric, limit))
    return overall, per_model


def metric_catalogue(history: History) -> list[dict[str, Any]]:
    out = []
    for key, title, vllm, genai in LATENCY_METRICS:
        out.append({"key": key, "title": title, "vllm_name": vllm, "gen_ai_name": genai,
                    "source": history.naming.get(key, vllm)})
    return out


def _quantiles(counts: Any, bounds: tuple[float, ...]) -> dict[str, float | None]:
    out: dict[str, float | None] = {"count": counts[-1] if counts is not None and len(counts) else 0.0}
    for q in QUANTILES:
        out[f"p{round(q * 100)}"] = finite(quantile_of_counts(q, bounds, counts)) if counts is not None else None
    return out


def overview(history: History, config: Any, window: str) -> dict[str, Any]:
    if window not in WINDOWS:
        raise ValueError(f"window must be one of {', '.join(WINDOWS)}")
    window_s = WINDOWS[window]
    current = history.take()
    ring = history.snapshots()
    now = current.time
    base = history.base_for(now, window_s, ring)
    span_s = now - (base.time if base is not None else history.started)
    overall, per_model = slo_thresholds(config)
    # the chart's points: ring snapshots inside the window (all of it for "since start"), then now
    start_t = base.time if base is not None else -1.0
    points: list[Snapshot] = [s for s in ring if s.time >= start_t] + [current]
    if base is None:
        points = [Snapshot(history.started)] + points
    if len(points) > MAX_POINTS + 1:  # thin out evenly, keeping the first and the newest
        step = math.ceil((len(points) - 1) / MAX_POINTS)
        keep = list(range(len(points) - 1, -1, -step))[::-1]
        points = [points[i] for i in ([0] + keep if keep[0] != 0 else keep)]
    groups = []
    money = _money_keys(current)
    for group in groups_of([current]):
        groups.append(_group(history, current, base, points, group, span_s, overall, per_model, money))
        groups[-1]["objectives"] = objectives(config, group[0])
    on_cards = set().union(*current.services.values()) if current.services else set()
    return {
        "window": window, "window_seconds": span_s, "now": now, "started": history.started,
        "snapshot_interval": history.interval_s, "history_seconds": history.history_s,
        "metrics": metric_catalogue(history),
        "outcomes_metric": {"vllm_name": "vllm:request_success_total",
                            "gen_ai_name": "gen_ai_server_request_duration_seconds_count (error_type)"},
        "slo": overall, "groups": groups, "selector": SOURCE_SELECTOR,
        # Services with spans refused or intervals not measurable that no card shows (every span refused).
        "unmeasured_elsewhere": {service: reasons for service, reasons in sorted(current.unmeasured.items())
                                 if service not in on_cards},
    }


def _increase(current: Snapshot, base: Snapshot | None, key: tuple[str, ...]) -> float:
    before = base.accounting.get(key, 0.0) if base is not None else 0.0
    return max(0.0, current.accounting.get(key, 0.0) - before)  # a restart resets the counters


def _slo_attainment(current: Snapshot, base: Snapshot | None, group: Group) -> dict[str, Any] | None:
    """Over the window: requests of this card that met / missed their SLO, or were unmeasured, and
    met / (met + missed) (None without any measured request); None when no objective applies."""
    model, engine = group
    counts = {status: _increase(current, base, ("slo", model, engine, status))
              for status in ("met", "missed", "unmeasured")}
    if not any(("slo", model, engine, status) in current.accounting for status in counts):
        return None
    measured = counts["met"] + counts["missed"]
    return {**counts, "ratio": counts["met"] / measured if measured else None}


def _money_keys(current: Snapshot) -> dict[str, list[tuple[str, ...]]]:
    """The snapshot's cost and unpriced-token keys by model, looked up once per overview."""
    by_model: dict[str, list[tuple[str, ...]]] = {}
    for key in current.accounting:
        if key[0] in ("cost", "unpriced"):
            by_model.setdefault(key[1], []).append(key)
    return by_model


def _cost(current: Snapshot, base: Snapshot | None, keys: list[tuple[str, ...]]) -> dict[str, Any] | None:
    """Over the window: a model's cost by tenant (and in total) per currency, and its unpriced
    tokens by type (``keys``: the model's, from ``_money_keys``); None when the model has neither
    (no price table, or no tokens)."""
    if not keys:
        return None
    by_tenant: dict[str, dict[str, float]] = {}
    unpriced: dict[str, float] = {}
    for key in keys:
        if key[0] == "cost":
            by_tenant.setdefault(key[3], {})[key[2]] = _increase(current, base, key)
        else:
            unpriced[key[2]] = unpriced.get(key[2], 0.0) + _increase(current, base, key)
    return {"currencies": {currency: {"total": sum(tenants.values()), "by_tenant": dict(sorted(tenants.items()))}
                           for currency, tenants in sorted(by_tenant.items())},
            "unpriced_tokens": dict(sorted(unpriced.items()))}


def _group(history: History, current: Snapshot, base: Snapshot | None, points: list[Snapshot], group: Group,
           span_s: float, overall: dict[str, float], per_model: dict[str, dict[str, float]],
           money: dict[str, list[tuple[str, ...]]]) -> dict[str, Any]:
    model, engine = group
    outcomes = outcome_delta(current, base, group)
    requests = sum(outcomes.values())
    errors = outcomes.get("error", 0.0) + sum(v for k, v in outcomes.items() if k not in
                                              ("stop", "length", "abort", "error", "unknown", "ok"))
    metrics: dict[str, Any] = {}
    series: dict[str, Any] = {"t": [p.time for p in points[1:]], "rate": []}
    for a, b in zip(points, points[1:]):
        dt = b.time - a.time
        series["rate"].append(sum(outcome_delta(b, a, group).values()) / dt if dt > 0 else None)
    slo = {**overall, **per_model.get(model, {})}
    for key, _, _, _ in LATENCY_METRICS:
        family = history.naming.get(key)
        bounds = history.bounds.get(family or "")
        if not family or not bounds:
            continue
        counts = delta(current, base, family, group)
        if counts is None:
            continue
        metrics[key] = _quantiles(counts, bounds)
        lines: dict[str, list[float | None]] = {"p50": [], "p95": [], "p99": []}
        for a, b in zip(points, points[1:]):
            step = delta(b, a if a.histograms else None, family, group)
            q = _quantiles(step, bounds)
            for name in lines:
                lines[name].append(q[name])
        series[key] = lines
    return {
        "model": model, "engine": engine, "requests": requests,
        "slo_attainment": _slo_attainment(current, base, group),
        "cost": _cost(current, base, money.get(model, [])),
        # Per service behind this card, since start: spans refused and intervals not measurable, by reason.
        "unmeasured": {service: current.unmeasured[service] for service in sorted(current.services.get(group, ()))
                       if service in current.unmeasured},
        "rate": requests / span_s if span_s > 0 else None,
        "error_ratio": errors / requests if requests else None,
        "abort_ratio": outcomes.get("abort", 0.0) / requests if requests else None,
        "outcomes": outcomes, "metrics": metrics, "series": series,
        "accounting": accounting(current, base, group),
        "slo": {k: v for k, v in slo.items() if k in metrics or k in {m[0] for m in LATENCY_METRICS}},
    }


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    return numerator / denominator if numerator is not None and denominator else None


def accounting(current: Snapshot, base: Snapshot | None, group: Group) -> dict[str, Any]:
    """Prefix cache, speculative decoding and LoRA adapters over the window: only what requests'
    spans reported (a key is absent when its samples are)."""
    def grown(name: str) -> float | None:
        return counter_delta(current, base, name, group)

    out: dict[str, Any] = {}
    cached, computed = grown("otel_llm_prompt_tokens_cached_total"), grown("otel_llm_prompt_tokens_computed_total")
    if cached is not None and computed is not None:
        out["prompt_cache"] = {
            "cached_tokens": cached, "computed_tokens": computed,
            "cache_write_tokens": grown("otel_llm_prompt_tokens_cache_write_total"),
            "hit_ratio": _ratio(cached, cached + computed),  # token-weighted, as the recording rule
            "requests": grown("otel_llm_request_prefix_cache_hit_ratio_count"),
            "mean_request_hit_ratio": _ratio(grown("otel_llm_request_prefix_cache_hit_ratio_sum"),
                                             grown("otel_llm_request_prefix_cache_hit_ratio_count")),
        }
    accepted, steps = grown("vllm:spec_decode_num_accepted_tokens_total"), grown("vllm:spec_decode_num_drafts_total")
    per_request = _ratio(grown("otel_llm_request_spec_decode_acceptance_length_sum"),
                         grown("otel_llm_request_spec_decode_acceptance_length_count"))
    if per_request is not None or (accepted is not None and steps):
        pooled = _ratio(accepted, steps)
        out["spec_decode"] = {
            "accepted_tokens": accepted, "steps": steps,
            "pooled_acceptance_length": 1.0 + pooled if pooled is not None else None,
            "mean_request_acceptance_length": per_request,
            "requests": grown("otel_llm_request_spec_decode_acceptance_length_count"),
        }
    prefix = ADAPTER_REQUESTS + ":"
    model, engine = group
    adapters: dict[str, float | None] = {}
    for name, (base_model, base_engine) in current.counters:
        if not name.startswith(prefix) or base_engine != engine:
            continue
        adapter = name[len(prefix):]
        if base_model == model:
            adapters[adapter] = grown(name)
        if adapter == model:  # this card's model is a configured adapter (vLLM answers with its name)
            out["adapter_of"] = base_model
    if adapters:
        out["adapters"] = dict(sorted(adapters.items()))
    return out
