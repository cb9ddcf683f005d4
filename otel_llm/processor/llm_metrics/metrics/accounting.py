"""Tenant tokens, their cost and SLO attainment, per request record: counters beside the namings.

Which records: tokens and cost count every server-side record, and the client-side records that no
engine span served (``joined_span_id`` empty: a gateway or SDK calling a provider whose engine sends
no spans), so a request is never counted twice. SLO attainment counts server-side records only.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from prometheus_client.metrics_core import Metric

from otel_llm.pdata.records import RequestRecord, Side
from otel_llm.processor.llm_metrics.metrics.definitions import (
    REQUEST_COST,
    SLO_REQUESTS,
    SLO_TARGET,
    TENANT_TOKENS,
    UNPRICED_TOKENS,
)
from otel_llm.processor.llm_metrics.metrics.families import CounterFamily, Family, Key, SeriesBudget

PER_MILLION = 1e6
MET, MISSED, UNMEASURED = "met", "missed", "unmeasured"
TOKEN_TYPES = ("input", "cached_input", "output")  # in token_split's order


@dataclass(frozen=True, slots=True)
class Price:
    """Per million tokens; None = not priced."""

    input: float | None
    output: float | None
    cached_input: float | None  # None: a cached prompt token costs ``input``


@dataclass(frozen=True, slots=True)
class Objectives:
    ttft_s: float | None
    tpot_s: float | None
    e2e_s: float | None
    target: float | None

    @property
    def any(self) -> bool:
        return self.ttft_s is not None or self.tpot_s is not None or self.e2e_s is not None


@dataclass(frozen=True, slots=True)
class AccountingSettings:
    tokens: bool  # a tenant or a price table is configured
    currency: str
    prices: dict[str, Price]  # model label -> prices
    default_objectives: Objectives | None
    objectives_by_model: dict[str, Objectives]  # merged with the default already


def slo_status(record: RequestRecord, objectives: Objectives) -> str:
    """``missed`` when the request failed or a reported quantity exceeds its threshold; else
    ``unmeasured`` when a configured quantity was not reported; else ``met``."""
    if not record.succeeded:
        return MISSED
    unmeasured = False
    for threshold, value in ((objectives.ttft_s, record.ttft_s), (objectives.tpot_s, record.tpot_s),
                             (objectives.e2e_s, record.e2e_s)):
        if threshold is None:
            continue
        if value is None:
            unmeasured = True
        elif value > threshold:  # le semantics, as a histogram bucket: value == threshold meets it
            return MISSED
    return UNMEASURED if unmeasured else MET


def token_split(record: RequestRecord) -> tuple[int | None, int | None, int | None]:
    """(input not from a cache, cached input, output). Cached tokens more than the prompt's are not
    a split anyone can price: the prompt is counted as input, the cached count is left out."""
    prompt, cached = record.prompt_tokens, record.cached_tokens
    if prompt is not None and cached is not None and 0 <= cached <= prompt:
        return prompt - cached, cached, record.completion_tokens
    return prompt, None, record.completion_tokens


class Accounting:
    """The counters; the recorder calls ``record`` under its lock and the exposition ``collect``s."""

    def __init__(self, settings: AccountingSettings, series_limit: int, budget: SeriesBudget,
                 max_label_value_bytes: int) -> None:
        self.settings = settings
        self.max_label_value_bytes = max_label_value_bytes
        self.families: dict[str, CounterFamily] = {}
        for spec in (TENANT_TOKENS, REQUEST_COST, UNPRICED_TOKENS, SLO_REQUESTS):
            self.families[spec.name] = CounterFamily(spec.name, series_limit, budget, label_names=spec.label_names)
        self.targets: dict[str, float] = {}  # model label -> target, for models counted
        self._targets_limit = series_limit
        self._slo = self.families[SLO_REQUESTS.name]
        self._tokens = self.families[TENANT_TOKENS.name]
        self._unpriced = self.families[UNPRICED_TOKENS.name]
        self._cost = self.families[REQUEST_COST.name]
        self._plans: dict[tuple[str, str], tuple[Objectives | None, tuple[float | None, ...] | None, bool]] = {}
        self._plans_limit = 4 * series_limit + 64

    def objectives_of(self, model: str) -> Objectives | None:
        found = self.settings.objectives_by_model.get(model, self.settings.default_objectives)
        return found if found is not None and found.any else None

    def _add(self, family: CounterFamily, key: Key, too_long: bool, amount: float) -> None:
        if too_long:
            family.add_overflow(amount)
        else:
            family.add(key, amount)

    def _too_long(self, *values: str) -> bool:
        limit = self.max_label_value_bytes
        return any(len(v) > limit // 4 and len(v.encode("utf-8", "replace")) > limit for v in values)

    def _plan(self, model: str, tenant: str) -> tuple[Objectives | None, tuple[float | None, ...] | None, bool]:
        """Per (model, tenant), resolved once: the objectives, the per-million prices by token type
        (input, cached_input, output; None = no price table entry) and whether a label is too long."""
        cache_key = (model, tenant)
        plan = self._plans.get(cache_key)
        if plan is None:
            if len(self._plans) >= self._plans_limit:  # bounded whatever the label values
                self._plans.clear()
            price = self.settings.prices.get(model)
            per_million = None if price is None else (
                price.input, price.cached_input if price.cached_input is not None else price.input, price.output)
            plan = self._plans[cache_key] = (self.objectives_of(model), per_million, self._too_long(model, tenant))
        return plan

    def record(self, record: RequestRecord) -> None:
        weight = record.weight
        model, tenant = record.model, record.tenant
        objectives, per_million, too_long = self._plan(model, tenant)
        if objectives is not None and record.side == Side.SERVER:
            engine_kind = record.engine_kind
            self._add(self._slo, (model, engine_kind, slo_status(record, objectives)),
                      too_long or self._too_long(engine_kind), weight)
            if objectives.target is not None and (model in self.targets or len(self.targets) < self._targets_limit):
                self.targets[model] = objectives.target
        if not self.settings.tokens or (record.side != Side.SERVER and record.joined_span_id):
            return
        counts = token_split(record)
        cost = 0.0
        priced = False
        for position, count in enumerate(counts):
            if not count:
                continue
            token_type = TOKEN_TYPES[position]
            amount = count * weight
            self._add(self._tokens, (model, tenant, token_type), too_long, amount)
            if not self.settings.prices:
                continue
            price = per_million[position] if per_million is not None else None
            if price is None:
                self._add(self._unpriced, (model, tenant, token_type), too_long, amount)
            else:
                cost += amount * price / PER_MILLION
                priced = True
        if priced:
            self._add(self._cost, (model, tenant, self.settings.currency), too_long, cost)

    def collect(self, overflow_labels: dict[str, str]) -> Iterator[Metric]:
        """Called under the recorder's lock; ``overflow_labels`` mark the overflow series, as on the namings'."""
        for spec in (TENANT_TOKENS, REQUEST_COST, UNPRICED_TOKENS, SLO_REQUESTS):
            family = self.families[spec.name]
            if not family.series:
                continue
            metric = Metric(spec.name, spec.description, "counter")
            for key, value in family.totals().items():
                labels = dict(overflow_labels) if key == Family.OVERFLOW else dict(zip(spec.label_names, key))
                metric.add_sample(spec.name + "_total", labels, value)
            yield metric
        if self.targets:
            gauge = Metric(SLO_TARGET.name, SLO_TARGET.description, "gauge")
            for model, target in sorted(self.targets.items()):
                gauge.add_sample(SLO_TARGET.name, {"model_name": model}, target)
            yield gauge
