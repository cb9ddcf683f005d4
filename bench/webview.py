"""``python -m bench.webview``: is the web view usable at 100 000 stored traces? (issue 16)

Fills a trace store with ``--traces`` traces (default 100 000; each a gateway span, a vLLM span and
its four segment spans, and the request's summary row, in the store's own schema), serves it from
the real metrics endpoint (``otel-llm``'s ``PrometheusEndpoint`` with the web view on) on a free
loopback port, and times over HTTP what the Requests and Trace pages ask for: the first page, each
sort, each filter, a deep page, and single traces. Prints one line per call (median and max of
``--repeat`` runs, in ms) and a ``RESULT`` line; the goal is < 200 ms for every call.

Not part of ``make bench`` (filling the store takes about a minute on two cores).
"""

from __future__ import annotations

import argparse
import json
import random
import sqlite3
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from prometheus_client import CollectorRegistry

GOAL_MS = 200.0
MODELS = ("llama-3.1-8b-instruct", "llama-3.1-70b-instruct", "qwen2.5-7b-instruct", "mistral-7b-instruct")
ENGINES = ("vllm", "sglang", "tgi")
OUTCOMES = ("stop", "stop", "stop", "length", "abort", "error", "unknown")
POLICIES = ("errors", "slowest", "baseline", "slo")


def fill(path: Path, traces: int, seed: int = 16) -> None:
    from otel_llm.exporter.store.sqlite import SCHEMA, SUMMARY_COLUMNS

    rng = random.Random(seed)
    connection = sqlite3.connect(path)
    connection.executescript(SCHEMA)
    now_ns = time.time_ns()
    batch_spans, batch_requests, batch_traces = [], [], []

    def flush() -> None:
        connection.executemany("INSERT INTO spans VALUES (?,?,?,?,?,?,?,?,?,?,?)", batch_spans)
        connection.executemany(f"INSERT INTO requests VALUES ({','.join('?' * len(SUMMARY_COLUMNS))})", batch_requests)
        connection.executemany("INSERT INTO traces VALUES (?,?,?,?)", batch_traces)
        connection.commit()
        batch_spans.clear(), batch_requests.clear(), batch_traces.clear()

    for i in range(traces):
        trace_id = f"{rng.getrandbits(128):032x}"
        start = now_ns - (traces - i) * 50_000_000  # one every 50 ms
        pre, queue, prefill = rng.uniform(0.001, 0.02), rng.expovariate(5), rng.uniform(0.02, 0.5)
        decode, overhead = rng.uniform(0.2, 8.0), rng.uniform(0.002, 0.05)
        ttft = pre + queue + prefill
        e2e = ttft + decode
        gateway_id, engine_id = f"{rng.getrandbits(64):016x}", f"{rng.getrandbits(64):016x}"
        engine_start = start + int(overhead / 2 * 1e9)
        model, engine = rng.choice(MODELS), rng.choice(ENGINES)
        outcome, policy = rng.choice(OUTCOMES), rng.choice(POLICIES)
        attrs = {"gen_ai.latency.e2e": e2e, "gen_ai.latency.time_to_first_token": ttft, "gen_ai.latency.time_in_queue": queue,
                 "gen_ai.usage.prompt_tokens": 700, "gen_ai.usage.completion_tokens": 220,
                 "otel_llm.sampling.policy": policy, "otel_llm.model_source": "gateway"}
        batch_spans.append((trace_id, gateway_id, None, "POST /v1/chat/completions", 2, "gateway", start,
                            start + int((e2e + overhead) * 1e9), 0, "", json.dumps({"http.route": "/v1/chat/completions"})))
        batch_spans.append((trace_id, engine_id, gateway_id, "llm_request", 2, "vllm", engine_start,
                            engine_start + int(e2e * 1e9), 2 if outcome == "error" else 0, "", json.dumps(attrs)))
        t, segments = engine_start, []
        for name, length in (("preprocess", pre), ("queue", queue), ("prefill", prefill), ("decode", decode)):
            end = t + int(length * 1e9)
            batch_spans.append((trace_id, f"{rng.getrandbits(64):016x}", engine_id, name, 1, "vllm", t, end, 0, "",
                                json.dumps({"otel_llm.segment": name})))
            segments.append({"name": name, "start_time_unix_nano": t, "end_time_unix_nano": end})
            t = end
        batch_requests.append((trace_id, engine_id, model, engine, "vllm", "chat", outcome, policy, "gateway", engine_start,
                               ttft, decode / 219, e2e, queue, prefill, decode, overhead, 700, 220, json.dumps(segments)))
        batch_traces.append((trace_id, time.time() - (traces - i) * 0.05, policy, 6))
        if len(batch_traces) >= 5000:
            flush()
    flush()
    connection.close()


