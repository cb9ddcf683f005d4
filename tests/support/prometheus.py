"""Start a real Prometheus (Debian's ``prometheus`` package) for tests.

The server runs on a free 127.0.0.1 port chosen at start-up (never the system
service's :9090), stores its TSDB under the given tmp dir, scrapes the given
targets under job ``otel-llm`` and exposes small helpers for PromQL queries.

Usage::

    with PrometheusServer(tmp_path, ["127.0.0.1:8889"]) as prom:
        prom.wait_for('up{job="otel-llm"}', lambda r: r and r[0]["value"][1] == "1")
        prom.query("sum(rate(vllm:e2e_request_latency_seconds_count[1m]))")
"""

from __future__ import annotations

import json
import pathlib
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Callable, Iterable

import yaml

from tests.support.ports import free_port

__all__ = ["PrometheusServer", "PrometheusQueryError"]

JOB_NAME = "otel-llm"
_MISSING_BINARY = (
    "the `prometheus` binary is not on PATH; run `make test` "
    "(it installs Debian's prometheus package)"
)


class PrometheusQueryError(RuntimeError):
    """A Prometheus HTTP API call returned a non-success response."""

    def __init__(self, message: str, *, http_status: int | None = None,
                 error_type: str | None = None, error: str | None = None,
                 body: str = "") -> None:
        super().__init__(message)
        self.http_status = http_status
        self.error_type = error_type
        self.error = error
        self.body = body


def _tail(path: pathlib.Path, n_lines: int = 40) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return "<no log>"
    return "\n".join(lines[-n_lines:]) or "<empty log>"


