"""The accounting corpus: seeded random request records counted by the Python reference, replayed by
``rust/engine/tests/accounting_corpus.rs`` (the engine's ``accounting::Accounting`` must expose the
same bytes, use the same budget and overflow the same observations).

Regenerate (from the repository's root, with a venv that has the project's dependencies)::

    PYTHONPATH=. OTEL_LLM_CORE=python .venv/bin/python rust/engine/tests/data/accounting/generate.py

It writes ``corpus.json`` next to itself. The reference is ``metrics/accounting.py``'s ``Accounting``
with settings made by ``stage.accounting_settings`` from an ``LlmMetricsProcessor`` configuration, a
``SeriesBudget`` of its own, and its families collected as ``RecorderCollector`` collects them
(``collect(OVERFLOW_LABELS)``) and encoded by prometheus_client: text 0.0.4 (``generate_latest``)
and OpenMetrics as ``/metrics`` asks for it (``escaping=allow-utf-8``; its closing ``# EOF`` line
is the whole exposition's, left out here).

A record is ``[model, tenant, engine_kind, side, joined_span_id (hex), outcome, weight, prompt_tokens,
cached_tokens, completion_tokens, ttft_s, tpot_s, e2e_s]``. Floats are written as their ``repr`` (a string: NaN and infinities are not JSON numbers, and
``str.parse::<f64>`` reads a ``repr`` back to the same float); ints as JSON numbers.
"""

from __future__ import annotations

import json
import math
import pathlib
import random
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.openmetrics import exposition as openmetrics

from otel_llm.pdata.records import Outcome, RequestRecord, Side
from otel_llm.processor.llm_metrics.config import (
    CostConfig,
    LlmMetricsProcessor,
    ModelPriceConfig,
    SloConfig,
    SloObjectivesConfig,
    TenantConfig,
)
from otel_llm.processor.llm_metrics.metrics.accounting import Accounting, Objectives
from otel_llm.processor.llm_metrics.metrics.exposition import OVERFLOW_LABELS
from otel_llm.processor.llm_metrics.metrics.families import SeriesBudget
from otel_llm.processor.llm_metrics.stage import accounting_settings
from otel_llm.service.declarations import accounting_settings_json, accounting_specs_json, number

EOF_LINE = "# EOF\n"
# Label values as spans may carry them: empty, non-ASCII, the characters the exposition escapes.
HOSTILE = ["", "团队-α", 'q"uote', "back\\slash", "new\nline"]


class Collected:
    """The accounting's families as ``RecorderCollector.collect`` yields them."""

    def __init__(self, accounting: Accounting) -> None:
        self.accounting = accounting

    def collect(self) -> Iterator[Metric]:
        yield from self.accounting.collect(OVERFLOW_LABELS)


