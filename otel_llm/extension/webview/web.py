"""The web view's HTTP side: its own listener's handler (``extension.py``) delegates ``/``,
``/ui/...``, ``/login``, ``/logout``, ``/static/...`` and ``/api/ui/...`` to ``WebView.handle``.

Read-only. Every response carries a strict Content-Security-Policy (no inline script or style:
the pages are static files, the data comes as JSON and is put into the page with ``textContent``).
"""

from __future__ import annotations

import json
import logging
import math
import re
import threading
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from prometheus_client import CollectorRegistry

from otel_llm.extension.webview.config import WebViewConfig, trace_links
from otel_llm.extension.webview.history import History
from otel_llm.extension.webview.overview import overview
from otel_llm.extension.webview.session import LoginThrottle, Sessions, session_from
from otel_llm.extension.webview.status import components_of, effective_config, self_telemetry
from otel_llm.internal.telemetry import TelemetryFamily

STATIC = Path(__file__).parent / "static"
_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
          ".css": "text/css; charset=utf-8", ".svg": "image/svg+xml"}
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                               "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; "
                               "frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Resource-Policy": "same-origin",
}
_PAGES = {"/": "overview", "/ui/overview": "overview", "/ui/requests": "requests", "/ui/status": "status"}
_TRACE_PAGE = re.compile(r"^/ui/trace/([0-9a-fA-F]{1,32})$")
_TRACE_API = re.compile(r"^/api/ui/trace/([0-9a-fA-F]{1,32})$")
_FILTER_COLUMNS = {"model": "model", "engine": "engine_kind", "outcome": "outcome", "policy": "policy",
                   "service": "service_name"}
_MAX_LOGIN_BODY = 4096
log = logging.getLogger(__name__)


class Handler(Protocol):  # what the listener's request handler gives us
    headers: Any
    rfile: Any
    command: str
    client_address: Any

    def send_body(self, status: int, body: bytes, content_type: str,
                  headers: dict[str, str] | None = None) -> None: ...

    def body_read(self) -> None: ...


WEBVIEW_LOGIN_FAILURES = TelemetryFamily(
    "otel_llm_webview_login_failures", "counter", "Refused logins to the web view: wrong_token, throttled (too many "
    "failures from one address, or from all, within a minute), malformed.", ("reason",), "extensions.webview",
    "Counted only with `extensions.webview.auth`.")


