"""Bearer-token checks and TLS contexts shared by both receivers and the metrics endpoint."""

from __future__ import annotations

import hmac
import ssl

from otel_llm.configtls import BearerAuth, ServerTls


class TokenCheck:
    """Constant-time comparison of an ``Authorization`` header against the configured token."""

    def __init__(self, auth: BearerAuth | None) -> None:
        self._expected = auth.token().strip().encode() if auth is not None else None

    @property
    def enabled(self) -> bool:
        return self._expected is not None

    def allows(self, header: str | None) -> bool:
        """``Bearer <token>``; the scheme is case-insensitive (RFC 9110 §11.1), the token is not."""
        if self._expected is None:
            return True
        if not header:
            return False
        scheme, _, credentials = header.strip().partition(" ")
        if scheme.lower() != "bearer":
            return False
        return hmac.compare_digest(credentials.strip().encode(), self._expected)


def server_ssl_context(tls: ServerTls) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(tls.cert_file, tls.key_file)
    if tls.client_ca_file:
        context.load_verify_locations(tls.client_ca_file)
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def read_bytes(path: str) -> bytes:
    with open(path, "rb") as file:
        return file.read()
