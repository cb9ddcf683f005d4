"""Regenerate the README's screenshots of the web view (docs/webview/*.png) from a realistic run.

    .venv/bin/python docs/webview/make_screenshots.py            # ~1.5 minutes
    .venv/bin/python docs/webview/make_screenshots.py --duration 30s --out /tmp/shots

What it does, the way a user would: ``otel-llm serve`` (the embedded defaults, on free loopback
ports, a throw-away store, plus SLO objectives and an ``slo`` policy so the cards have both to show and a 5 s
snapshot interval so a one-minute run has a dozen points per chart), fed in real time by
``otel-llm simulate --scenario burst --rate 8`` (the default fleet: vLLM, SGLang, TGI, Triton,
TensorRT-LLM, Dynamo, llm-d behind a gateway and a LiteLLM proxy, and the app tier with GenAI CLIENT
spans), the same traffic as ``make demo``. Once every trace is decided and stored, Debian's headless
Chromium (tests/support/browser.py) opens each page and saves it: the overview, the requests list,
the waterfall of a slow request that went through a gateway into a segmented engine, and the status.
Needs ``chromium`` and ``chromium-driver`` (``make services``) and the test extras (selenium).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.support import browser  # noqa: E402

BIN = Path(sys.executable).parent
OUT = ROOT / "docs" / "webview"
SEED = 16
POLICIES = [
    {"name": "errors", "type": "errors"},
    {"name": "slo", "type": "slo", "slo": {"thresholds": {"ttft": "2s", "e2e": "20s"}}},
    {"name": "slowest", "type": "slowest"},
    {"name": "baseline", "type": "probabilistic", "probabilistic": {"sampling_percentage": 10}},
]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as response:
        body = response.read()
    return json.loads(body) if "/api/" in url else body.decode()


def metric(text: str, name: str) -> float:
    """Sum of the samples of ``name`` in an exposition."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


def wait(condition: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if condition():
                return
        except OSError:
            pass
        time.sleep(0.5)
    raise SystemExit(f"make_screenshots: timed out waiting for {what}")


def pick_trace(base: str) -> str:
    """A slow kept request that crossed a gateway into an engine with synthesized segments: the
    waterfall worth looking at."""
    best: tuple[float, str] | None = None
    rows = get(base + "/api/ui/requests?sort=e2e&order=desc&limit=100")["rows"]
    for row in rows:
        trace = get(base + f"/api/ui/trace/{row['trace_id']}")
        spans = trace["spans"]
        segments = {s.get("segment") for s in spans if s.get("segment")}
        services = {s.get("service_name") for s in spans}
        if not {"queue", "prefill", "decode"} <= segments or len(services) < 2 or len(spans) > 14:
            continue
        score = len(segments) + len(services) + (2 if row.get("outcome") == "stop" else 0)
        if best is None or score > best[0]:
            best = (score, row["trace_id"])
    if best is None:
        raise SystemExit("make_screenshots: no kept trace with a gateway and engine segments")
    return best[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", default="60s", help="simulated traffic, in real time (default 60s)")
    parser.add_argument("--out", type=Path, default=OUT, help=f"where the PNGs go (default {OUT.relative_to(ROOT)})")
    args = parser.parse_args()
    if (why := browser.available()) is not None:
        raise SystemExit(f"make_screenshots: {why}")

    with tempfile.TemporaryDirectory(prefix="otel-llm-shots-") as tmp:
        grpc, http, metrics, web = free_port(), free_port(), free_port(), free_port()
        config = {
            "receivers": {"otlp": {"protocols": {"grpc": {"endpoint": f"127.0.0.1:{grpc}"},
                                                 "http": {"endpoint": f"127.0.0.1:{http}"}}}},
            "processors": {"tail_sampling": {"policies": POLICIES, "decision_wait": "5s"},
                           # objectives the cards' "SLO met" and objective column read, beside the policy's thresholds
                           "llm_metrics": {"slo": {"default": {"ttft": "1s", "e2e": "15s", "target": 0.95}}}},
            "exporters": {"prometheus": {"endpoint": f"127.0.0.1:{metrics}"},
                          "store": {"path": os.path.join(tmp, "store")}},
            "extensions": {"webview": {"endpoint": f"127.0.0.1:{web}", "snapshot_interval": "5s",
                                       "refresh_interval": "2s"}},
        }
        config_path = Path(tmp) / "otel-llm.yaml"
        config_path.write_text(yaml.safe_dump(config))
        base = f"http://127.0.0.1:{metrics}"
        server = subprocess.Popen([str(BIN / "otel-llm"), "--log-level", "WARNING", "serve", "--config", str(config_path)])
        try:
            wait(lambda: urllib.request.urlopen(base + "/readyz", timeout=1).status == 200, 30, "otel-llm serve")
            print(f"make_screenshots: otel-llm serve, its web view at http://127.0.0.1:{web}/; simulating {args.duration} of the burst scenario")
            subprocess.run([str(BIN / "otel-llm"), "--log-level", "WARNING", "simulate", "--endpoint", f"127.0.0.1:{grpc}",
                            "--scenario", "burst", "--rate", "8", "--duration", args.duration, "--seed", str(SEED)],
                           check=True)
            wait(lambda: metric(get(base + "/metrics"), "otel_llm_traces_in_memory") == 0, 60, "every trace decided")
            time.sleep(6)  # one more snapshot after the last request, and the store's flush
            driver = browser.chromium()
            try:
                shoot(driver, f"http://127.0.0.1:{web}", args.out)
            finally:
                driver.quit()
        finally:
            server.send_signal(signal.SIGTERM)
            try:
                server.wait(30)
            except subprocess.TimeoutExpired:
                server.kill()


def shoot(driver: Any, base: str, out: Path) -> None:
    def open_page(path: str) -> None:
        driver.get(base + path)
        browser.poll(lambda: int(driver.find_element("css selector", "body").get_attribute("data-loaded") or 0) >= 1,
                     20, f"{path} to load its data")
        time.sleep(0.3)  # fonts and layout settle

    trace_id = pick_trace(base)
    for name, path in (("overview", "/?window=5m"), ("requests", "/ui/requests"),
                       ("trace", f"/ui/trace/{trace_id}"), ("status", "/ui/status")):
        open_page(path)
        print("make_screenshots: wrote", browser.screenshot(driver, out / f"{name}.png"))
    errors = browser.console_errors(driver)
    if errors:
        raise SystemExit(f"make_screenshots: console errors: {errors}")


if __name__ == "__main__":
    main()
