"""The web view's own listener: every path goes to ``WebView.handle`` (pages, static files,
``/login``, ``/api/ui/...``); nothing here is on the metrics port, so a slow or expensive page
never delays a scrape."""

from __future__ import annotations

import threading
import urllib.parse
from typing import Any, ClassVar

from prometheus_client import CollectorRegistry

from otel_llm.extension.webview.config import WebViewConfig
from otel_llm.extension.webview.web import WebView
from otel_llm.internal.httpserver import BackgroundHTTPServer, ConnectionLimits, QuietHandler, refused_connections
from otel_llm.internal.security import TokenCheck


class _Handler(QuietHandler):
    webview: ClassVar[WebView]

    def do_GET(self) -> None:
        self.body_read()  # no body: the read deadline ends here
        path = urllib.parse.urlsplit(self.path).path
        if self.webview.handles(path):
            self.webview.handle(self, self.command, self.path)
        else:
            self.webview.not_found(self)

    do_HEAD = do_GET

    def do_POST(self) -> None:  # only /login and /logout; the body is read there
        if self.webview.handles(urllib.parse.urlsplit(self.path).path):
            self.webview.handle(self, "POST", self.path)
        else:
            self.close_connection = True  # the body is not read: the connection closes after the answer
            self.webview.not_found(self, {"Connection": "close"})


class WebViewServer:
    def __init__(self, settings: WebViewConfig, registry: CollectorRegistry, store: Any = None,
                 config: Any = None, service: Any = None) -> None:
        self.webview = WebView(settings, registry, store, TokenCheck(settings.auth), config, service)
        handler = type("WebViewHandler", (_Handler,), {"webview": self.webview})
        limits = ConnectionLimits(max_connections=settings.max_connections,
                                  header_timeout_s=settings.read_header_timeout,
                                  request_timeout_s=settings.read_timeout, evict_idle=True,
                                  on_refused=refused_connections(registry, "webview"))
        self._server = BackgroundHTTPServer(settings.endpoint, handler, "webview", limits=limits)
        self.ready = threading.Event()

    @property
    def port(self) -> int:
        return self._server.port

    def start(self) -> None:
        self._server.start()
        self.webview.start()

    def stop(self) -> None:
        self.webview.stop()
        self._server.stop()
