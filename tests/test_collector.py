"""otel-llm behind the real OpenTelemetry Collector (our own build, collector-config/otelcol-llm-front/,
started by tests/support/collector.py from the binary `make test` builds):

- every Collector config in collector-config/ validates with our build (`validate --config`);
- drop-in: simulated engines -> Collector (otlp in, otlp_grpc / otlp_http out; `otlp` and `otlphttp`
  before v0.161's renames, still accepted as aliases) -> otel-llm gives exactly
  the counts and buckets of the same engines sending to otel-llm directly, over gRPC and HTTP;
- scale-out: the Collector's loadbalancing exporter (routing_key traceID, static resolver) over
  three otel-llm replicas under a simulated fleet: each request is counted by exactly one replica
  and the sum over replicas equals one replica fed everything, bucket for bucket, in both namings;
  a rolling restart of one replica (SIGTERM, start again) under load loses nothing, and the test
  reports how many spans the Collector retried (its own otelcol_exporter_* telemetry) and how many
  exports otel-llm refused retryably.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from pathlib import Path

import pytest
import yaml

from otel_llm_simulate.runner import otlp_exporter_factory, run_plan
from otel_llm_simulate.scenarios import DEFAULT_MODELS, Plan, plan
from tests.support.collector import CollectorProcess, otlp_exporter, validate_config
from tests.support.otelllm import Scrape, ServerProcess

ROOT = Path(__file__).resolve().parents[1]
KIT = ROOT / "collector-config"
FAST_DECISIONS = {"processors": {"tail_sampling": {"decision_wait": "1s", "grace": "100ms"}}}
DERIVED_PREFIXES = ("vllm:", "gen_ai_")  # the two namings otel-llm derives from spans


def collector_configs() -> list[Path]:
    """Every YAML file in collector-config/ that is a config of our Collector (has receivers and
    service.pipelines; collector-config/jaeger/ holds Jaeger's, which tests/test_jaeger.py validates)."""
    found = []
    for path in sorted(KIT.rglob("*.y*ml")):
        if {"grafana", "jaeger"} & set(path.relative_to(KIT).parts) or path.name == "builder-config.yaml":
            continue
        try:
            doc = yaml.safe_load(path.read_text())
        except yaml.YAMLError:
            continue
        if isinstance(doc, dict) and "receivers" in doc and isinstance(doc.get("service"), dict) \
                and "pipelines" in doc["service"] and "otel-llm" not in path.name:
            found.append(path)
    return found


def derived(scrape: Scrape) -> dict[tuple[str, frozenset], float]:
    """The span-derived series of both namings (counters, histogram buckets, sums and counts)."""
    return {key: value for key, value in scrape.samples.items()
            if key[0].startswith(DERIVED_PREFIXES) and not key[0].endswith("_created")}


def summed(scrapes: list[Scrape]) -> dict[tuple[str, frozenset], float]:
    out: Counter = Counter()
    for scrape in scrapes:
        for key, value in derived(scrape).items():
            out[key] += value
    return dict(out)


def assert_same_series(actual: dict, expected: dict, what: str) -> None:
    def close(a: float, b: float) -> bool:  # sums of float observations may differ in the last bits
        return abs(a - b) <= 1e-9 * max(1.0, abs(a), abs(b))

    missing = sorted(set(expected) - set(actual), key=str)[:5]
    extra = sorted(set(actual) - set(expected), key=str)[:5]
    different = [(k, actual[k], expected[k]) for k in sorted(set(actual) & set(expected), key=str)
                 if not close(actual[k], expected[k])][:5]
    assert not missing and not extra and not different, (
        f"{what}: {len(expected)} series expected, {len(actual)} seen; missing {missing}; extra {extra}; "
        f"different (seen, expected) {different}")


def settled(scrape: Scrape, requests: int | None = None) -> bool:
    done = scrape.value("otel_llm_traces_in_memory") == 0 and scrape.value("otel_llm_intake_queued_spans") == 0 \
        and scrape.value("otel_llm_store_queue_size") == 0
    return done and (requests is None or scrape.value("otel_llm_requests_assembled_total") >= requests)


def server_process(tmp_dir: Path, config: dict) -> ServerProcess:
    tmp_dir.mkdir(parents=True, exist_ok=True)
    return ServerProcess(tmp_dir, config)


def make_plan(scenario: str, seed: int, rate: float, duration_s: float, start_ns: int | None = None) -> Plan:
    start = time.time_ns() - round(duration_s * 1e9) if start_ns is None else start_ns
    return plan(scenario, seed=seed, rate=rate, duration_s=duration_s, start_ns=start)


# --- configs --------------------------------------------------------------------------------------


def test_every_collector_config_in_the_kit_validates_with_our_build(tmp_path):
    configs = collector_configs()
    assert KIT / "otelcol-loadbalancer.yaml" in configs, configs
    for path in configs:
        done = validate_config(path)
        assert done.returncode == 0, f"{path.relative_to(ROOT)} rejected by our Collector build:\n{done.stderr[-3000:]}"
    # And the validator is real: a typo in an option is rejected.
    bad = yaml.safe_load((KIT / "otelcol-loadbalancer.yaml").read_text())
    bad["processors"]["memory_limiter"]["check_intervall"] = "1s"
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(bad))
    done = validate_config(tmp_path / "bad.yaml")
    assert done.returncode != 0 and "check_intervall" in done.stderr, done.stderr[-2000:]