class WebView:
    def __init__(self, settings: WebViewConfig, registry: CollectorRegistry, store: Any, token: Any,
                 config: Any = None, service: Any = None) -> None:
        """``store``: a ``StoreReader`` or None; ``token``: the endpoint's ``TokenCheck``;
        ``service``: the running ``Service`` (for the status page's components), optional."""
        self.settings = settings
        self.registry = registry
        self.store = store
        self.token = token
        self.config = config
        self.service = service
        self.history = History(registry, settings.snapshot_interval, settings.history)
        self.sessions = Sessions(settings.session_ttl)
        self.throttle = LoginThrottle()
        self.login_failures = WEBVIEW_LOGIN_FAILURES.counter(registry)
        self._static = {p.name: p.read_bytes() for p in STATIC.iterdir() if p.suffix in _TYPES}
        self._filters_cache: tuple[float, dict[str, list[str]]] | None = None
        # The overview per window, computed once for every open tab within half a refresh interval
        # (one at a time): its cost (a snapshot of the registry, the groups' quantiles) is per
        # interval, not per tab, and never more than one core's worth beside the scrape.
        self._overview_cache: dict[str, tuple[float, bytes]] = {}
        self._overview_lock = threading.Lock()

    # --- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        self.history.record()
        self.history.start()

    def stop(self) -> None:
        self.history.stop()

    # --- routing ---------------------------------------------------------------------------

    @staticmethod
    def handles(path: str) -> bool:
        return (path in _PAGES or path in ("/login", "/logout") or path.startswith("/ui/")
                or path.startswith("/static/") or path.startswith("/api/ui/"))

    def handle(self, handler: Handler, method: str, raw_path: str) -> None:
        parsed = urllib.parse.urlsplit(raw_path)
        path = parsed.path
        try:
            if method == "POST":
                if path == "/login":
                    self._login(handler)
                elif path == "/logout":
                    self._logout(handler)
                else:
                    self._send(handler, 405, b"read-only\n", "text/plain", {"Allow": "GET, HEAD"})
                return
            if path.startswith("/static/"):
                self._static_file(handler, path.removeprefix("/static/"))
            elif path == "/login":
                if not self.token.enabled or self._authorized(handler):
                    self._redirect(handler, "/")
                else:
                    self._login_page(handler, 200, "")
            elif path == "/logout":
                self._send(handler, 405, b"POST /logout\n", "text/plain", {"Allow": "POST"})
            elif not self._authorized(handler):
                if path.startswith("/api/ui/"):
                    self._json(handler, 401, {"error": "missing or wrong bearer token; log in at /login"},
                               {"WWW-Authenticate": "Bearer"})
                else:
                    self._redirect(handler, "/login")
            elif path.startswith("/api/ui/"):
                self._api(handler, path, urllib.parse.parse_qs(parsed.query))
            elif path in _PAGES or _TRACE_PAGE.match(path):
                self._send(handler, 200, self._static["index.html"], _TYPES[".html"])
            else:
                self._send(handler, 404, b"not found\n", "text/plain")
        except BrokenPipeError:
            pass

    # --- auth ------------------------------------------------------------------------------

    def _authorized(self, handler: Handler) -> bool:
        if not self.token.enabled:
            return True
        header = handler.headers.get("Authorization")
        if header and self.token.allows(header):
            return True
        return self.sessions.valid(session_from(handler.headers.get("Cookie")))

    def _login(self, handler: Handler) -> None:
        if not self.token.enabled:
            self._redirect(handler, "/")
            return
        try:
            length = int(handler.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if not 0 <= length <= _MAX_LOGIN_BODY:
            self.login_failures.labels("malformed").inc()
            self._login_page(handler, 413 if length > _MAX_LOGIN_BODY else 400, "The request is not a login form.")
            return
        body = handler.rfile.read(length).decode("utf-8", "replace") if length else ""
        handler.body_read()  # the read deadline ends with the body
        address = str(handler.client_address[0]) if handler.client_address else ""
        wait = self.throttle.retry_after(address)
        if wait > 0:
            self.login_failures.labels("throttled").inc()
            self._login_page(handler, 429, "Too many failed logins; try again later.",
                             {"Retry-After": str(max(1, round(wait)))})
            return
        token = (urllib.parse.parse_qs(body).get("token") or [""])[-1].strip()
        if token and self.token.allows(f"Bearer {token}"):
            session = self.sessions.create()
            self._send(handler, 303, b"", "text/plain", {"Location": "/", "Set-Cookie": self.sessions.set_cookie(session)})
        else:
            self.throttle.failed(address)
            self.login_failures.labels("wrong_token").inc()
            log.warning("web view: failed login from %s", address or "an unknown address")
            self._login_page(handler, 401, "Wrong token.")

    def _logout(self, handler: Handler) -> None:
        self.sessions.end(session_from(handler.headers.get("Cookie")))
        self._send(handler, 303, b"", "text/plain",
                   {"Location": "/login" if self.token.enabled else "/", "Set-Cookie": self.sessions.clear_cookie()})

    def _login_page(self, handler: Handler, status: int, message: str,
                    headers: dict[str, str] | None = None) -> None:
        # ``message`` is one of our own fixed sentences, never request data.
        page = self._static["login.html"].replace(b"<!--message-->", message.encode())
        self._send(handler, status, page, _TYPES[".html"], headers)

    # --- responses -------------------------------------------------------------------------

    def not_found(self, handler: Handler, headers: dict[str, str] | None = None) -> None:
        self._send(handler, 404, b"not found; the web view is at /\n", "text/plain", headers)

    def _send(self, handler: Handler, status: int, body: bytes, content_type: str,
              headers: dict[str, str] | None = None, cache: bool = False) -> None:
        all_headers = dict(SECURITY_HEADERS)
        all_headers["Cache-Control"] = "max-age=60" if cache else "no-store"
        all_headers.update(headers or {})
        handler.send_body(status, body, content_type, all_headers)

    def _json(self, handler: Handler, status: int, payload: Any, headers: dict[str, str] | None = None) -> None:
        self._send(handler, status, self._encode(payload), "application/json", headers)

    @staticmethod
    def _encode(payload: Any) -> bytes:
        return json.dumps(_clean(payload), default=_json_default, allow_nan=False).encode()

    def _redirect(self, handler: Handler, location: str) -> None:
        self._send(handler, 303, b"", "text/plain", {"Location": location})

    def _static_file(self, handler: Handler, name: str) -> None:
        body = self._static.get(name)
        if body is None or name == "login.html":
            self._send(handler, 404, b"not found\n", "text/plain")
            return
        self._send(handler, 200, body, _TYPES[Path(name).suffix], cache=True)

    # --- JSON API --------------------------------------------------------------------------

    def _api(self, handler: Handler, path: str, query: dict[str, list[str]]) -> None:
        def arg(name: str) -> str | None:
            values = query.get(name)
            return values[-1] if values else None
        try:
            if path == "/api/ui/meta":
                self._json(handler, 200, {"refresh_interval": self.settings.refresh_interval,
                                          "auth": bool(self.token.enabled), "store": self.store is not None})
            elif path == "/api/ui/overview":
                self._send(handler, 200, self.overview_body(arg("window") or "5m"), "application/json")
            elif path == "/api/ui/status":
                self._json(handler, 200, self.status())
            elif self.store is None:
                self._json(handler, 404, {"error": "the trace store is disabled (exporters.store)"})
            elif path == "/api/ui/requests":
                self._json(handler, 200, self.requests(arg))
            elif path == "/api/ui/filters":
                self._json(handler, 200, self.filters())
            elif (match := _TRACE_API.match(path)) is not None:
                trace = self.trace(match.group(1).rjust(32, "0"))
                if trace is None:
                    self._json(handler, 404, {"error": "this trace is not in the store"})
                else:
                    self._json(handler, 200, trace)
            else:
                self._json(handler, 404, {"error": "unknown web view API"})
        except ValueError as exc:
            self._json(handler, 400, {"error": str(exc)})
        except (FileNotFoundError, _store_error()) as exc:
            self._json(handler, 503, {"error": str(exc)})

    def overview_body(self, window: str) -> bytes:
        """The overview's JSON, encoded once per window and half refresh interval for every tab."""
        ttl = self.settings.refresh_interval / 2
        with self._overview_lock:
            cached = self._overview_cache.get(window)
            if cached is not None and time.monotonic() - cached[0] < ttl:
                return cached[1]
            body = self._encode(overview(self.history, self.config, window))
            self._overview_cache[window] = (time.monotonic(), body)
            return body

    def requests(self, arg: Callable[[str], str | None]) -> dict[str, Any]:
        try:
            limit = int(arg("limit") or 50)
            offset = int(arg("offset") or 0)
            since_arg, until_arg = arg("since"), arg("until")
            since = int(since_arg) if since_arg else None
            until = int(until_arg) if until_arg else None
        except ValueError:
            raise ValueError("limit, offset, since and until are integers (since/until: Unix ns)") from None
        if not 1 <= limit <= 500 or not 0 <= offset <= 1_000_000:
            raise ValueError("limit is 1 to 500, offset 0 to 1000000")
        order = arg("order") or "desc"
        if order not in ("asc", "desc"):
            raise ValueError("order is asc or desc")
        sort = arg("sort") or "start"
        if until is None:
            from otel_llm.exporter.store.sqlite import FUTURE_SKEW_NS

            until = time.time_ns() + FUTURE_SKEW_NS  # a start time far ahead (a bad clock) must not pin the list
        rows = self.store.list_requests(
            model=arg("model"), engine=arg("engine"), outcome=arg("outcome"), policy=arg("policy"),
            service=arg("service"), sort=sort, limit=limit + 1, offset=offset, ascending=order == "asc",
            since_unix_ns=since, until_unix_ns=until)
        return {"rows": rows[:limit], "offset": offset, "limit": limit, "has_more": len(rows) > limit,
                "sort": sort, "order": order}

    def filters(self) -> dict[str, list[str]]:
        now = time.monotonic()
        if self._filters_cache is not None and now - self._filters_cache[0] < 5.0:
            return self._filters_cache[1]
        values = {name: self.store.distinct(column) for name, column in _FILTER_COLUMNS.items()}
        self._filters_cache = (now, values)
        return values

    def trace(self, trace_id: str) -> dict[str, Any] | None:
        trace = self.store.get_trace(trace_id)
        if trace is None:
            return None
        spans = trace["spans"]
        ids = {s["span_id"] for s in spans}
        children: dict[str | None, list[dict[str, Any]]] = {}
        for span in spans:
            parent = span.get("parent_span_id") or None
            children.setdefault(parent if parent in ids else None, []).append(span)
        ordered: list[dict[str, Any]] = []
        seen: set[str] = set()
        # Depth first, parents before their children, with a stack of its own: a chain of
        # thousands of spans is as deep as it is long (recursion ended in RecursionError at ~1 000).
        stack: list[tuple[dict[str, Any], int]] = [(span, 0) for span in reversed(children.get(None, []))]
        while stack:
            span, depth = stack.pop()
            if span["span_id"] in seen:
                continue
            seen.add(span["span_id"])
            ordered.append({**span, "depth": depth, "segment": (span.get("attributes") or {}).get("otel_llm.segment")})
            stack.extend((child, depth + 1) for child in reversed(children.get(span["span_id"], [])))
        for span in spans:  # cycles: shown flat rather than lost
            if span["span_id"] not in seen:
                ordered.append({**span, "depth": 0, "segment": (span.get("attributes") or {}).get("otel_llm.segment")})
        starts = [s["start_time_unix_nano"] for s in spans if s.get("start_time_unix_nano")]
        ends = [s["end_time_unix_nano"] for s in spans if s.get("end_time_unix_nano")]
        policies = sorted({str(s["attributes"].get("otel_llm.sampling.policy")) for s in spans
                           if isinstance(s.get("attributes"), dict) and "otel_llm.sampling.policy" in s["attributes"]})
        return {**trace, "spans": ordered, "start_unix_nano": min(starts) if starts else 0,
                "end_unix_nano": max(ends) if ends else 0, "policies": policies,
                "links": trace_links(self.settings, trace["trace_id"])}

    def status(self) -> dict[str, Any]:
        store: dict[str, Any] | None = None
        store_config = getattr(getattr(self.config, "exporters", None), "store", None)
        if self.store is not None:
            try:
                store = self.store.stats()
            except (FileNotFoundError, _store_error()) as exc:
                store = {"error": str(exc)}
            if store_config is not None:
                store.update({"retention_seconds": store_config.retention,
                              "max_size_bytes": store_config.max_size_mib * 1024 * 1024})
        from otel_llm.config import Config, exposed_without_token

        exposed = exposed_without_token(self.config) if isinstance(self.config, Config) else []
        return {"components": components_of(self.service), "telemetry": self_telemetry(self.registry),
                "exposed_without_token": exposed,
                "store": store, "config": effective_config(self.config), "started": self.history.started}


def _store_error() -> type[Exception]:
    from otel_llm.exporter.store.sqlite import StoreError

    return StoreError


def _clean(value: Any) -> Any:
    """JSON has no NaN or infinities: they become strings (span attributes may hold them)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def _json_default(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    if isinstance(value, bytes):
        return value.hex()
    return str(value)
