"""``processors.tail_sampling``: how long a trace is buffered, how many, and the policies that keep it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from otel_llm.confmap import ConfigError, Duration, PositiveInt


_POLICY_METRICS = ("ttft", "tpot", "e2e", "queue", "gateway_overhead")


@dataclass(frozen=True)
class SloPolicyConfig:
    thresholds: dict[str, Duration] = field(default_factory=dict)  # metric -> limit: ttft, tpot, e2e, queue, gateway_overhead
    per_model: dict[str, dict[str, Duration]] = field(default_factory=dict)


@dataclass(frozen=True)
class SlowestPolicyConfig:
    metrics: list[str] = field(default_factory=lambda: ["ttft", "e2e"])
    quantile: float = 0.99
    window: Duration = 600.0

    BOUNDS: ClassVar[dict[str, tuple[float, float]]] = {
        "window": (0.001, 30 * 86400.0),
    }


@dataclass(frozen=True)
class ProbabilisticPolicyConfig:
    sampling_percentage: float = 1.0


@dataclass(frozen=True)
class PolicyConfig:
    name: str = ""
    type: str = ""  # errors | slo | slowest | probabilistic
    slo: SloPolicyConfig | None = None
    slowest: SlowestPolicyConfig | None = None
    probabilistic: ProbabilisticPolicyConfig | None = None


def default_policies() -> list[PolicyConfig]:
    """Every error and abort, every request above its model's rolling p99 of TTFT or e2e, a 1 % baseline."""
    return [
        PolicyConfig(name="errors", type="errors"),
        PolicyConfig(name="slowest", type="slowest", slowest=SlowestPolicyConfig()),
        PolicyConfig(name="baseline", type="probabilistic", probabilistic=ProbabilisticPolicyConfig()),
    ]


@dataclass(frozen=True)
class RateLimitConfig:
    traces_per_second: float = 0.0  # 0 = unlimited
    per_model_traces_per_second: float = 0.0
    applies_to: list[str] = field(default_factory=list)  # policy names; empty = every policy but errors

    BOUNDS: ClassVar[dict[str, tuple[float, float]]] = {
        "traces_per_second": (0.0, 1_000_000.0),
        "per_model_traces_per_second": (0.0, 1_000_000.0),
    }


# How long an engine usually holds a finished request's span before sending it: vLLM (0.32
# vllm/tracing/otel.py:85) exports through the OpenTelemetry SDK's BatchSpanProcessor, which sends
# every OTEL_BSP_SCHEDULE_DELAY, 5000 ms unless set (opentelemetry-sdk 1.45 sdk/trace/export/__init__.py:41).
# A trace decided before its engine's span comes loses the join: with decision_wait 3 s, 7 of 12
# requests of the real openai client -> LiteLLM proxy -> vLLM 0.32 chain lost theirs.
ENGINE_EXPORT_DELAY_S = 5.0


@dataclass(frozen=True)
class TailSamplingProcessor:
    decision_wait: Duration = 10.0
    grace: Duration = 1.0
    # A trace holding a CLIENT span whose parent has not arrived (a call still in flight: a GenAI
    # client span ends after the HTTP span under it, a stream after minutes) is held past
    # decision_wait until that parent comes: while no engine span came, and decision_wait after one
    # did; at most this long after it was first seen. 0: off.
    max_open_call_wait: Duration = 600.0
    # The share of num_traces one sender's held traces may take (the sender: the service.name of the
    # CLIENT span in flight); past it that sender's longest-held trace is completed (open_call_limit).
    # 0: no bound of their own (a full buffer still completes held traces first).
    max_open_call_share: float = 0.25
    num_traces: PositiveInt = 50_000
    max_spans_per_trace: PositiveInt = 10_000
    decision_cache_size: PositiveInt = 100_000
    policies: list[PolicyConfig] = field(default_factory=default_policies)
    rate_limit: RateLimitConfig = field(default_factory=RateLimitConfig)

    BOUNDS: ClassVar[dict[str, tuple[float, float]]] = {
        "decision_wait": (0.0, 86400.0),
        "grace": (0.0, 86400.0),
        "max_open_call_wait": (0.0, 86400.0),
        "max_open_call_share": (0.0, 1.0),
        "num_traces": (1, 10_000_000),
        "max_spans_per_trace": (1, 10_000_000),
        "decision_cache_size": (1, 100_000_000),
    }

    def validate(self, path: str) -> None:
        names: set[str] = set()
        for i, policy in enumerate(self.policies):
            where = f"{path}.policies[{i}]"
            if not policy.name:
                raise ConfigError(f"{where}.name", "required")
            if policy.name in names:
                raise ConfigError(f"{where}.name", f"duplicate policy name {policy.name!r}")
            names.add(policy.name)
            if policy.type not in ("errors", "slo", "slowest", "probabilistic"):
                raise ConfigError(f"{where}.type", f"expected errors, slo, slowest or probabilistic, got {policy.type!r}")
            block = getattr(policy, policy.type, None) if policy.type != "errors" else None
            if policy.type == "slo":
                if block is None or not (block.thresholds or block.per_model):
                    raise ConfigError(f"{where}.slo.thresholds", "required: e.g. {ttft: 2s, e2e: 30s}")
                for key in list(block.thresholds) + [m for limits in block.per_model.values() for m in limits]:
                    if key not in _POLICY_METRICS:
                        raise ConfigError(f"{where}.slo", f"unknown metric {key!r}; expected one of {', '.join(_POLICY_METRICS)}")
            elif policy.type == "slowest":
                block = block or SlowestPolicyConfig()
                if not 0 < block.quantile < 1:
                    raise ConfigError(f"{where}.slowest.quantile", f"must be between 0 and 1, got {block.quantile}")
                for metric in block.metrics:
                    if metric not in _POLICY_METRICS:
                        raise ConfigError(f"{where}.slowest.metrics", f"unknown metric {metric!r}")
                if block.window <= 0:
                    raise ConfigError(f"{where}.slowest.window", "must be positive")
            elif policy.type == "probabilistic":
                percentage = (block or ProbabilisticPolicyConfig()).sampling_percentage
                if not 0 <= percentage <= 100:
                    raise ConfigError(f"{where}.probabilistic.sampling_percentage", f"must be 0-100, got {percentage}")
        for i, name in enumerate(self.rate_limit.applies_to):
            if name not in names:
                raise ConfigError(f"{path}.rate_limit.applies_to[{i}]", f"no policy named {name!r}")
        if self.rate_limit.traces_per_second < 0 or self.rate_limit.per_model_traces_per_second < 0:
            raise ConfigError(f"{path}.rate_limit", "rates must not be negative")
        if self.grace > self.decision_wait:
            raise ConfigError(f"{path}.grace", "must not exceed decision_wait")

    def warnings(self, path: str) -> list[str]:
        """What this config runs but likely loses; said, never refused."""
        if self.decision_wait < ENGINE_EXPORT_DELAY_S:
            return [f"{path}.decision_wait: {self.decision_wait:g}s is below the usual engine export delay "
                    f"({ENGINE_EXPORT_DELAY_S:g}s: vLLM's BatchSpanProcessor exports every 5 s): a trace decided "
                    "before its engine's span arrives loses the join of gateway, client and engine"]
        return []


def open_calls_per_sender(config: TailSamplingProcessor) -> int:
    """``max_open_call_share`` as a count of traces (at least one); 0 when off."""
    share = config.max_open_call_share
    return max(1, int(share * config.num_traces)) if share > 0 else 0
