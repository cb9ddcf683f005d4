"""Test support: an otel-llm Service on free loopback ports, real OTLP exporters pointed at it,
and a scrape of its /metrics parsed with prometheus_client's own parser."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcSpanExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpSpanExporter
from opentelemetry.sdk.trace.export import SpanExporter
from prometheus_client.parser import text_string_to_metric_families

from otel_llm.config import config_from_dict
from otel_llm.service.service import Service
from tests.support.ports import free_port

LOOPBACK_ANY_PORT = "127.0.0.1:0"


def deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def server_config(store_path: str, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    base = {
        "receivers": {"otlp": {"protocols": {"grpc": {"endpoint": LOOPBACK_ANY_PORT},
                                             "http": {"endpoint": LOOPBACK_ANY_PORT}}}},
        "processors": {"tail_sampling": {"decision_wait": "3s", "grace": "100ms"}},
        "exporters": {"prometheus": {"endpoint": LOOPBACK_ANY_PORT}, "store": {"path": store_path}},
        "extensions": {"webview": {"endpoint": LOOPBACK_ANY_PORT}},
    }
    return deep_merge(base, overrides or {})


Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


@dataclass
class Scrape:
    samples: Samples
    text: str

    def value(self, name: str, **labels: str) -> float:
        """Sum of every sample named ``name`` whose labels include ``labels``."""
        want = set(labels.items())
        return sum(v for (n, ls), v in self.samples.items() if n == name and want <= ls)

    def buckets(self, name: str, **labels: str) -> dict[str, float]:
        """``{le: cumulative count}`` of histogram ``name`` summed over series matching ``labels``."""
        want = set(labels.items())
        out: dict[str, float] = {}
        for (n, ls), v in self.samples.items():
            if n == name + "_bucket" and want <= ls:
                le = dict(ls)["le"]
                out[le] = out.get(le, 0.0) + v
        return out

    def label_sets(self, name: str) -> list[dict[str, str]]:
        return [dict(ls) for (n, ls) in self.samples if n == name]


def parse_exposition(text: str) -> Samples:
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return samples


def scrape_metrics(base_url: str, accept: str | None = None) -> Scrape:
    request = urllib.request.Request(base_url + "/metrics", headers={"Accept": accept} if accept else {})
    with urllib.request.urlopen(request, timeout=10) as response:
        text = response.read().decode()
    return Scrape(parse_exposition(text), text)


def poll_metrics(base_url: str, predicate: Callable[[Scrape], bool], timeout_s: float, what: str = "") -> Scrape:
    """Scrape until ``predicate`` holds: the condition, not a sleep, is the synchronisation."""
    deadline = time.monotonic() + timeout_s
    scrape = scrape_metrics(base_url)
    while not predicate(scrape):
        if time.monotonic() > deadline:
            # The product's own counters and gauges say why; histogram buckets would bury them.
            telemetry = "\n".join(line for line in scrape.text.splitlines()
                                  if line.startswith("otel_llm_") and "_bucket{" not in line)
            raise AssertionError(f"timed out waiting for {what or predicate}; last scrape, otel_llm_* "
                                 f"without buckets:\n{telemetry[-6000:]}")
        time.sleep(0.05)
        scrape = scrape_metrics(base_url)
    return scrape


@dataclass
class RunningServer:
    service: Service
    exporters: list[SpanExporter] = field(default_factory=list)

    @property
    def grpc_port(self) -> int:
        assert self.service.grpc_port
        return self.service.grpc_port

    @property
    def http_port(self) -> int:
        assert self.service.http_port
        return self.service.http_port

    @property
    def metrics_url(self) -> str:
        assert self.service.prometheus is not None
        return f"http://127.0.0.1:{self.service.prometheus.port}"

    @property
    def webview_url(self) -> str:
        assert self.service.webview is not None
        return f"http://127.0.0.1:{self.service.webview.port}"

    def exporter(self, protocol: str) -> SpanExporter:
        exporter: SpanExporter
        if protocol == "grpc":
            exporter = GrpcSpanExporter(endpoint=f"127.0.0.1:{self.grpc_port}", insecure=True, timeout=10)
        elif protocol == "http":
            exporter = HttpSpanExporter(endpoint=f"http://127.0.0.1:{self.http_port}/v1/traces", timeout=10)
        else:
            raise ValueError(protocol)
        self.exporters.append(exporter)
        return exporter

    def scrape(self, accept: str | None = None) -> Scrape:
        return scrape_metrics(self.metrics_url, accept)

    def wait_until(self, predicate: Callable[[Scrape], bool], timeout_s: float = 20.0, what: str = "") -> Scrape:
        return poll_metrics(self.metrics_url, predicate, timeout_s, what)

    def wait_for_requests(self, count: int, timeout_s: float = 20.0) -> Scrape:
        return self.wait_until(lambda s: s.value("otel_llm_requests_assembled_total") >= count, timeout_s,
                               f"{count} assembled requests")

    def stop(self) -> None:
        # The exporters belong to TracerProviders that shut them down at exit; doing it here too
        # only makes the SDK warn "Exporter already shutdown".
        self.service.stop(grace_s=1.0)


def start_server(store_path: str, overrides: dict[str, Any] | None = None) -> RunningServer:
    service = Service(config_from_dict(server_config(store_path, overrides)))
    service.start()
    return RunningServer(service)


class ServerProcess:
    """`otel-llm serve` as a separate process, as users run it: for signals and restarts."""

    def __init__(self, tmp_dir: Path, config: dict[str, Any]) -> None:
        self.grpc_port, self.http_port, self.metrics_port = free_port(), free_port(), free_port()
        self.webview_port = free_port()
        base = {
            "receivers": {"otlp": {"protocols": {"grpc": {"endpoint": f"127.0.0.1:{self.grpc_port}"},
                                                 "http": {"endpoint": f"127.0.0.1:{self.http_port}"}}}},
            "exporters": {"prometheus": {"endpoint": f"127.0.0.1:{self.metrics_port}"},
                          "store": {"path": str(tmp_dir / "store")}},
            "extensions": {"webview": {"endpoint": f"127.0.0.1:{self.webview_port}"}},
        }
        self.config_path = tmp_dir / "otel-llm.yaml"
        self.config_path.write_text(yaml.safe_dump(deep_merge(base, config)))
        self.log_path = tmp_dir / "otel-llm.log"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}"

    @property
    def webview_url(self) -> str:
        return f"http://127.0.0.1:{self.webview_port}"

    new_session = False  # a process group of its own, so one killpg reaches every otel-llm process

    def start(self, timeout_s: float = 15.0, degraded: bool = False) -> None:
        """Until ``/readyz`` is 200; ``degraded``: or 503 with a component's reason (started, not ready)."""
        log = self.log_path.open("ab")
        self.process = subprocess.Popen([sys.executable, "-m", "otel_llm", "serve", "--config", str(self.config_path)],
                                        stdout=log, stderr=subprocess.STDOUT, start_new_session=self.new_session)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"otel-llm exited {self.process.returncode}:\n{self.log_path.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(self.metrics_url + "/readyz", timeout=1) as response:
                    if response.status == 200:
                        return
            except urllib.error.HTTPError as exc:
                if degraded and exc.read().startswith(b"not ready:"):
                    return
            except OSError:
                pass
            time.sleep(0.05)
        raise AssertionError(f"otel-llm not ready in {timeout_s}s:\n{self.log_path.read_text()[-3000:]}")

    def scrape(self) -> Scrape:
        return scrape_metrics(self.metrics_url)

    def wait_until(self, predicate: Callable[[Scrape], bool], timeout_s: float = 30.0, what: str = "") -> Scrape:
        return poll_metrics(self.metrics_url, predicate, timeout_s, what)

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 30.0) -> int:
        assert self.process is not None
        self.process.send_signal(sig)
        return self.process.wait(timeout=timeout_s)

    def ensure_stopped(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)
