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
            seen.add(dim.name)
            if not dim.attribute:
                raise ConfigError(f"{where}.attribute", "required")
            if not dim.values:
                raise ConfigError(f"{where}.values", "required: the allow-list of label values (anything else becomes 'other')")


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
