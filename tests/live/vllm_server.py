"""A real vLLM OpenAI-compatible server, run as its users run it: its own virtualenv
(``tests/live/engines.sh``), API server and engine core in two processes, a tiny model with dummy
weights (``tiny_llama.py``), traces sent with ``--otlp-traces-endpoint`` over gRPC or OTLP/HTTP."""

from __future__ import annotations

import os
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

from tests.support.otelllm import Scrape, parse_exposition

HERE = Path(__file__).resolve().parent
ENGINES = HERE / "engines.sh"
SERVED_MODEL = "tiny-llama"
MAX_MODEL_LEN = 1024
MAX_NUM_SEQS = 4  # fewer than the workload's concurrency: requests queue
STARTUP_TIMEOUT_S = 600.0  # two cores under a loaded suite: first start compiles and warms up


def vllm_python() -> str:
    """The vLLM virtualenv's Python, installed (once, cached outside the repo) if missing."""
    subprocess.run([str(ENGINES), "build"], check=True)
    return subprocess.run([str(ENGINES), "path", "vllm"], check=True, capture_output=True, text=True).stdout.strip()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def listening_sockets(pid: int) -> list[str]:
    """Local addresses of the TCP sockets ``pid`` and its descendants listen on (from /proc)."""
    pids, frontier = {pid}, [pid]
    while frontier:
        parent = frontier.pop()
        for task in Path(f"/proc/{parent}/task").glob("*"):
            children = (task / "children").read_text().split() if (task / "children").exists() else []
            for child in map(int, children):
                if child not in pids:
                    pids.add(child)
                    frontier.append(child)
    inodes: set[str] = set()
    for p in pids:
        for fd in Path(f"/proc/{p}/fd").glob("*"):
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    out = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                out.append(fields[1])
    return out


def is_loopback(hex_address: str) -> bool:
    host = hex_address.split(":")[0]
    if len(host) == 8:  # IPv4, little-endian
        return bytes.fromhex(host)[::-1][0] == 127
    return host == "00000000000000000000000001000000"  # ::1


class VllmServer:
    def __init__(self, model_dir: Path, otlp_endpoint: str, protocol: str, log_path: Path,
                 extra_args: tuple[str, ...] = ()) -> None:
        self.port = free_port()
        self.protocol = protocol  # OTLP's, to otel-llm
        self.log_path = log_path
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "VLLM_"))}
        env.update({
            "OTEL_SERVICE_NAME": SERVED_MODEL,  # what a user sets; otel-llm's model label default reads it
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": protocol,
            "OTEL_BSP_SCHEDULE_DELAY": "200",
            "VLLM_HOST_IP": "127.0.0.1",  # its internal queues stay on loopback
            "VLLM_CPU_KVCACHE_SPACE": "1",
            "VLLM_CPU_OMP_THREADS_BIND": "nobind",  # two shared cores: no pinning
            "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
            "PYTHONUNBUFFERED": "1",
        })
        command = [vllm_python(), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
                   "--served-model-name", SERVED_MODEL, "--load-format", "dummy", "--dtype", "float32",
                   "--max-model-len", str(MAX_MODEL_LEN), "--max-num-seqs", str(MAX_NUM_SEQS),
                   "--host", "127.0.0.1", "--port", str(self.port), "--otlp-traces-endpoint", otlp_endpoint,
                   *extra_args]
        self._log = open(log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(command, env=env, stdout=self._log, stderr=subprocess.STDOUT,
                                        start_new_session=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log_tail(self, chars: int = 6000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:]

    def wait_ready(self, timeout_s: float = STARTUP_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"vLLM exited with {self.process.returncode}:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(self.base_url + "/health", timeout=5) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.5)
        raise AssertionError(f"vLLM not ready after {timeout_s} s:\n{self.log_tail()}")

    def scrape(self) -> Scrape:
        with urllib.request.urlopen(self.base_url + "/metrics", timeout=30) as response:
            text = response.read().decode()
        return Scrape(parse_exposition(text), text)

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, 15)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, 9)
                self.process.wait(timeout=30)
        self._log.close()
