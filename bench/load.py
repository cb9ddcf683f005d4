"""The load generator: replays pre-generated OTLP batches over gRPC or HTTP, from its own process.

    python -m bench.load --batches FILE --protocol grpc|http --target HOST:PORT --mode MODE ...

Modes (each prints one JSON object on stdout and exits):

- ``saturate``: ``--concurrency`` callers send back to back for ``--warmup`` + ``--duration``
  seconds; calls that complete inside the measurement window count. With ``--server-pid`` the
  server's CPU (utime+stime from /proc/PID/stat) is read at the window's edges.
- ``paced``: open loop at ``--rate`` spans/s. Each batch has a scheduled send time; latency is
  measured from that time (so a stalled server cannot hide its stall behind a waiting sender,
  i.e. no coordinated omission) and, separately, from the moment the call was actually issued.
- ``count``: send until ``--spans`` spans were acknowledged, as fast as ``--concurrency`` allows.

gRPC goes through a plain ``grpc`` channel with no serializer (the bytes are the request);
HTTP through ``http.client`` with one keep-alive connection per caller.
"""

from __future__ import annotations

import argparse
import http.client
import itertools
import json
import math
import os
import pickle
import queue
import sys
import threading
import time
from collections.abc import Callable

import grpc
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from bench.workload import Batch, stamp

EXPORT_METHOD = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
CALL_TIMEOUT_S = 10.0
CLK_TCK = os.sysconf("SC_CLK_TCK")


# --- /proc readers (also used by the orchestrator) ------------------------------------------

def process_tree(pid: int) -> list[int]:
    """``pid`` and its live descendants (otel-llm runs its receivers in a child process)."""
    pids, todo = [], [pid]
    while todo:
        current = todo.pop()
        pids.append(current)
        try:
            for task in os.listdir(f"/proc/{current}/task"):
                with open(f"/proc/{current}/task/{task}/children", encoding="ascii") as f:
                    todo.extend(int(child) for child in f.read().split())
        except OSError:
            continue
    return pids


def _one_cpu_seconds(pid: int, task: str | None = None) -> float:
    with open(f"/proc/{pid}/task/{task}/stat" if task else f"/proc/{pid}/stat", encoding="ascii") as f:
        data = f.read()
    rest = data[data.rindex(")") + 2:].split()
    return (int(rest[11]) + int(rest[12])) / CLK_TCK


def proc_cpu_seconds(pid: int) -> float:
    """utime + stime of every thread of ``pid`` and of its live child processes, in seconds."""
    total = 0.0
    for member in process_tree(pid):
        try:
            total += _one_cpu_seconds(member)
        except OSError:
            pass  # exited meanwhile
    return total


def proc_cpu_seconds_by_process(pid: int) -> dict[str, float]:
    """``{"<comm>": seconds}`` (utime + stime) over ``pid`` and its live child processes."""
    out: dict[str, float] = {}
    for member in process_tree(pid):
        try:
            with open(f"/proc/{member}/comm", encoding="utf-8") as f:
                name = f.read().strip()
            out[name] = out.get(name, 0.0) + _one_cpu_seconds(member)
        except OSError:
            pass
    return out


def proc_cpu_seconds_by_thread(pid: int) -> dict[str, float]:
    """``{"<thread comm>": seconds}`` (utime + stime) over the threads of ``pid`` alone: otel-llm names
    its busy threads (``otel_llm.internal.runtime.name_thread``), so the pipeline process's CPU splits
    into its worker, ticker, intake pipe reader, store writer and the rest."""
    out: dict[str, float] = {}
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/comm", encoding="utf-8") as f:
                name = f.read().strip()
            out[name] = out.get(name, 0.0) + _one_cpu_seconds(pid, task)
        except OSError:
            pass  # exited meanwhile
    return out


def _one_status_kib(pid: int, key: str) -> int:
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise KeyError(key)


