"""The tail sampler: policies in config order, the first match keeps the trace, then rate limits."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from otel_llm.internal import core as native_core
from otel_llm.pdata.records import Outcome, RequestRecord
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


def build_policies(config: TailSamplingProcessor, core: Any = True,
                   clock: Callable[[], float] = time.monotonic) -> list[Policy]:
    """``core`` and ``clock`` as ``SlowestPolicy`` takes them."""
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
            policies.append(SlowestPolicy(list(slowest.metrics), slowest.quantile, slowest.window, name=policy.name,
                                          clock=clock, core=core))
        elif policy.type == "probabilistic":
            probabilistic = policy.probabilistic or ProbabilisticPolicyConfig()
            policies.append(ProbabilisticPolicy(probabilistic.sampling_percentage / 100.0, name=policy.name))
    return policies


def _kept_by(policy: Policy) -> Decision:
    return Decision(True, policy.name, policy.th if isinstance(policy, ProbabilisticPolicy) else "0")


def native_decider(policies: list[Policy], extension: Any) -> Any:
    """The compiled core's ``Decider`` for ``policies`` (``rust/src/quantiles.rs``), or ``None`` where
    one of them is a kind it does not run (the ``slo`` policy, a policy of Python's own) or there
    is no core."""
    if extension is None:
        return None
    rules: list[tuple[str, object]] = []
    for policy in policies:
        if type(policy) is ErrorsPolicy:
            rules.append(("errors", None))
        elif type(policy) is SlowestPolicy and policy._native is not None:
            rules.append(("slowest", policy._native))
        elif type(policy) is ProbabilisticPolicy and 0 <= policy.threshold <= 1 << 56:
            rules.append(("probabilistic", policy.threshold))
        else:
            return None
    return extension.Decider(rules, Outcome.FAILED)


class TailSampler:
    def __init__(self, config: TailSamplingProcessor, core: Any = True,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """``core``: the compiled core that runs the policies (``True``: the process's choice,
        ``internal/core.py``; ``None`` or ``False``: the Python policies, the reference); ``clock``
        the slowest policy's."""
        extension = native_core.active()[0] if core is True else (core or None)
        self.policies = build_policies(config, extension, clock)
        # With the core, every policy runs there, in one call per batch of traces, when it runs them
        # all; the lock (taken for Python's policies too) keeps two completing threads out of the
        # slowest policy's windows at once.
        self._native = native_decider(self.policies, extension)
        self._lock = threading.Lock()
        rate = config.rate_limit
        exempt = {p.name for p in config.policies if p.type == "errors"}
        applies_to = rate.applies_to or [p.name for p in config.policies if p.name not in exempt]
        self.rate_limit = (
            RateLimit(rate.traces_per_second, rate.per_model_traces_per_second, applies_to)
            if rate.traces_per_second > 0 or rate.per_model_traces_per_second > 0 else None
        )
        # A kept decision is immutable and the same for every trace a policy keeps: built once per policy.
        self._kept = {id(policy): _kept_by(policy) for policy in self.policies}

    def lane_decider(self) -> tuple[Any, threading.Lock, list[Decision]] | None:
        """(the core's ``Decider``, the lock it runs under, the decision each policy keeps a trace
        with) where ``decide_batch`` is the core's first match and nothing after it (no rate limit),
        for the completion lane (``service/lane.py``); else None."""
        if self._native is None or self.rate_limit is not None:
            return None
        return self._native, self._lock, [self._kept[id(policy)] for policy in self.policies]

    def decide_batch(self, traces: list[tuple[PendingTrace, list[RequestRecord]]]) -> list[Decision | Exception]:
        """The decision of each (trace, records) in order, the policies run under one taking of the
        lock; a trace whose decision fails gets its exception in its place (the others are decided)."""
        with self._lock:
            matched = self._native_matches(traces) if self._native is not None else None
            if matched is None:
                matched = [self._first_match(trace, records) for trace, records in traces]
        decisions: list[Decision | Exception] = []
        for (_, records), policy in zip(traces, matched):
            if policy is None or isinstance(policy, Exception):
                decisions.append(DROP if policy is None else policy)
                continue
            try:
                decisions.append(self._kept_or_rate_limited(policy, records))
            except Exception as exc:  # noqa: BLE001 - this trace's, handed back in its place
                decisions.append(exc)
        return decisions

    def decide(self, trace: PendingTrace, records: list[RequestRecord]) -> Decision:
        (decided,) = self.decide_batch([(trace, records)])
        if isinstance(decided, Exception):
            raise decided
        return decided

    def _native_matches(self, traces: list[tuple[PendingTrace, list[RequestRecord]]]
                        ) -> list[Policy | None | Exception] | None:
        """``_first_match`` of each trace in one call into the core; None where the call itself is
        refused (an argument it cannot read), so each trace is then matched on its own."""
        assert self._native is not None
        try:
            indexes = self._native.first_match_many([(trace.trace_id, trace.spans, records) for trace, records in traces])
        except Exception:  # noqa: BLE001 - the per-trace calls say whose it was
            return None
        policies = self.policies
        return [index if isinstance(index, Exception) else policies[index] if index >= 0 else None
                for index in indexes]

    def _first_match(self, trace: PendingTrace, records: list[RequestRecord]) -> Policy | None | Exception:
        """The first policy that matches, None, or what the policies raised. Every policy sees every
        trace (the rolling quantiles must learn from all traffic): no short-circuit."""
        try:
            if self._native is not None:
                index = self._native.first_match(trace.trace_id, trace.spans, records)
                return self.policies[index] if index >= 0 else None
            matched: Policy | None = None
            for policy in self.policies:
                if policy.matches(trace, records) and matched is None:
                    matched = policy
            return matched
        except Exception as exc:  # noqa: BLE001 - this trace's, handed back in its place
            return exc

    def _kept_or_rate_limited(self, matched: Policy, records: list[RequestRecord]) -> Decision:
        if self.rate_limit is not None and not self.rate_limit.allow(matched.name, records):
            return Decision(False, matched.name, rate_limited=True)
        kept = self._kept.get(id(matched))
        if kept is None:  # a policy added after construction
            kept = _kept_by(matched)
        return kept
