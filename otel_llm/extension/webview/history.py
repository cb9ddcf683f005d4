"""A bounded ring of snapshots of the cumulative histogram and outcome counters ``/metrics``
serves, summed per (model, engine). A window's numbers are the newest counts minus those of the
snapshot taken at the window's start (``increase`` without extrapolation); "since start" subtracts
nothing. Every percentile is computed from the merged, subtracted buckets."""

from __future__ import annotations

import logging
import math
import threading
import time
from array import array
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry

log = logging.getLogger(__name__)

# (key, title, vllm naming, gen_ai naming): the latency families the overview shows.
LATENCY_METRICS: tuple[tuple[str, str, str, str | None], ...] = (
    ("ttft", "TTFT", "vllm:time_to_first_token_seconds", "gen_ai_server_time_to_first_token_seconds"),
    ("tpot", "TPOT", "vllm:request_time_per_output_token_seconds", "gen_ai_server_time_per_output_token_seconds"),
    ("e2e", "e2e", "vllm:e2e_request_latency_seconds", "gen_ai_server_request_duration_seconds"),
    ("queue", "queue", "vllm:request_queue_time_seconds", None),
    ("gateway_overhead", "gateway overhead", "otel_llm_gateway_overhead_seconds", None),
)
# Per-request accounting (issue 26): counter and histogram sum/count samples summed per (model, engine),
# by sample name; adapter requests by adapter too. Absent until a request's spans report them.
ACCOUNTING_SAMPLES = frozenset({
    "otel_llm_prompt_tokens_cached_total", "otel_llm_prompt_tokens_computed_total",
    "otel_llm_prompt_tokens_cache_write_total",
    "otel_llm_request_prefix_cache_hit_ratio_sum", "otel_llm_request_prefix_cache_hit_ratio_count",
    "vllm:spec_decode_num_accepted_tokens_total", "vllm:spec_decode_num_drafts_total",
    "otel_llm_request_spec_decode_acceptance_length_sum", "otel_llm_request_spec_decode_acceptance_length_count",
})
ADAPTER_REQUESTS = "otel_llm_adapter_requests_total"
ACCOUNTING_FAMILIES = frozenset({name.rsplit("_", 1)[0] for name in ACCOUNTING_SAMPLES}
                                | {"otel_llm_request_prefix_cache_hit_ratio",
                                   "otel_llm_request_spec_decode_acceptance_length", "otel_llm_adapter_requests"})
OUTCOMES_FAMILY = "vllm:request_success"  # counter; samples vllm:request_success_total{finished_reason}
UNMEASURED_FAMILY = "otel_llm_service_unmeasured"  # counter; {service_name, reason}
# processors.llm_metrics' accounting counters (metrics/definitions.py ACCOUNTING_METRICS), for the cards.
SLO_FAMILY = "otel_llm_slo_requests"  # {model_name, engine_kind, slo}
COST_FAMILY = "otel_llm_request_cost"  # {model_name, tenant, currency}
UNPRICED_FAMILY = "otel_llm_unpriced_tokens"  # {model_name, tenant, token_type}
MAX_ACCOUNTING = 4 * 500  # accounting entries kept per snapshot (the families' own caps come first)
GENAI_DURATION = "gen_ai_server_request_duration_seconds"
MAX_GROUPS = 500  # (model, engine) pairs kept per snapshot; the families' own series caps come first
# The ring's memory: past it, every other snapshot of the older half is dropped (the oldest is kept,
# so every window still has a base; an old window's start is then up to a few intervals early).
HISTORY_BUDGET_BYTES = 64 * 1024 * 1024


def snapshot_bytes(snapshot: Snapshot) -> int:
    """An estimate of a snapshot's memory: its arrays, tuples, keys and dict slots."""
    return (sum(len(counts) * 8 + 200 for counts in snapshot.histograms.values()) + 150 * len(snapshot.outcomes)
            + 200 * len(snapshot.accounting) + 150 * len(snapshot.counters) + 200)

Group = tuple[str, str]  # (model, engine)


