"""The product's own metric families (``otel_llm_*`` self-telemetry), each declared once as data:
its Prometheus name, type, labels, description and the component that exposes it.

The code builds its prometheus_client families from these declarations (``TelemetryFamily.counter``,
``.gauge``, ``.collected``), and ``tools/gen_docs.py`` writes ``docs/reference/self-telemetry.md``
from them: the Collector's mdatagen, as a dataclass. A family named by a string anywhere else fails
``tests/test_metrics_reference.py``; the span-derived families are declared in
``processor/llm_metrics/metrics/definitions.py`` the same way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:  # prometheus_client is imported where a family is built: the receiver process never builds one
    from prometheus_client import CollectorRegistry, Counter, Gauge
    from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily


@dataclass(frozen=True)
class TelemetryFamily:
    name: str  # as exposed; a counter's samples add ``_total``
    kind: Literal["counter", "gauge"]
    description: str  # the HELP line
    labels: tuple[str, ...] = ()
    # The config path of what exposes it ("service": always), for the reference's sections.
    exposed_by: str = "service"
    # What the reference says beyond the HELP line (the label values, how two families add up).
    notes: str = ""

    @property
    def exposed_name(self) -> str:
        """The name of its samples: a counter's with ``_total``."""
        return self.name + "_total" if self.kind == "counter" else self.name

    def counter(self, registry: CollectorRegistry) -> Counter:
        from prometheus_client import Counter

        assert self.kind == "counter", self.name
        return Counter(self.name, self.description, self.labels, registry=registry)

    def gauge(self, registry: CollectorRegistry) -> Gauge:
        from prometheus_client import Gauge

        assert self.kind == "gauge", self.name
        return Gauge(self.name, self.description, self.labels, registry=registry)

    def collected(self, value: float | None = None) -> CounterMetricFamily | GaugeMetricFamily:
        """The family as a custom collector yields it: with ``value`` (an unlabelled family's one
        sample), or empty for ``add_metric`` calls."""
        from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily

        if self.kind == "counter":
            if value is not None:
                return CounterMetricFamily(self.name, self.description, value=value)
            return CounterMetricFamily(self.name, self.description, labels=list(self.labels))
        if value is not None:
            return GaugeMetricFamily(self.name, self.description, value=value)
        return GaugeMetricFamily(self.name, self.description, labels=list(self.labels))
