"""``otel-llm validate --explain``: why numbers are missing, read from a running instance's own counters.

Every counter that means "a request, span or value was not measured" is read from ``/metrics`` and
ranked by how much it lost (spans or requests, since the start); the first few are printed, each with
the anchor of its section in ``docs/troubleshooting.md``. The reason anchors are the ones
``tools/gen_docs.py`` writes on that page (``reason_anchor``, one definition for both).
"""

from __future__ import annotations

import http.client
import socket
import threading
import urllib.parse
from collections import defaultdict
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

TROUBLESHOOTING = "docs/troubleshooting.md"
# The counters whose reasons have a row each on the troubleshooting page.
REASON_COUNTERS = ("otel_llm_spans_malformed_total", "otel_llm_values_rejected_total",
                   "otel_llm_service_unmeasured_total", "otel_llm_spans_dropped_total",
                   "otel_llm_receiver_refused_requests_total", "otel_llm_receiver_refused_spans_total")


def reason_anchor(counter: str, reason: str) -> str:
    """The troubleshooting page's anchor of one reason of ``counter``."""
    return f"{counter.removeprefix('otel_llm_').removesuffix('_total')}-{reason}".replace("_", "-")


@dataclass(frozen=True)
class Finding:
    count: float  # spans, requests or values lost, since the instance started
    what: str
    hint: str
    anchor: str

    @property
    def link(self) -> str:
        return f"{TROUBLESHOOTING}#{self.anchor}"


Samples = dict[str, list[tuple[dict[str, str], float]]]


def parse(exposition: str) -> Samples:
    samples: Samples = defaultdict(list)
    for family in text_string_to_metric_families(exposition):
        for sample in family.samples:
            samples[sample.name].append((dict(sample.labels), float(sample.value)))
    return samples


def _total(samples: Samples, name: str, **labels: str) -> float:
    return sum(value for found, value in samples.get(name, []) if all(found.get(k) == v for k, v in labels.items()))


def _by_reason(samples: Samples, name: str) -> dict[str, float]:
    out: dict[str, float] = defaultdict(float)
    for labels, value in samples.get(name, []):
        out[labels.get("reason", "")] += value
    return out


# An OTLP gRPC exporter treats any scheme but http:// as TLS (opentelemetry-exporter-otlp-proto-grpc
# exporter.py: insecure = scheme == "http" unless OTEL_EXPORTER_OTLP[_TRACES]_INSECURE says otherwise): its
# handshake with a plaintext receiver fails, and only the sender's log shows it.
NO_SPANS_HINT = ("is the engine exporting (--otlp-traces-endpoint), to this host and port, on a non-loopback "
                 "listener? A gRPC exporter given grpc:// or https:// (any scheme but http://) speaks TLS, which a "
                 "plaintext receiver never answers, and only the sender's log says so: set "
                 "OTEL_EXPORTER_OTLP_TRACES_INSECURE=true on the sender, or give it http://")

_HINTS = {
    "otel_llm_spans_malformed_total": "engine spans with unusable values: passed through, not measured",
    "otel_llm_values_rejected_total": "durations read at assembly that failed validation: the request is counted without them",
    "otel_llm_service_unmeasured_total": "an interval derived across two clocks came out negative: that interval is not observed",
    "otel_llm_spans_dropped_total": "spans accepted, then lost",
    "otel_llm_receiver_refused_requests_total": "export requests refused at the door",
    "otel_llm_receiver_refused_spans_total": "spans refused at the door",
}


