"""A config that validates runs: ``otel-llm validate`` rejects, with the key's path, every value
``serve`` cannot run, and ``serve`` refuses what the machine will not give it (a port in use, a key
that does not match its certificate) within seconds, in one line, exit 1 — never a traceback.

Run as users run it: the CLI as a subprocess."""

from __future__ import annotations

import dataclasses
import socket
import subprocess
import sys
import time
import types
import typing
from pathlib import Path
from typing import Annotated, Any

import pytest

from otel_llm import config as config_module
from otel_llm.config import Config, ConfigError, config_from_dict

OTEL_LLM = [sys.executable, "-m", "otel_llm"]
LOOPBACK = "127.0.0.1:0"
# Start-up refusals must not wait for a shutdown grace period: this one is long enough that
# waiting for it (plus the 15 s the receivers get on top) cannot pass for "prompt" on any machine.
LONG_GRACE_S = 120


def run_cli(*args: str) -> tuple[subprocess.CompletedProcess[str], float]:
    start = time.monotonic()
    result = subprocess.run([*OTEL_LLM, *args], capture_output=True, text=True, timeout=LONG_GRACE_S)
    return result, time.monotonic() - start


def write_config(tmp_path: Path, text: str, name: str = "config.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def listening_on_loopback(extra: str = "", grpc_extra: str = "") -> str:
    """Every listener on a free port, so only the value under test can make ``serve`` fail."""
    return (f"receivers:\n  otlp:\n    protocols:\n      grpc: {{endpoint: '{LOOPBACK}'{grpc_extra}}}\n"
            f"      http: {{endpoint: '{LOOPBACK}'}}\n"
            f"exporters:\n  prometheus: {{endpoint: '{LOOPBACK}'}}\n"
            f"extensions:\n  webview: {{endpoint: '{LOOPBACK}'}}\n" + extra)


def assert_one_clean_line(stderr: str) -> None:
    assert "Traceback" not in stderr, stderr
    assert len([line for line in stderr.splitlines() if line.strip()]) == 1, stderr


@pytest.mark.parametrize("text,path", [
    # .inf passed validation, then the SIGTERM path crashed (0 of 50 pending traces stored).
    ("service: {shutdown_grace: .inf}\n", "service.shutdown_grace"),
    ("service: {shutdown_grace: 2h}\n", "service.shutdown_grace"),
    # Written beside the store: without one it would be ignored.
    ("service:\n  hand_over_pending_traces: true\n  pipelines:\n    traces: {receivers: [otlp], processors: "
     "[llm_metrics, tail_sampling, redaction], exporters: [debug]}\nexporters: {debug: {}}\n",
     "service.hand_over_pending_traces"),
    # 0 made the memory limiter's loop spin (95 % CPU idle).
    ("processors:\n  memory_limiter: {check_interval: 0}\n", "processors.memory_limiter.check_interval"),
    # 2^64 wrapped to 0 in the shared intake counters.
    ("receivers:\n  otlp: {max_queued_spans: 18446744073709551616}\n", "receivers.otlp.max_queued_spans"),
    ("processors:\n  memory_limiter: {limit_mib: 18446744073709551616}\n", "processors.memory_limiter.limit_mib"),
    # Oversized gRPC options: a C int in grpcio; a traceback in the receiver process, and
    # "no answer in 60 s" from serve.
    ("receivers:\n  otlp:\n    protocols:\n      grpc: {endpoint: '127.0.0.1:0', max_recv_msg_size_mib: 4096}\n",
     "receivers.otlp.protocols.grpc.max_recv_msg_size_mib"),
    ("receivers:\n  otlp:\n    protocols:\n      grpc: {endpoint: '127.0.0.1:0', max_concurrent_streams: 2147483648}\n",
     "receivers.otlp.protocols.grpc.max_concurrent_streams"),
    ("processors:\n  tail_sampling: {decision_wait: 99999999999999999999999999h}\n",
     "processors.tail_sampling.decision_wait"),
    ("processors:\n  tail_sampling: {rate_limit: {traces_per_second: .nan}}\n",
     "processors.tail_sampling.rate_limit.traces_per_second"),
    ("exporters:\n  otlp: {endpoint: 'tempo:4317', retry_on_failure: {initial_interval: 0, max_interval: 1s}}\n",
     "exporters.otlp.retry_on_failure.initial_interval"),
    # Accepted, then a ValueError from the exporter at start, or every export failing.
    ("exporters:\n  otlphttp: {endpoint: 'http://'}\n", "exporters.otlphttp.endpoint"),
    ("exporters:\n  otlphttp: {endpoint: 'http://tempo:notaport'}\n", "exporters.otlphttp.endpoint"),
    ("exporters:\n  otlp: {endpoint: 'tempo:4317', headers: {'X Scope OrgID': a}}\n",
     "exporters.otlp.headers.X Scope OrgID"),
    ("exporters:\n  otlphttp: {endpoint: 'http://tempo:4318', headers: {x-token: \"a\\nb\"}}\n",
     "exporters.otlphttp.headers.x-token"),
    # A duplicate label on every series: Prometheus rejects the whole scrape.
    ("processors:\n  llm_metrics: {dimensions: [{name: model_name, attribute: x, values: [a]}]}\n",
     "processors.llm_metrics.dimensions[0].name"),
    ("processors:\n  llm_metrics: {dimensions: [{name: le, attribute: x, values: [a]}]}\n",
     "processors.llm_metrics.dimensions[0].name"),
])
def test_values_serve_cannot_run_are_refused_with_their_path(tmp_path, text, path):
    config = write_config(tmp_path, text)
    for command in (["validate", str(config)], ["serve", "--config", str(config)]):
        result, _ = run_cli(*command)
        assert result.returncode == 2, (command, result.stdout, result.stderr)
        assert path in result.stderr, result.stderr
        assert "Traceback" not in result.stderr


def test_non_utf8_config_and_token_file_are_config_errors(tmp_path):
    latin1 = tmp_path / "latin1.yaml"
    latin1.write_bytes("service:\n  shutdown_grace: 10s  # café\n".encode("latin-1"))
    token = tmp_path / "token"
    token.write_bytes(b"s\xe9cret\n")
    with_token = write_config(tmp_path, listening_on_loopback().replace(
        f"prometheus: {{endpoint: '{LOOPBACK}'}}",
        f"prometheus: {{endpoint: '{LOOPBACK}', auth: {{bearer_token_file: '{token}'}}}}"), "token.yaml")
    for config, expected in ((latin1, "not UTF-8"), (with_token, "exporters.prometheus.auth.bearer_token_file")):
        for command in (["validate", str(config)], ["serve", "--config", str(config)]):
            result, _ = run_cli(*command)
            assert result.returncode == 2, (command, result.stderr)
            assert expected in result.stderr
            assert_one_clean_line(result.stderr)


@pytest.fixture(scope="module")
def mismatched_key(tmp_path_factory) -> tuple[Path, Path]:
    directory = tmp_path_factory.mktemp("tls")
    cert, key, other_key = directory / "server.crt", directory / "server.key", directory / "other.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
                    "-days", "2", "-subj", "/CN=localhost"], check=True, capture_output=True, timeout=60)
    subprocess.run(["openssl", "genrsa", "-out", str(other_key), "2048"], check=True, capture_output=True, timeout=60)
    return cert, other_key


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_key_that_does_not_match_its_certificate(tmp_path, mismatched_key, protocol):
    cert, key = mismatched_key
    tls = f", tls: {{cert_file: '{cert}', key_file: '{key}'}}"
    text = listening_on_loopback(f"service: {{shutdown_grace: {LONG_GRACE_S}s}}\n")
    text = text.replace(f"{protocol}: {{endpoint: '{LOOPBACK}'}}", f"{protocol}: {{endpoint: '{LOOPBACK}'{tls}}}")
    config = write_config(tmp_path, text)
    path = f"receivers.otlp.protocols.{protocol}.tls"
    result, _ = run_cli("validate", str(config))
    assert result.returncode == 2, result.stderr
    assert path in result.stderr and "does not match" in result.stderr
    result, elapsed = run_cli("serve", "--config", str(config))
    assert result.returncode == 1, result.stderr  # the environment, not the config's shape
    assert path in result.stderr and "does not match the certificate" in result.stderr
    assert "Failed to bind" not in result.stderr
    assert_one_clean_line(result.stderr)
    assert elapsed < LONG_GRACE_S / 2, f"took {elapsed:.1f}s: it waited for the shutdown grace"


