"""Start a real Alertmanager (Debian's ``prometheus-alertmanager`` package) and a webhook sink for tests.

The server listens on a free 127.0.0.1 port, keeps its state under the given tmp dir and has its
cluster (gossip) listener switched off (``--cluster.listen-address=`` empty), so nothing binds
beyond loopback. The config is given as a dict (usually collector-config/alertmanager.yml with the
receivers' URLs pointed at a :class:`WebhookSink` and the intervals shortened).

Usage::

    with WebhookSink() as sink, AlertmanagerServer(tmp_path, config) as am:
        am.post_alerts([{"labels": {"alertname": "X", "severity": "page"}}])
        sink.wait_for(lambda n: n["receiver"] == "pager", timeout_s=10)
"""

from __future__ import annotations

import json
import pathlib
import shutil
import subprocess
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable

import yaml

from tests.support.ports import free_port

__all__ = ["AlertmanagerServer", "WebhookSink", "alertmanager_binary"]

_NAMES = ("prometheus-alertmanager", "alertmanager")  # Debian's name, upstream's name
_MISSING_BINARY = (
    "the Alertmanager binary (prometheus-alertmanager) is not on PATH; run `make services` "
    "(it installs Debian's prometheus-alertmanager package)"
)


def alertmanager_binary() -> str | None:
    for name in _NAMES:
        path = shutil.which(name)
        if path:
            return path
    return None


def _tail(path: pathlib.Path, n_lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n_lines:]) or "<empty log>"
    except OSError:
        return "<no log>"


class WebhookSink:
    """A webhook receiver on 127.0.0.1: records every notification Alertmanager posts, by URL path."""

    def __init__(self) -> None:
        self.notifications: list[dict[str, Any]] = []  # the webhook JSON plus "path"
        self._cond = threading.Condition()
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                payload = json.loads(body)
                payload["path"] = self.path
                with sink._cond:
                    sink.notifications.append(payload)
                    sink._cond.notify_all()
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/{path.lstrip('/')}"

    def snapshot(self) -> list[dict[str, Any]]:
        with self._cond:
            return list(self.notifications)

    def wait_for(self, predicate: Callable[[dict[str, Any]], bool], timeout_s: float) -> dict[str, Any]:
        """The first notification (already received or arriving within timeout_s) matching predicate."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while True:
                for notification in self.notifications:
                    if predicate(notification):
                        return notification
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(
                        f"no matching notification within {timeout_s}s; received: "
                        f"{json.dumps(self.notifications, indent=1)[:4000]}")
                self._cond.wait(left)

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> "WebhookSink":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class AlertmanagerServer:
    def __init__(self, tmp_dir: pathlib.Path, config: dict[str, Any]) -> None:
        self.tmp_dir = pathlib.Path(tmp_dir)
        self.config = config
        self.config_path = self.tmp_dir / "alertmanager.yml"
        self.data_dir = self.tmp_dir / "alertmanager-data"
        self.log_path = self.tmp_dir / "alertmanager.log"
        self.port: int | None = None
        self.url = ""
        self._proc: subprocess.Popen | None = None
        self._log_file = None

    # ------------------------------------------------------------------ lifecycle

    def start(self, timeout_s: float = 30) -> None:
        if self._proc is not None:
            raise RuntimeError("AlertmanagerServer already started")
        binary = alertmanager_binary()
        if binary is None:
            raise RuntimeError(_MISSING_BINARY)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(yaml.safe_dump(self.config, sort_keys=False))
        last_error: Exception | None = None
        for _attempt in range(3):  # free_port() can race with another process: retry
            try:
                self._start_once(binary, timeout_s)
                return
            except _PortInUse as exc:
                last_error = exc
        raise RuntimeError(f"could not start alertmanager: {last_error}")

    def _start_once(self, binary: str, timeout_s: float) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [binary, f"--config.file={self.config_path}", f"--storage.path={self.data_dir}",
               f"--web.listen-address=127.0.0.1:{self.port}", "--cluster.listen-address=",
               "--log.level=debug"]
        self._log_file = open(self.log_path, "ab")
        self._log_file.write(f"\n### {' '.join(cmd)}\n".encode())
        self._log_file.flush()
        self._proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=self._log_file,
                                      stderr=self._log_file, cwd=self.tmp_dir)
        deadline = time.monotonic() + timeout_s
        last = "no response yet"
        while True:
            rc = self._proc.poll()
            if rc is not None:
                log = _tail(self.log_path)
                self._close_log()
                self._proc = None
                if "address already in use" in log:
                    raise _PortInUse(f"port {self.port} taken:\n{log}")
                raise RuntimeError(f"alertmanager exited with code {rc} during start-up; log:\n{log}")
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as resp:
                    if resp.status == 200:
                        return
                    last = f"HTTP {resp.status}"
            except urllib.error.HTTPError as exc:
                last = f"HTTP {exc.code}"
            except (urllib.error.URLError, OSError) as exc:
                last = repr(exc)
            if time.monotonic() > deadline:
                log = _tail(self.log_path)
                self.stop()
                raise RuntimeError(f"alertmanager not ready after {timeout_s}s (last: {last}); log:\n{log}")
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
        self._close_log()

    def _close_log(self) -> None:
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    def log(self) -> str:
        return _tail(self.log_path, 80)

    def log_text(self) -> str:
        """The whole log so far (debug level: the dispatcher logs every aggregation group flush)."""
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def __enter__(self) -> "AlertmanagerServer":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ HTTP API v2

    def _request(self, method: str, path: str, body: Any = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(f"{self.url}{path}", data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        with urllib.request.urlopen(req, timeout=10) as resp:
            raw = resp.read().decode()
        return json.loads(raw) if raw.strip() else None

    def post_alerts(self, alerts: list[dict[str, Any]]) -> None:
        """POST /api/v2/alerts (what Prometheus does): labels, annotations, startsAt/endsAt."""
        self._request("POST", "/api/v2/alerts", alerts)

    def alerts(self) -> list[dict[str, Any]]:
        """GET /api/v2/alerts: every alert Alertmanager holds, with status.state and status.inhibitedBy."""
        return self._request("GET", "/api/v2/alerts?active=true&silenced=true&inhibited=true&unprocessed=true")

    def metrics(self) -> str:
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=10) as resp:
            return resp.read().decode()


class _PortInUse(RuntimeError):
    pass
