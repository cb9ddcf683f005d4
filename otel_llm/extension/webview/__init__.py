"""The built-in web view served on the metrics port (issue 16): overview, requests, trace, status.
See README.md here."""

from otel_llm.extension.webview.config import WebViewConfig
from otel_llm.extension.webview.web import WebView

__all__ = ["WebView", "WebViewConfig"]
