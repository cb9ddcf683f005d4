"""The peer in the benchmark: our own OpenTelemetry Collector build (collector-config/otelcol-llm-front/,
built by `make peers`) configured as the closest pipeline a user could build without otel-llm, fed
the same pre-generated batches by the same load generator in the same run:

    otlp (gRPC + HTTP) --+--> signaltometrics: vLLM's TTFT, e2e and queue-time histograms from the
                         |    engine span's gen_ai.latency.* attributes, with vLLM's buckets
                         |    --> deltatocumulative --> prometheus exporter (/metrics)
                         +--> tail_sampling (errors, latency, probabilistic 1 %) --> debug (basic)

What this peer cannot do that otel-llm does: no segment spans (queue / prefill / decode children of
the engine span), one naming only (no gen_ai.server.* / gen_ai.client.* beside vllm:*), no join of a
gateway span with its engine span (no gateway overhead, no model name for vLLM V1, which never names
its model: the histograms are keyed by service.name), SGLang's and TGI's shapes not read (their
spans carry other attributes), no per-model rolling-p99 "slowest" policy (a fixed latency threshold
instead), exemplars on every observation's bucket rather than only of kept traces (here: none), and
kept traces go to the debug exporter (a log line per batch) instead of an embedded store.

Figures, as for otel-llm: saturated spans/s (acknowledged = processed: the Collector's receivers
answer after signaltometrics has aggregated the batch and tail_sampling has buffered it),
CPU-s per million spans (/proc, the Collector is one process), RSS per buffered span (a second
Collector with decision_wait 600s holding every trace) and Export p99 at the paced rate.
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request
from pathlib import Path
from types import ModuleType
from typing import Any

from otel_llm.processor.llm_metrics.metrics.definitions import REQUEST_LATENCY_BUCKETS, TTFT_BUCKETS

ROOT = Path(__file__).resolve().parent.parent
NAME = "otelcol-llm-front"
HISTOGRAMS = (  # (metric, span attribute, buckets): vLLM's own three
    ("vllm.time_to_first_token", "gen_ai.latency.time_to_first_token", TTFT_BUCKETS),
    ("vllm.e2e_request_latency", "gen_ai.latency.e2e", REQUEST_LATENCY_BUCKETS),
    ("vllm.request_queue_time", "gen_ai.latency.time_in_queue", REQUEST_LATENCY_BUCKETS),
)


def binary() -> Path:
    done = subprocess.run(["bash", str(ROOT / "collector-config" / "peers.sh"), "path", NAME],
                          capture_output=True, text=True, timeout=60, check=True)
    path = Path(done.stdout.strip())
    if not path.is_file():
        raise RuntimeError(f"{NAME} is not built ({path}): run `make bench` (or `make peers`), which builds it")
    return path


def peer_config(grpc_port: int, http_port: int, prom_port: int, telemetry_port: int, health_port: int,
                decision_wait: str = "10s", num_traces: int = 100_000) -> dict[str, Any]:
    spans = [{
        "name": metric, "unit": "s", "description": f"{attribute} of vLLM engine spans",
        "conditions": [f'attributes["{attribute}"] != nil'],
        "include_resource_attributes": [{"key": "service.name"}],
        "histogram": {"buckets": list(buckets), "value": f'Double(attributes["{attribute}"])'},
    } for metric, attribute, buckets in HISTOGRAMS]
    return {
        "extensions": {"health_check": {"endpoint": f"127.0.0.1:{health_port}"}},
        "receivers": {"otlp": {"protocols": {"grpc": {"endpoint": f"127.0.0.1:{grpc_port}",
                                                      "max_recv_msg_size_mib": 64},
                                             "http": {"endpoint": f"127.0.0.1:{http_port}"}}}},
        "connectors": {"signal_to_metrics": {"spans": spans}},
        "processors": {
            "tail_sampling": {"decision_wait": decision_wait, "num_traces": num_traces, "policies": [
                {"name": "errors", "type": "status_code", "status_code": {"status_codes": ["ERROR"]}},
                {"name": "latency", "type": "latency", "latency": {"threshold_ms": 10_000}},
                {"name": "baseline", "type": "probabilistic", "probabilistic": {"sampling_percentage": 1}},
            ]},
            "delta_to_cumulative": {},
        },
        "exporters": {"prometheus": {"endpoint": f"127.0.0.1:{prom_port}"},
                      "debug": {"verbosity": "basic", "sampling_initial": 1, "sampling_thereafter": 1000}},
        "service": {
            "extensions": ["health_check"],
            "pipelines": {
                "traces/metrics": {"receivers": ["otlp"], "exporters": ["signal_to_metrics"]},
                "traces/sampling": {"receivers": ["otlp"], "processors": ["tail_sampling"], "exporters": ["debug"]},
                "metrics": {"receivers": ["signal_to_metrics"], "processors": ["delta_to_cumulative"],
                            "exporters": ["prometheus"]},
            },
            "telemetry": {"metrics": {"level": "normal", "readers": [{"pull": {"exporter": {"prometheus": {
                "host": "127.0.0.1", "port": telemetry_port}}}}]}, "logs": {"level": "warn"}},
        },
    }


def start(m: ModuleType, workdir: Path, name: str, **config: Any) -> Any:
    """A ``bench.__main__.Server`` running our Collector build; ready once its health check answers."""
    ports = {k: m.free_port() for k in ("grpc", "http", "prom", "telemetry", "health")}
    path = workdir / f"{name}.yaml"
    path.write_text(json.dumps(peer_config(ports["grpc"], ports["http"], ports["prom"], ports["telemetry"],
                                           ports["health"], **config), indent=2))
    server = m.Server(name, [str(binary()), "--config", str(path)], workdir, ports["grpc"], ports["http"])
    server.prom_url = f"http://127.0.0.1:{ports['prom']}/metrics"
    server.telemetry_url = f"http://127.0.0.1:{ports['telemetry']}/metrics"
    deadline = time.monotonic() + 60
    while True:
        if server.proc.poll() is not None:
            raise RuntimeError(f"{name} exited with {server.proc.returncode}:\n{server.log_tail()}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{ports['health']}/", timeout=1) as response:
                if response.status == 200:
                    return server
        except OSError:
            pass
        if time.monotonic() > deadline:
            server.stop()
            raise RuntimeError(f"{name} not healthy after 60 s:\n{server.log_tail()}")
        time.sleep(0.1)


def scrape_sum(url: str, prefix: str) -> float:
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith(prefix):
            try:
                total += float(line.rpartition(" ")[2])
            except ValueError:
                pass
    return total


def run(m: ModuleType, load: Any, workdir: Path, batches: Path, pending: Path, durations: dict[str, float],
        rate: float, rss_spans: int, servers: list, rss: bool = True) -> dict[str, Any]:
    """The Collector peer's phases: gRPC paced at ``rate``, gRPC saturated, then (``rss``) RSS per buffered span."""
    out: dict[str, Any] = {}
    peer = start(m, workdir, "collector")
    servers.append(peer)
    out["grpc_paced"] = m.paced_phase(load, peer, batches, "grpc", rate, durations["paced_warmup"],
                                      durations["paced_grpc"])
    out["grpc_saturate"] = m.saturate_phase(load, peer, batches, "grpc", durations["warmup"], durations["saturate"])
    out["ttft_observations"] = scrape_sum(peer.prom_url, "vllm_time_to_first_token_seconds_count")
    out["hwm_kib"] = peer.hwm_kib()
    m.log(f"  TTFT histogram count on its /metrics: {out['ttft_observations']:.0f}; "
          f"peak RSS {out['hwm_kib'] / 1024:.0f} MiB")
    peer.stop()
    if not rss:
        return out

    # RSS per buffered span: every trace held (decision_wait 600 s), as for otel-llm.
    holder = start(m, workdir, "collector-rss", decision_wait="600s", num_traces=5_000_000)
    servers.append(holder)
    try:
        warmup = min(20_000, rss_spans)
        load.run(pending, holder, "grpc", "count", spans=warmup, concurrency=4, duration=60, rate=rate)
        time.sleep(1.0)  # let the Go runtime settle (no queue to drain: acknowledged = buffered)
        first_kib = holder.rss_kib()
        sent = load.run(pending, holder, "grpc", "count", spans=rss_spans, concurrency=4, duration=120, rate=rate)
        time.sleep(1.0)
        second_kib = holder.rss_kib()
        on_memory = scrape_sum(holder.telemetry_url, "otelcol_processor_tail_sampling_sampling_traces_on_memory")
        spans = sent.get("spans") or rss_spans
        out["rss"] = {"rss_after_warmup_kib": first_kib, "rss_after_kib": second_kib, "spans_measured": spans,
                      "traces_on_memory": on_memory,
                      "rss_per_buffered_span_bytes": (second_kib - first_kib) * 1024 / spans if spans else None}
        m.log(f"  RSS per buffered span: {out['rss']['rss_per_buffered_span_bytes']:.0f} bytes "
              f"({first_kib / 1024:.0f} -> {second_kib / 1024:.0f} MiB over {spans} spans; "
              f"tail_sampling holds {on_memory:.0f} traces)")
    finally:
        holder.stop()
    return out


