"""Builds the components a config's pipelines run, from their factories, in pipeline order; starts
them (exporters first, receivers last) and stops them in the opposite order."""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from otel_llm.internal import core as native_core
from otel_llm.internal.files import replacing
from otel_llm.component import CreateSettings, Host, KeptTraceConsumer, Kind, Signal, factories
from otel_llm.config import Config, ConfigError, check_certificates, exposed_without_token, intake_log_directory
from otel_llm.exporter.store.exporter import StoreComponent
from otel_llm.exporter.store.sqlite import TraceStore
from otel_llm.processor.llm_metrics.metrics.exposition import RecorderCollector
from otel_llm.processor.memory_limiter.config import MemoryLimiterProcessor
from otel_llm.processor.memory_limiter.limiter import intake_bytes_bound, memory_limits
from otel_llm.pdata.traces import Decision, Remembered
from otel_llm.receiver.otlp.intake_log import (
    IntakeLogCollector,
    IntakeLogKeeper,
    IntakeLogSettings,
    IntakeLogShared,
    PriorDecision,
    read_journal,
)
from otel_llm.receiver.otlp.process import IntakeState, ReceiverCounters, spawn_context
from otel_llm.pdata.spans import PendingTrace
from otel_llm.service.graph import Pipeline, TakenOver
from otel_llm.service.handover import (
    HANDOVER_FILE,
    every_pending_trace,
    read_handover,
    remove_handover,
    write_handover,
)
from otel_llm.service.processes import IngestProcesses
from otel_llm.service.telemetry import SelfTelemetry

log = logging.getLogger(__name__)


class ComponentStartError(OSError):
    """A component could not start (a port in use, a file it cannot open or lock): the message names it."""


DECISIONS_FILE = "decision-cache"  # beside the store: the decision cache kept across a graceful restart


