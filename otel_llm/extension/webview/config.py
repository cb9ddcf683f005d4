"""``extensions.webview``: the built-in web view's options (see README.md here)."""

from __future__ import annotations

import json
import urllib.parse
from dataclasses import dataclass
from typing import ClassVar

from otel_llm.confmap import ConfigError, Duration, Endpoint, PositiveInt
from otel_llm.configtls import BearerAuth, check_server_security


@dataclass(frozen=True)
class WebViewConfig:
    # Its own listener, off the scrape path: a slow or expensive page never delays /metrics.
    endpoint: Endpoint = "127.0.0.1:9465"
    auth: BearerAuth | None = None  # required on every page and /api/ui/* (or a login cookie)
    max_connections: PositiveInt = 64  # a thread each; at the cap the longest-waiting idle one is evicted
    read_header_timeout: Duration = 10.0
    read_timeout: Duration = 30.0
    snapshot_interval: Duration = 10.0  # between snapshots of the histograms: the windows' and charts' resolution
    history: Duration = 3600.0  # how long snapshots are kept: the longest window and chart
    refresh_interval: Duration = 5.0  # how often the open page fetches fresh data
    session_ttl: Duration = 43200.0  # a login cookie's lifetime (only with exporters.prometheus.auth)
    jaeger_url: str = ""  # e.g. http://jaeger:16686 -> {jaeger_url}/trace/{trace_id}
    tempo_url: str = ""  # e.g. http://tempo:3200 -> {tempo_url}/api/v2/traces/{trace_id}
    grafana_url: str = ""  # e.g. http://grafana:3000 -> Explore on the grafana_datasource data source
    grafana_datasource: str = "tempo"  # the uid of Grafana's Tempo data source (only with grafana_url)

    BOUNDS: ClassVar[dict[str, tuple[float, float]]] = {
        "snapshot_interval": (0.1, 3600.0),
        "history": (1.0, 7 * 86400.0),
        "refresh_interval": (0.5, 3600.0),
        "session_ttl": (60.0, 30 * 86400.0),
        "max_connections": (1, 10_000),
    }
    MAX_SNAPSHOTS: ClassVar[int] = 100_000

    def validate(self, path: str) -> None:
        check_server_security(path, None, self.auth)
        for message in problems(self, path):
            raise ConfigError(*message)

    def listen_endpoints(self, path: str) -> list[tuple[str, str]]:
        return [(f"{path}.endpoint", self.endpoint)]


def problems(web: WebViewConfig, path: str) -> list[tuple[str, str]]:
    """What is wrong with the block, as (path, message); empty when it is valid."""
    out: list[tuple[str, str]] = []
    for key, (low, high) in WebViewConfig.BOUNDS.items():  # also checked as the YAML loads
        if key == "max_connections":
            continue
        value = getattr(web, key)
        if not low <= value <= high:
            out.append((f"{path}.{key}", f"must be between {low:g}s and {high:g}s, got {value:g}s"))
    for key in ("read_header_timeout", "read_timeout"):  # 0 would cut every request, .inf is no deadline
        seconds = getattr(web, key)
        if not 0.001 <= seconds <= 86_400:
            out.append((f"{path}.{key}", f"must be between 1ms and 24h, got {seconds!r}"))
    if not out and web.read_header_timeout > web.read_timeout:
        out.append((f"{path}.read_header_timeout", "must not exceed read_timeout"))
    if not out and web.history < web.snapshot_interval:
        out.append((f"{path}.history", "must be at least snapshot_interval"))
    elif not out and web.history / web.snapshot_interval > WebViewConfig.MAX_SNAPSHOTS:
        out.append((f"{path}.history", f"at most {WebViewConfig.MAX_SNAPSHOTS} snapshots are kept: history / "
                                       f"snapshot_interval is {web.history / web.snapshot_interval:.0f}"))
    for key in ("jaeger_url", "tempo_url", "grafana_url"):
        value = getattr(web, key)
        if value:
            problem = link_template_ok(value)
            if problem:
                out.append((f"{path}.{key}", problem))
    if not web.grafana_datasource.strip():
        out.append((f"{path}.grafana_datasource", "must not be empty"))
    return out


def link_template_ok(url: str) -> str | None:
    """None when ``url`` is an http(s) URL (``{trace_id}`` its only placeholder), else why not."""
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        return f"must be an http:// or https:// URL, got {url!r}"
    if any(c in url for c in "\"'<>` \t\r\n\\"):
        return f"must not contain quotes, angle brackets, backslashes or whitespace, got {url!r}"
    rest = url.replace("{trace_id}", "")
    if "{" in rest or "}" in rest:
        return f"the only placeholder is {{trace_id}}, got {url!r}"
    return None


def trace_links(web: WebViewConfig, trace_id: str) -> list[dict[str, str]]:
    """Links to the configured trace backends; a URL with ``{trace_id}`` is used as a template."""
    out = []
    defaults = (("Jaeger", web.jaeger_url, "/trace/{trace_id}"),
                ("Tempo", web.tempo_url, "/api/v2/traces/{trace_id}"),
                ("Grafana", web.grafana_url, None))
    for name, base, suffix in defaults:
        if not base:
            continue
        if "{trace_id}" in base:
            url = base.replace("{trace_id}", trace_id)
        elif suffix is not None:
            url = base.rstrip("/") + suffix.replace("{trace_id}", trace_id)
        else:
            left = {"datasource": web.grafana_datasource, "range": {"from": "now-24h", "to": "now"},
                    "queries": [{"refId": "A", "datasource": {"type": "tempo", "uid": web.grafana_datasource},
                                 "queryType": "traceql", "query": trace_id}]}
            url = base.rstrip("/") + "/explore?left=" + urllib.parse.quote(json.dumps(left, separators=(",", ":")))
        out.append({"name": name, "url": url})
    return out
