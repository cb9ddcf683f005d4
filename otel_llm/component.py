"""What every configured component is, and how the service finds them (the Collector's ``component``).

A component is a folder under ``receiver/``, ``processor/``, ``exporter/`` or ``extension/`` whose ``factory.py``
defines ``FACTORY``: its YAML key, its config dataclass, whether the embedded defaults include it,
and a pure ``create``. The service discovers the folders, so adding a component is adding a folder.
Creating touches nothing outside the object; ``start(host)`` takes ports, files and locks, and an
``OSError`` it raises is reported with the component's path (``exporters.otlp: ...``).
"""

from __future__ import annotations

import builtins
import enum
import importlib
import pkgutil
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from otel_llm.pdata.records import KeptTrace

ConfigT = TypeVar("ConfigT")


class Kind(enum.Enum):
    RECEIVER = "receivers"
    PROCESSOR = "processors"
    EXPORTER = "exporters"
    EXTENSION = "extensions"  # beside the pipelines (the web view); run when service.extensions lists them

    @property
    def package(self) -> str:
        return f"otel_llm.{self.value.removesuffix('s')}"


class Signal(enum.Enum):
    TRACES = "traces"
    METRICS = "metrics"  # exporters of service.pipelines.metrics: they read processors.llm_metrics's families


class Component(Protocol):
    def start(self, host: Host) -> None: ...

    def shutdown(self, grace_s: float) -> None: ...


class KeptTraceConsumer(Component, Protocol):
    """A destination for kept traces, in the shape of the SDK's ``SpanExporter``."""

    name: str

    def consume(self, kept: KeptTrace) -> bool:
        """Take one kept trace; False when it had to be dropped (the consumer counted why)."""
        ...

    def flush(self, only_if_due: bool) -> None:
        """Send what is batched: all of it, or (``only_if_due``) what has waited long enough."""
        ...


@dataclass
class Host:
    """What a component may use of the running service (the Collector's ``component.Host``)."""

    registry: CollectorRegistry
    ready: threading.Event
    recorder: Any = None  # processors.llm_metrics's MetricsRecorder, when it runs
    components: dict[str, Any] = field(default_factory=dict)  # "exporters.store" -> the component
    config: Any = None  # the whole Config, for the components that show it (masked) or read a sibling's settings
    # Parts that can stop taking data while the process runs (the intake log on a full disk, a memory
    # limiter refusing for long): each returns why, or None; /readyz is 503 while one does.
    readiness: list[Callable[[], str | None]] = field(default_factory=list)

    def problem(self) -> str | None:
        for check in self.readiness:
            reason = check()
            if reason is not None:
                return reason
        return None

    def component(self, path: str) -> Any:
        return self.components.get(path)


@dataclass(frozen=True)
class CreateSettings:
    """What ``create`` is given beside its own config: its name, and its path for messages."""

    name: str
    path: str


@dataclass(frozen=True)
class Factory(Generic[ConfigT]):
    type: str  # the YAML key under its kind: ``store``, ``tail_sampling``
    kind: Kind
    config_class: builtins.type[ConfigT]
    create: Callable[[ConfigT, CreateSettings], Any]
    in_defaults: bool  # present in the embedded defaults (a config without this section)
    signal: Signal = Signal.TRACES

    def default_config(self) -> ConfigT:
        return self.config_class()


@cache
def factories(kind: Kind) -> dict[str, Factory[Any]]:
    """Every component folder of ``kind``, by YAML key, in name order."""
    package = importlib.import_module(kind.package)
    found: dict[str, Factory[Any]] = {}
    for module in sorted(pkgutil.iter_modules(package.__path__), key=lambda m: m.name):
        if not module.ispkg:
            continue
        try:
            factory_module = importlib.import_module(f"{kind.package}.{module.name}.factory")
        except ModuleNotFoundError as exc:
            if exc.name == f"{kind.package}.{module.name}.factory":
                continue  # a shared helper package (exporterhelper), not a component
            raise
        factory = getattr(factory_module, "FACTORY", None)
        if not isinstance(factory, Factory) or factory.kind is not kind:
            raise TypeError(f"{factory_module.__name__}: FACTORY must be a Factory of kind {kind.name}")
        found[factory.type] = factory
    return found
