"""The real OpenTelemetry Collector (our own distribution, collector-config/otelcol-llm-front/) for
tests: started from the binary `make test` builds (``collector-config/peers.sh``), on free
127.0.0.1 ports, with a generated config; health polled on its health_check extension; stopped
with SIGTERM (SIGKILL only if it does not exit in time).

Nothing is skipped: a missing binary fails the test with the command that builds it.

Usage::

    with CollectorProcess(tmp_path, exporters={"otlp_grpc": otlp_exporter("127.0.0.1:4317")},
                          pipelines={"traces": {"receivers": ["otlp"], "exporters": ["otlp_grpc"]}}) as otelcol:
        send to otelcol.grpc_endpoint / otelcol.http_endpoint
        otelcol.telemetry().value("otelcol_exporter_sent_spans_total")
"""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from tests.support.otelllm import Scrape, parse_exposition
from tests.support.ports import free_port

REPO = Path(__file__).resolve().parents[2]
PEERS_SCRIPT = REPO / "collector-config" / "peers.sh"
COLLECTOR = "otelcol-llm-front"


@functools.cache
def peer_binary(name: str) -> Path:
    """Where ``collector-config/peers.sh`` puts ``name``'s binary; fails (never skips) if it is not built."""
    done = subprocess.run(["bash", str(PEERS_SCRIPT), "path", name], capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        raise RuntimeError(f"{PEERS_SCRIPT} path {name} failed ({done.returncode}): {done.stderr.strip()}")
    path = Path(done.stdout.strip())
    if not path.is_file() or not os.access(path, os.X_OK):
        raise RuntimeError(f"{name} is not built (expected {path}): run `make test` (or `make peers`), which "
                           f"builds it from the Go module proxy into that cache once")
    return path


def _tail(path: Path, n_lines: int = 60) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n_lines:]) or "<empty log>"
    except OSError:
        return "<no log>"


def internal_telemetry(port: int, level: str = "detailed") -> dict[str, Any]:
    """``service.telemetry`` of a Collector-based binary: its own metrics pulled on 127.0.0.1:``port``
    (never the default :8888, which another process may hold)."""
    return {"metrics": {"level": level,
                        "readers": [{"pull": {"exporter": {"prometheus": {"host": "127.0.0.1", "port": port}}}}]},
            "logs": {"level": "info"}}


class _PortTaken(Exception):
    """The binary exited at start because one of its ports was already bound."""


class PeerProcess:
    """A Collector-based binary (ours or Jaeger) run with ``--config``; subclasses build the config
    and say where health is. The ports are chosen once, so ``stop()`` then ``start()`` comes back on
    the same ones (an outage and a return)."""

    binary_name = ""
    health_path = "/"

    def __init__(self, tmp_dir: Path, name: str) -> None:
        self.tmp_dir = Path(tmp_dir)
        self.name = name
        self.tmp_dir.mkdir(parents=True, exist_ok=True)
        self.config_path = self.tmp_dir / f"{name}.yaml"
        self.log_path = self.tmp_dir / f"{name}.log"
        self.health_port, self.metrics_port = free_port(), free_port()
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def config(self) -> dict[str, Any]:
        raise NotImplementedError

    @property
    def health_url(self) -> str:
        return f"http://127.0.0.1:{self.health_port}{self.health_path}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}"

    # free_port() releases the port before the binary binds it: another process may take it in
    # between. A first start that fails so picks new ports (a restart keeps its own, as it must).
    port_attempts = 3

    def _pick_ports(self) -> None:
        self.health_port, self.metrics_port = free_port(), free_port()

    def start(self, timeout_s: float = 60.0) -> None:
        for attempt in range(self.port_attempts):
            try:
                self._start_once(timeout_s)
                return
            except _PortTaken:
                if self.starts > 1 or attempt == self.port_attempts - 1:
                    raise AssertionError(f"{self.name}: a port was taken before it could bind; log {self.log_path}:\n"
                                         f"{_tail(self.log_path)}") from None
                self.starts -= 1
                self._pick_ports()

    def _start_once(self, timeout_s: float) -> None:
        binary = peer_binary(self.binary_name)
        self.config_path.write_text(yaml.safe_dump(self.config(), sort_keys=False))
        log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        log = self.log_path.open("ab")
        log.write(f"\n### start {self.starts + 1}: {binary} --config {self.config_path}\n".encode())
        log.flush()
        self.process = subprocess.Popen([str(binary), "--config", str(self.config_path)], stdin=subprocess.DEVNULL,
                                        stdout=log, stderr=subprocess.STDOUT, cwd=self.tmp_dir)
        log.close()
        self.starts += 1
        deadline = time.monotonic() + timeout_s
        last = "no answer yet"
        while True:
            if self.process.poll() is not None:
                with self.log_path.open("rb") as written:
                    written.seek(log_offset)
                    if b"address already in use" in written.read():
                        raise _PortTaken()
                raise AssertionError(f"{self.name} exited with {self.process.returncode} during start-up; "
                                     f"log {self.log_path}:\n{_tail(self.log_path)}")
            try:
                with urllib.request.urlopen(self.health_url, timeout=2) as response:
                    if response.status == 200:
                        return
                    last = f"HTTP {response.status}"
            except urllib.error.HTTPError as exc:
                last = f"HTTP {exc.code}"
            except OSError as exc:
                last = repr(exc)
            if time.monotonic() > deadline:
                self.kill()
                raise AssertionError(f"{self.name} not healthy at {self.health_url} after {timeout_s}s ({last}); "
                                     f"log {self.log_path}:\n{_tail(self.log_path)}")
            time.sleep(0.05)

    def stop(self, timeout_s: float = 30.0) -> int | None:
        """SIGTERM and wait: a Collector drains its pipelines on shutdown. SIGKILL only past ``timeout_s``."""
        proc, self.process = self.process, None
        if proc is None:
            return None
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                return proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
                raise AssertionError(f"{self.name} did not stop within {timeout_s}s of SIGTERM; killed. "
                                     f"Log:\n{_tail(self.log_path)}") from None
        return proc.returncode

    def kill(self) -> None:
        proc, self.process = self.process, None
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def telemetry(self) -> Scrape:
        """The binary's own metrics (otelcol_*), parsed."""
        with urllib.request.urlopen(self.metrics_url + "/metrics", timeout=10) as response:
            text = response.read().decode()
        return Scrape(parse_exposition(text), text)

    def __enter__(self) -> "PeerProcess":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.stop()
        finally:
            self.kill()