def test_the_bench_peer_pipeline_validates_with_our_build(tmp_path):
    """bench/collector_peer.py's pipeline (signal_to_metrics, tail_sampling, delta_to_cumulative,
    prometheus) is a valid config of the build `make bench` runs."""
    from bench.collector_peer import peer_config

    path = tmp_path / "peer.yaml"
    path.write_text(yaml.safe_dump(peer_config(4317, 4318, 9464, 8888, 13133)))
    done = validate_config(path)
    assert done.returncode == 0, done.stderr[-3000:]


# --- drop-in ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_drop_in_behind_the_collector_gives_the_counts_of_sending_directly(tmp_path, protocol):
    # Two otel-llm processes, fed the same plan: one directly, one through the Collector.
    direct = server_process(tmp_path / "direct", FAST_DECISIONS)
    behind = server_process(tmp_path / "behind", FAST_DECISIONS)
    exporter = ("otlp_grpc", otlp_exporter(f"127.0.0.1:{behind.grpc_port}")) if protocol == "grpc" else \
        ("otlp_http", {"endpoint": f"http://127.0.0.1:{behind.http_port}", "compression": "gzip",
                      "retry_on_failure": {"initial_interval": "100ms", "max_interval": "1s"}})
    otelcol = CollectorProcess(tmp_path / "otelcol", processors={"batch": {"timeout": "100ms"}},
                               exporters={exporter[0]: exporter[1]},
                               pipelines={"traces": {"receivers": ["otlp"], "processors": ["batch"],
                                                     "exporters": [exporter[0]]}})
    try:
        direct.start()
        behind.start()
        otelcol.start()
        p = make_plan("errors", seed=21, rate=6.0, duration_s=30.0)
        n = len(p.requests)
        sent_direct = run_plan(p, otlp_exporter_factory(
            f"127.0.0.1:{direct.grpc_port if protocol == 'grpc' else direct.http_port}", protocol), realtime=False)
        sent_behind = run_plan(p, otlp_exporter_factory(
            otelcol.grpc_endpoint if protocol == "grpc" else otelcol.http_endpoint, protocol), realtime=False)
        assert sent_direct.ok and sent_behind.ok and sent_direct.requests_sent == sent_behind.requests_sent == n
        spans = sent_behind.spans_exported
        assert sent_direct.spans_exported == spans

        def done(s: Scrape) -> bool:
            return settled(s, n) and s.value("otel_llm_receiver_accepted_spans_total") >= spans

        a = direct.wait_until(done, timeout_s=60, what=f"{spans} spans, direct")
        b = behind.wait_until(done, timeout_s=60, what=f"{spans} spans, behind the Collector")
        for scrape in (a, b):
            assert scrape.value("otel_llm_requests_assembled_total") == a.value("otel_llm_requests_assembled_total")
            assert scrape.value("otel_llm_receiver_accepted_spans_total") == spans
            assert scrape.value("otel_llm_late_spans_total") == 0
            assert scrape.value("otel_llm_spans_malformed_total") == 0
        assert_same_series(derived(b), derived(a), f"behind the Collector ({protocol}) vs direct")
        assert len(derived(a)) > 100  # both namings, many buckets: not a vacuous comparison
        sent = otelcol.telemetry().value("otelcol_exporter_sent_spans_total")
        assert sent == spans, f"Collector exported {sent} spans, the engines {spans}"
        print(f"drop-in {protocol}: {n} planned requests, {a.value('otel_llm_requests_assembled_total'):.0f} assembled "
              f"on each side, {spans} spans, {len(derived(a))} derived series equal")
    finally:
        stop_all(otelcol, [direct, behind])


