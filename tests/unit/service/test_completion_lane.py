"""The completion lane (``service/lane.py``, ``rust/src/lane.rs``) against the chain it stands for.

Two real services of the bench's configuration (the real loader, factories, ``Pipeline`` and SQLite
store), the core's buffer in both, one with the lane and one without it, are fed the same traffic on
the same schedule: the bench's fleet mix (streams, errors, slow requests the slowest policy keeps)
and the engine fixtures (shapes the core leaves to Python, so the lane's runs and the chain's
alternate), completed in ticks at random times. ``/metrics`` (every sample, the self-telemetry
included), the store's rows, the completions by reason and the decision cache must be the same."""

from __future__ import annotations

import json
import logging
import random
import re
import sys
import types
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from prometheus_client import generate_latest

from otel_llm.internal import core as native_core
from otel_llm.pdata.records import Outcome
from otel_llm.processor.llm_metrics.metrics.recorder import MetricsRecorder
from otel_llm.processor.tail_sampling import sampler as sampler_module
from otel_llm.processor.tail_sampling.assembler import NativeTraceAssembler
from otel_llm.service.lane import Lane
from tests.support import engine_fixtures as F
from tests.support.store_rows import store_rows

pytestmark = pytest.mark.skipif(native_core.active()[0] is None or not hasattr(native_core.active()[0], "Lane"),
                                reason="the compiled core is not built: there is no lane")

_CREATED = re.compile(r"^[^ {]*_created[ {]")


def _traffic(seed: int, with_fixtures: bool = True) -> list[bytes]:
    """``with_fixtures=False``: the fleet mix alone, whose traces the lane nearly all takes."""
    from bench.workload import generate

    fleet = [batch.payload for batch in generate(6, seed=seed, min_spans=150, max_spans=250)]
    fixtures = [builder().SerializeToString() for builder in F.BUILDERS.values()] if with_fixtures else []
    # Gateway spans that end before they start: a value the core refuses (counted by reason, the
    # request measured without it).
    with_refusals = ExportTraceServiceRequest.FromString(fleet[0])
    gateways = [span for rs in with_refusals.resource_spans for ss in rs.scope_spans for span in ss.spans
                if ss.scope.name == "llm-gateway"]
    for span in gateways[:5]:
        span.end_time_unix_nano = span.start_time_unix_nano - 1
    fleet[0] = with_refusals.SerializeToString()
    requests = fleet + fixtures
    random.Random(seed).shuffle(requests)
    return requests


def _service(workdir: Path, lane: bool) -> Any:
    from bench.hotpath import build

    workdir.mkdir(parents=True)
    service, clock = build(workdir)
    assembler = service.pipeline.assembler
    assert isinstance(assembler, NativeTraceAssembler), "the lane runs on the core's buffer only"
    assert isinstance(assembler.lane, Lane), "the bench's configuration is the one the lane stands for"
    if not lane:
        assembler.lane = None
    return service, clock



def _assert_same(lane: dict[str, Any], chain: dict[str, Any], *what: str) -> None:
    """The lane's run and the chain's gave the same of each of ``what`` (each compared on its own,
    so a failure names the one that differs)."""
    for name in what:
        assert lane[name] == chain[name], name

@pytest.fixture
def run(tmp_path: Path) -> Iterator[Any]:
    stores: list[Any] = []

    def run(name: str, requests: list[bytes], lane: bool, seed: int, again: Sequence[bytes] = (),
            while_deciding: Sequence[bytes] = ()) -> dict[str, Any]:
        """``again``: fed once every trace is decided; ``while_deciding``: fed once, when the first
        decisions are about to be remembered (their traces completed, undecided: their spans park)."""
        service, clock = _service(tmp_path / name, lane)
        store = service.components.get("exporters.store")
        stores.append(store)
        pipeline = service.pipeline
        assembler = pipeline.assembler
        parked: list[tuple[str, bool]] = []  # (where the spans were fed, whether some were parked)
        for method in ("remember_decisions", "remember_lane"):
            def feeding_first(*args: Any, _remember: Any = getattr(assembler, method), _method: str = method) -> None:
                if while_deciding and not parked:
                    for data in while_deciding:
                        pipeline.buffer(data, False)
                    parked.append((_method, assembler._has_parked()))
                _remember(*args)

            setattr(assembler, method, feeding_first)
        schedule = random.Random(seed)
        for data in requests:
            pipeline.buffer(data, False)
            if schedule.random() < 0.5:  # a tick at a random time: completions in runs of every length
                clock.now += schedule.uniform(0.0, 2.0)
                pipeline.assembler.tick()
        for _ in range(3):  # past the grace, then the decision wait: every trace completed
            clock.now += 60.0
            pipeline.assembler.tick()
        for data in again:  # after their traces were decided: late spans, redelivered engine spans
            pipeline.buffer(data, False)
        for _ in range(3):
            clock.now += 60.0
            pipeline.assembler.tick()
        assert store.wait_written(), "the store did not write in time"
        # Sorted: the order of a family's children is the order they were first used, not data (the lane
        # counts a run's drops at once, the chain a batch's kept traces first).
        metrics = sorted(line for line in generate_latest(service.registry).decode().splitlines()
                         if not _CREATED.match(line))
        lane_completed = pipeline.assembler.lane.completed if lane else 0
        decisions = sorted((trace_id, repr(remembered)) for trace_id, remembered in pipeline.assembler.decisions())
        store.shutdown(5.0)
        return {"metrics": metrics, "rows": store_rows(tmp_path / name), "completions": pipeline.assembler.completions,
                "decisions": decisions, "lane_completed": lane_completed, "parked": parked}

    yield run
    for store in stores:
        store.shutdown(1.0)