def test_metrics_port_in_use_exits_promptly(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        text = listening_on_loopback(f"service: {{shutdown_grace: {LONG_GRACE_S}s}}\n").replace(
            f"prometheus: {{endpoint: '{LOOPBACK}'}}", f"prometheus: {{endpoint: '127.0.0.1:{port}'}}")
        config = write_config(tmp_path, text)
        assert run_cli("validate", str(config))[0].returncode == 0  # a port in use is not the config's fault
        result, elapsed = run_cli("serve", "--config", str(config))
    assert result.returncode == 1, result.stderr
    assert f"127.0.0.1:{port}" in result.stderr and "prometheus" in result.stderr
    assert_one_clean_line(result.stderr)
    assert elapsed < LONG_GRACE_S / 2, f"took {elapsed:.1f}s: it waited for the shutdown grace"


# --- every numeric field has a bound ----------------------------------------------------------


def _numeric_fields(cls: Any, prefix: str) -> list[tuple[str, Any, Any, str]]:
    """(path, owning class, type, field name) of every int, float and duration under ``cls``,
    through nested sections (optional ones included); lists and maps of sections are left out."""
    out = []
    hints = typing.get_type_hints(cls, include_extras=True)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        path = f"{prefix}.{f.name}" if prefix else f.name
        inner = tp
        if typing.get_origin(tp) in (types.UnionType, typing.Union):
            inner = next(a for a in typing.get_args(tp) if a is not type(None))
        base = typing.get_args(inner)[0] if typing.get_origin(inner) is Annotated else inner
        if dataclasses.is_dataclass(inner):
            out += _numeric_fields(inner, path)
        elif base in (int, float):
            out.append((path, cls, inner, f.name))
    return out


NUMERIC_FIELDS = _numeric_fields(Config, "")
# What a section needs besides the field under test to be valid.
REQUIRED = {"exporters.otlp": {"endpoint": "tempo:4317"}, "exporters.otlphttp": {"endpoint": "http://tempo:4318"},
            # options refused unless their feature is on (exponential.*, native_histogram_max_buckets)
            "exporters.otlp_metrics": {"histogram": "exponential"},
            "exporters.prometheus": {"native_histograms": True}}


# Fields checked against another (grace <= decision_wait, initial_interval <= max_interval): at
# a bound of one, the other is set where the pair stays valid.
COMPANIONS: dict[str, tuple[str, float, float]] = {  # field: (other field, its value at our low, at our high)
    "grace": ("decision_wait", 0.0, 86400.0),
    "decision_wait": ("grace", 0.0, 0.0),
    "initial_interval": ("max_interval", 86400.0, 86400.0),
    "max_interval": ("initial_interval", 0.001, 0.001),
    "history": ("snapshot_interval", 0.1, 10.0),  # exporters.prometheus.web: history >= snapshot_interval
}


def _config_with(path: str, value: Any, companion: float | None = None) -> dict[str, Any]:
    data: dict[str, Any] = {}
    node = data
    parts = path.split(".")
    for i, part in enumerate(parts[:-1]):
        node = node.setdefault(part, dict(REQUIRED.get(".".join(parts[:i + 1]), {})))
    node[parts[-1]] = value
    if companion is not None:
        node[COMPANIONS[parts[-1]][0]] = companion
    return data


def test_the_walk_finds_the_fields_of_the_issue():
    paths = {path for path, *_ in NUMERIC_FIELDS}
    assert {"service.shutdown_grace", "processors.memory_limiter.check_interval", "receivers.otlp.max_queued_spans",
            "receivers.otlp.protocols.grpc.max_recv_msg_size_mib"} <= paths
    assert len(paths) >= 40


@pytest.mark.parametrize("path,cls,tp,name", NUMERIC_FIELDS, ids=[p for p, *_ in NUMERIC_FIELDS])
def test_every_numeric_field_refuses_what_cannot_run(path, cls, tp, name):
    is_duration = config_module._Duration in typing.get_args(tp)
    too_large: list[Any] = [float("inf"), float("nan"), 1e300] if is_duration or tp is float else [2**64, 2**31]
    for value in too_large:
        with pytest.raises(ConfigError) as info:
            config_from_dict(_config_with(path, value))
        assert info.value.path == path, (value, str(info.value))
    bound = getattr(cls, "BOUNDS", {}).get(name)
    if bound is not None:
        low, high = bound
        default = next(f for f in dataclasses.fields(cls) if f.name == name).default
        assert low <= default <= high, f"{path}: default {default} outside its bound {bound}"
        for value, side in ((high, 2), (low, 1)):
            companion = COMPANIONS[name][side] if name in COMPANIONS else None
            config = config_from_dict(_config_with(path, value, companion))  # the bounds themselves are valid
            assert config is not None
        with pytest.raises(ConfigError) as info:
            config_from_dict(_config_with(path, high * 2 + 1))
        assert info.value.path == path and "must be" in str(info.value)


def test_bounds_name_existing_fields():
    for cls, name in [(c, n) for c in {c for _, c, _, _ in NUMERIC_FIELDS} for n in getattr(c, "BOUNDS", {})]:
        assert name in {f.name for f in dataclasses.fields(cls)}, (cls.__name__, name)