def proc_status_kib_by_process(pid: int, key: str) -> dict[str, int]:
    """``{"<comm> <pid>": kB}`` over ``pid`` and its live child processes."""
    out: dict[str, int] = {}
    for member in process_tree(pid):
        try:
            with open(f"/proc/{member}/comm", encoding="utf-8") as f:
                out[f"{f.read().strip()} {member}"] = _one_status_kib(member, key)
        except OSError:
            pass
    return out


def proc_status_kib(pid: int, key: str) -> int:
    """A ``kB`` line of /proc/PID/status (``VmRSS``, ``VmHWM``), summed over ``pid`` and its live
    child processes (for ``VmHWM`` an upper bound: the peaks need not coincide)."""
    total = 0
    for member in process_tree(pid):
        try:
            total += _one_status_kib(member, key)
        except OSError:
            pass
    return total


def self_cpu_seconds() -> float:
    t = os.times()
    return t.user + t.system


# --- senders ---------------------------------------------------------------------------------

Sender = Callable[[bytes], int]  # sends one request; returns spans the server rejected; raises on failure
REFUSAL_BACKOFF_S = 0.05  # a refused caller waits this long (real exporters back off for seconds)


class Refused(Exception):
    """A retryable refusal (gRPC UNAVAILABLE / RESOURCE_EXHAUSTED, HTTP 429 / 503): the server shed load."""


def _rejected(body: bytes) -> int:
    if not body:
        return 0
    response = ExportTraceServiceResponse()
    response.ParseFromString(body)
    return response.partial_success.rejected_spans