# --- scale-out -------------------------------------------------------------------------------------

# decision_wait above the engines' SDK export interval (BatchSpanProcessor: 5 s): a gateway span and its
# engine span, exported by different engines' SDKs, can arrive that far apart in a real-time run.
# grace > the senders' BatchSpanProcessor schedule (5 s): a proxy's span exported a batch after its
# engine's still joins the request in every replica and in the reference alike (with 100 ms, whether it
# joined depended on which exporter's batch came first, and the stores differed without a restart).
KEEP_ALL = {"decision_wait": "15s", "grace": "8s",
            "policies": [{"name": "all", "type": "probabilistic", "probabilistic": {"sampling_percentage": 100}}]}
REPLICA = {"processors": {"tail_sampling": KEEP_ALL},
           "service": {"shutdown_grace": "5s", "hand_over_pending_traces": True}}
SUB_EXPORTER_RETRY = {"enabled": True, "initial_interval": "100ms", "max_interval": "1s", "max_elapsed_time": "120s"}


def load_balancer(tmp_path: Path, replicas: list[ServerProcess],
                  reference: ServerProcess | None = None) -> CollectorProcess:
    """The scale-out front: loadbalancing by trace id over the replicas (static resolver); with a
    ``reference``, the same pipeline also sends everything to that one replica."""
    exporters = {"load_balancing": {
        "routing_key": "traceID",
        "protocol": {"otlp": {"timeout": "10s", "tls": {"insecure": True}, "retry_on_failure": SUB_EXPORTER_RETRY,
                              "sending_queue": {"enabled": True, "queue_size": 5000}}},
        "resolver": {"static": {"hostnames": [f"127.0.0.1:{r.grpc_port}" for r in replicas]}},
    }}
    if reference is not None:
        exporters["otlp_grpc/reference"] = otlp_exporter(f"127.0.0.1:{reference.grpc_port}")
    return CollectorProcess(tmp_path / "otelcol", processors={"batch": {"timeout": "100ms"}}, exporters=exporters,
                            pipelines={"traces": {"receivers": ["otlp"], "processors": ["batch"],
                                                  "exporters": list(exporters)}})


def stored(server: ServerProcess) -> tuple[set[tuple[str, str]], Counter]:
    """(requests as (trace_id, span_id), spans per trace without the synthesized segments) in a replica's store."""
    from otel_llm.exporter.store.sqlite import StoreReader

    reader = StoreReader(Path(server.config_path.parent / "store"))
    with reader._connection() as connection:
        requests = {(t, s) for t, s in connection.execute("SELECT trace_id, span_id FROM requests")}
        spans = Counter(t for (t,) in connection.execute(
            "SELECT trace_id FROM spans WHERE attributes IS NULL OR attributes NOT LIKE '%\"otel_llm.segment\"%'"))
    return requests, spans