@dataclass
class Snapshot:
    time: float  # Unix seconds
    # (family, group) -> cumulative bucket counts in bound order, then count (requests for outcomes)
    histograms: dict[tuple[str, Group], array] = field(default_factory=dict)
    outcomes: dict[tuple[Group, str], float] = field(default_factory=dict)  # (group, finished_reason) -> total
    # Totals since start, for the cards: the services behind each group, and per service what was not
    # measured (spans refused, intervals not measurable) by reason.
    services: dict[Group, set[str]] = field(default_factory=dict)
    unmeasured: dict[str, dict[str, float]] = field(default_factory=dict)
    # Cumulative accounting totals: ("slo", model, engine, met|missed|unmeasured), ("cost", model,
    # tenant, currency), ("unpriced", model, token_type).
    accounting: dict[tuple[str, ...], float] = field(default_factory=dict)
    # (sample name, group) -> cumulative value: the accounting samples; adapter requests as
    # ("otel_llm_adapter_requests_total:<adapter>", group).
    counters: dict[tuple[str, Group], float] = field(default_factory=dict)

    def groups(self) -> set[Group]:
        """The (model, engine) pairs that have requests: the outcome counter's, which counts every
        request the latency families observe. A histogram series alone never makes a group: the
        two namings label engines differently (``engine_kind`` vs ``gen_ai.provider.name``, empty
        on a gateway-only record), so their pairs need not be ones that served anything."""
        return {g for (g, _), value in self.outcomes.items() if value > 0}


def _group_of(labels: dict[str, str], vllm: bool) -> Group:
    if vllm:
        return labels.get("model_name", ""), labels.get("engine_kind", "")
    model = labels.get("gen_ai_response_model") or labels.get("gen_ai_request_model") or ""
    return model, labels.get("gen_ai_provider_name", "")