class Service:
    def __init__(self, config: Config) -> None:
        """Creates every component (no port, file or lock is taken until ``start``). Raises
        ``OSError`` for a TLS certificate, key or CA file that cannot be loaded (before any component
        reads one: an encrypted key would make OpenSSL prompt for its passphrase)."""
        try:
            check_certificates(config)
        except ConfigError as exc:
            raise OSError(str(exc)) from None
        self.config = config
        self.registry = CollectorRegistry(auto_describe=False)
        self.ready = threading.Event()
        # Created from the factories, by "kind.name", in pipeline order.
        self.components: dict[str, Any] = {}
        for kind in (Kind.RECEIVER, Kind.PROCESSOR, Kind.EXPORTER, Kind.EXTENSION):
            for signal in (Signal.TRACES, Signal.METRICS) if kind is Kind.EXPORTER else (Signal.TRACES,):
                for name in config.running(kind, signal):
                    factory = factories(kind)[name]
                    path = f"{kind.value}.{name}"
                    self.components[path] = factory.create(getattr(getattr(config, kind.value), name),
                                                           CreateSettings(name, path))
        receiver = self.components.get("receivers.otlp")
        otlp = receiver.config if receiver is not None else None
        context = spawn_context()
        counters = ReceiverCounters(context)
        self.telemetry = SelfTelemetry(self.registry, counters)
        try:
            extension, why_python = native_core.active()
        except native_core.CoreUnavailable as exc:
            raise OSError(str(exc)) from None
        implementation = native_core.NATIVE if extension is not None else native_core.PYTHON
        self.telemetry.core_info.labels(implementation).set(1)
        # Said once the service has started (a start that fails says only why, on one line).
        self._core_line = (f"per-span hot path: the compiled core ({extension.__file__})" if extension is not None
                           else f"per-span hot path: pure Python ({why_python})")
        processors = {path.partition(".")[2]: component.config for path, component in self.components.items()
                      if path.startswith("processors.")}
        limiter = processors.get("memory_limiter")
        _, spike_bytes = memory_limits(limiter if isinstance(limiter, MemoryLimiterProcessor)
                                       else MemoryLimiterProcessor())
        intake = IntakeState(context, otlp.max_queued_spans if otlp is not None else 200_000,
                             intake_bytes_bound(spike_bytes))
        self.consumers: list[KeptTraceConsumer] = [
            c for path, c in self.components.items() if path.startswith("exporters.") and hasattr(c, "consume")]
        self.pipeline = Pipeline(processors, self.consumers, self.telemetry, intake)
        if self.pipeline.recorder is not None:
            self.registry.register(RecorderCollector(self.pipeline.recorder))
        self.host = Host(self.registry, self.ready, recorder=self.pipeline.recorder, components=self.components,
                         config=config)
        self.host.readiness.append(self.pipeline.problem)
        self._started: list[str] = []  # what ``stop`` has to stop, in start order
        self.ingest: IngestProcesses | None = None
        if otlp is not None and (otlp.protocols.grpc is not None or otlp.protocols.http is not None):
            self.ingest = IngestProcesses(otlp, intake, counters, self.pipeline.receive, context)
        self.intake_log: IntakeLogKeeper | None = None
        log_config = otlp.intake_log if otlp is not None else None
        if log_config is not None and self.ingest is not None:
            settings = IntakeLogSettings(intake_log_directory(config), log_config.fsync, log_config.fsync_interval,
                                         log_config.segment_size_mib << 20, log_config.max_size_mib << 20,
                                         min_free_bytes=log_config.min_free_mib << 20,
                                         redaction=self.pipeline.intake_redaction)
            self.intake_log = IntakeLogKeeper(settings, IntakeLogShared(context),
                                              self.pipeline.assembler.settings.decision_wait_s)
            self.pipeline.use_intake_log(self.intake_log)
            store = self.components.get("exporters.store")
            if isinstance(store, StoreComponent):  # a request is handled once its kept traces are written
                self.intake_log.barriers.append(store.wait_written)
            self.registry.register(IntakeLogCollector(self.intake_log))
            self.host.readiness.append(self.intake_log.problem)

    # --- the decision cache and the pending traces across a graceful restart ------------------

    def _handover_file(self) -> Path | None:
        decisions = self._decisions_path()
        return None if decisions is None else decisions.parent / HANDOVER_FILE

    def _handover_path(self) -> Path | None:
        """Where a stop writes its pending traces; None when it decides them instead."""
        return self._handover_file() if self.config.service.hand_over_pending_traces else None

    def _hand_over(self, path: Path, pending: list[PendingTrace]) -> list[PendingTrace]:
        """Write ``pending`` for the next start; returns what was not written (decided now, as without)."""
        result = write_handover(path, pending, self.pipeline.intake_redaction)
        if result.traces:
            log.warning("handed %d pending traces (%d spans) over to the next start on this store; they are "
                        "measured when otel-llm next starts with %s", result.traces, result.spans, path)
        return result.not_written or []

    def _take_over(self) -> None:
        """Buffer again what an earlier run left pending: the intake log's carried traces (a crash),
        then a graceful stop's handover, whose traces the intake log carries before it is deleted."""
        if self.intake_log is not None and self.intake_log.carried_in:
            taken = self.pipeline.take_over(self.intake_log.carried_in)
            self.intake_log.carried_in = []
            self._count_taken_over(taken, "the intake log's carried traces", carried=True)
        # Whatever this run's setting: a handover a previous run wrote is taken, never left unread.
        path = self._handover_file()
        if path is None:
            return
        read = read_handover(path)
        if read is None:
            return
        if read.damaged:
            log.error("the previous run's handover %s is damaged: the traces from the damage on are lost", path)
            self.telemetry.handover_damaged.inc(read.damaged)
        taken = self.pipeline.take_over(read.requests)
        self._count_taken_over(taken, f"the previous run's handover {path}")
        if self.intake_log is not None and taken.traces:  # covered by the log before the handover goes
            try:
                self.intake_log.carry(self.pipeline.assembler.overdue(float("-inf"), taken.traces))
            except OSError as exc:  # the handover stays for the next start
                raise ComponentStartError(f"receivers.otlp.intake_log: cannot carry the traces taken over from "
                                          f"{path}: {exc}") from None
        remove_handover(path)
        log.info("took over %d pending traces (%d spans) from the previous run", len(taken.traces), taken.spans)

    def _count_taken_over(self, taken: TakenOver, source: str, carried: bool = False) -> None:
        if taken.damaged:
            log.error("%s: %d records do not decode: skipped", source, taken.damaged)
            self.telemetry.handover_damaged.inc(taken.damaged)
        if taken.rejected_spans:
            log.error("%s: %d spans with an unusable trace, span or parent id: dropped", source, taken.rejected_spans)
            self.telemetry.spans_dropped.labels("invalid_id").inc(taken.rejected_spans)
        if not carried:
            self.telemetry.spans_taken_over.inc(taken.spans)

    def _decisions_path(self) -> Path | None:
        """Beside the store: a sender that never got the answer to a request this process took
        (its stop cut the call) sends it again to the next one, which must know those spans."""
        component = self.components.get("exporters.store")
        return Path(component.config.path) / DECISIONS_FILE if isinstance(component, StoreComponent) else None

    def _save_decisions(self) -> None:
        path = self._decisions_path()
        if path is None:
            return
        try:
            with replacing(path, sync=False) as f:  # read by the next start only after a graceful stop
                for trace_id, remembered in self.pipeline.assembler.decisions():
                    decision = remembered.decision
                    f.write(IntakeLogKeeper._decided_entry(trace_id, decision.keep, decision.rate_limited,
                                                           decision.policy, decision.threshold, remembered.measured))
        except OSError as exc:
            log.warning("cannot keep the decision cache for the next start (%s): a span redelivered to it "
                        "is measured again", exc)

    def _restore_decisions(self) -> None:
        path = self._decisions_path()
        if path is None or not path.exists():
            return
        prior: dict[bytes, PriorDecision] = {}
        try:
            read_journal(path, prior)
            path.unlink()  # one start only: after a crash the next start has none (never a stale cache)
        except OSError as exc:
            log.warning("cannot read the previous run's decision cache %s: %s", path, exc)
            return
        self.pipeline.assembler.restore_decisions([
            (trace_id, Remembered(Decision(p.keep, p.policy, p.threshold, p.rate_limited), p.measured))
            for trace_id, p in prior.items()])

    # --- what tests and the CLI read ------------------------------------------------------------

    @property
    def store(self) -> TraceStore | None:
        component = self.components.get("exporters.store")
        return component.store if isinstance(component, StoreComponent) else None

    @property
    def prometheus(self) -> Any:
        return self.components.get("exporters.prometheus")

    @property
    def exposed_without_token(self) -> list[str]:
        return exposed_without_token(self.config)

    @property
    def webview(self) -> Any:
        return self.components.get("extensions.webview")

    @property
    def grpc_port(self) -> int:
        return self.ingest.grpc_port if self.ingest is not None else 0

    @property
    def http_port(self) -> int:
        return self.ingest.http_port if self.ingest is not None else 0

    @property
    def failed(self) -> bool:
        """A part died that the process cannot run without (the receiver process)."""
        return self.ingest is not None and self.ingest.exited_unexpectedly.is_set()

    # --- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        """Start everything; ``/readyz`` turns 200 only once every receiver listens.

        Raises ``ComponentStartError`` (an ``OSError``) naming the component that cannot start,
        having stopped what had started: within seconds, whatever ``shutdown_grace`` is."""
        try:
            # Exporters first (the store before the endpoint that reads it), so nothing that
            # arrives finds its destination missing.
            exporters = [p for p in self.components if p.startswith("exporters.")]
            exporters.sort(key=lambda p: p == "exporters.prometheus")
            for path in exporters:
                try:
                    self.components[path].start(self.host)
                except OSError as exc:
                    raise ComponentStartError(f"{path}: {exc}") from None
                self._started.append(path)
            self._restore_decisions()
            # Extensions (the web view) once the store they read is open.
            for path in (p for p in self.components if p.startswith("extensions.")):
                try:
                    self.components[path].start(self.host)
                except OSError as exc:
                    raise ComponentStartError(f"{path}: {exc}") from None
                self._started.append(path)
            self.pipeline.start()
            self._started.append("pipeline")
            if self.intake_log is not None:
                try:
                    self.intake_log.open()
                except OSError as exc:
                    raise ComponentStartError(f"receivers.otlp.intake_log: {exc}") from None
            self._take_over()
            if self.intake_log is not None and self.ingest is not None:
                # Before the receivers listen: what was acknowledged before a crash goes first.
                try:
                    self.pipeline.replay(self.intake_log.recover())
                except OSError as exc:
                    raise ComponentStartError(f"receivers.otlp.intake_log: {exc}") from None
                self.ingest.intake_log = self.intake_log.receiver_settings()
                self.ingest.intake_log_shared = self.intake_log.shared
                self.intake_log.start()
                self._started.append("intake_log")
            if self.ingest is not None:
                self._started.append("ingest")  # a failed start has stopped its processes already
                try:
                    self.ingest.start()
                except OSError as exc:
                    message = str(exc)
                    raise ComponentStartError(message if message.startswith("receivers.") else
                                              f"receivers.otlp: {message}") from None
        except Exception:
            # Nothing was accepted yet: no grace period to give anyone.
            self.stop(grace_s=0.0)
            raise
        log.info("%s", self._core_line)
        for exposure in self.exposed_without_token:  # allowed, said once (and on the Status page)
            log.warning("listening beyond loopback without a token: %s", exposure)
        self.ready.set()

    def stop(self, grace_s: float | None = None) -> None:
        """Stop accepting, complete every pending trace, then stop the exporters (the metrics endpoint last)."""
        grace = self.config.service.shutdown_grace if grace_s is None else grace_s
        started = self._started
        self.ready.clear()
        for path in [p for p in started if p.startswith("extensions.")]:
            self.components[path].shutdown(grace)  # first: they only read what the others hold
            started.remove(path)
        if self.ingest is not None and "ingest" in started:
            self.ingest.stop(grace)  # returns once everything they admitted is in the intake
            if self.ingest.exited_unexpectedly.is_set():
                lost = self.pipeline.intake.forget_in_flight()
                if lost > 0:
                    self.telemetry.spans_dropped.labels("receiver_exit").inc(lost)
        if "pipeline" in started:
            handover = self._handover_path()
            # Every pending trace decided and handed to the exporters, but those the next start should decide.
            if handover is None:
                self.pipeline.shutdown()
            else:
                self.pipeline.shutdown(hand_over=every_pending_trace,
                                       write_handover=lambda pending: self._hand_over(handover, pending))
            self._save_decisions()
        if "exporters.store" in started:
            self.components["exporters.store"].shutdown(grace)
        if self.intake_log is not None and "intake_log" in started:
            self.intake_log.close()  # what was handled leaves the log; anything else is replayed next time
        # The metrics exporters after the pipeline (their final push has every decided request),
        # the endpoint last.
        for path in sorted((p for p in started if p.startswith("exporters.") and p != "exporters.store"),
                           key=lambda p: p == "exporters.prometheus"):
            self.components[path].shutdown(grace)
        started.clear()