def wait_for(compute, ok, timeout_s: float = 30.0):
    """``compute()`` until ``ok(value)`` or the deadline; returns the last value (the caller asserts on it)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = compute()
        if ok(value) or time.monotonic() > deadline:
            return value
        time.sleep(0.1)


def stores_agree(replicas: list[ServerProcess], reference: ServerProcess, spans: int):
    """The replicas' and the reference's stores, once every request of the reference is in one replica's
    store and every span is stored (the store writer commits a little after a decision)."""
    def compute():
        return [stored(r) for r in replicas], stored(reference)

    def ok(value) -> bool:
        per_replica, (reference_requests, reference_spans) = value
        return (set().union(*(r for r, _ in per_replica)) == reference_requests
                and sum(reference_spans.values()) == spans == sum(sum(c.values()) for _, c in per_replica))

    return wait_for(compute, ok)


def stop_all(otelcol: CollectorProcess | None, servers: list[ServerProcess]) -> None:
    try:
        if otelcol is not None:
            otelcol.stop()
    finally:
        for server in servers:
            if server.process is not None and server.process.poll() is None:
                try:
                    server.stop(timeout_s=30)
                except Exception:
                    pass
            server.ensure_stopped()


def collector_counters(otelcol: CollectorProcess) -> dict[str, float]:
    """The Collector's own exporter/receiver counters that say what it sent, refused and retried."""
    scrape = otelcol.telemetry()
    out: Counter = Counter()
    for (name, labels), value in scrape.samples.items():
        if name.startswith(("otelcol_exporter_", "otelcol_receiver_", "otelcol_loadbalancer_backend_outcome")) \
                and not name.endswith(("_bucket", "_created")):
            label = dict(labels)
            key = name + "{" + ",".join(f"{k}={label[k]}" for k in sorted(label)
                                        if k in ("exporter", "receiver", "success", "transport")) + "}"
            out[key] += value
    return dict(out)


def test_load_balanced_replicas_sum_to_one_replica_fed_everything(tmp_path):
    replicas = [server_process(tmp_path / f"replica{i}", REPLICA) for i in range(3)]
    reference = server_process(tmp_path / "reference", REPLICA)
    otelcol = load_balancer(tmp_path, replicas, reference)
    try:
        for server in (*replicas, reference):
            server.start()
        otelcol.start()
        p = make_plan("burst", seed=31, rate=8.0, duration_s=30.0)
        n = len(p.requests)
        sent = run_plan(p, otlp_exporter_factory(otelcol.grpc_endpoint, "grpc"), realtime=False)
        assert sent.ok and sent.requests_sent == n, sent
        ref = reference.wait_until(lambda s: settled(s, n) and s.value("otel_llm_receiver_accepted_spans_total")
                                   >= sent.spans_exported, timeout_s=60, what=f"{n} requests on the reference")
        per_replica = [r.wait_until(lambda s: settled(s) and s.value("otel_llm_receiver_accepted_spans_total") > 0,
                                    timeout_s=60, what="a settled replica") for r in replicas]
        # All spans arrived somewhere, and nothing twice: the replicas' intake adds up to the reference's.
        deadline = time.monotonic() + 60
        while sum(s.value("otel_llm_receiver_accepted_spans_total") for s in per_replica) < sent.spans_exported \
                and time.monotonic() < deadline:
            time.sleep(0.1)
            per_replica = [r.scrape() for r in replicas]
        per_replica = [r.wait_until(settled, timeout_s=60, what="settled") for r in replicas]
        accepted = [s.value("otel_llm_receiver_accepted_spans_total") for s in per_replica]
        assert sum(accepted) == ref.value("otel_llm_receiver_accepted_spans_total") == sent.spans_exported, accepted
        counted = [s.value("otel_llm_requests_assembled_total") for s in per_replica]
        assert sum(counted) == ref.value("otel_llm_requests_assembled_total") >= n and all(c > 0 for c in counted), \
            counted
        for scrape in (*per_replica, ref):
            assert scrape.value("otel_llm_late_spans_total") == 0
        # Each request in exactly one replica's store (every trace kept), and the reference's requests all there.
        stores, (reference_requests, _) = stores_agree(replicas, reference, sent.spans_exported)
        requests = [s[0] for s in stores]
        assert set().union(*requests) == reference_requests
        assert sum(len(r) for r in requests) == len(reference_requests), "a request stored by two replicas"
        traces = [set(s[1]) for s in stores]
        assert all(not (traces[i] & traces[j]) for i in range(3) for j in range(i + 1, 3)), \
            "a trace split over replicas"
        # Bucket for bucket, both namings: the sum over replicas is the replica fed everything.
        assert_same_series(summed(per_replica), derived(ref), "sum over 3 load-balanced replicas vs one fed everything")
        names = {k[0] for k in derived(ref)}
        assert any(x.startswith("vllm:") for x in names) and any(x.startswith("gen_ai_") for x in names), names
        print(f"scale-out: {n} planned, {sum(counted):.0f} requests, {sent.spans_exported} spans; per replica "
              f"requests {counted}, spans {accepted}; "
              f"{len(derived(ref))} series equal to the reference")
    finally:
        stop_all(otelcol, [*replicas, reference])


