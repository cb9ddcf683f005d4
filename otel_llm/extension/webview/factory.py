"""``extensions.webview``: the built-in web view and its JSON API on a listener of its own (the
Collector's zpages shape). In the defaults: a config without an ``extensions`` section runs it on
loopback; ``service.extensions: []`` (or an ``extensions`` section without it) turns it off."""

from __future__ import annotations

from otel_llm.component import CreateSettings, Factory, Host, Kind
from otel_llm.extension.webview.config import WebViewConfig
from otel_llm.extension.webview.extension import WebViewServer


class WebViewComponent:
    def __init__(self, name: str, config: WebViewConfig) -> None:
        self.name = name
        self.config = config
        self.server: WebViewServer | None = None

    @property
    def port(self) -> int:
        return self.server.port if self.server is not None else 0

    @property
    def webview(self) -> object:
        return self.server.webview if self.server is not None else None

    def start(self, host: Host) -> None:
        store = host.component("exporters.store")
        self.server = WebViewServer(self.config, host.registry, store.reader() if store is not None else None,
                                    config=host.config, service=host)
        self.server.start()

    def shutdown(self, grace_s: float) -> None:
        if self.server is not None:
            self.server.stop()


def create(config: WebViewConfig, settings: CreateSettings) -> WebViewComponent:
    return WebViewComponent(settings.name, config)


FACTORY = Factory("webview", Kind.EXTENSION, WebViewConfig, create, in_defaults=True)