class PrometheusServer:
    def __init__(
        self,
        tmp_dir: pathlib.Path,
        targets: list[str],
        *,
        scrape_interval: str = "1s",
        exemplars: bool = False,
        rule_files: Iterable[pathlib.Path] = (),
        extra_scrape_configs: list[dict] | None = None,
        features: Iterable[str] = (),
    ) -> None:
        self.tmp_dir = pathlib.Path(tmp_dir)
        self.targets = list(targets)
        self.scrape_interval = scrape_interval
        self.exemplars = exemplars
        self.rule_files = [pathlib.Path(p) for p in rule_files]
        self.extra_scrape_configs = list(extra_scrape_configs or [])
        self.features = list(features)  # --enable-feature=<each>, e.g. native-histograms

        self.config_path = self.tmp_dir / "prometheus.yml"
        self.data_dir = self.tmp_dir / "prometheus-data"
        self.log_path = self.tmp_dir / "prometheus.log"
        self.port: int | None = None
        self.url: str = ""
        self._proc: subprocess.Popen | None = None
        self._log_file = None

    # ------------------------------------------------------------------ lifecycle

    def config(self) -> dict[str, Any]:
        """The prometheus.yml contents as a dict (written by start())."""
        cfg: dict[str, Any] = {
            "global": {
                "scrape_interval": self.scrape_interval,
                "scrape_timeout": self.scrape_interval,
                "evaluation_interval": self.scrape_interval,
            },
            "scrape_configs": [
                {
                    "job_name": JOB_NAME,
                    "metrics_path": "/metrics",
                    "honor_labels": True,
                    "static_configs": [{"targets": self.targets}],
                },
                *self.extra_scrape_configs,
            ],
        }
        if self.rule_files:
            cfg["rule_files"] = [str(p.resolve()) for p in self.rule_files]
        return cfg

    def start(self, timeout_s: float = 30) -> None:
        if self._proc is not None:
            raise RuntimeError("PrometheusServer already started")
        binary = shutil.which("prometheus")
        if binary is None:
            raise RuntimeError(_MISSING_BINARY)

        self.tmp_dir.mkdir(parents=True, exist_ok=True)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(yaml.safe_dump(self.config(), sort_keys=False))

        # The port is picked by binding to :0 then released, so another process
        # could grab it before Prometheus binds; retry a few times on that race.
        last_error: Exception | None = None
        for _attempt in range(3):
            try:
                self._start_once(binary, timeout_s)
                return
            except _PortInUse as exc:
                last_error = exc
                continue
        raise RuntimeError(f"could not start prometheus: {last_error}")

    def _start_once(self, binary: str, timeout_s: float) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [
            binary,
            f"--config.file={self.config_path}",
            f"--storage.tsdb.path={self.data_dir}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--log.level=info",
        ]
        if self.exemplars:
            cmd.append("--enable-feature=exemplar-storage")
        cmd.extend(f"--enable-feature={feature}" for feature in self.features)

        self._log_file = open(self.log_path, "ab")
        self._log_file.write(f"\n### {' '.join(cmd)}\n".encode())
        self._log_file.flush()
        self._proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=self._log_file,
            stderr=self._log_file,
            cwd=self.tmp_dir,
        )

        deadline = time.monotonic() + timeout_s
        last = "no response yet"
        while True:
            rc = self._proc.poll()
            if rc is not None:
                log = _tail(self.log_path)
                self._cleanup_handles()
                if "address already in use" in log:
                    raise _PortInUse(f"port {self.port} taken:\n{log}")
                raise RuntimeError(
                    f"prometheus exited with code {rc} during start-up "
                    f"(cmd: {' '.join(cmd)}); log tail ({self.log_path}):\n{log}"
                )
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as resp:
                    if resp.status == 200:
                        return
                    last = f"HTTP {resp.status}"
            except urllib.error.HTTPError as exc:  # 503 while TSDB is starting
                last = f"HTTP {exc.code}"
            except (urllib.error.URLError, OSError) as exc:
                last = repr(exc)
            if time.monotonic() > deadline:
                log = _tail(self.log_path)
                self.stop()
                raise RuntimeError(
                    f"prometheus not ready at {self.url}/-/ready after {timeout_s}s "
                    f"(last: {last}); log tail ({self.log_path}):\n{log}"
                )
            time.sleep(0.05)

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        self._cleanup_handles()

    def _cleanup_handles(self) -> None:
        if self._proc is not None and self._proc.poll() is not None:
            self._proc = None
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    def __enter__(self) -> "PrometheusServer":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ HTTP API

    def _api(self, path: str, params: dict[str, Any] | None = None) -> Any:
        """POST form-encoded params to /api/v1/<path>; return the ``data`` field."""
        if not self.url:
            raise RuntimeError("PrometheusServer not started")
        body = urllib.parse.urlencode(params or {}).encode() if params is not None else None
        req = urllib.request.Request(f"{self.url}/api/v1/{path}", data=body)
        if body is not None:
            req.add_header("Content-Type", "application/x-www-form-urlencoded")
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                status, raw = resp.status, resp.read().decode(errors="replace")
        except urllib.error.HTTPError as exc:
            status, raw = exc.code, exc.read().decode(errors="replace")
        try:
            payload = json.loads(raw)
        except ValueError:
            raise PrometheusQueryError(
                f"/api/v1/{path} {params!r}: HTTP {status}, non-JSON body: {raw[:2000]}",
                http_status=status, body=raw) from None
        if status != 200 or payload.get("status") != "success":
            raise PrometheusQueryError(
                f"/api/v1/{path} {params!r}: HTTP {status} "
                f"{payload.get('errorType')}: {payload.get('error')} (body: {raw[:2000]})",
                http_status=status, error_type=payload.get("errorType"),
                error=payload.get("error"), body=raw)
        return payload.get("data")

    def query(self, promql: str, *, time_s: float | None = None) -> list[dict]:
        """Instant query; returns ``data.result`` (a list for vector results)."""
        params: dict[str, Any] = {"query": promql}
        if time_s is not None:
            params["time"] = f"{time_s:.3f}"
        return self._api("query", params)["result"]

    def wait_for(
        self,
        promql: str,
        predicate: Callable[[list[dict]], bool],
        timeout_s: float = 30,
        interval_s: float = 0.25,
    ) -> list[dict]:
        """Poll ``promql`` until ``predicate(result)`` is true; return that result.

        Bad PromQL (errorType ``bad_data``) raises immediately instead of polling.
        On timeout raises AssertionError showing the last result.
        """
        deadline = time.monotonic() + timeout_s
        last: Any = "<no successful query>"
        while True:
            try:
                result = self.query(promql)
            except PrometheusQueryError as exc:
                if exc.error_type == "bad_data":
                    raise
                last = f"<error: {exc}>"
            else:
                if predicate(result):
                    return result
                last = result
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"timed out after {timeout_s}s waiting for {promql!r}; "
                    f"last result: {json.dumps(last, indent=1) if not isinstance(last, str) else last}"
                )
            time.sleep(interval_s)

    def active_targets(self) -> list[dict]:
        """Active targets from /api/v1/targets."""
        return self._api("targets?state=active")["activeTargets"]

    def targets_up(self) -> bool:
        """True if there is at least one active target and all have health == "up"."""
        active = self.active_targets()
        return bool(active) and all(t.get("health") == "up" for t in active)

    def query_exemplars(self, promql: str, start: float, end: float) -> list[dict]:
        """/api/v1/query_exemplars; needs exemplars=True and an OpenMetrics target."""
        return self._api(
            "query_exemplars",
            {"query": promql, "start": f"{start:.3f}", "end": f"{end:.3f}"},
        )

    def rules(self) -> list[dict]:
        """Rule groups from /api/v1/rules."""
        return self._api("rules")["groups"]


class _PortInUse(RuntimeError):
    pass