def _sample(metrics: list[str], prefix: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in metrics if line.startswith(prefix))


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_the_lane_completes_what_the_chain_completes(run: Any, seed: int) -> None:
    requests = _traffic(seed)
    chain = run("chain", requests, lane=False, seed=seed)
    lane = run("lane", requests, lane=True, seed=seed)
    _assert_same(lane, chain, "metrics", "rows", "completions", "decisions")
    # It compared something: the lane took most traces, the chain the rest; requests were measured,
    # some traces kept (and stored), most dropped.
    completed = sum(chain["completions"].values())
    assert completed > 400 and completed * 0.8 < lane["lane_completed"] < completed, (lane["lane_completed"], completed)
    assert _sample(chain["metrics"], "vllm:e2e_request_latency_seconds_count") > 300
    assert _sample(chain["metrics"], 'otel_llm_values_rejected_total{reason="invalid_span_times"}') >= 1
    assert len(chain["rows"]["traces"]) > 10 and len(chain["decisions"]) > len(chain["rows"]["traces"]) * 3


def test_spans_after_the_lane_decided_their_trace_follow_its_decision_as_after_the_chain(run: Any) -> None:
    """The lane keeps its decisions as their parts in the buffer; a span that comes after its trace
    was decided (a retried export) reads them as the chain's ``Remembered``: a redelivered engine span
    is counted a duplicate, not measured twice, and any other follows the decision (stored if kept)."""
    requests = _traffic(5)
    again = requests[: len(requests) // 2]
    chain = run("chain", requests, lane=False, seed=5, again=again)
    lane = run("lane", requests, lane=True, seed=5, again=again)
    _assert_same(lane, chain, "metrics", "rows", "completions", "decisions")
    assert lane["lane_completed"] > 300
    assert _sample(chain["metrics"], "otel_llm_spans_duplicate_total") > 100
    assert _sample(chain["metrics"], "otel_llm_late_spans_total") > 100


def test_spans_parked_while_the_lane_decides_their_trace_follow_its_decision_as_in_the_chain(run: Any) -> None:
    """A span that comes while its trace is being decided is parked and handed on with the decision
    once remembered: from the lane, read from the buffer's parts of it (``take_parked``). The fleet
    mix alone, so that the first decisions remembered are a lane run's."""
    requests = _traffic(6, with_fixtures=False)
    chain = run("chain", requests, lane=False, seed=6, while_deciding=requests)
    lane = run("lane", requests, lane=True, seed=6, while_deciding=requests)
    assert chain["parked"] == [("remember_decisions", True)] and lane["parked"] == [("remember_lane", True)]
    _assert_same(lane, chain, "metrics", "rows", "completions", "decisions")
    assert lane["lane_completed"] > 300
    assert _sample(chain["metrics"], "otel_llm_late_spans_total") > 0


def test_a_trace_whose_policies_raise_fails_alone_in_both(run: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The ``errors`` policy reads each record's outcome through ``Outcome.FAILED``: one that raises on
    ``length`` fails those traces (logged, their spans counted dropped, measured without exemplars,
    no decision remembered) and no other, with the lane as along the chain."""

    class RaisingOnLength(frozenset[str]):
        def __contains__(self, outcome: object) -> bool:
            if outcome == Outcome.LENGTH:
                raise ValueError("a policy that fails on this trace")
            return frozenset.__contains__(self, outcome)

    monkeypatch.setattr(sampler_module, "Outcome", types.SimpleNamespace(FAILED=RaisingOnLength(Outcome.FAILED)))
    requests = _traffic(5)
    chain = run("chain", requests, lane=False, seed=5)
    lane = run("lane", requests, lane=True, seed=5)
    _assert_same(lane, chain, "metrics", "rows", "decisions")
    assert _sample(chain["metrics"], 'otel_llm_spans_dropped_total{reason="assembly_error"}') > 10
    assert lane["lane_completed"] > 300


def test_a_run_whose_recording_fails_is_counted_and_the_next_runs_go_on(
        run: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """Recording raising (a bug, not an input) fails the lane's run as it fails the chain's batch:
    each of its traces logged and its spans counted dropped; the runs after it are recorded."""
    resolve = MetricsRecorder._resolve_segment
    failures: list[str] = []

    def fail_once(self: MetricsRecorder, by_name: Any, base: Any, dimensions: Any, name: str) -> Any:
        if not failures:
            failures.append(name)
            raise RuntimeError("recording failed")
        return resolve(self, by_name, base, dimensions, name)

    monkeypatch.setattr(MetricsRecorder, "_resolve_segment", fail_once)
    caplog.set_level(logging.ERROR, logger="otel_llm.service.graph")
    lane = run("lane", _traffic(6), lane=True, seed=6)
    assert failures, "the recording never failed: the test tested nothing"
    failed = [r for r in caplog.records if r.getMessage().startswith("completing trace")]
    dropped = _sample(lane["metrics"], 'otel_llm_spans_dropped_total{reason="assembly_error"}')
    assert failed and dropped >= len(failed)
    recorded = _sample(lane["metrics"], "vllm:e2e_request_latency_seconds_count")
    assert recorded > 300 and lane["lane_completed"] > len(failed) + 300


def test_the_lane_stands_aside_where_the_chain_does_more(tmp_path: Path) -> None:
    """An intake log (each decision journaled), a rate limit or request accounting: the chain's work."""
    from otel_llm.config import config_from_dict
    from otel_llm.service.service import Service

    from bench.__main__ import pipeline_config

    def lane_of(change: Any) -> Any:
        path = pipeline_config(tmp_path, "lane", 0, 0, 0, {"decision_wait": "10s", "grace": "1s"})
        data = json.loads(path.read_text())
        data["receivers"]["otlp"]["protocols"] = {"grpc": {"endpoint": "127.0.0.1:0"}}
        change(data)
        return Service(config_from_dict(data)).pipeline.assembler.lane

    assert lane_of(lambda data: data["processors"]["tail_sampling"].update(
        {"rate_limit": {"traces_per_second": 10}})) is None
    assert lane_of(lambda data: data["processors"]["llm_metrics"].update(
        {"tenant": {"attributes": ["tenant.id"], "values": ["acme"]}})) is None
    assert isinstance(lane_of(lambda data: None), Lane)
    path = pipeline_config(tmp_path, "journaled", 0, 0, 0, {"decision_wait": "10s", "grace": "1s"})
    data = json.loads(path.read_text())
    data["receivers"]["otlp"]["protocols"] = {"grpc": {"endpoint": "127.0.0.1:0"}}
    pipeline = Service(config_from_dict(data)).pipeline
    assert isinstance(pipeline.assembler.lane, Lane)
    pipeline.use_intake_log(types.SimpleNamespace(prior={}))  # type: ignore[arg-type]
    assert pipeline.assembler.lane is None


def test_a_run_the_core_cannot_decide_is_completed_failed_not_lost(
        run: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """A failure of the lane itself rather than of one trace (the core's ``decide`` raising): the run's
    traces are counted completed, each logged and its spans counted dropped; nothing else stops."""
    real_service = _service

    class FailingOnce:
        def __init__(self, core: Any) -> None:
            self.core, self.failed_runs = core, []

        def __getattr__(self, name: str) -> Any:
            return getattr(self.core, name)

        def decide(self, lane_run: Any) -> None:
            if not self.failed_runs:
                self.failed_runs.append(len(lane_run))
                raise MemoryError("the core could not decide")
            self.core.decide(lane_run)

    wrapped: list[FailingOnce] = []

    def service_with_a_failing_lane(workdir: Path, lane: bool) -> Any:
        service, clock = real_service(workdir, lane)
        failing = FailingOnce(service.pipeline.assembler.lane._core)
        service.pipeline.assembler.lane._core = failing
        wrapped.append(failing)
        return service, clock

    monkeypatch.setattr(sys.modules[__name__], "_service", service_with_a_failing_lane)
    caplog.set_level(logging.ERROR, logger="otel_llm.service.graph")
    requests = _traffic(7)
    lane = run("lane", requests, lane=True, seed=7)
    (failing,) = wrapped
    (failed_run,) = failing.failed_runs
    logged = [r for r in caplog.records if r.getMessage().startswith("completing trace")]
    assert failed_run >= 1 and len(logged) == failed_run
    assert _sample(lane["metrics"], 'otel_llm_spans_dropped_total{reason="assembly_error"}') >= failed_run
    # Every trace counted completed: the failed run's and the others (the lane's and the chain's).
    completed = sum(lane["completions"].values())
    assert _sample(lane["metrics"], "otel_llm_traces_completed_total") == completed
    assert lane["lane_completed"] + failed_run <= completed and lane["lane_completed"] > 300
