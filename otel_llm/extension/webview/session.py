"""Browser sessions for the web view when ``exporters.prometheus.auth`` is set: ``POST /login`` with
the bearer token gives an HttpOnly, SameSite=Strict cookie holding a random session id (never the
token); the id is kept in memory (bounded, with a lifetime), so a restart or ``/logout`` ends it."""

from __future__ import annotations

import hashlib
import secrets
import threading
import time
from collections import OrderedDict
from http.cookies import CookieError, SimpleCookie

COOKIE = "otel_llm_session"
MAX_SESSIONS = 10_000


class Sessions:
    def __init__(self, ttl_s: float) -> None:
        self.ttl_s = ttl_s
        self._sessions: OrderedDict[str, float] = OrderedDict()  # sha256(id) -> expiry (monotonic)
        self._lock = threading.Lock()

    @staticmethod
    def _key(session_id: str) -> str:
        return hashlib.sha256(session_id.encode()).hexdigest()

    def create(self) -> str:
        session_id = secrets.token_urlsafe(32)
        with self._lock:
            self._sessions[self._key(session_id)] = time.monotonic() + self.ttl_s
            while len(self._sessions) > MAX_SESSIONS:
                self._sessions.popitem(last=False)
        return session_id

    def valid(self, session_id: str | None) -> bool:
        if not session_id or len(session_id) > 128:
            return False
        key = self._key(session_id)
        with self._lock:
            expiry = self._sessions.get(key)
            if expiry is None:
                return False
            if expiry < time.monotonic():
                del self._sessions[key]
                return False
            return True

    def end(self, session_id: str | None) -> None:
        if session_id:
            with self._lock:
                self._sessions.pop(self._key(session_id), None)

    def set_cookie(self, session_id: str) -> str:
        return f"{COOKIE}={session_id}; Path=/; HttpOnly; SameSite=Strict; Max-Age={int(self.ttl_s)}"

    @staticmethod
    def clear_cookie() -> str:
        return f"{COOKIE}=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0"


def session_from(cookie_header: str | None) -> str | None:
    if not cookie_header:
        return None
    try:
        cookie = SimpleCookie(cookie_header)
    except CookieError:
        return None
    morsel = cookie.get(COOKIE)
    return morsel.value if morsel is not None else None


class LoginThrottle:
    """Failed logins per client address: past ``max_failures`` within ``window_s`` that address is
    refused (429, ``Retry-After``) until its oldest failure leaves the window; over every address
    together, ``max_failures * 10`` (one host can have many addresses). Bounded: at most
    ``MAX_SESSIONS`` addresses are remembered, the oldest forgotten first."""

    def __init__(self, max_failures: int = 10, window_s: float = 60.0) -> None:
        self.max_failures = max_failures
        self.window_s = window_s
        self._failures: OrderedDict[str, list[float]] = OrderedDict()
        self._all: list[float] = []
        self._lock = threading.Lock()

    def _recent(self, times: list[float], now: float) -> list[float]:
        cutoff = now - self.window_s
        return [t for t in times if t > cutoff]

    def retry_after(self, address: str) -> float:
        """Seconds until ``address`` may try again; 0 when it may now."""
        now = time.monotonic()
        with self._lock:
            self._all = self._recent(self._all, now)
            mine = self._failures[address] = self._recent(self._failures.get(address, []), now) \
                if address in self._failures else []
            if not mine:
                del self._failures[address]
            waits = []
            if len(mine) >= self.max_failures:
                waits.append(mine[0] + self.window_s - now)
            if len(self._all) >= self.max_failures * 10:
                waits.append(self._all[0] + self.window_s - now)
            return max(waits, default=0.0)

    def failed(self, address: str) -> None:
        now = time.monotonic()
        with self._lock:
            times = self._failures.pop(address, [])
            times.append(now)
            self._failures[address] = times[-self.max_failures:]
            self._all.append(now)
            del self._all[:-self.max_failures * 10]
            while len(self._failures) > MAX_SESSIONS:
                self._failures.popitem(last=False)
