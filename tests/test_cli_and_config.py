"""The CLI as users run it: a real `otel-llm` process, its exit codes and its error messages."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from otel_llm.component import Kind
from otel_llm.config import ConfigError, config_from_dict, load_config
from tests.support.ports import free_port

ROOT = Path(__file__).resolve().parent.parent
TESTDATA = Path(__file__).parent / "testdata"
OTEL_LLM = [sys.executable, "-m", "otel_llm"]


def run_cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*OTEL_LLM, *args], capture_output=True, text=True, timeout=60, cwd=cwd)


def wait_ready(url: str, proc: subprocess.Popen, timeout_s: float) -> float:
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        if proc.poll() is not None:
            raise AssertionError(f"otel-llm exited {proc.returncode}: {proc.stderr.read() if proc.stderr else ''}")
        try:
            with urllib.request.urlopen(url, timeout=1) as response:
                if response.status == 200:
                    return time.monotonic() - start
        except OSError:
            pass
        time.sleep(0.05)
    raise AssertionError(f"{url} not ready within {timeout_s}s")


def test_minimal_config_validates_exactly_as_written():
    result = run_cli("validate", str(TESTDATA / "minimal.yaml"))
    assert result.returncode == 0, result.stderr
    config = load_config(TESTDATA / "minimal.yaml")
    assert config.receivers.otlp.protocols.grpc.endpoint == "127.0.0.1:14317"
    assert config.exporters.store.path == "/some/dir"



def test_validate_warns_when_decision_wait_is_below_the_engine_export_delay(tmp_path):
    """vLLM's BatchSpanProcessor sends every 5 s: a decision_wait of 3 s loses joins (7 of 12, live). The config
    still runs: validate says so, exit 0, and serve logs the same line."""
    short = tmp_path / "short.yaml"
    short.write_text("processors:\n  tail_sampling: {decision_wait: 3s, grace: 100ms}\n")
    result = run_cli("validate", str(short))
    assert result.returncode == 0 and result.stdout.startswith(f"{short}: ok;"), result.stderr
    assert result.stderr.count("warning:") == 1
    assert "processors.tail_sampling.decision_wait: 3s is below the usual engine export delay (5s" in result.stderr
    enough = tmp_path / "enough.yaml"
    enough.write_text("processors:\n  tail_sampling: {decision_wait: 5s}\n")
    result = run_cli("validate", str(enough))
    assert result.returncode == 0 and result.stderr == "", result.stderr
    # A pipeline that does not run tail_sampling has no decision to wait for.
    unused = tmp_path / "unused.yaml"
    unused.write_text("processors:\n  tail_sampling: {decision_wait: 1s, grace: 100ms}\n"
                      "exporters:\n  prometheus: {endpoint: '127.0.0.1:0'}\n"
                      "service:\n  pipelines:\n    traces: {processors: [llm_metrics, redaction], "
                      "exporters: [prometheus]}\n")
    result = run_cli("validate", str(unused))
    assert result.returncode == 0 and result.stderr == "", result.stderr

    from tests.support.otelllm import ServerProcess

    server = ServerProcess(tmp_path, {"processors": {"tail_sampling": {"decision_wait": "3s", "grace": "100ms"}}})
    try:
        server.start(timeout_s=60)
    finally:
        server.ensure_stopped()
    assert "WARNING otel_llm: processors.tail_sampling.decision_wait: 3s is below" in server.log_path.read_text()

@pytest.mark.parametrize(
    "text,path",
    [
        ("receivers:\n  otlp:\n    protocols:\n      grpc: {endpoint: 'localhost'}\n", "receivers.otlp.protocols.grpc.endpoint"),
        ("receivers:\n  otlp:\n    protocols:\n      grpc: {endpoint: '127.0.0.1:99999'}\n",
         "receivers.otlp.protocols.grpc.endpoint"),
        ("receivers:\n  otlp:\n    protocol: {}\n", "receivers.otlp.protocol"),
        ("processors:\n  tail_sampling: {decision_wait: soon}\n", "processors.tail_sampling.decision_wait"),
        ("processors:\n  llm_metrics: {series_limit: -1}\n", "processors.llm_metrics.series_limit"),
        ("processors:\n  llm_metrics: {namings: {vllm: 'yes'}}\n", "processors.llm_metrics.namings.vllm"),
        ("exporters:\n  prometheus: {endpoint: '127.0.0.1:9464'}\nservice:\n  pipelines:\n    traces: {exporters: [tempo]}\n",
         "service.pipelines.traces.exporters[0]"),
        ("exporter: {}\n", "exporter"),
        ("[1, 2\n", "not valid YAML"),
    ],
)
def test_bad_config_exits_2_naming_the_path(tmp_path, text, path):
    config = tmp_path / "bad.yaml"
    config.write_text(text)
    for command in (["validate", str(config)], ["serve", "--config", str(config)]):
        result = run_cli(*command)
        assert result.returncode == 2, (command, result.stdout, result.stderr)
        assert path in result.stderr


@pytest.mark.parametrize("value", ["true", "false"])
def test_the_removed_adapter_process_key_is_refused_saying_what_to_do(tmp_path, value):
    """``service.adapter_process`` was removed (a third process cost more than it bought once the
    compiled core made the adapter stage cheap): either value is a config error naming the key, why,
    and what to do, exit code 2 from ``validate`` and ``serve``, never silently ignored."""
    config = tmp_path / "old.yaml"
    config.write_text(f"service:\n  adapter_process: {value}\n")
    for command in (["validate", str(config)], ["serve", "--config", str(config)]):
        result = run_cli(*command)
        assert result.returncode == 2, (command, result.stdout, result.stderr)
        assert "service.adapter_process" in result.stderr and "removed" in result.stderr, result.stderr
        assert "delete the key" in result.stderr and "scale out" in result.stderr, result.stderr
    with pytest.raises(ConfigError, match="service.adapter_process"):
        config_from_dict({"service": {"adapter_process": False}})


def test_absent_components_in_a_listed_section_are_off():
    config = config_from_dict({"exporters": {"prometheus": {"endpoint": "127.0.0.1:1"}},
                               "receivers": {"otlp": {"protocols": {"http": None}}}})
    assert config.exporters.store is None
    assert config.receivers.otlp.protocols.grpc is None
    assert config.receivers.otlp.protocols.http.endpoint == "127.0.0.1:4318"
    config = config_from_dict({"receivers": {"otlp": {"max_queued_spans": 7, "protocols": {"grpc": None}}}})
    assert config.receivers.otlp.max_queued_spans == 7  # options beside the protocols survive their filtering
    with pytest.raises(ConfigError, match="already used"):
        config_from_dict({"receivers": {"otlp": {"protocols": {"grpc": {"endpoint": "127.0.0.1:5000"},
                                                               "http": {"endpoint": "127.0.0.1:5000"}}}}})


def test_serve_minimal_config_shape_then_sigterm_exits_0(tmp_path):
    grpc_port, http_port, metrics_port = free_port(), free_port(), free_port()
    text = (TESTDATA / "minimal.yaml").read_text()
    text = (text.replace("14317", str(grpc_port)).replace("14318", str(http_port))
            .replace("19464", str(metrics_port)).replace("/some/dir", str(tmp_path / "store")))
    text += f"extensions:\n  webview: {{endpoint: '127.0.0.1:{free_port()}'}}\n"  # off the default port
    config = tmp_path / "config.yaml"
    config.write_text(text)
    proc = subprocess.Popen([*OTEL_LLM, "serve", "--config", str(config)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        wait_ready(f"http://127.0.0.1:{metrics_port}/readyz", proc, 10)
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/healthz", timeout=2) as response:
            assert response.status == 200
        for port in (grpc_port, http_port):
            socket.create_connection(("127.0.0.1", port), timeout=2).close()
        assert (tmp_path / "store").is_dir()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()


def test_serve_with_embedded_defaults_is_ready_within_10s(tmp_path):
    """What `make run` starts: no config file, the default ports of DESIGN.md §2."""
    for port in (4317, 4318, 9464, 9465):
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                pytest.fail(f"port {port} is taken on this machine; the embedded defaults need it")
    proc = subprocess.Popen([*OTEL_LLM, "serve"], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent)})
    try:
        elapsed = wait_ready("http://127.0.0.1:9464/readyz", proc, 10)
        assert elapsed < 10
        assert (tmp_path / "otel-llm-data").is_dir()
        with urllib.request.urlopen("http://127.0.0.1:9465/api/ui/meta", timeout=5) as response:  # the web view
            assert response.status == 200
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()


def test_port_in_use_is_a_clear_error(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        config = tmp_path / "c.yaml"
        config.write_text(f"exporters:\n  prometheus: {{endpoint: '127.0.0.1:{port}'}}\n"
                          "receivers:\n  otlp:\n    protocols:\n      http: {endpoint: '127.0.0.1:0'}\n")
        result = run_cli("serve", "--config", str(config))
    assert result.returncode == 1
    assert f"127.0.0.1:{port}" in result.stderr


# --- the web view runs unless a config turns it off; validate and the ready line say so ------------------


def _serve_until_ready(config: Path, metrics_port: int) -> tuple[subprocess.Popen[str], str]:
    """``otel-llm serve --config`` started and ready; returns the process and its ready line."""
    proc = subprocess.Popen([*OTEL_LLM, "serve", "--config", str(config)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    wait_ready(f"http://127.0.0.1:{metrics_port}/readyz", proc, 15)
    assert proc.stdout is not None
    return proc, proc.stdout.readline()  # printed once everything listens


def _stop(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=20) == 0


def _config_without_extensions(tmp_path: Path) -> tuple[Path, int]:
    """The README's starter otel-llm.yaml on free ports for everything it listens on but the web
    view: it does not mention ``extensions``, and neither does the file written here."""
    starter = yaml.safe_load((ROOT / "otel-llm.yaml").read_text(encoding="utf-8"))
    assert "extensions" not in starter and "service" not in starter
    metrics_port = free_port()
    starter["receivers"] = {"otlp": {"protocols": {"grpc": {"endpoint": f"127.0.0.1:{free_port()}"},
                                                   "http": {"endpoint": f"127.0.0.1:{free_port()}"}}}}
    starter["exporters"] = {"prometheus": {"endpoint": f"127.0.0.1:{metrics_port}"},
                            "store": {"path": str(tmp_path / "store")}}
    config = tmp_path / "otel-llm.yaml"
    config.write_text(yaml.safe_dump(starter))
    return config, metrics_port


def test_the_starter_config_validates_in_both_forms_and_names_the_web_view():
    for args in (["validate", "otel-llm.yaml"], ["validate", "--config", "otel-llm.yaml"],
                 ["validate", "--config=otel-llm.yaml"]):
        result = run_cli(*args, cwd=ROOT)
        assert result.returncode == 0, (args, result.stderr)
        assert result.stdout == "otel-llm.yaml: ok; extensions: webview 127.0.0.1:9465\n", args
    twice = run_cli("validate", "otel-llm.yaml", "--config", "otel-llm.yaml", cwd=ROOT)
    assert twice.returncode == 2 and "give the config file once" in twice.stderr


def test_a_config_without_extensions_runs_the_web_view_on_loopback(tmp_path):
    """A config file keeps the embedded default web view unless it turns it off (the starter config,
    the README's one-liner, docs/configuration.md's example all leave ``extensions`` out)."""
    with socket.socket() as s:
        if s.connect_ex(("127.0.0.1", 9465)) == 0:
            pytest.fail("port 9465 is taken on this machine; the web view's default endpoint needs it")
    config, metrics_port = _config_without_extensions(tmp_path)
    proc, ready = _serve_until_ready(config, metrics_port)
    try:
        assert ready.rstrip().endswith("; extensions: webview 127.0.0.1:9465"), ready
        with urllib.request.urlopen("http://127.0.0.1:9465/api/ui/meta", timeout=5) as response:
            assert response.status == 200
        _stop(proc)
    finally:
        if proc.poll() is None:
            proc.kill()


def test_service_extensions_empty_turns_the_web_view_off(tmp_path):
    """The explicit off switch, as in the Collector: the extensions that run are those
    ``service.extensions`` lists. Its endpoint given here so that "closed" is checked on a port of
    the test's own."""
    config, metrics_port = _config_without_extensions(tmp_path)
    webview_port = free_port()
    data = yaml.safe_load(config.read_text())
    data["extensions"] = {"webview": {"endpoint": f"127.0.0.1:{webview_port}"}}
    data["service"] = {"extensions": []}
    config.write_text(yaml.safe_dump(data))
    result = run_cli("validate", "--config", str(config))
    assert result.returncode == 0, result.stderr
    assert result.stdout.endswith("ok; extensions: none (service.extensions: [])\n"), result.stdout
    proc, ready = _serve_until_ready(config, metrics_port)
    try:
        assert ready.rstrip().endswith("; extensions: none (service.extensions: [])"), ready
        with socket.socket() as s:
            assert s.connect_ex(("127.0.0.1", webview_port)) != 0, "the web view listens although turned off"
        _stop(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
    # An extensions section that is present runs what it lists: an empty one runs none.
    assert config_from_dict({"extensions": {}}).running(Kind.EXTENSION) == []


def _yaml_blocks(page: str) -> list[str]:
    return [block for lang, block in _fenced(page) if lang == "yaml"]


def _fenced(page: str) -> list[tuple[str, str]]:
    out, lines, lang = [], [], None
    for line in page.splitlines():
        if lang is None and line.startswith("```"):
            lang, lines = line[3:].strip(), []
        elif lang is not None and line.startswith("```"):
            out.append((lang, "\n".join(lines)))
            lang = None
        elif lang is not None:
            lines.append(line)
    return out


def test_the_configuration_page_example_keeps_the_web_view_its_rule_promises():
    """docs/configuration.md says a section left out takes its defaults: its example leaves
    ``extensions`` out, so it runs the web view, on loopback."""
    page = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    assert "A top-level section you leave out takes its defaults" in page
    example = yaml.safe_load(_yaml_blocks(page)[0])
    assert "extensions" not in example
    config = config_from_dict(example)
    assert config.running(Kind.EXTENSION) == ["webview"]
    assert config.extensions.webview.endpoint == "127.0.0.1:9465"
