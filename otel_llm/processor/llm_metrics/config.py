"""``processors.llm_metrics``: which namings, label limits, model names, extra dimensions, edge TTFT."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import re

from otel_llm.confmap import ConfigError, Duration, PositiveInt


@dataclass(frozen=True)
class Namings:
    vllm: bool = True
    gen_ai: bool = True
    # Which GenAI conventions the gen_ai naming follows: "1.41" (semconv v1.41.0) or "0.1"
    # (semantic-conventions-genai v0.1.0); definitions.GENAI_VERSIONS.
    gen_ai_version: str = "1.41"


@dataclass(frozen=True)
class ResourceModelRuleConfig:
    attribute: str = "service.name"
    values: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ModelNameConfig:
    from_resource: list[ResourceModelRuleConfig] = field(default_factory=list)
    # A bare vLLM's spans carry no model: the service name its user set (OTEL_SERVICE_NAME) is the
    # one name for the deployment they chose; the SDK's "unknown_service..." placeholder never is.
    from_service_name: bool = True
    default: str = ""  # empty: no model label value is made up


@dataclass(frozen=True)
class DimensionConfig:
    name: str = ""
    attribute: str = ""
    values: list[str] = field(default_factory=list)
    other: str = "other"


@dataclass(frozen=True)
class EdgeTtftConfig:
    attributes: list[str] = field(default_factory=lambda: ["gen_ai.server.time_to_first_token"])
    events: list[str] = field(default_factory=lambda: ["gen_ai.first_token", "first_token"])


@dataclass(frozen=True)
class TenantConfig:
    """The ``tenant`` label of the token and cost counters: the first of ``attributes`` a request's
    spans carry (engine span, then the gateway and client spans joined with it, then the resource),
    kept when it is in ``values``, else ``other``; "" when no span carries one."""

    attributes: list[str] = field(default_factory=list)
    values: list[str] = field(default_factory=list)
    other: str = "other"


@dataclass(frozen=True)
class ModelPriceConfig:
    """Prices per million tokens in ``cost.currency``; a token kind without a price is not priced
    (counted in ``otel_llm_unpriced_tokens_total``). ``cached_input`` unset: a cached prompt token
    costs ``input``."""

    input: float | None = None
    output: float | None = None
    cached_input: float | None = None


@dataclass(frozen=True)
class CostConfig:
    currency: str = ""  # ISO 4217 code, e.g. USD: the ``currency`` label of the cost counter
    prices: dict[str, ModelPriceConfig] = field(default_factory=dict)  # model label -> its prices


@dataclass(frozen=True)
class SloObjectivesConfig:
    """Thresholds a request must not exceed (value <= threshold meets it) and the attainment target."""

    ttft: Duration | None = None
    tpot: Duration | None = None
    e2e: Duration | None = None
    target: float | None = None  # the ratio met / (met + missed) the alert compares against


@dataclass(frozen=True)
class SloConfig:
    default: SloObjectivesConfig = field(default_factory=SloObjectivesConfig)
    # model label -> objectives; each field set here replaces the default's for that model
    models: dict[str, SloObjectivesConfig] = field(default_factory=dict)

    def objectives_for(self, model: str) -> SloObjectivesConfig:
        override = self.models.get(model)
        if override is None:
            return self.default
        return SloObjectivesConfig(*(getattr(override, k) if getattr(override, k) is not None
                                     else getattr(self.default, k) for k in ("ttft", "tpot", "e2e", "target")))


@dataclass(frozen=True)
class LlmMetricsProcessor:
    namings: Namings = field(default_factory=Namings)
    max_model_len: PositiveInt = 131072
    # model label -> that model's max_model_len: its token histograms get vLLM's buckets for it.
    max_model_len_by_model: dict[str, int] = field(default_factory=dict)
    series_limit: PositiveInt = 2000
    # The series cap in bytes: the estimated exposition of every metric's series together (MiB).
    series_limit_mib: PositiveInt = 16
    # A label value longer than this (UTF-8 bytes) never gets a series: its observations go to the
    # overflow series, counted (otel_llm_label_values_too_long_total).
    max_label_value_bytes: PositiveInt = 256
    default_operation_name: str = ""
    max_latency: Duration = 86400.0
    model_name: ModelNameConfig = field(default_factory=ModelNameConfig)
    dimensions: list[DimensionConfig] = field(default_factory=list)
    edge_time_to_first_token: EdgeTtftConfig = field(default_factory=EdgeTtftConfig)
    tenant: TenantConfig = field(default_factory=TenantConfig)
    cost: CostConfig = field(default_factory=CostConfig)
    slo: SloConfig = field(default_factory=SloConfig)
    # LoRA adapter name -> its base model, as vLLM's --lora-modules names them: a request naming one
    # is counted per adapter (otel_llm_adapter_*). Empty: no adapter label anywhere.
    lora_adapters: dict[str, str] = field(default_factory=dict)

    BOUNDS: ClassVar[dict[str, tuple[float, float]]] = {
        "max_model_len": (1, 1 << 30),
        "series_limit": (1, 10_000_000),
        "series_limit_mib": (1, 65_536),
        "max_label_value_bytes": (16, 65_536),
        "max_latency": (0.001, 365 * 86400.0),
    }

    def validate(self, path: str) -> None:
        from otel_llm.processor.llm_metrics.metrics.definitions import GENAI_VERSIONS

        if self.namings.gen_ai_version not in GENAI_VERSIONS:
            raise ConfigError(f"{path}.namings.gen_ai_version",
                              f"expected one of {', '.join(repr(v) for v in GENAI_VERSIONS)} (the GenAI conventions "
                              f"semconv v1.41.0 or semantic-conventions-genai v0.1.0), got "
                              f"{self.namings.gen_ai_version!r}")
        if not self.namings.gen_ai and self.namings.gen_ai_version != "1.41":
            raise ConfigError(f"{path}.namings.gen_ai_version", "applies only with namings.gen_ai: true")
        low, high = self.BOUNDS["max_model_len"]
        for model, length in self.max_model_len_by_model.items():
            if isinstance(length, bool) or not isinstance(length, int) or not low <= length <= high:
                raise ConfigError(f"{path}.max_model_len_by_model.{model}",
                                  f"must be an integer between {int(low)} and {int(high)}, got {length!r}")
        for adapter, base in self.lora_adapters.items():
            if not isinstance(base, str) or not base or not adapter:
                raise ConfigError(f"{path}.lora_adapters.{adapter}",
                                  f"must map a non-empty adapter name to its non-empty base model, got {base!r}")
            if adapter == base:
                raise ConfigError(f"{path}.lora_adapters.{adapter}", "an adapter's name must differ from its base model")
        seen: set[str] = set()
        reserved: set[str] = set()
        for i, dim in enumerate(self.dimensions):
            where = f"{path}.dimensions[{i}]"
            if not re.fullmatch(r"[a-zA-Z_][a-zA-Z0-9_]*", dim.name):
                raise ConfigError(f"{where}.name", f"must be a Prometheus label name, got {dim.name!r}")
            if dim.name in seen:
                raise ConfigError(f"{where}.name", f"duplicate dimension {dim.name!r}")
            if dim.name.startswith("__") or dim.name in (reserved := reserved or _reserved_label_names()):
                raise ConfigError(f"{where}.name",
                                  f"{dim.name!r} is a label the metrics have already (or Prometheus reserves)")
            if self.lora_adapters and dim.name == "adapter":
                raise ConfigError(f"{where}.name", "'adapter' is the label of the LoRA adapter counters (lora_adapters)")
            seen.add(dim.name)
            if not dim.attribute:
                raise ConfigError(f"{where}.attribute", "required")
            if not dim.values:
                raise ConfigError(f"{where}.values", "required: the allow-list of label values (anything else becomes 'other')")
            if self.tenant.attributes and dim.name == "tenant":
                raise ConfigError(f"{where}.name", "'tenant' is the label of the tenant block (tenant.attributes)")
        _validate_tenant(self.tenant, f"{path}.tenant")
        _validate_cost(self.cost, f"{path}.cost")
        _validate_slo(self.slo, f"{path}.slo")


_CURRENCY = re.compile(r"[A-Z]{3}")


def _validate_tenant(tenant: TenantConfig, path: str) -> None:
    if tenant.values and not tenant.attributes:
        raise ConfigError(f"{path}.attributes", "required with tenant.values: the span attribute(s) naming the tenant")
    if not tenant.attributes:
        return
    if not tenant.values:
        raise ConfigError(f"{path}.values", "required: the allow-list of tenants (anything else becomes "
                                            f"{tenant.other!r}); a tenant label without one is unbounded")
    for i, attribute in enumerate(tenant.attributes):
        if not attribute:
            raise ConfigError(f"{path}.attributes[{i}]", "must not be empty")
    if not tenant.other:
        raise ConfigError(f"{path}.other", "must not be empty: it is the label of every tenant not allowed")
    if "" in tenant.values:
        raise ConfigError(f"{path}.values", "must not contain '': that is the label of a request without a tenant")


def _validate_cost(cost: CostConfig, path: str) -> None:
    if cost.currency and not _CURRENCY.fullmatch(cost.currency):
        raise ConfigError(f"{path}.currency", f"must be an ISO 4217 code like USD or EUR, got {cost.currency!r}")
    if cost.prices and not cost.currency:
        raise ConfigError(f"{path}.currency", "required with cost.prices: the currency the prices are in")
    if cost.currency and not cost.prices:
        raise ConfigError(f"{path}.prices", "required with cost.currency: the prices per model (nothing is priced without)")
    for model, price in cost.prices.items():
        where = f"{path}.prices.{model}"
        if price.input is None and price.output is None and price.cached_input is None:
            raise ConfigError(where, "set at least one of input, output, cached_input (per million tokens)")
        for kind in ("input", "output", "cached_input"):
            value = getattr(price, kind)
            if value is not None and value < 0:
                raise ConfigError(f"{where}.{kind}", f"a price must not be negative, got {value!r}")


def _validate_slo(slo: SloConfig, path: str) -> None:
    for where, objectives in [(f"{path}.default", slo.default),
                              *((f"{path}.models.{m}", o) for m, o in slo.models.items())]:
        for kind in ("ttft", "tpot", "e2e"):
            value = getattr(objectives, kind)
            if value is not None and value <= 0:
                raise ConfigError(f"{where}.{kind}", f"an objective must be a positive duration, got {value!r}")
        if objectives.target is not None and not 0 < objectives.target <= 1:
            raise ConfigError(f"{where}.target", f"must be a ratio in (0, 1], got {objectives.target!r}")
    for model, objectives in slo.models.items():
        if all(getattr(objectives, k) is None for k in ("ttft", "tpot", "e2e", "target")):
            raise ConfigError(f"{path}.models.{model}", "set at least one of ttft, tpot, e2e, target")
    for model in slo.models:
        merged = slo.objectives_for(model)
        if merged.target is not None and all(getattr(merged, k) is None for k in ("ttft", "tpot", "e2e")):
            raise ConfigError(f"{path}.models.{model}.target", "a target needs at least one objective (ttft, tpot, e2e)")
    if slo.default.target is not None and all(getattr(slo.default, k) is None for k in ("ttft", "tpot", "e2e")) \
            and not slo.models:
        raise ConfigError(f"{path}.default.target", "a target needs at least one objective (ttft, tpot, e2e)")


def _reserved_label_names() -> set[str]:
    """Label names the metric namings use already, and Prometheus's own: a dimension named like one
    would give series with a duplicate label, which Prometheus rejects with the whole scrape."""
    from otel_llm.processor.llm_metrics.metrics import definitions

    names = {"le", "quantile", "segment", "finished_reason"}
    namings = [definitions.genai_naming(), definitions.own_naming(), definitions.vllm_naming(1)]
    namings += [definitions.genai_client_naming(version) for version in definitions.GENAI_VERSIONS]
    for naming in namings:
        names.update(definitions.prometheus_label_name(n) for n in naming.label_names)
        fixed = [spec.fixed_label for spec in naming.histograms] + [spec.fixed_label for spec in naming.counters]
        names.update(definitions.prometheus_label_name(label[0]) for label in fixed if label)
    return names
