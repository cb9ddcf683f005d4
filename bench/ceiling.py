"""What each layer of ``otel-llm serve`` costs at saturation: the server cut short at four depths.

``python -m bench.ceiling`` (~4 minutes; loopback only, every server stopped) runs the bench's
saturated gRPC window (4 callers, the bench's batches) against fresh servers of the default
configuration, in alternating rounds, each with the pipeline process's work cut at one depth:

- ``receive``: the pipeline process takes each request off the receivers' pipe and drops it: the
  receiver process (gRPC, validation, the pipe) and the hand-off alone;
- ``digest``: each request is also digested (the compiled core's walk, the adapters, the spans'
  objects) and its spans dropped;
- ``buffer``: the spans are also buffered by trace and the traces completed (``TraceAssembler``),
  and the chain after it does nothing (no records, metrics, decision or store);
- ``full``: the whole default pipeline, what ``make bench`` measures.

Each depth's CPU per span less the one before it is what that layer costs with the cores shared as
in production; the shallowest depth bounds what any change behind the receive path can reach.
The cut is a patch of the server's own code in its process (``--serve DEPTH``), not a
configuration: these servers are for measuring only.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

DEPTHS = ("receive", "digest", "buffer", "full")


def serve(depth: str, argv: list[str]) -> int:
    """``otel-llm`` with the pipeline process's work cut at ``depth``."""
    from otel_llm.cli import main
    from otel_llm.service import graph

    if depth in ("receive", "digest"):
        def buffer(self: graph.Pipeline, data: bytes, validated: bool = False) -> None:
            if depth == "digest":
                graph.digest_in_process(data, self.digest_settings, validated)

        graph.Pipeline.buffer = buffer  # type: ignore[method-assign]
    elif depth == "buffer":
        def consume_batch(self: Any, batch: list[Any]) -> None:
            pass

        graph._Entry.consume_batch = consume_batch  # type: ignore[method-assign]
        # The completion lane would do the chain's work itself (records, decision, store).
        graph.completion_lane = lambda *args, **kwargs: None  # type: ignore[assignment]
    elif depth != "full":
        raise SystemExit(f"unknown depth {depth!r}: one of {', '.join(DEPTHS)}")
    return main(argv)


def measure(rounds: int, warmup: float, duration: float, depths: list[str]) -> dict[str, list[dict[str, Any]]]:
    from bench.__main__ import (
        PYTHON,
        ROOT,
        Load,
        Server,
        cpu_per_million,
        free_port,
        log,
        pipeline_config,
        saturate_phase,
        write_batches,
    )
    from bench.workload import generate

    results: dict[str, list[dict[str, Any]]] = {depth: [] for depth in depths}
    with tempfile.TemporaryDirectory(prefix="otel-llm-ceiling-") as tmp:
        workdir = Path(tmp)
        batches = workdir / "batches.pkl"
        write_batches(batches, generate(32, seed=1))
        load = Load(workdir)
        for round_index in range(rounds):
            for depth in depths:
                grpc_port, http_port, metrics_port = free_port(), free_port(), free_port()
                name = f"{depth}-{round_index}"
                config = pipeline_config(workdir, name, grpc_port, http_port, metrics_port,
                                         {"decision_wait": "10s", "grace": "1s"})
                argv = [PYTHON, "-m", "bench.ceiling", "--serve", depth, "--", "--log-level", "WARNING",
                        "serve", "--config", str(config)]
                server = Server(name, argv, workdir, grpc_port, http_port, metrics_port, cwd=ROOT)
                try:
                    server.wait_ready()
                    log(f"round {round_index + 1}, depth {depth}:")
                    res = saturate_phase(load, server, batches, "grpc", warmup, duration)
                    # A cut that no longer fits the pipeline (a changed signature) fails every request,
                    # counted as dropped: a figure of that would measure the failure, not the depth.
                    dropped = server.scrape().get("otel_llm_spans_dropped_total", 0.0)
                    if dropped:
                        raise RuntimeError(f"depth {depth}: the server dropped {dropped:.0f} spans; not a measurement")
                finally:
                    server.stop()
                spans = res.get("spans") or 0
                by_process = res.get("server_cpu_s_by_process") or {}
                results[depth].append({
                    "spans_per_s": res.get("spans_per_s"),
                    "cpu_us_per_span": cpu_per_million(res),
                    "cpu_us_per_span_by_process": {name: seconds / spans * 1e6 for name, seconds in by_process.items()}
                    if spans else {},
                })
    return results


def report(results: dict[str, list[dict[str, Any]]]) -> None:
    print("depth     spans/s (median; rounds)                 CPU-us per span, process tree (median; by process)")
    for depth, runs in results.items():
        rates = [run["spans_per_s"] for run in runs if run["spans_per_s"]]
        cpus = [run["cpu_us_per_span"] for run in runs if run["cpu_us_per_span"]]
        processes = sorted({name for run in runs for name in run["cpu_us_per_span_by_process"]})
        split = ", ".join(
            f"{name} {statistics.median(run['cpu_us_per_span_by_process'].get(name, 0.0) for run in runs):.2f}"
            for name in processes)
        print(f"{depth:8}  {statistics.median(rates) if rates else 0:9.0f} ({' / '.join(f'{r:.0f}' for r in rates)})"
              f"   {statistics.median(cpus) if cpus else 0:6.2f} ({split})")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--serve"]:
        if len(argv) < 3 or argv[2] != "--":
            raise SystemExit("usage: python -m bench.ceiling --serve DEPTH -- OTEL-LLM-ARGS...")
        return serve(argv[1], argv[3:])
    parser = argparse.ArgumentParser(prog="python -m bench.ceiling", description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--duration", type=float, default=8.0)
    parser.add_argument("--depths", default=",".join(DEPTHS), help="comma-separated, in the order each round runs them")
    parser.add_argument("--json", type=Path, help="also write every round's figures here")
    args = parser.parse_args(argv)
    depths = [depth.strip() for depth in args.depths.split(",") if depth.strip()]
    unknown = [depth for depth in depths if depth not in DEPTHS]
    if unknown:
        parser.error(f"unknown depth(s) {', '.join(unknown)}: one of {', '.join(DEPTHS)}")
    results = measure(args.rounds, args.warmup, args.duration, depths)
    report(results)
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