class CollectorProcess(PeerProcess):
    """Our Collector build with an ``otlp`` receiver on free loopback ports (gRPC and HTTP) and the
    given processors, connectors, exporters and pipelines; a pipeline's ``receivers`` may name
    ``otlp``. health_check and the internal metrics are added on free ports."""

    binary_name = COLLECTOR
    health_path = "/"

    def __init__(self, tmp_dir: Path, *, exporters: dict[str, Any], pipelines: dict[str, Any],
                 processors: dict[str, Any] | None = None, connectors: dict[str, Any] | None = None,
                 name: str = "otelcol", telemetry_level: str = "detailed") -> None:
        super().__init__(tmp_dir, name)
        self.grpc_port, self.http_port = free_port(), free_port()
        self.exporters, self.pipelines = exporters, pipelines
        self.processors, self.connectors = processors or {}, connectors or {}
        self.telemetry_level = telemetry_level

    def _pick_ports(self) -> None:
        super()._pick_ports()
        self.grpc_port, self.http_port = free_port(), free_port()

    @property
    def grpc_endpoint(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def http_endpoint(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def config(self) -> dict[str, Any]:
        config: dict[str, Any] = {
            "extensions": {"health_check": {"endpoint": f"127.0.0.1:{self.health_port}"}},
            "receivers": {"otlp": {"protocols": {"grpc": {"endpoint": self.grpc_endpoint},
                                                 "http": {"endpoint": f"127.0.0.1:{self.http_port}"}}}},
        }
        if self.processors:
            config["processors"] = self.processors
        if self.connectors:
            config["connectors"] = self.connectors
        config["exporters"] = self.exporters
        config["service"] = {"extensions": ["health_check"], "pipelines": self.pipelines,
                             "telemetry": internal_telemetry(self.metrics_port, self.telemetry_level)}
        return config


def validate_config(path: Path, timeout_s: float = 60.0) -> subprocess.CompletedProcess[str]:
    """``otelcol-llm-front validate --config PATH``: parses, resolves and validates every component's
    config and the pipelines without starting anything."""
    return subprocess.run([str(peer_binary(COLLECTOR)), "validate", "--config", str(path)],
                          capture_output=True, text=True, timeout=timeout_s)


def otlp_exporter(endpoint: str, **extra: Any) -> dict[str, Any]:
    """The Collector's ``otlp_grpc`` exporter (``otlp`` before v0.161) to a loopback endpoint, plain text,
    fast retries."""
    config = {"endpoint": endpoint, "tls": {"insecure": True},
              "retry_on_failure": {"enabled": True, "initial_interval": "100ms", "max_interval": "1s",
                                   "max_elapsed_time": "120s"}}
    config.update(extra)
    return config
