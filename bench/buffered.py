"""``python -m bench.buffered``: bytes per buffered span by ``tracemalloc``, in one process.

The RSS phase's workload (``python -m bench --rss-only``: traces whose root never arrives) digested
by the adapter stage of the configured core (``OTEL_LLM_CORE``) into the real ``TraceAssembler``,
with ``decision_wait`` long enough that nothing completes; prints the bytes allocated per buffered
span and the source lines that allocated them. A few seconds, and steadier than RSS: for measuring
one change to what a buffered span holds at a time. It sees Python's allocations only: on the native
path a buffered span's bytes are a Rust allocation of the core's ``BufferedSpan`` (``rust/src/lib.rs``
``Row``), counted by RSS and by ``sys.getsizeof(span)``, not here, and so is the trace buffer itself
(``rust/src/buffer.rs``: its traces, their span tables and the decision cache).
"""

from __future__ import annotations

import argparse
import gc
import tempfile
import tracemalloc
from dataclasses import replace
from pathlib import Path

from bench.hotpath import build
from bench.workload import generate


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.buffered", description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, default=16, help="batches of 515-988 spans (the first is a warm-up)")
    parser.add_argument("--lines", type=int, default=12, help="allocating source lines to print")
    args = parser.parse_args(argv)

    from otel_llm.internal import core as native_core
    from otel_llm.processor.llm_metrics.digest import digest_in_process

    service, _ = build(Path(tempfile.mkdtemp(prefix="otel-llm-buffered-")))
    pipeline = service.pipeline
    from otel_llm.processor.tail_sampling.assembler import make_assembler

    # Made again with the hold long enough (the core's buffer takes its settings when it is made).
    assembler = pipeline.assembler = make_assembler(
        replace(pipeline.assembler.settings, decision_wait_s=1e9, max_traces=10**9), pipeline.assembler._next,
        native_core.active()[0])
    settings = pipeline.digest_settings
    batches = generate(args.batches, seed=2, upstream_parent=True)  # the RSS phase's pending batches
    assembler.add_batch(digest_in_process(batches[0].payload, settings)[0])  # interned strings, caches
    gc.collect()
    held_before = assembler.held_spans()
    traces_before = len(assembler)
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    for batch in batches[1:]:
        assembler.add_batch(digest_in_process(batch.payload, settings)[0])
    gc.collect()
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    spans = assembler.held_spans() - held_before
    traces = len(assembler) - traces_before
    if assembler.completions:
        raise SystemExit(f"traces completed during the hold ({assembler.completions}): the figure would be low")
    differences = after.compare_to(before, "lineno")
    total = sum(difference.size_diff for difference in differences)
    extension, why = native_core.active()
    print(f"core {'native' if extension is not None else 'python (' + why + ')'}: {spans} spans of {traces} "
          f"traces held, {total / spans:.0f} B per buffered span (tracemalloc), {total / traces:.0f} B per trace")
    for difference in differences[:args.lines]:
        frame = difference.traceback[0]
        print(f"  {difference.size_diff / spans:7.1f} B  {difference.count_diff / spans:5.2f} objects per span  "
              f"{Path(frame.filename).name}:{frame.lineno}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