def timed(url: str, repeat: int) -> tuple[float, float, int]:
    times, size = [], 0
    for _ in range(repeat):
        started = time.perf_counter()
        with urllib.request.urlopen(url, timeout=30) as response:
            size = len(response.read())
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times), max(times), size


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.webview", description=__doc__.split("\n\n")[0])
    parser.add_argument("--traces", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--keep", metavar="DIR", help="fill (or reuse) the store in DIR instead of a temporary one")
    args = parser.parse_args(argv)

    from otel_llm.config import config_from_dict
    from otel_llm.exporter.store.sqlite import DB_NAME, StoreReader
    from otel_llm.extension.webview.extension import WebViewServer

    directory = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="otel-llm-webview-bench-"))
    directory.mkdir(parents=True, exist_ok=True)
    db = directory / DB_NAME
    if not db.exists():
        started = time.monotonic()
        fill(db, args.traces)
        print(f"filled {args.traces} traces ({db.stat().st_size / 2**20:.0f} MiB) in {time.monotonic() - started:.1f} s")
    config = config_from_dict({"exporters": {"prometheus": {"endpoint": "127.0.0.1:0"}, "store": {"path": str(directory)}},
                               "extensions": {"webview": {"endpoint": "127.0.0.1:0"}}})
    reader = StoreReader(db)
    endpoint = WebViewServer(config.extensions.webview, CollectorRegistry(), reader, config=config)
    endpoint.start()
    base = f"http://127.0.0.1:{endpoint.port}"
    try:
        stored = reader.stats()
        sample = [r["trace_id"] for r in reader.list_requests(sort="ttft", limit=5)]
        middle = [r["trace_id"] for r in reader.list_requests(limit=1, offset=stored["requests"] // 2)]
        calls = [("requests: first page (newest)", "/api/ui/requests?limit=50")]
        calls += [(f"requests: sort {s}", f"/api/ui/requests?limit=50&sort={s}")
                  for s in ("ttft", "e2e", "queue", "gateway_overhead", "tpot")]
        calls += [("requests: sort ttft ascending", "/api/ui/requests?limit=50&sort=ttft&order=asc"),
                  ("requests: model filter, by ttft", f"/api/ui/requests?limit=50&sort=ttft&model={MODELS[1]}"),
                  ("requests: engine + outcome filter", "/api/ui/requests?limit=50&engine=sglang&outcome=error"),
                  ("requests: policy filter, by e2e", "/api/ui/requests?limit=50&policy=slo&sort=e2e"),
                  ("requests: last hour", f"/api/ui/requests?limit=50&since={time.time_ns() - 3600 * 10**9}"),
                  ("requests: last hour, by ttft", f"/api/ui/requests?limit=50&sort=ttft&since={time.time_ns() - 3600 * 10**9}"),
                  ("requests: page 200 (offset 10000)", "/api/ui/requests?limit=50&offset=10000"),
                  ("requests: page 20 by ttft (offset 1000)", "/api/ui/requests?limit=50&sort=ttft&offset=1000"),
                  ("requests: filter options", "/api/ui/filters"),
                  ("status (store counts)", "/api/ui/status")]
        calls += [(f"trace {i}", f"/api/ui/trace/{t}") for i, t in enumerate(sample[:3] + middle)]
        worst = 0.0
        print(f"{stored['traces']} stored traces, {stored['requests']} requests; {args.repeat} runs each, ms")
        for name, path in calls:
            median, most, size = timed(base + path, args.repeat)
            worst = max(worst, median)
            print(f"  {name:38s} median {median:7.1f}  max {most:7.1f}  ({size} bytes)")
        verdict = "met" if worst < GOAL_MS else "NOT met"
        print(f"RESULT webview traces={stored['traces']} worst_median_ms={worst:.1f} goal_ms={GOAL_MS:.0f} {verdict}")
        return 0 if worst < GOAL_MS else 1
    finally:
        endpoint.stop()


if __name__ == "__main__":
    sys.exit(main())