def diagnose(exposition: str) -> list[Finding]:
    """Every reason numbers may be missing, the largest loss first."""
    samples = parse(exposition)
    accepted = _total(samples, "otel_llm_receiver_accepted_spans_total")
    refused = _total(samples, "otel_llm_receiver_refused_spans_total") + \
        _total(samples, "otel_llm_receiver_refused_requests_total")
    findings: list[Finding] = []
    if accepted == 0 and refused == 0:
        # Nothing else can be wrong yet: this one goes first whatever the counts.
        findings.append(Finding(float("inf"), "no spans have arrived at all", NO_SPANS_HINT, "no-spans"))
    matched = _total(samples, "otel_llm_spans_matched_total")
    passed = _total(samples, "otel_llm_spans_passed_through_total")
    if accepted > 0 and matched == 0 and passed > 0:
        findings.append(Finding(passed, f"{passed:.0f} spans arrived and none came from an engine",
                                "no engine adapter recognised them: is the engine's own tracing on?", "unmatched-spans"))
    for counter in REASON_COUNTERS:
        for reason, count in _by_reason(samples, counter).items():
            if count > 0:
                unit = "requests" if "requests" in counter else "values" if "values" in counter else "spans"
                if counter == "otel_llm_service_unmeasured_total":
                    if not reason.startswith("not_measurable_"):
                        continue  # its malformed reasons are otel_llm_spans_malformed_total's, counted there
                    unit = "requests"
                findings.append(Finding(count, f"{count:.0f} {unit}: {counter}{{reason=\"{reason}\"}}",
                                        _HINTS[counter], reason_anchor(counter, reason)))
    unlabelled = _total(samples, "vllm:request_success_total", model_name="")
    if "vllm:request_success_total" not in samples:  # the vllm naming off: the gen_ai one says the same
        unlabelled = _total(samples, "gen_ai_server_request_duration_seconds_count", gen_ai_request_model="")
    if unlabelled > 0:
        findings.append(Finding(unlabelled, f"{unlabelled:.0f} requests with an empty model label",
                                "the spans name no model: start vLLM with OTEL_SERVICE_NAME=<served model name>, "
                                "or map service names with model_name.from_resource", "empty-model-label"))
    late = _total(samples, "otel_llm_late_spans_total")
    if late > 0:
        findings.append(Finding(late, f"{late:.0f} spans arrived after their trace was decided",
                                "late spans are not measured: raise tail_sampling.decision_wait above the longest "
                                "export delay", "late-spans"))
    overflow = _total(samples, "otel_llm_series_overflow_total")
    if overflow > 0:
        findings.append(Finding(overflow, f"{overflow:.0f} observations went to an overflow series",
                                "a label has too many values (series_limit)", "series-overflow"))
    findings.sort(key=lambda f: -f.count)
    return findings


def render(findings: list[Finding], top: int = 3) -> str:
    if not findings:
        return "nothing refused, malformed, rejected, unlabelled, late or dropped: no reason found for missing numbers\n"
    lines = [f"the {min(top, len(findings))} most likely reasons numbers are missing (of {len(findings)} found):"]
    for i, finding in enumerate(findings[:top], 1):
        lines += [f"{i}. {finding.what}", f"   {finding.hint}", f"   see {finding.link}"]
    return "\n".join(lines) + "\n"


# What ``fetch`` reads at most: an exposition larger than this is not an otel-llm's (its label values
# are bounded); reading one whole held 2.6 GB for a 512 MiB answer (issue 50).
MAX_EXPOSITION_BYTES = 64 << 20


class FetchError(OSError):
    """The answer was refused: too large, or not complete within the deadline (the message says which)."""


def fetch(url: str, deadline_s: float, max_bytes: int = MAX_EXPOSITION_BYTES) -> str:
    """``url``'s ``/metrics``, read whole within ``deadline_s`` in all (connecting included, however
    slowly the bytes come: a socket timeout alone bounds each read, not their sum) and at most
    ``max_bytes`` of body. Raises ``OSError`` (``FetchError`` for the two bounds, saying which)."""
    parts = urllib.parse.urlsplit(url.rstrip("/") + "/metrics")
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise FetchError(f"not an http:// or https:// URL: {url}")
    connection_class = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    connection = connection_class(parts.hostname, parts.port, timeout=deadline_s)
    expired = threading.Event()
    # The socket, held here: a response that ends with the connection takes it over from
    # ``connection`` (whose ``sock`` is then None) until it is read.
    opened: list[socket.socket] = []

    def cut() -> None:  # at the deadline: every read in progress or to come ends at once
        expired.set()
        for sock in opened:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    watchdog = threading.Timer(deadline_s, cut)
    watchdog.daemon = True
    watchdog.start()
    try:
        connection.connect()
        assert connection.sock is not None
        opened.append(connection.sock)
        if expired.is_set():
            raise TimeoutError
        connection.request("GET", parts.path + (f"?{parts.query}" if parts.query else ""),
                           headers={"Accept": "text/plain"})
        response = connection.getresponse()
        if response.status != 200:
            raise FetchError(f"HTTP {response.status} {response.reason}")
        declared = response.getheader("Content-Length", "")
        if declared.isdigit() and int(declared) > max_bytes:
            raise FetchError(f"the answer is {int(declared)} bytes, more than the {max_bytes >> 20} MiB read at most")
        chunks: list[bytes] = []
        size = 0
        while chunk := response.read1(1 << 16):
            size += len(chunk)
            if size > max_bytes:
                raise FetchError(f"the answer is larger than the {max_bytes >> 20} MiB read at most")
            chunks.append(chunk)
        if expired.is_set():
            raise TimeoutError
        return b"".join(chunks).decode("utf-8", "replace")
    except (OSError, http.client.HTTPException) as exc:
        if expired.is_set() or isinstance(exc, TimeoutError):
            raise FetchError(f"no complete answer within {deadline_s:g}s (--timeout)") from None
        if isinstance(exc, OSError):
            raise
        raise FetchError(f"not an HTTP answer: {exc!r}") from None
    finally:
        watchdog.cancel()
        connection.close()