class GrpcClient:
    def __init__(self, target: str) -> None:
        self.channel = grpc.insecure_channel(
            target, options=[("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)])
        grpc.channel_ready_future(self.channel).result(timeout=10)
        self.export = self.channel.unary_unary(EXPORT_METHOD)  # no serializers: bytes in, bytes out

    def sender(self) -> Sender:
        export = self.export

        def send(payload: bytes) -> int:
            try:
                return _rejected(export(payload, timeout=CALL_TIMEOUT_S))
            except grpc.RpcError as exc:
                if exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED):
                    raise Refused(f"gRPC {exc.code().name}: {exc.details()}") from None
                raise

        return send

    def close(self) -> None:
        self.channel.close()


class HttpClient:
    def __init__(self, target: str) -> None:
        self.host, port = target.rsplit(":", 1)
        self.port = int(port)

    def sender(self) -> Sender:
        state: dict[str, http.client.HTTPConnection | None] = {"conn": None}
        headers = {"Content-Type": "application/x-protobuf"}

        def send(payload: bytes) -> int:
            conn = state["conn"]
            if conn is None:
                conn = state["conn"] = http.client.HTTPConnection(self.host, self.port, timeout=CALL_TIMEOUT_S)
            try:
                conn.request("POST", "/v1/traces", body=payload, headers=headers)
                response = conn.getresponse()
                body = response.read()
            except Exception:
                conn.close()
                state["conn"] = None
                raise
            if response.status in (429, 503):
                raise Refused(f"HTTP {response.status}: {body[:200]!r}")
            if response.status != 200:
                raise RuntimeError(f"HTTP {response.status}: {body[:200]!r}")
            return _rejected(body)

        return send

    def close(self) -> None:
        pass


def percentile(sorted_values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100) of an already sorted list."""
    if not sorted_values:
        return None
    rank = max(1, min(len(sorted_values), -(-len(sorted_values) * q // 100)))
    return sorted_values[int(rank) - 1]


def latency_summary(seconds: list[float]) -> dict[str, float | int | None]:
    values = sorted(v * 1000.0 for v in seconds)
    return {
        "n": len(values),
        "p50_ms": percentile(values, 50),
        "p90_ms": percentile(values, 90),
        "p99_ms": percentile(values, 99),
        "max_ms": values[-1] if values else None,
    }


SCRAPED = ("otel_llm_receiver_accepted_spans_total", "otel_llm_intake_queued_spans", "otel_llm_traces_in_memory")


def scrape_counters(url: str) -> dict[str, float]:
    """Sums of a few otel_llm_ self-telemetry series from ``/metrics``."""
    import urllib.request

    with urllib.request.urlopen(url, timeout=10) as r:
        text = r.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in SCRAPED:
            out[name] = out.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


class Windowed:
    """Reads server and own CPU (and the server's own span counters, when it has a /metrics) at the
    measurement window's edges, from a timer thread."""

    def __init__(self, server_pid: int | None, start: float, end: float, metrics_url: str | None = None) -> None:
        self.server_pid = server_pid
        self.metrics_url = metrics_url
        self.counters: dict[str, dict[str, float]] = {}
        self.marks: dict[str, float] = {}
        self.by_process: dict[str, dict[str, float]] = {}
        self.by_thread: dict[str, dict[str, float]] = {}
        self._thread = threading.Thread(target=self._run, args=(start, end), daemon=True)
        self._thread.start()

    def _mark(self, name: str) -> None:
        if self.metrics_url:  # before the CPU marks: the scrape's own cost falls outside the window
            try:
                self.counters[name] = scrape_counters(self.metrics_url)
            except Exception:
                self.counters[name] = {}
        self.marks[f"{name}_wall"] = time.perf_counter()
        self.marks[f"{name}_self_cpu"] = self_cpu_seconds()
        if self.server_pid:
            self.marks[f"{name}_server_cpu"] = proc_cpu_seconds(self.server_pid)
            self.by_process[name] = proc_cpu_seconds_by_process(self.server_pid)
            self.by_thread[name] = proc_cpu_seconds_by_thread(self.server_pid)

    def _run(self, start: float, end: float) -> None:
        time.sleep(max(0.0, start - time.perf_counter()))
        self._mark("start")
        time.sleep(max(0.0, end - time.perf_counter()))
        self._mark("end")

    def result(self) -> dict[str, float | None]:
        self._thread.join()
        m = self.marks
        wall = m["end_wall"] - m["start_wall"]
        out: dict[str, float | None] = {
            "window_s": wall,
            "client_cpu_s": m["end_self_cpu"] - m["start_self_cpu"],
            "server_cpu_s": None,
        }
        if self.server_pid:
            out["server_cpu_s"] = m["end_server_cpu"] - m["start_server_cpu"]
            before, after = self.by_process.get("start", {}), self.by_process.get("end", {})
            out["server_cpu_s_by_process"] = {name: seconds - before.get(name, 0.0)  # type: ignore[assignment]
                                              for name, seconds in after.items()}
            before, after = self.by_thread.get("start", {}), self.by_thread.get("end", {})
            out["server_cpu_s_by_thread"] = {name: seconds - before.get(name, 0.0)  # type: ignore[assignment]
                                             for name, seconds in after.items()}
        start, end = self.counters.get("start", {}), self.counters.get("end", {})
        accepted = "otel_llm_receiver_accepted_spans_total"
        queued = "otel_llm_intake_queued_spans"
        if accepted in start and accepted in end:
            # Spans the pipeline got through in the window: accepted, minus what still waits in its queue.
            out["server_accepted_spans"] = end[accepted] - start[accepted]
            out["server_queue_growth_spans"] = end.get(queued, 0.0) - start.get(queued, 0.0)
            out["server_processed_spans"] = out["server_accepted_spans"] - out["server_queue_growth_spans"]
            out["server_queued_spans_end"] = end.get(queued)
            out["server_traces_in_memory_end"] = end.get("otel_llm_traces_in_memory")
        return out


# --- modes -----------------------------------------------------------------------------------

def run_saturate(batches: list[Batch], client: GrpcClient | HttpClient, args: argparse.Namespace) -> dict:
    counter = itertools.count()
    t0 = time.perf_counter()
    window_start, window_end = t0 + args.warmup, t0 + args.warmup + args.duration
    window = Windowed(args.server_pid, window_start, window_end, args.metrics_url)
    lock = threading.Lock()
    totals = {"spans": 0, "calls": 0, "errors": 0, "refused": 0, "rejected": 0, "spans_sent_total": 0}
    latencies: list[float] = []
    first_error: list[str] = []

    def caller() -> None:
        send = client.sender()
        local_lat: list[float] = []
        spans = calls = errors = refused = rejected = sent = 0
        while True:
            i = next(counter)
            batch = batches[i % len(batches)]
            payload = stamp(batch, args.epoch_base + i)
            start = time.perf_counter()
            if start >= window_end:
                break
            outcome = "ok"
            try:
                rej = send(payload)
            except Refused:
                outcome, rej = "refused", 0
            except Exception as exc:  # counted; the caller keeps going
                outcome, rej = "error", 0
                if not first_error:
                    first_error.append(repr(exc)[:300])
            end = time.perf_counter()
            sent += batch.spans
            if window_start <= end <= window_end:
                if outcome == "ok":
                    spans += batch.spans - rej
                    calls += 1
                    rejected += rej
                    local_lat.append(end - start)
                elif outcome == "refused":
                    refused += 1
                else:
                    errors += 1
            if outcome != "ok":
                time.sleep(REFUSAL_BACKOFF_S)
        with lock:
            totals["spans"] += spans
            totals["calls"] += calls
            totals["errors"] += errors
            totals["refused"] += refused
            totals["rejected"] += rejected
            totals["spans_sent_total"] += sent
            latencies.extend(local_lat)

    threads = [threading.Thread(target=caller, daemon=True) for _ in range(args.concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=args.warmup + args.duration + 2 * CALL_TIMEOUT_S)
    res = window.result()
    out = dict(totals)
    out.update(res)
    out["acked_spans_per_s"] = totals["spans"] / res["window_s"]
    # With a queue behind the receiver, acknowledged is not processed: prefer the server's own count.
    processed = res.get("server_processed_spans")
    out["spans_per_s"] = processed / res["window_s"] if processed is not None else out["acked_spans_per_s"]
    out["spans"] = processed if processed is not None else totals["spans"]
    out["latency"] = latency_summary(latencies)
    out["batches_used"] = next(counter)
    out["first_error"] = first_error[0] if first_error else None
    return out


def run_paced(batches: list[Batch], client: GrpcClient | HttpClient, args: argparse.Namespace) -> dict:
    work: queue.Queue[tuple[float, bytes, int] | None] = queue.Queue()
    lock = threading.Lock()
    records: list[tuple[float, float, float, int, str]] = []  # scheduled, issued, done, spans, outcome
    first_error: list[str] = []

    def worker() -> None:
        send = client.sender()
        while True:
            item = work.get()
            if item is None:
                return
            scheduled, payload, spans = item
            issued = time.perf_counter()
            outcome = "ok"
            try:
                rej = send(payload)
            except Refused:
                outcome, rej = "refused", 0
            except Exception as exc:
                outcome, rej = "error", 0
                if not first_error:
                    first_error.append(repr(exc)[:300])
            done = time.perf_counter()
            with lock:
                records.append((scheduled, issued, done, spans - rej, outcome))

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(args.concurrency)]
    for t in threads:
        t.start()
    t0 = time.perf_counter() + 0.05
    window_start, window_end = t0 + args.warmup, t0 + args.warmup + args.duration
    window = Windowed(args.server_pid, window_start, window_end, args.metrics_url)
    offered = 0
    skipped = 0
    for i in itertools.count():
        batch = batches[i % len(batches)]
        scheduled = t0 + offered / args.rate
        if scheduled >= window_end:
            break
        payload = stamp(batch, args.epoch_base + i)
        delay = scheduled - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        if work.qsize() > 256:  # the server has stalled for seconds; bound the backlog
            skipped += 1
        else:
            work.put((scheduled, payload, batch.spans))
        offered += batch.spans
    for _ in threads:
        work.put(None)
    for t in threads:
        t.join(timeout=2 * CALL_TIMEOUT_S)
    res = window.result()
    in_window = [r for r in records if window_start <= r[0] < window_end]
    ok = [r for r in in_window if r[4] == "ok"]
    failed = len(in_window) - len(ok) + skipped
    out: dict = {
        "offered_spans_per_s": args.rate,
        "calls": len(ok),
        "errors": sum(1 for r in in_window if r[4] == "error"),
        "refused": sum(1 for r in in_window if r[4] == "refused"),
        "skipped_batches": skipped,
        "spans": sum(r[3] for r in ok),
        "latency_from_schedule": latency_summary([r[2] - r[0] for r in ok]),
        "latency_from_issue": latency_summary([r[2] - r[1] for r in ok]),
        # A call that was refused or failed never exported its spans: it counts as infinitely slow.
        "latency_all_calls": latency_summary([r[2] - r[0] for r in ok] + [math.inf] * failed),
        "first_error": first_error[0] if first_error else None,
    }
    out.update(res)
    out["acked_spans"] = out["spans"]
    out["acked_spans_per_s"] = out["spans"] / res["window_s"]
    processed = res.get("server_processed_spans")
    if processed is not None:
        out["spans"] = processed
    out["spans_per_s"] = out["spans"] / res["window_s"]
    return out


def run_count(batches: list[Batch], client: GrpcClient | HttpClient, args: argparse.Namespace) -> dict:
    counter = itertools.count()
    lock = threading.Lock()
    totals = {"spans": 0, "calls": 0, "errors": 0, "refused": 0, "rejected": 0}
    deadline = time.perf_counter() + args.duration
    start = time.perf_counter()
    # With --rate, call i is not sent before its slot: the server is never behind, so nothing queues.
    seconds_per_call = (sum(b.spans for b in batches) / len(batches) / args.rate) if args.rate > 0 else 0.0

    def caller() -> None:
        send = client.sender()
        while time.perf_counter() < deadline:
            with lock:
                if totals["spans"] >= args.spans:
                    return
            i = next(counter)
            batch = batches[i % len(batches)]
            if seconds_per_call:
                delay = start + i * seconds_per_call - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)
            try:
                rej = send(stamp(batch, args.epoch_base + i))
            except Refused:
                with lock:
                    totals["refused"] += 1
                time.sleep(REFUSAL_BACKOFF_S)
                continue
            except Exception:
                with lock:
                    totals["errors"] += 1
                time.sleep(REFUSAL_BACKOFF_S)
                continue
            with lock:
                totals["spans"] += batch.spans - rej
                totals["rejected"] += rej
                totals["calls"] += 1

    threads = [threading.Thread(target=caller, daemon=True) for _ in range(args.concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=args.duration + 2 * CALL_TIMEOUT_S)
    out: dict = dict(totals)
    out["elapsed_s"] = time.perf_counter() - start
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.load")
    parser.add_argument("--batches", required=True, help="pickle of [(payload, spans, traces, offsets)]")
    parser.add_argument("--protocol", choices=["grpc", "http"], required=True)
    parser.add_argument("--target", required=True, help="host:port")
    parser.add_argument("--mode", choices=["saturate", "paced", "count"], required=True)
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--duration", type=float, default=8.0)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--rate", type=float, default=20000.0, help="offered spans/s (paced; count: 0 = unpaced)")
    parser.add_argument("--spans", type=int, default=100000, help="spans to send (count)")
    parser.add_argument("--epoch-base", type=lambda s: int(s, 0), default=1 << 24,
                        help="first trace-id epoch; each replay adds 1 (keep distinct per run)")
    parser.add_argument("--server-pid", type=int, default=0)
    parser.add_argument("--metrics-url", help="the server's /metrics, read at the window edges (otel-llm only)")
    args = parser.parse_args(argv)

    with open(args.batches, "rb") as f:
        batches = [Batch(*fields) for fields in pickle.load(f)]
    client: GrpcClient | HttpClient = GrpcClient(args.target) if args.protocol == "grpc" else HttpClient(args.target)
    try:
        if args.mode == "saturate":
            result = run_saturate(batches, client, args)
        elif args.mode == "paced":
            result = run_paced(batches, client, args)
        else:
            result = run_count(batches, client, args)
    finally:
        client.close()
    if args.server_pid:
        try:
            result["server_rss_kib"] = proc_status_kib(args.server_pid, "VmRSS")
            result["server_hwm_kib"] = proc_status_kib(args.server_pid, "VmHWM")
        except (OSError, KeyError):
            pass
    json.dump(result, sys.stdout)
    sys.stdout.write("\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