class History:
    """Takes a snapshot every ``interval_s`` and keeps ``history_s`` of them."""

    def __init__(self, registry: CollectorRegistry, interval_s: float, history_s: float,
                 budget_bytes: int = HISTORY_BUDGET_BYTES) -> None:
        self.registry = registry
        self.interval_s = interval_s
        self.history_s = history_s
        self.bounds: dict[str, tuple[float, ...]] = {}  # family -> upper bounds, +Inf last
        self.naming: dict[str, str] = {}  # metric key -> the family the numbers come from
        self.started = time.time()
        self._ring: deque[Snapshot] = deque(maxlen=max(2, int(math.ceil(history_s / interval_s)) + 1))
        self.budget_bytes = budget_bytes
        self.ring_bytes = 0  # snapshot_bytes over the ring
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    # --- collection ------------------------------------------------------------------------

    def take(self) -> Snapshot:
        """A snapshot of the registry now (also used, unstored, as the newest point of a query)."""
        wanted = {vllm for _, _, vllm, _ in LATENCY_METRICS} | {g for _, _, _, g in LATENCY_METRICS if g}
        snapshot = Snapshot(time.time())
        bucket_rows: dict[tuple[str, Group], dict[float, float]] = {}
        genai_outcomes: dict[tuple[Group, str], float] = {}
        for family in self.registry.collect():
            name = family.name
            if name == OUTCOMES_FAMILY:
                for sample in family.samples:
                    if sample.name.endswith("_total"):
                        group = _group_of(sample.labels, True)
                        key = (group, sample.labels.get("finished_reason", "unknown"))
                        snapshot.outcomes[key] = snapshot.outcomes.get(key, 0.0) + sample.value
                        if sample.value > 0:
                            snapshot.services.setdefault(group, set()).add(sample.labels.get("service_name", ""))
                continue
            if name in (SLO_FAMILY, COST_FAMILY, UNPRICED_FAMILY):
                for sample in family.samples:
                    if not sample.name.endswith("_total") or "otel_metric_overflow" in sample.labels:
                        continue
                    labels = sample.labels
                    model = labels.get("model_name", "")
                    entry = (("slo", model, labels.get("engine_kind", ""), labels.get("slo", "")) if name == SLO_FAMILY
                           else ("cost", model, labels.get("tenant", ""), labels.get("currency", ""))
                           if name == COST_FAMILY else ("unpriced", model, labels.get("token_type", "")))
                    if entry in snapshot.accounting or len(snapshot.accounting) < MAX_ACCOUNTING:
                        snapshot.accounting[entry] = snapshot.accounting.get(entry, 0.0) + sample.value
                continue
            if name == UNMEASURED_FAMILY:
                for sample in family.samples:
                    if sample.name.endswith("_total") and sample.value > 0:
                        reasons = snapshot.unmeasured.setdefault(sample.labels.get("service_name", ""), {})
                        reasons[sample.labels.get("reason", "")] = sample.value
                continue
            if name in ACCOUNTING_FAMILIES:
                for sample in family.samples:
                    sample_name = sample.name
                    if sample_name == ADAPTER_REQUESTS:
                        sample_name = f"{ADAPTER_REQUESTS}:{sample.labels.get('adapter', '')}"
                    elif sample_name not in ACCOUNTING_SAMPLES:
                        continue
                    slot = (sample_name, _group_of(sample.labels, True))
                    if slot in snapshot.counters or len(snapshot.counters) < MAX_GROUPS * 16:
                        snapshot.counters[slot] = snapshot.counters.get(slot, 0.0) + sample.value
                continue
            if name not in wanted:
                continue
            vllm = not name.startswith("gen_ai_")
            for sample in family.samples:
                if sample.name == name + "_bucket":
                    group = _group_of(sample.labels, vllm)
                    row = bucket_rows.setdefault((name, group), {})
                    bound = float(sample.labels["le"])
                    row[bound] = row.get(bound, 0.0) + sample.value
                elif sample.name == name + "_count" and name == GENAI_DURATION:
                    error = sample.labels.get("error_type", "")
                    key = (_group_of(sample.labels, False), error or "ok")
                    genai_outcomes[key] = genai_outcomes.get(key, 0.0) + sample.value
        for (name, group), row in bucket_rows.items():
            bounds = self.bounds.get(name)
            if bounds is None or len(bounds) != len(row):
                self.bounds[name] = tuple(sorted(row))
        for metric, vllm_name, genai_name in ((k, v, g) for k, _, v, g in LATENCY_METRICS):
            self.naming[metric] = (vllm_name if vllm_name in self.bounds or genai_name is None
                                   or genai_name not in self.bounds else genai_name)
        # Only the families the numbers come from are kept: the other naming's series would be
        # grouped by other labels (and cost memory for nothing).
        used = set(self.naming.values())
        for (name, group), row in bucket_rows.items():
            if name in used and len(snapshot.histograms) < MAX_GROUPS * len(used):
                snapshot.histograms[(name, group)] = array("d", (row.get(b, 0.0) for b in self.bounds[name]))
        if not snapshot.outcomes and genai_outcomes:  # vllm naming off: outcomes from error.type
            snapshot.outcomes = genai_outcomes
        return snapshot

    def record(self) -> None:
        snapshot = self.take()
        with self._lock:
            ring = self._ring
            if ring.maxlen is not None and len(ring) == ring.maxlen:
                self.ring_bytes -= snapshot_bytes(ring[0])
            ring.append(snapshot)
            self.ring_bytes += snapshot_bytes(snapshot)
            while self.ring_bytes > self.budget_bytes and len(ring) > 3:
                # Thin the older half (keeping its first): windows keep a base, charts a coarser past.
                items = list(ring)
                half = len(items) // 2
                kept = [items[0]] + items[1:half][1::2] + items[half:]
                if len(kept) == len(items):
                    break
                self._ring = ring = deque(kept, maxlen=ring.maxlen)
                self.ring_bytes = sum(snapshot_bytes(s) for s in kept)

    def start(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="webview-history", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()

    def _run(self) -> None:
        while not self._stopped.wait(self.interval_s):
            try:
                self.record()
            except Exception:  # noqa: BLE001 - a failed snapshot must not stop the next ones
                log.exception("web view: metrics snapshot failed")

    def snapshots(self) -> list[Snapshot]:
        with self._lock:
            return list(self._ring)

    def base_for(self, now: float, window_s: float | None, ring: list[Snapshot]) -> Snapshot | None:
        """The newest snapshot at or before ``now - window`` (None: subtract nothing, i.e. since start)."""
        if window_s is None:
            return None
        cut = now - window_s
        base = None
        for snapshot in ring:
            if snapshot.time <= cut + 1e-6:
                base = snapshot
            else:
                break
        return base


def delta(new: Snapshot, old: Snapshot | None, name: str, group: Group) -> array | None:
    counts = new.histograms.get((name, group))
    if counts is None:
        return None
    if old is None:
        return counts
    before = old.histograms.get((name, group))
    if before is None or len(before) != len(counts):
        return counts
    # A counter that went down was reset (a restart cannot happen in-process; kept for safety).
    return array("d", (c - b if c >= b else c for c, b in zip(counts, before)))


def outcome_delta(new: Snapshot, old: Snapshot | None, group: Group) -> dict[str, float]:
    out: dict[str, float] = {}
    for (g, reason), value in new.outcomes.items():
        if g != group:
            continue
        before = old.outcomes.get((g, reason), 0.0) if old is not None else 0.0
        out[reason] = value - before if value >= before else value
    return out


def counter_delta(new: Snapshot, old: Snapshot | None, name: str, group: Group) -> float | None:
    """An accounting sample's growth over the window; None where the sample does not exist."""
    value = new.counters.get((name, group))
    if value is None:
        return None
    before = old.counters.get((name, group), 0.0) if old is not None else 0.0
    return value - before if value >= before else value


def finite(value: float) -> float | None:
    return value if isinstance(value, float) and math.isfinite(value) else None


def groups_of(snapshots: Iterable[Snapshot]) -> list[Group]:
    seen: set[Group] = set()
    for snapshot in snapshots:
        seen |= snapshot.groups()
    return sorted(seen)