class Case:
    def __init__(self, name: str, metrics: LlmMetricsProcessor, series_limit: int, budget_bytes: int,
                 max_label_value_bytes: int, models: list[str], tenants: list[str], seed: int) -> None:
        self.name = name
        self.metrics = metrics
        self.series_limit = series_limit
        self.budget_bytes = budget_bytes
        self.max_label_value_bytes = max_label_value_bytes
        self.models = models
        self.tenants = tenants
        self.rng = random.Random(seed)

    def tokens(self) -> int | None:
        rng = self.rng
        roll = rng.random()
        if roll < 0.25:
            return None
        if roll < 0.35:
            return 0
        if roll < 0.4:  # negative, past 2^53 (an int a float rounds), and near the i64 end
            return rng.choice((-3, 2**53 + 1, 2**62 + 12345, 10**15))
        return rng.randrange(1, 5000)

    def latency(self) -> float | None:
        rng = self.rng
        roll = rng.random()
        if roll < 0.2:
            return None
        if roll < 0.3:  # the objectives' own values (equal meets them), NaN, infinity
            return rng.choice((0.5, 1.0, 2.0, 0.05, math.nan, math.inf))
        return float(f"{rng.lognormvariate(-1, 1):.4g}")  # four digits: a short repr in the corpus

    def record(self) -> RequestRecord:
        rng = self.rng
        side = rng.choice((Side.SERVER,) * 7 + (Side.CLIENT,) * 3)
        return RequestRecord(
            trace_id=b"\x01" * 16, span_id=b"\x02" * 8,
            engine_kind=rng.choice(("vllm", "sglang", "genai", "client", "k" * 40)), adapter="a", service_name="s",
            model=rng.choice(self.models), model_source="test", request_model="", response_model="",
            operation_name="chat", provider_name="p",
            outcome=rng.choice((Outcome.STOP,) * 8 + (Outcome.LENGTH, Outcome.UNKNOWN, Outcome.ABORT, Outcome.ERROR)),
            side=side, joined_span_id=rng.choice((b"", rng.randbytes(8))) if side == Side.CLIENT else rng.choice(
                (b"", b"", rng.randbytes(8))),
            weight=rng.choice((1.0,) * 6 + (0.5, 2.5, 1e-3, 3.0)),
            prompt_tokens=self.tokens(), cached_tokens=self.tokens() if rng.random() < 0.6 else None,
            completion_tokens=self.tokens(), tenant=rng.choice(self.tenants),
            ttft_s=self.latency(), tpot_s=self.latency(), e2e_s=self.latency())

    def run(self) -> dict[str, Any]:
        settings = accounting_settings(self.metrics)
        budget = SeriesBudget(self.budget_bytes)
        accounting = Accounting(settings, self.series_limit, budget, self.max_label_value_bytes)
        registry = CollectorRegistry()
        registry.register(Collected(accounting))
        records = []
        checkpoints = []
        for index in range(400):
            record = self.record()
            accounting.record(record)
            records.append([
                record.model, record.tenant, record.engine_kind, record.side, record.joined_span_id.hex(),
                record.outcome, number(record.weight), record.prompt_tokens, record.cached_tokens,
                record.completion_tokens, number(record.ttft_s), number(record.tpot_s), number(record.e2e_s),
            ])
            if index in (0, 9, 99, 399):
                om = openmetrics.generate_latest(registry, escaping=openmetrics.ALLOWUTF8).decode()  # type: ignore[no-untyped-call]
                assert om.endswith(EOF_LINE)
                checkpoints.append({
                    "after": index + 1,
                    "text": generate_latest(registry).decode(),
                    "openmetrics": om[: -len(EOF_LINE)],
                    "budget_used": budget.used,
                    "overflowed": {name: family.overflowed for name, family in accounting.families.items()},
                })
        last = checkpoints[-1]
        print(f"{self.name}: {len(last['text'].splitlines())} lines, budget {last['budget_used']}, "
              f"overflowed {last['overflowed']}")
        return {
            "name": self.name,
            "settings": accounting_settings_json(settings),
            "series_limit": self.series_limit,
            "budget_bytes": self.budget_bytes,
            "max_label_value_bytes": self.max_label_value_bytes,
            "records": records,
            "checkpoints": checkpoints,
        }


def cases() -> list[Case]:
    models = ["gpt-4o-mini", "llama-70b", "free-model", "absurd", "overflowing"] + HOSTILE
    tenants = ["team-a", "team-b", "other", "t" * 20] + HOSTILE
    prices = {
        "gpt-4o-mini": ModelPriceConfig(input=0.15, output=0.60, cached_input=0.075),
        "llama-70b": ModelPriceConfig(input=0.9),  # output unpriced, cached input at the input price
        "absurd": ModelPriceConfig(input=1.5e302, output=3e300, cached_input=0.0),
        "overflowing": ModelPriceConfig(input=1e303, output=1.7976931348623157e308),
        "团队-α": ModelPriceConfig(output=2.0),
    }
    slo = SloConfig(default=SloObjectivesConfig(ttft=1.0, e2e=2.0, target=0.99),
                    models={"llama-70b": SloObjectivesConfig(ttft=2.0, target=0.9),
                            "gpt-4o-mini": SloObjectivesConfig(tpot=0.05),
                            "": SloObjectivesConfig(target=0.5)})
    everything = LlmMetricsProcessor(tenant=TenantConfig(attributes=["team"], values=["team-a", "team-b"]),
                                     cost=CostConfig(currency="USD", prices=prices), slo=slo)
    return [
        Case("tenant_cost_slo", everything, 2000, 16 * 1024 * 1024, 256, models, tenants, 1),
        Case("capped_series_and_budget", everything, 6, 2500, 16, models, tenants, 2),
        Case("tenant_only", LlmMetricsProcessor(tenant=TenantConfig(attributes=["team"], values=["team-a"])),
             2000, 16 * 1024 * 1024, 16, models, tenants, 3),
        Case("slo_only_per_model", LlmMetricsProcessor(slo=SloConfig(
            models={"llama-70b": SloObjectivesConfig(e2e=0.5, target=0.95), "absurd": SloObjectivesConfig(tpot=0.1)})),
             3, 16 * 1024 * 1024, 256, models, tenants, 4),
        Case("prices_only", LlmMetricsProcessor(cost=CostConfig(currency="EUR", prices=prices)),
             2000, 1200, 256, models, tenants, 5),
    ]


def main() -> None:
    corpus = {"generator": "rust/engine/tests/data/accounting/generate.py", **accounting_specs_json(),
              "overflow_labels": OVERFLOW_LABELS, "cases": [case.run() for case in cases()]}
    path = pathlib.Path(__file__).with_name("corpus.json")
    path.write_text(json.dumps(corpus, ensure_ascii=False, separators=(",", ":")) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
