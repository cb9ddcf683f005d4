"""The tail sampler: policies in config order, the first match keeps the trace, then rate limits."""

from __future__ import annotations

from otel_llm.pdata.records import RequestRecord
from otel_llm.pdata.traces import DROP, Decision
from otel_llm.pdata.spans import PendingTrace
from otel_llm.processor.tail_sampling.config import ProbabilisticPolicyConfig, SlowestPolicyConfig, TailSamplingProcessor
from otel_llm.processor.tail_sampling.policies import (
    ErrorsPolicy,
    Policy,
    ProbabilisticPolicy,
    RateLimit,
    SloPolicy,
    SlowestPolicy,
)


def build_policies(config: TailSamplingProcessor) -> list[Policy]:
    policies: list[Policy] = []
    for policy in config.policies:
        if policy.type == "errors":
            policies.append(ErrorsPolicy(name=policy.name))
        elif policy.type == "slo":
            assert policy.slo is not None
            policies.append(SloPolicy(dict(policy.slo.thresholds), {m: dict(v) for m, v in policy.slo.per_model.items()},
                                      name=policy.name))
        elif policy.type == "slowest":
            slowest = policy.slowest or SlowestPolicyConfig()
            policies.append(SlowestPolicy(list(slowest.metrics), slowest.quantile, slowest.window, name=policy.name))
        elif policy.type == "probabilistic":
            probabilistic = policy.probabilistic or ProbabilisticPolicyConfig()
            policies.append(ProbabilisticPolicy(probabilistic.sampling_percentage / 100.0, name=policy.name))
    return policies


def _kept_by(policy: Policy) -> Decision:
    return Decision(True, policy.name, policy.th if isinstance(policy, ProbabilisticPolicy) else "0")


class TailSampler:
    def __init__(self, config: TailSamplingProcessor) -> None:
        self.policies = build_policies(config)
        rate = config.rate_limit
        exempt = {p.name for p in config.policies if p.type == "errors"}
        applies_to = rate.applies_to or [p.name for p in config.policies if p.name not in exempt]
        self.rate_limit = (
            RateLimit(rate.traces_per_second, rate.per_model_traces_per_second, applies_to)
            if rate.traces_per_second > 0 or rate.per_model_traces_per_second > 0 else None
        )
        # A kept decision is immutable and the same for every trace a policy keeps: built once per policy.
        self._kept = {id(policy): _kept_by(policy) for policy in self.policies}

    def decide(self, trace: PendingTrace, records: list[RequestRecord]) -> Decision:
        # Every policy sees every trace (the rolling quantiles must learn from all traffic), so no
        # short-circuit: the first match names the decision.
        matched: Policy | None = None
        for policy in self.policies:
            if policy.matches(trace, records) and matched is None:
                matched = policy
        if matched is None:
            return DROP
        if self.rate_limit is not None and not self.rate_limit.allow(matched.name, records):
            return Decision(False, matched.name, rate_limited=True)
        kept = self._kept.get(id(matched))
        if kept is None:  # a policy added after construction
            kept = _kept_by(matched)
        return kept
