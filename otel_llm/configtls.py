"""TLS and bearer-token settings shared by the receivers, the exporters and the metrics endpoint,
with the checks ``validate`` can make of them before anything starts (configtls in the Collector)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from otel_llm.confmap import ConfigError, parse_endpoint


@dataclass(frozen=True)
class ServerTls:
    """TLS for a listener; both files or neither."""

    cert_file: str = ""
    key_file: str = ""
    client_ca_file: str = ""  # when set, clients must present a certificate signed by it (mTLS)


@dataclass(frozen=True)
class BearerAuth:
    """``Authorization: Bearer <token>``; the token inline or, better, from a file."""

    bearer_token: str = ""
    bearer_token_file: str = ""

    def token(self) -> str:
        if self.bearer_token_file:
            return Path(self.bearer_token_file).read_text(encoding="utf-8").strip()
        return self.bearer_token


@dataclass(frozen=True)
class ClientTls:
    insecure: bool = True
    ca_file: str = ""
    cert_file: str = ""
    key_file: str = ""


_HTTP_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_GRPC_KEY = re.compile(r"[0-9a-z_.-]+")


def check_url(url: str, path: str) -> None:
    import urllib.parse

    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError on a port that is not a number in 0-65535
    except ValueError as exc:
        raise ConfigError(path, f"expected http(s)://host[:port][/path], got {url!r}: {exc}") from None
    if not parts.hostname:
        raise ConfigError(path, f"expected http(s)://host[:port][/path], got {url!r}: no host")


def check_grpc_target(endpoint: str, path: str) -> None:
    """An OTLP/gRPC exporter's endpoint: host:port, optionally behind http:// or https://."""
    scheme, sep, rest = endpoint.partition("://")
    if sep and scheme not in ("http", "https"):
        raise ConfigError(path, f"expected host:port or http(s)://host:port, got {endpoint!r}")
    parse_endpoint(rest if sep else endpoint, path)


def check_client_tls(tls: Any, path: str) -> None:
    if bool(tls.cert_file) != bool(tls.key_file):
        raise ConfigError(path, "cert_file and key_file go together (client certificate)")
    for key in ("ca_file", "cert_file", "key_file"):
        file = getattr(tls, key)
        if file and not Path(file).is_file():
            raise ConfigError(f"{path}.{key}", f"no such file: {file}")


def check_headers(headers: dict[str, str], path: str, grpc: bool) -> None:
    """What the transport will send, checked now: a bad name or value fails every export otherwise."""
    for key, value in headers.items():
        if not (_GRPC_KEY.fullmatch(key.lower()) if grpc else _HTTP_TOKEN.fullmatch(key)):
            allowed = "letters, digits, '-', '_' and '.'" if grpc else "an HTTP token (no spaces or separators)"
            raise ConfigError(f"{path}.{key}", f"not a valid header name: {allowed}")
        if grpc and not key.lower().endswith("-bin"):
            bad = next((c for c in value if not 32 <= ord(c) < 127), None)
        else:
            bad = next((c for c in value if (ord(c) < 32 and c != "\t") or ord(c) == 127 or ord(c) > 255), None)
        if bad is not None:
            raise ConfigError(f"{path}.{key}", f"the value contains {bad!r}, which a header cannot carry")


def check_server_security(path: str, tls: ServerTls | None, auth: BearerAuth | None) -> None:
    """A listener's TLS files exist, and its bearer token is set exactly once and readable."""
    if tls is not None:
        if not tls.cert_file or not tls.key_file:
            raise ConfigError(f"{path}.tls", "cert_file and key_file are both required")
        for key in ("cert_file", "key_file", "client_ca_file"):
            file = getattr(tls, key)
            if file and not Path(file).is_file():
                raise ConfigError(f"{path}.tls.{key}", f"no such file: {file}")
    if auth is not None:
        if bool(auth.bearer_token) == bool(auth.bearer_token_file):
            raise ConfigError(f"{path}.auth", "set exactly one of bearer_token or bearer_token_file")
        try:
            token = auth.token()
        except OSError as exc:
            raise ConfigError(f"{path}.auth.bearer_token_file", f"cannot read: {exc.strerror or exc}") from None
        except UnicodeDecodeError:
            raise ConfigError(f"{path}.auth.bearer_token_file", "not UTF-8 text") from None
        if not token.strip():
            raise ConfigError(f"{path}.auth", "the token is empty" if not token else "the token is only whitespace")


def _no_passphrase() -> bytes:
    raise ValueError("the private key is encrypted; otel-llm needs it unencrypted")


def check_certificates(places: list[tuple[str, str, str, str]]) -> None:
    """Load every certificate, key and CA file (``(path, cert_file, key_file, ca_file)``) as the
    listeners and exporters will, so a key that does not match its certificate, or a file that is
    not PEM, is reported with its path before anything starts (``validate``) instead of as a
    listener that cannot start (``serve``)."""
    import ssl

    for path, cert_file, key_file, ca_file in places:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        if cert_file and key_file:
            try:
                context.load_cert_chain(cert_file, key_file, password=_no_passphrase)
            except ssl.SSLError as exc:
                if "KEY_VALUES_MISMATCH" in str(exc) or "key values mismatch" in str(exc):
                    message = f"the private key {key_file} does not match the certificate {cert_file}"
                else:
                    message = f"cannot load the certificate {cert_file} with the key {key_file}: {exc.reason or exc}"
                raise ConfigError(path, message) from None
            except ValueError as exc:
                raise ConfigError(f"{path}.key_file", str(exc)) from None
            except OSError as exc:
                raise ConfigError(path, f"cannot read {cert_file} or {key_file}: {exc.strerror or exc}") from None
        if ca_file:
            key = "client_ca_file" if path.startswith("receivers.") else "ca_file"
            try:
                context.load_verify_locations(cafile=ca_file)
            except (ssl.SSLError, OSError, ValueError) as exc:
                raise ConfigError(f"{path}.{key}", f"cannot load {ca_file} as PEM certificates: "
                                                   f"{getattr(exc, 'reason', None) or exc}") from None
