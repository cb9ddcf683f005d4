"""The pipeline's hot path in one process, one thread, no sockets: CPU µs per span of each stage.

``python -m bench.hotpath`` builds the same ``otel-llm serve`` the bench runs (``bench.__main__``'s
config: the real config loader, factories and ``Pipeline``; the store started in a temp directory),
then feeds the bench's batches (``bench.workload.generate(32, seed=1)``, re-stamped with a new trace-id
epoch every pass so no id repeats) through:

- ``parse+adapter``: the adapter stage (``digest.py``: the parse into ``otlp_view`` included), what
  ``Pipeline.buffer`` does before the buffer;
- ``buffer``: ``TraceAssembler.add_batch``;
- ``completion``: ``TraceAssembler.tick`` once the grace has passed (the assembler's clock is moved
  forward, not waited for): the whole chain, records, decision, metrics, redaction, the store's queue.

Each figure is ``time.process_time()`` over a pass divided by the pass's spans, median of ``--passes``
(the GC tuned as the server tunes it, so its pauses are counted where they fall). ``--split`` also
times the completion chain's parts alone on one pass's completed traces (records, decision, metrics
recording), and the completion lane (``service/lane.py``) on another pass's, where it runs.
``--profile N`` prints cProfile's top ``N`` functions of one more pass.

``--engine`` then sends the same passes through the native engine (``otel_llm._core.Engine``, built
from ``service/declarations.py``'s declaration of the same configuration): ``engine ingest`` (the
request read, the adapters, the buffer: what ``parse+adapter`` and ``buffer`` are in Python) and
``engine completion`` (drained and ticked: records, decisions, both namings' series, the kept-trace
writer's bytes and rows handed to Python — not the store's write, which the Python figure holds),
on one thread, then the ingest on two threads at once (the engine releases the GIL; shards by trace
id), as CPU µs per span and spans/s of wall time.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.workload import generate, stamp


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def build(workdir: Path, production: bool = False) -> tuple[Any, _Clock]:
    """The bench's server configuration; ``production``: ``bench.__main__.PRODUCTION``'s processors
    (accounting with tenants, cost and SLO; the rate limit), its intake log apart (the receivers')."""
    import json

    from otel_llm.config import config_from_dict
    from otel_llm.internal.runtime import tune_gc
    from otel_llm.service.service import Service

    from bench.__main__ import PRODUCTION, pipeline_config

    if production:
        path = pipeline_config(workdir, "hotpath", 0, 0, 0, PRODUCTION["tail_sampling"],
                               llm_metrics=PRODUCTION["llm_metrics"])
    else:
        path = pipeline_config(workdir, "hotpath", 0, 0, 0, {"decision_wait": "10s", "grace": "1s"})
    data = json.loads(path.read_text())
    data["receivers"]["otlp"]["protocols"] = {"grpc": {"endpoint": "127.0.0.1:0"}}
    service = Service(config_from_dict(data))
    store = service.components.get("exporters.store")
    if store is not None:
        store.start(service.host)
    clock = _Clock()
    service.pipeline.assembler._clock = clock
    tune_gc()
    return service, clock


def run_pass(pipeline: Any, clock: _Clock, payloads: list[bytes]) -> dict[str, float]:
    from otel_llm.processor.llm_metrics.digest import digest_in_process

    settings = pipeline.digest_settings
    assembler = pipeline.assembler
    process_time = time.process_time
    digest_s = buffer_s = 0.0
    for payload in payloads:
        t0 = process_time()
        spans, counts = digest_in_process(payload, settings)  # parsed there, as Pipeline.buffer does
        t1 = process_time()
        assembler.add_batch(spans)
        t2 = process_time()
        digest_s += t1 - t0
        buffer_s += t2 - t1
    clock.now += 1.5  # past the grace: every rooted trace is due
    t0 = process_time()
    assembler.tick()
    _wait_store(pipeline)  # the store's writer thread: its CPU is the completion's too
    completion_s = process_time() - t0
    return {"parse+adapter": digest_s, "buffer": buffer_s, "completion": completion_s}


def _wait_store(pipeline: Any) -> None:
    for consumer in pipeline.consumers:
        wait = getattr(consumer, "wait_written", None)
        if wait is not None:
            wait()


def _capture(pipeline: Any, clock: _Clock, payloads: list[bytes]) -> list[Any]:
    """The traces one pass of ``payloads`` completes, as they enter the chain (not handed on)."""
    from otel_llm.processor.llm_metrics.digest import digest_in_process

    captured: list[Any] = []
    entry = pipeline.assembler._next
    lane = pipeline.assembler.lane
    pipeline.assembler._next = type("Capture", (), {"consume_batch": staticmethod(captured.extend)})()
    pipeline.assembler.lane = None  # every trace to the chain's entry, captured there
    try:
        for payload in payloads:
            pipeline.assembler.add_batch(digest_in_process(payload, pipeline.digest_settings)[0])
        clock.now += 1.5
        pipeline.assembler.tick()
    finally:
        pipeline.assembler._next = entry
        pipeline.assembler.lane = lane
    return captured


def split_completion(pipeline: Any, clock: _Clock, payloads: list[bytes],
                     lane_payloads: list[bytes]) -> dict[str, float]:
    """The completion chain's parts alone, on the traces one pass completes (CPU s for the pass);
    the lane's on those of ``lane_payloads`` (new trace ids: kept traces not stored yet)."""
    from otel_llm.processor.llm_metrics.requests import records_of_trace
    from otel_llm.processor.tail_sampling.assembler import COMPLETION_BATCH

    captured = _capture(pipeline, clock, payloads)
    entry = pipeline.assembler._next
    lane = pipeline.assembler.lane
    metrics = pipeline.metrics
    sampler = pipeline.decision._sampler
    out: dict[str, float] = {}
    t0 = time.process_time()
    all_records = [records_of_trace(c.trace, metrics.settings, [], metrics.native_records) for c in captured]
    out["records_of_trace"] = time.process_time() - t0
    t0 = time.process_time()
    for c, records in zip(captured, all_records):
        sampler.decide(c.trace, records)
    out["decide"] = time.process_time() - t0
    recorder = metrics.recorder
    t0 = time.process_time()
    for records in all_records:
        for record in records:
            recorder.record(record, False)
    out["recorder.record"] = time.process_time() - t0
    t0 = time.process_time()
    for records in all_records:
        metrics.count_measured([(record, False) for record in records])
    out["stage telemetry"] = time.process_time() - t0
    t0 = time.process_time()
    for start in range(0, len(captured), COMPLETION_BATCH):
        entry.consume_batch(captured[start:start + COMPLETION_BATCH])
    _wait_store(pipeline)
    out["whole chain on these traces"] = time.process_time() - t0
    if lane is not None:  # another pass's traces through the completion lane (service/lane.py)
        due = [(c.trace, c.reason) for c in _capture(pipeline, clock, lane_payloads)]
        t0 = time.process_time()
        for start in range(0, len(due), COMPLETION_BATCH):
            lane.complete(due[start:start + COMPLETION_BATCH], pipeline.assembler._complete_in_chain)
        _wait_store(pipeline)
        out[f"completion lane instead ({len(due)} traces)"] = time.process_time() - t0
    kept = [c for c in captured if c.decision is not None and c.decision.keep]
    t0 = time.process_time()
    for start in range(0, len(kept), COMPLETION_BATCH):
        pipeline.redaction.consume_batch(kept[start:start + COMPLETION_BATCH])
    _wait_store(pipeline)
    out[f"redaction+store again ({len(kept)} kept)"] = time.process_time() - t0
    out["_traces"] = len(captured)
    out["_records"] = sum(len(r) for r in all_records)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.hotpath", description=__doc__.split("\n")[0])
    parser.add_argument("--passes", type=int, default=7)
    parser.add_argument("--batches", type=int, default=32)
    parser.add_argument("--split", action="store_true", help="time the completion chain's parts alone")
    parser.add_argument("--profile", type=int, default=0, metavar="N", help="cProfile's top N of one more pass")
    parser.add_argument("--sort", default="tottime")
    parser.add_argument("--no-gc", action="store_true", help="experiment: the cyclic GC disabled")
    parser.add_argument("--engine", action="store_true", help="the same passes through the native engine")
    parser.add_argument("--production", action="store_true",
                        help="bench.__main__.PRODUCTION's processors (tenants, cost, SLO, rate limit) and its "
                             "workload (gateway spans with a tenant)")
    args = parser.parse_args(argv)
    batches = generate(args.batches, seed=1, tenants=args.production)
    spans = sum(b.spans for b in batches)
    traces = sum(b.traces for b in batches)
    with tempfile.TemporaryDirectory(prefix="otel-llm-hotpath-") as tmp:
        service, clock = build(Path(tmp), production=args.production)
        pipeline = service.pipeline
        if args.no_gc:
            import gc
            gc.disable()
        epoch = 1
        results: list[dict[str, float]] = []
        for index in range(args.passes + 1):  # the first pass warms up (caches, series, quantiles)
            payloads = [stamp(b, epoch) for b in batches]
            epoch += 1
            figures = run_pass(pipeline, clock, payloads)
            if index:
                results.append(figures)
        print(f"{spans} spans, {traces} traces per pass, {args.passes} passes (+1 warm-up); "
              f"CPU us per span, median [min-max]")
        total = []
        for stage in ("parse+adapter", "buffer", "completion"):
            values = [r[stage] / spans * 1e6 for r in results]
            print(f"  {stage:16} {statistics.median(values):7.2f}  [{min(values):.2f}-{max(values):.2f}]")
        total = [sum(r.values()) / spans * 1e6 for r in results]
        print(f"  {'total':16} {statistics.median(total):7.2f}  [{min(total):.2f}-{max(total):.2f}]"
              f"  ({statistics.median(total) * spans / traces:.1f} us per trace)")
        if args.split:
            payloads = [stamp(b, epoch) for b in batches]
            lane_payloads = [stamp(b, epoch + 1) for b in batches]
            epoch += 2
            parts = split_completion(pipeline, clock, payloads, lane_payloads)
            n_traces, n_records = parts.pop("_traces"), parts.pop("_records")
            print(f"  completion parts alone ({n_traces:.0f} traces, {n_records:.0f} records): "
                  "us per span / per trace / per record")
            for name, seconds in parts.items():
                print(f"    {name:34} {seconds / spans * 1e6:6.2f} / {seconds / n_traces * 1e6:6.2f} / "
                      f"{seconds / max(n_records, 1) * 1e6:6.2f}")
        if args.profile:
            payloads = [stamp(b, epoch) for b in batches]
            profiler = cProfile.Profile(time.process_time)
            profiler.enable()
            run_pass(pipeline, clock, payloads)
            profiler.disable()
            out = io.StringIO()
            pstats.Stats(profiler, stream=out).sort_stats(args.sort).print_stats(args.profile)
            print(out.getvalue())
        if args.engine:
            engine_passes(service, batches, epoch, args.passes, spans)
        store = service.components.get("exporters.store")
        if store is not None:
            store.shutdown(2.0)
    return 0


def _engine(service: Any, shards: int) -> Any:
    import json

    from otel_llm.internal import core
    from otel_llm.service.declarations import engine_declaration

    extension, why = core.active()
    if extension is None or not hasattr(extension, "Engine"):
        raise SystemExit(f"--engine needs the compiled extension with the engine ({why})")
    processors = {path.partition(".")[2]: component.config for path, component in service.components.items()
                  if path.startswith("processors.")}
    return extension.Engine(json.dumps(engine_declaration(processors, write_kept=True, shards=shards)))


def _engine_pass(engine: Any, payloads: list[bytes], now: float, threads: int) -> tuple[float, float, float, int]:
    """(ingest CPU s, completion CPU s, ingest wall s, requests Python would read) of one pass."""
    import threading

    python_read = [0]

    def ingest(part: list[bytes]) -> None:
        for payload in part:
            if engine.ingest(payload, False, now) is None:
                python_read[0] += 1

    t0, w0 = time.process_time(), time.perf_counter()
    if threads == 1:
        ingest(payloads)
    else:
        workers = [threading.Thread(target=ingest, args=(payloads[i::threads],)) for i in range(threads)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
    t1, w1 = time.process_time(), time.perf_counter()
    engine.drain()
    engine.tick(now + 1.5)
    t2 = time.process_time()
    return t1 - t0, t2 - t1, w1 - w0, python_read[0]


def engine_passes(service: Any, batches: list[Any], epoch: int, passes: int, spans: int) -> None:
    for threads in (1, 2):
        engine = _engine(service, shards=threads)
        results = []
        for index in range(passes + 1):
            payloads = [stamp(b, epoch) for b in batches]
            epoch += 1
            figures = _engine_pass(engine, payloads, 1000.0 + 10.0 * index, threads)
            if index:
                results.append(figures)
        if any(r[3] for r in results):
            print(f"  engine: {results[0][3]} requests of a pass would be read by Python (not measured here)")
        ingest = [r[0] / spans * 1e6 for r in results]
        completion = [r[1] / spans * 1e6 for r in results]
        total = [(r[0] + r[1]) / spans * 1e6 for r in results]
        rate = [spans / r[2] for r in results]
        label = "engine" if threads == 1 else f"engine x{threads}"
        print(f"  {label + ' ingest':16} {statistics.median(ingest):7.2f}  [{min(ingest):.2f}-{max(ingest):.2f}]"
              f"  ingest {statistics.median(rate):,.0f} spans/s wall ({threads} thread{'s' if threads > 1 else ''},"
              f" {threads} shard{'s' if threads > 1 else ''})")
        print(f"  {label + ' completion':16} {statistics.median(completion):7.2f}"
              f"  [{min(completion):.2f}-{max(completion):.2f}]")
        print(f"  {label + ' total':16} {statistics.median(total):7.2f}  [{min(total):.2f}-{max(total):.2f}]")


if __name__ == "__main__":
    sys.exit(main())
