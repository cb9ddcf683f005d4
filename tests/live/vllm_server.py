"""A real vLLM OpenAI-compatible server, run as its users run it: its own virtualenv
(``tests/live/engines.sh``), API server and engine core in two processes, a tiny model with dummy
weights (``tiny_llama.py``), traces sent with ``--otlp-traces-endpoint`` over gRPC or OTLP/HTTP:
either the line a page shows (``VllmServer.documented``) or a test's own (``VllmServer.api_server``)."""

from __future__ import annotations

import os
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

from tests.support.otelllm import Scrape, parse_exposition
from tests.support.snippets import snippet

HERE = Path(__file__).resolve().parent
ENGINES = HERE / "engines.sh"
SERVED_MODEL = "tiny-llama"
MAX_MODEL_LEN = 1024
MAX_NUM_SEQS = 4  # fewer than the workload's concurrency: requests queue
STARTUP_TIMEOUT_S = 600.0  # two cores under a loaded suite: first start compiles and warms up
DOCUMENTED_MODEL = "meta-llama/Llama-3.1-8B-Instruct"  # the pages' model, served here by tiny_llama.py's
# What a test adds to a vLLM command, after the page's words: dummy weights in float32 on a CPU, fewer
# sequences than the workload's concurrency, and where the API server listens.
TEST_ARGS = ("--load-format", "dummy", "--dtype", "float32", "--max-num-seqs", str(MAX_NUM_SEQS), "--host", "127.0.0.1")
# ... and to its environment (the test's own OTEL_* and VLLM_* never reach it): its internal queues on
# loopback, a 1 GiB KV cache and no thread pinning on two shared cores, nothing fetched or reported.
TEST_ENV = {
    "VLLM_HOST_IP": "127.0.0.1", "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
    "PYTHONUNBUFFERED": "1",
}


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
    def __init__(self, command: list[str], env: dict[str, str], protocol: str, log_path: Path,
                 served_model: str, max_model_len: int) -> None:
        self.port = free_port()
        self.protocol = protocol  # OTLP's, to otel-llm
        self.served_model, self.max_model_len = served_model, max_model_len
        self.log_path = log_path
        self.command = [*command, *TEST_ARGS, "--port", str(self.port)]
        clean = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "VLLM_"))}
        self._log = open(log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(self.command, env={**clean, **TEST_ENV, **env}, stdout=self._log,
                                        stderr=subprocess.STDOUT, start_new_session=True)

    @classmethod
    def api_server(cls, model_dir: Path, otlp_endpoint: str, protocol: str, log_path: Path,
                   extra_args: tuple[str, ...] = ()) -> VllmServer:
        """``python -m vllm.entrypoints.openai.api_server``, serving SERVED_MODEL with the test's own flags."""
        command = [vllm_python(), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
                   "--served-model-name", SERVED_MODEL, "--max-model-len", str(MAX_MODEL_LEN),
                   "--otlp-traces-endpoint", otlp_endpoint, *extra_args]
        env = {"OTEL_SERVICE_NAME": SERVED_MODEL,  # what a user sets; otel-llm's model label default reads it
               "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": protocol, "OTEL_BSP_SCHEDULE_DELAY": "200"}
        return cls(command, env, protocol, log_path, SERVED_MODEL, MAX_MODEL_LEN)

    @classmethod
    def documented(cls, page: str, name: str, model_dir: Path, grpc_port: int, http_port: int,
                   log_path: Path) -> VllmServer:
        """The ``vllm serve`` line ``page`` marks ``name``, as shown but for tests/support/snippets.py's
        rules: its otel-llm address (gRPC or OTLP/HTTP, as its protocol says) the test's, its model the
        tiny one, ``vllm`` the engine virtualenv's; TEST_ARGS and TEST_ENV appended."""
        block = snippet(page, name)
        protocol = block.command().env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "grpc")
        block = block.address("otlp-grpc", grpc_port) if protocol == "grpc" else block.address("otlp-http", http_port)
        command = block.replace(DOCUMENTED_MODEL, str(model_dir)).command()
        argv = command.program("vllm", str(Path(vllm_python()).with_name("vllm")))
        return cls(argv, command.env, protocol, log_path, command.flag("--served-model-name"),
                   int(command.flag("--max-model-len")))

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def wait_ready(self, timeout_s: float = STARTUP_TIMEOUT_S) -> None:
        wait_healthy("vLLM", self.process, self.base_url + "/health", self.log_path, timeout_s)

    def scrape(self) -> Scrape:
        with urllib.request.urlopen(self.base_url + "/metrics", timeout=30) as response:
            text = response.read().decode()
        return Scrape(parse_exposition(text), text)

    def stop(self) -> None:
        stop_group(self.process)
        self._log.close()


def wait_healthy(what: str, process: subprocess.Popen[bytes], url: str, log_path: Path, timeout_s: float) -> None:
    """Until ``url`` answers 200; fails with the log's tail if ``process`` exits or the time is up."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"{what} exited with {process.returncode}:\n{log_tail(log_path)}")
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.5)
    raise AssertionError(f"{what} not ready after {timeout_s} s:\n{log_tail(log_path)}")


def log_tail(log_path: Path, chars: int = 6000) -> str:
    return log_path.read_text(errors="replace")[-chars:]


def stop_group(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the process group a test started (``start_new_session``), SIGKILL if it lingers."""
    if process.poll() is None:
        os.killpg(process.pid, 15)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, 9)
            process.wait(timeout=30)