def summary(m: ModuleType, peer: dict[str, Any], pipeline: dict[str, Any], rss: dict[str, Any],
            rate: float) -> dict[str, Any]:
    """The peer's figures beside otel-llm's (default configuration), printed; returns the RESULT fields."""
    c_sat, p_sat = peer.get("grpc_saturate", {}), pipeline.get("grpc_saturate", {})
    c_cpu, p_cpu = m.cpu_per_million(c_sat), m.cpu_per_million(p_sat)
    c_p99 = peer.get("grpc_paced", {}).get("latency_all_calls", {}).get("p99_ms")
    p_p99 = pipeline.get("grpc_paced", {}).get("latency_all_calls", {}).get("p99_ms")
    rows = [
        ("saturated spans/s, gRPC", p_sat.get("spans_per_s"), c_sat.get("spans_per_s"), 0),
        ("CPU-s per million spans, gRPC saturated", p_cpu, c_cpu, 1),
        ("RSS per buffered span, bytes", rss.get("rss_per_buffered_span_bytes"),
         peer.get("rss", {}).get("rss_per_buffered_span_bytes"), 0),
        (f"Export p99 at {rate:.0f} spans/s, gRPC, ms", p_p99, c_p99, 2),
    ]
    m.log(f"  {'otel-llm vs the Collector peer':48} {'otel-llm':>10} {'Collector':>10}")
    for label, ours, theirs, digits in rows:
        m.log(f"  {label:48} {m.fmt(ours, digits):>10} {m.fmt(theirs, digits):>10}")
    keeps = peer.get("grpc_paced", {}).get("keeps_up")
    m.log(f"  (the Collector peer {'keeps' if keeps else 'does NOT keep'} up at {rate:.0f} spans/s; it derives 3 "
          f"histograms in one naming from vLLM spans only: no segments, joins, gen_ai.* naming, SGLang/TGI, "
          f"or exemplars of kept traces)")
    return {"collector_spans_per_s": c_sat.get("spans_per_s"), "collector_cpu_s_per_mspans": c_cpu,
            "cpu_vs_collector": p_cpu / c_cpu if p_cpu and c_cpu else None}
