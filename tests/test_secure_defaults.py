"""Secure by default: the embedded defaults listen on loopback only; a listener bound beyond
loopback without a token is allowed but logged once at start and shown on the Status page; the
image runs as a non-root user with a config that binds the container's interfaces."""

from __future__ import annotations

import json
import logging
import re
import urllib.request
from pathlib import Path

import yaml

from otel_llm.config import config_from_dict, exposed_without_token, load_config, split_endpoint

ROOT = Path(__file__).resolve().parent.parent
TOKEN = "a-token-for-the-metrics-port"


def test_the_embedded_defaults_listen_on_loopback_only():
    """Before: 0.0.0.0 for OTLP gRPC, OTLP HTTP and the metrics port (web view and /api included)."""
    config = load_config(None)
    endpoints = [config.receivers.otlp.protocols.grpc.endpoint, config.receivers.otlp.protocols.http.endpoint,
                 config.exporters.prometheus.endpoint, config.extensions.webview.endpoint]
    assert endpoints == ["127.0.0.1:4317", "127.0.0.1:4318", "127.0.0.1:9464", "127.0.0.1:9465"]
    assert exposed_without_token(config) == []


def _status(server) -> dict:  # noqa: ANN001
    request = urllib.request.Request(server.webview_url + "/api/ui/status",
                                     headers={"Authorization": f"Bearer {TOKEN}"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def test_listening_beyond_loopback_without_a_token_is_logged_once_and_shown(make_server, caplog):
    caplog.set_level(logging.WARNING, logger="otel_llm.service.service")
    server = make_server({"receivers": {"otlp": {"protocols": {"http": {"endpoint": "0.0.0.0:0"}}}},
                          "exporters": {"prometheus": {"endpoint": "0.0.0.0:0"}},
                          "extensions": {"webview": {"endpoint": "0.0.0.0:0"}}})
    exposed = _status(server)["exposed_without_token"]
    assert len(exposed) == 3
    assert exposed[0].startswith("receivers.otlp.protocols.http.endpoint 0.0.0.0:0")
    assert exposed[1].startswith("exporters.prometheus.endpoint 0.0.0.0:0")
    assert exposed[2].startswith("extensions.webview.endpoint 0.0.0.0:0")
    logged = [r.getMessage() for r in caplog.records if "beyond loopback without a token" in r.getMessage()]
    assert len(logged) == 3
    _status(server)  # reading the page logs nothing more
    assert len([r for r in caplog.records if "beyond loopback" in r.getMessage()]) == 3


def test_a_token_or_loopback_says_nothing(make_server, caplog):
    caplog.set_level(logging.WARNING, logger="otel_llm.service.service")
    server = make_server({"exporters": {"prometheus": {"endpoint": "0.0.0.0:0", "auth": {"bearer_token": TOKEN}}},
                          "extensions": {"webview": {"endpoint": "0.0.0.0:0", "auth": {"bearer_token": TOKEN}}}})
    assert _status(server)["exposed_without_token"] == []
    assert not [r for r in caplog.records if "beyond loopback" in r.getMessage()]
    for host, expected in (("localhost:1", []), ("[::1]:1", []), ("127.0.0.2:1", []), ("10.0.0.1:1", ["x"])):
        config = config_from_dict({"exporters": {"prometheus": {"endpoint": host}, "store": {}}})
        assert len(exposed_without_token(config)) == len(expected), host


def test_the_image_runs_as_a_user_and_its_config_binds_the_container_interfaces():
    """Before: no USER line (root) and ``CMD ["serve"]`` on the embedded defaults."""
    dockerfile = (ROOT / "Dockerfile").read_text(encoding="utf-8")
    users = re.findall(r"^USER\s+(\S+)", dockerfile, re.M)
    assert users and users[-1].split(":")[0] not in ("root", "0")
    assert 'CMD ["serve", "--config", "/etc/otel-llm/config.yaml"]' in dockerfile
    assert "COPY deploy/docker/otel-llm.yaml /etc/otel-llm/config.yaml" in dockerfile
    config = config_from_dict(yaml.safe_load((ROOT / "deploy/docker/otel-llm.yaml").read_text(encoding="utf-8")))
    hosts = {split_endpoint(e)[0] for e in (config.receivers.otlp.protocols.grpc.endpoint,
                                            config.receivers.otlp.protocols.http.endpoint,
                                            config.exporters.prometheus.endpoint)}
    assert hosts == {"0.0.0.0"}
    assert config.exporters.store.path.startswith("/var/lib/otel-llm")  # the directory the user owns
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text(encoding="utf-8"))
    for name in ("otel-llm-1", "otel-llm-2"):
        assert all(str(p).startswith("127.0.0.1:") for p in compose["services"][name]["ports"]), name