class LastScrape(threading.Thread):
    """Scrapes a server's /metrics every 50 ms until told to stop; keeps the last good scrape (the
    endpoint closes last on SIGTERM, so this sees the refusals made during the shutdown)."""

    def __init__(self, server: ServerProcess) -> None:
        super().__init__(daemon=True)
        self.server, self.last, self.done = server, None, threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            try:
                self.last = self.server.scrape()
            except OSError:
                pass
            self.done.wait(0.05)


RETRY_LOG = "Exporting failed. Will retry the request after interval."


def retries_logged(otelcol: CollectorProcess, endpoint: str) -> int:
    """Export requests the Collector retried to ``endpoint``: exporterhelper has no retry counter in its
    own metrics, it logs each retry (the loadbalancing exporter's per-backend exporters name the endpoint)."""
    return sum(1 for line in otelcol.log_text().splitlines() if RETRY_LOG in line and endpoint in line)


def test_rolling_restart_of_a_replica_under_load_loses_nothing(tmp_path):
    replicas = [server_process(tmp_path / f"replica{i}", REPLICA) for i in range(3)]
    reference = server_process(tmp_path / "reference", REPLICA)  # fed everything, never restarted
    otelcol = load_balancer(tmp_path, replicas, reference)
    try:
        for server in (*replicas, reference):
            server.start()
        otelcol.start()
        # A real-time fleet: ~15 requests/s for 25 s, sent as they end, so the restart happens under load.
        # Engines whose request is one process's spans: a disaggregated request (Dynamo, llm-d) whose
        # workers' exports straddle the restart is split between the old and the new process, and each
        # half is measured on its own (a limitation the README's scale-out section states).
        p = plan("steady", seed=41, rate=15.0, duration_s=25.0, start_ns=time.time_ns(),
                 models=[m for m in DEFAULT_MODELS if m.engine not in ("dynamo", "llm-d")])
        n = len(p.requests)
        result: dict = {}
        sender = threading.Thread(target=lambda: result.update(
            r=run_plan(p, otlp_exporter_factory(otelcol.grpc_endpoint, "grpc"), realtime=True)), daemon=True)
        sender.start()
        victim = replicas[1]
        victim.wait_until(lambda s: s.value("otel_llm_requests_assembled_total") >= 20, timeout_s=30,
                          what="the replica to restart has work")
        watcher = LastScrape(victim)
        watcher.start()
        # SIGTERM just as a burst of exports reaches it (the engines' SDKs export in batches every few
        # seconds), so that calls arrive while it stops: those it refuses, retryably.
        accepted = victim.scrape().value("otel_llm_receiver_accepted_spans_total")
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            now = victim.scrape().value("otel_llm_receiver_accepted_spans_total")
            if now > accepted:
                break
            accepted = now
            time.sleep(0.01)
        restart_started = time.monotonic()
        exit_code = victim.stop()  # SIGTERM: refuse retryably, decide pending traces, flush, exit
        watcher.done.set()
        watcher.join(timeout=5)
        assert exit_code == 0, victim.log_path.read_text()[-3000:]
        before = watcher.last
        # Stay down until the Collector has had to retry an export to this replica (the load comes in
        # the engines' SDK batches, every few seconds), then come back on the same ports and store.
        victim_endpoint = f"127.0.0.1:{victim.grpc_port}"
        deadline = time.monotonic() + 30
        while retries_logged(otelcol, victim_endpoint) == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        retried_while_down = retries_logged(otelcol, victim_endpoint)
        assert retried_while_down > 0, "the Collector never tried the stopped replica: no load during the restart"
        victim.start()
        downtime = time.monotonic() - restart_started
        sender.join(timeout=120)
        assert not sender.is_alive() and result["r"].ok and result["r"].requests_sent == n, result
        spans = result["r"].spans_exported
        # Everything the Collector accepted is delivered: its queues drain, nothing failed for good.
        deadline = time.monotonic() + 90
        while True:
            c = collector_counters(otelcol)
            lb_sent = sum(v for k, v in c.items()
                          if k.startswith("otelcol_exporter_sent_spans") and "load_balancing" in k)
            if lb_sent >= spans or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        scrapes = [r.wait_until(settled, timeout_s=60, what="settled after the restart") for r in replicas]
        reference.wait_until(lambda s: settled(s) and s.value("otel_llm_receiver_accepted_spans_total") >= spans,
                             timeout_s=60, what="the reference has everything")
        stores, (reference_requests, reference_spans) = stores_agree(replicas, reference, spans)
        requests = [s[0] for s in stores]
        assert sum(reference_spans.values()) == spans
        union = set().union(*requests)
        lost, extra = reference_requests - union, union - reference_requests
        # A gateway's span the stopping replica held without its engine span is handed to the new
        # process (service.hand_over_pending_traces), where the engine's span joins it: no request
        # is counted twice, as the reference counts them.
        assert not lost and not extra, f"{len(lost)} requests lost, {len(extra)} extra: {sorted(extra)[:5]}"
        assert sum(len(r) for r in requests) == len(union), "a request stored by two replicas"
        stored_spans = sum(sum(s[1].values()) for s in stores)
        assert stored_spans == spans, f"{stored_spans} spans stored, {spans} sent"
        failed = {k: v for k, v in c.items() if ("failed" in k or "refused" in k) and v}
        assert not any(k.startswith(("otelcol_exporter_send_failed", "otelcol_receiver_refused",
                                     "otelcol_exporter_enqueue_failed")) for k in failed), failed
        refused_by_victim = before.value("otel_llm_receiver_refused_spans_total") if before else float("nan")
        outcomes = {k: v for k, v in c.items() if k.startswith("otelcol_loadbalancer_backend_outcome")}
        retried = retries_logged(otelcol, victim_endpoint)
        print(f"rolling restart: {n} planned, {len(reference_requests)} requests, {spans} spans, all stored once; "
              f"replica down {downtime:.1f} s; Collector retried {retried} export requests to it "
              f"({retried_while_down} while it was down), gave up on none (send_failed/enqueue_failed 0: {failed}); "
              f"otel-llm refused (retryably, while stopping) {refused_by_victim:.0f} spans; backend outcomes "
              f"{outcomes}; late spans after restart {[s.value('otel_llm_late_spans_total') for s in scrapes]}")
    finally:
        stop_all(otelcol, [*replicas, reference])
