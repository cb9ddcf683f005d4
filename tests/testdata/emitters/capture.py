#!/usr/bin/env python3
"""Capture what REAL third-party LLM emitters send over OTLP/HTTP, as replayable testdata.

Run it in the capture venv (NOT the project's venv; see README.md in this folder):

    /work/capture-venv/bin/python tests/testdata/emitters/capture.py            # all scenarios
    /work/capture-venv/bin/python tests/testdata/emitters/capture.py --only openai_v2_span_only
    /work/capture-venv/bin/python tests/testdata/emitters/capture.py --list

Everything happens on 127.0.0.1:

* a fake OpenAI-compatible upstream (``/v1/chat/completions``, any path ending in
  ``/chat/completions``): non-streaming JSON with ``usage``, SSE streaming with the
  ``stream_options.include_usage`` usage chunk, HTTP 500 / 400 errors. The mode is chosen by a
  ``[call=LABEL]`` tag in the last user message, so it survives any gateway in between. Per request
  it records ``traceparent`` / ``tracestate`` / ``baggage`` as received.
* an OTLP/HTTP capture receiver (POST ``*/v1/traces``, ``*/v1/logs``, ``*/v1/metrics``) that keeps
  each body exactly as received (gzip undone) and answers 200 with an empty Export*ServiceResponse.
* each scenario runs in its own child process (``--child NAME``) so instrumentors and env-driven
  switches never leak from one scenario into the next. The parent attributes every upstream request
  and every OTLP request to the scenario currently running (scenarios run one after another).

Outputs (next to this file unless ``--out``): ``<scenario>.<n>.binpb`` (the n-th OTLP traces request
body, n from 1, in arrival order), ``<scenario>.logs.<n>.binpb`` (OTLP logs requests, when the
emitter sends events as log records), and ``MANIFEST.json``.
"""

from __future__ import annotations

import argparse
import gzip
import http.server
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import zlib
from pathlib import Path

HERE = Path(__file__).resolve().parent

PROMPT_MARKER = "PROMPT-MARKER-7f3a"
COMPLETION_MARKER = "COMPLETION-MARKER-9c1e"
SYSTEM_MARKER = "SYSTEM-MARKER-5b2d"
MARKERS = {"prompt": PROMPT_MARKER, "completion": COMPLETION_MARKER, "system": SYSTEM_MARKER}

REQUEST_MODEL = "gpt-4o-mini"
# The upstream answers with a different (dated) model, so tests can tell request from response model.
RESPONSE_MODEL = "gpt-4o-mini-2024-07-18"
PROMPT_TOKENS = 23
COMPLETION_TOKENS = 7
STREAM_CHUNK_DELAY_S = 0.03
FIRST_CHUNK_DELAY_S = 0.05
NONSTREAM_DELAY_S = 0.05

# Caller (application) trace context sent to the LiteLLM proxy: W3C example ids, one span id per call.
CALLER_TRACE_ID = "0af7651916cd43dd8448eb211c80319c"


def caller_traceparent(n: int) -> str:
    return f"00-{CALLER_TRACE_ID[:-2]}{n:02x}-b7ad6b71692033{n:02x}-01"


def messages_for(label: str) -> list[dict]:
    return [
        {"role": "system", "content": f"You are terse. {SYSTEM_MARKER}"},
        {"role": "user", "content": f"Say hi. {PROMPT_MARKER} [call={label}]"},
    ]


# --------------------------------------------------------------------------------------------------
# shared helpers
# --------------------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def log(*a):
    print("[capture]", *a, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------------------
# parent side: fake upstream + OTLP capture receiver
# --------------------------------------------------------------------------------------------------


class State:
    def __init__(self):
        self.lock = threading.Lock()
        self.scenario: str | None = None
        self.upstream: list[dict] = []
        self.otlp: list[dict] = []


STATE = State()


class Quiet(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):  # noqa: D401 - silence
        pass


class UpstreamHandler(Quiet):
    def do_GET(self):
        # /v1/models and health probes some clients do
        body = json.dumps({"object": "list", "data": [{"id": REQUEST_MODEL, "object": "model"}]}).encode()
        self._send(200, body, "application/json")

    def _send(self, status, body: bytes, ctype: str, extra=None):
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            req = json.loads(raw or b"{}")
        except ValueError:
            req = {}
        msgs = req.get("messages") or []
        last_user = ""
        for m in msgs:
            if m.get("role") == "user":
                c = m.get("content")
                last_user = c if isinstance(c, str) else json.dumps(c)
        m = re.search(r"\[call=([A-Za-z0-9_\-]+)\]", last_user)
        label = m.group(1) if m else "unlabelled"
        stream = bool(req.get("stream"))
        include_usage = bool((req.get("stream_options") or {}).get("include_usage"))
        with STATE.lock:
            seq = sum(1 for r in STATE.upstream if r["scenario"] == STATE.scenario) + 1
            rec = {
                "scenario": STATE.scenario,
                "seq": seq,
                "call": label,
                "method": "POST",
                "path": self.path,
                "traceparent": self.headers.get("traceparent"),
                "tracestate": self.headers.get("tracestate"),
                "baggage": self.headers.get("baggage"),
                "user_agent": self.headers.get("User-Agent"),
                "model": req.get("model"),
                "stream": stream,
                "stream_options_include_usage": include_usage,
                "status": None,
            }
            STATE.upstream.append(rec)
        if not self.path.rstrip("/").endswith("/chat/completions"):
            rec["status"] = 404
            self._send(404, b'{"error":{"message":"not found"}}', "application/json")
            return
        rid = f"chatcmpl-fake-{label}-{seq}"
        if "err500" in label:
            rec["status"] = 500
            body = json.dumps(
                {"error": {"message": "fake upstream internal error", "type": "server_error", "code": None}}
            ).encode()
            self._send(500, body, "application/json")
            return
        if "err400" in label:
            rec["status"] = 400
            body = json.dumps(
                {
                    "error": {
                        "message": "fake upstream: invalid request",
                        "type": "invalid_request_error",
                        "param": "messages",
                        "code": "invalid_value",
                    }
                }
            ).encode()
            self._send(400, body, "application/json")
            return
        rec["status"] = 200
        created = int(time.time())
        usage = {
            "prompt_tokens": PROMPT_TOKENS,
            "completion_tokens": COMPLETION_TOKENS,
            "total_tokens": PROMPT_TOKENS + COMPLETION_TOKENS,
        }
        if not stream:
            time.sleep(NONSTREAM_DELAY_S)
            body = json.dumps(
                {
                    "id": rid,
                    "object": "chat.completion",
                    "created": created,
                    "model": RESPONSE_MODEL,
                    "system_fingerprint": "fp_fake",
                    "service_tier": "default",
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": f"Hi! {COMPLETION_MARKER}"},
                            "logprobs": None,
                            "finish_reason": "stop",
                        }
                    ],
                    "usage": usage,
                }
            ).encode()
            self._send(200, body, "application/json", {"x-request-id": rid})
            return
        # SSE streaming
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.send_header("x-request-id", rid)
        self.end_headers()
        self.close_connection = True

        def chunk(delta, finish=None, usage_=None, choices=True):
            d = {
                "id": rid,
                "object": "chat.completion.chunk",
                "created": created,
                "model": RESPONSE_MODEL,
                "system_fingerprint": "fp_fake",
                "choices": (
                    [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}] if choices else []
                ),
            }
            if include_usage:
                d["usage"] = usage_
            self.wfile.write(b"data: " + json.dumps(d).encode() + b"\n\n")
            self.wfile.flush()

        time.sleep(FIRST_CHUNK_DELAY_S)
        chunk({"role": "assistant", "content": ""})
        for piece in ["Hi", "! ", COMPLETION_MARKER]:
            time.sleep(STREAM_CHUNK_DELAY_S)
            chunk({"content": piece})
        chunk({}, finish="stop")
        if include_usage:
            chunk(None, usage_=usage, choices=False)
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()


class OTLPHandler(Quiet):
    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        enc = (self.headers.get("Content-Encoding") or "").lower()
        body = raw
        if enc == "gzip":
            body = gzip.decompress(raw)
        elif enc == "deflate":
            body = zlib.decompress(raw)
        path = self.path
        signal_ = "traces"
        if path.rstrip("/").endswith("/v1/logs"):
            signal_ = "logs"
        elif path.rstrip("/").endswith("/v1/metrics"):
            signal_ = "metrics"
        with STATE.lock:
            STATE.otlp.append(
                {
                    "scenario": STATE.scenario,
                    "signal": signal_,
                    "path": path,
                    "content_type": self.headers.get("Content-Type"),
                    "content_encoding": enc or None,
                    "user_agent": self.headers.get("User-Agent"),
                    "body": body,
                }
            )
        # an empty Export{Trace,Logs,Metrics}ServiceResponse is zero bytes of protobuf
        self.send_response(200)
        ctype = self.headers.get("Content-Type") or "application/x-protobuf"
        resp = b"{}" if "json" in ctype else b""
        self.send_header("Content-Type", "application/json" if "json" in ctype else "application/x-protobuf")
        self.send_header("Content-Length", str(len(resp)))
        self.end_headers()
        self.wfile.write(resp)


def serve(handler) -> tuple[http.server.ThreadingHTTPServer, int]:
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, srv.server_address[1]


# --------------------------------------------------------------------------------------------------
# scenarios (what each child does); the parent only needs the metadata
# --------------------------------------------------------------------------------------------------

OPENAI_CALLS = ["chat", "stream", "err500", "err400", "connerr"]

SCENARIOS: dict[str, dict] = {
    # a. official OTel openai-v2 instrumentation
    "openai_v2_span_only": {
        "group": "a",
        "packages": ["openai", "opentelemetry-instrumentation-openai-v2", "opentelemetry-util-genai"],
        "env": {"OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": "SPAN_ONLY"},
        "calls": OPENAI_CALLS,
        "content_expected": True,
        "notes": "OpenAIInstrumentor only, no HTTP client instrumentation: nothing propagates a traceparent "
        "to the upstream.",
    },
    "openai_v2_span_and_event": {
        "group": "a",
        "packages": ["openai", "opentelemetry-instrumentation-openai-v2", "opentelemetry-util-genai"],
        "env": {"OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": "SPAN_AND_EVENT"},
        "calls": ["chat", "stream", "err500"],
        "content_expected": True,
        "content_expected_logs": True,
        "notes": "Content on the span AND as an event log record (sent to /v1/logs, see logs files).",
    },
    "openai_v2_event_only": {
        "group": "a",
        "packages": ["openai", "opentelemetry-instrumentation-openai-v2", "opentelemetry-util-genai"],
        "env": {"OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": "EVENT_ONLY"},
        "calls": ["chat"],
        "content_expected": False,  # on the spans; the logs carry it
        "content_expected_logs": True,
        "notes": "Content only in the event log record; the span has none.",
    },
    "openai_v2_content_true": {
        "group": "a",
        "packages": ["openai", "opentelemetry-instrumentation-openai-v2", "opentelemetry-util-genai"],
        "env": {
            "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": "true",
            "OTEL_SEMCONV_STABILITY_OPT_IN": "gen_ai_latest_experimental",
        },
        "calls": ["chat"],
        "content_expected": False,  # observed: "true" is not a valid mode in 2.4b0 -> NO_CONTENT
        "notes": "The legacy switch value 'true' (documented for the old v1.30 path) plus the opt-in: "
        "records what this version does with it.",
    },
    # The same package one release earlier (2.3b0): the v1.30 "legacy" path, content as log events.
    # Needs its own venv (2.3b0 and 2.4b0 cannot share one); see README.md.
    "openai_v2_legacy_content": {
        "group": "a",
        "venv": "/work/capture-venv-openai-legacy",
        "packages": ["openai", "opentelemetry-instrumentation-openai-v2", "opentelemetry-instrumentation-httpx"],
        "env": {"OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": "true"},
        "calls": ["chat", "stream", "err500", "connerr"],
        "content_expected": False,
        "content_expected_logs": True,
        "httpx": True,
        "notes": "opentelemetry-instrumentation-openai-v2 2.3b0 (no util-genai; semconv v1.30 path) with "
        "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true: content goes to log events "
        "(gen_ai.system.message / gen_ai.user.message / gen_ai.choice), not to the span. With "
        "HTTPX2ClientInstrumentor, so the upstream gets a traceparent.",
    },
    "openai_v2_httpx": {
        "group": "a",
        "packages": [
            "openai",
            "opentelemetry-instrumentation-openai-v2",
            "opentelemetry-util-genai",
            "opentelemetry-instrumentation-httpx",
        ],
        "httpx": True,
        "env": {"OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": "SPAN_ONLY"},
        "calls": ["chat", "stream", "err500"],
        "content_expected": True,
        "notes": "OpenAIInstrumentor + HTTPXClientInstrumentor: the HTTP CLIENT span is a child of the "
        "GenAI span and its context is what the upstream receives as traceparent.",
    },
    # b. LiteLLM SDK
    "litellm_sdk_v1": {
        "group": "b",
        "packages": ["litellm"],
        "env": {},
        "calls": ["chat", "stream", "err500"],
        "content_expected": True,
        "notes": "litellm.callbacks=['otel'] (legacy OpenTelemetry logger), OTEL_EXPORTER=otlp_http, "
        "OTEL_ENDPOINT=<receiver>/v1/traces. No content env set: the default for a new user.",
    },
    "litellm_sdk_v1_semconv": {
        "group": "b",
        "packages": ["litellm"],
        "env": {
            "OTEL_SEMCONV_STABILITY_OPT_IN": "gen_ai_latest_experimental",
            "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": "SPAN_ONLY",
        },
        "calls": ["chat", "stream"],
        "content_expected": True,
        "notes": "Legacy logger with the GenAI semconv opt-in and SPAN_ONLY content.",
    },
    "litellm_sdk_v2_sync": {
        "group": "b",
        "packages": ["litellm"],
        "env": {"LITELLM_OTEL_V2": "true"},
        "calls": ["chat"],
        "content_expected": None,
        "notes": "LITELLM_OTEL_V2=true with the SYNC litellm.completion(): the V2 logger opens the LLM-call span "
        "in log_pre_api_call and closes it only in async_log_success/failure_event, which the sync path does not "
        "run here, so nothing is exported (0 spans is the observed, recorded result).",
    },
    "litellm_sdk_v2": {
        "group": "b",
        "packages": ["litellm"],
        "env": {"LITELLM_OTEL_V2": "true"},
        "calls": ["chat", "stream", "err500"],
        "async": True,
        "content_expected": False,  # observed: V2 defaults to no_content
        "notes": "LITELLM_OTEL_V2=true (litellm/integrations/otel), litellm.acompletion(); no content env.",
    },
    "litellm_sdk_v2_content": {
        "group": "b",
        "packages": ["litellm"],
        "env": {"LITELLM_OTEL_V2": "true", "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": "SPAN_ONLY"},
        "calls": ["chat", "stream", "err500"],
        "async": True,
        "content_expected": True,
        "notes": "LITELLM_OTEL_V2=true with OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=SPAN_ONLY, "
        "litellm.acompletion().",
    },
    # c. LiteLLM proxy
    "litellm_proxy_v1": {
        "group": "c",
        "packages": ["litellm"],
        "env": {},
        "calls": ["chat_tp", "stream_tp", "chat_notp", "err500_tp", "passthrough_tp"],
        "content_expected": True,
        "notes": "litellm --config (callbacks: ['otel'], forward_traceparent_to_llm_provider: true), on "
        "127.0.0.1. Calls suffixed _tp carry a caller traceparent (see caller_traceparents).",
        "proxy": True,
    },
    "litellm_proxy_v2": {
        "group": "c",
        "packages": ["litellm"],
        "env": {"LITELLM_OTEL_V2": "true", "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": "SPAN_ONLY"},
        "calls": ["chat_tp", "stream_tp", "chat_notp", "err500_tp", "passthrough_tp"],
        "content_expected": True,
        "notes": "Same proxy with LITELLM_OTEL_V2=true and SPAN_ONLY content.",
        "proxy": True,
    },
    # d. OpenLLMetry and OpenInference on the openai client
    "openllmetry_openai": {
        "group": "d",
        "packages": ["openai", "opentelemetry-instrumentation-openai", "opentelemetry-semantic-conventions-ai"],
        "env": {"TRACELOOP_TRACE_CONTENT": "true"},
        "calls": ["chat", "stream", "err500"],
        "content_expected": True,
        "notes": "Traceloop OpenAIInstrumentor() defaults (use_attributes=True, "
        "enable_trace_context_propagation=True).",
    },
    "openllmetry_openai_legacy": {
        "group": "d",
        "packages": ["openai", "opentelemetry-instrumentation-openai", "opentelemetry-semantic-conventions-ai"],
        "env": {"TRACELOOP_TRACE_CONTENT": "true"},
        "calls": ["chat"],
        "content_expected": False,
        "content_expected_logs": True,
        "notes": "Traceloop OpenAIInstrumentor(use_attributes=False) (the events path).",
    },
    "openllmetry_openai_indexed": {
        "group": "d",
        "venv": "/work/capture-venv-openai-legacy",
        "packages": ["openai", "opentelemetry-instrumentation-openai", "opentelemetry-semantic-conventions-ai"],
        "env": {"TRACELOOP_TRACE_CONTENT": "true"},
        "calls": ["chat", "stream", "err500"],
        "content_expected": True,
        "notes": "Traceloop opentelemetry-instrumentation-openai 0.54.0, the last release with the indexed "
        "gen_ai.prompt.N.* / gen_ai.completion.N.* attributes (0.55.0 moved to gen_ai.input.messages), "
        "OpenAIInstrumentor() defaults, in the older-releases venv (openai 2.x).",
    },
    "openinference_openai": {
        "group": "d",
        "packages": ["openai", "openinference-instrumentation-openai", "openinference-instrumentation"],
        "env": {},
        "calls": ["chat", "stream", "err500"],
        "content_expected": True,
        "notes": "OpenInference OpenAIInstrumentor() defaults (content is captured unless "
        "OPENINFERENCE_HIDE_* is set).",
    },
}


# --------------------------------------------------------------------------------------------------
# child side
# --------------------------------------------------------------------------------------------------


def _sdk_providers(service_name: str, logs: bool = False):
    from opentelemetry import trace
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    resource = Resource.create({"service.name": service_name})
    tp = TracerProvider(resource=resource)
    tp.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=os.environ["CAPTURE_OTLP"] + "/v1/traces")))
    trace.set_tracer_provider(tp)
    lp = None
    if logs:
        from opentelemetry import _logs
        from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter
        from opentelemetry.sdk._logs import LoggerProvider
        from opentelemetry.sdk._logs.export import SimpleLogRecordProcessor

        lp = LoggerProvider(resource=resource)
        lp.add_log_record_processor(
            SimpleLogRecordProcessor(OTLPLogExporter(endpoint=os.environ["CAPTURE_OTLP"] + "/v1/logs"))
        )
        _logs.set_logger_provider(lp)
    return tp, lp


def _sdk_meter_provider(service_name: str):
    """The emitter's OWN client metrics (names, units, buckets as the instrumentation defines them)."""
    from opentelemetry import metrics
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
    from opentelemetry.sdk.resources import Resource

    reader = PeriodicExportingMetricReader(
        OTLPMetricExporter(endpoint=os.environ["CAPTURE_OTLP"] + "/v1/metrics"), export_interval_millis=3_600_000
    )
    mp = MeterProvider(resource=Resource.create({"service.name": service_name}), metric_readers=[reader])
    metrics.set_meter_provider(mp)
    return mp


def _openai_calls(calls: list[str], results: list):
    import openai

    base = os.environ["CAPTURE_UPSTREAM"] + "/v1"
    client = openai.OpenAI(base_url=base, api_key="sk-fake-capture", max_retries=0, timeout=10)
    for call in calls:
        try:
            if call == "connerr":
                dead = openai.OpenAI(
                    base_url=f"http://127.0.0.1:{free_port()}/v1", api_key="sk-fake", max_retries=0, timeout=3
                )
                dead.chat.completions.create(model=REQUEST_MODEL, messages=messages_for(call))
            elif call.startswith("abort"):
                # The client gives up after the first chunk and closes the stream (a user's cancel).
                stream = client.chat.completions.create(
                    model=REQUEST_MODEL, messages=messages_for(call), stream=True, stream_options={"include_usage": True}
                )
                next(iter(stream))
                stream.close()
                results.append({"call": call, "ok": False, "error": "aborted by the client"})
                continue
            elif call.startswith("stream"):
                stream = client.chat.completions.create(
                    model=REQUEST_MODEL,
                    messages=messages_for(call),
                    stream=True,
                    stream_options={"include_usage": True},
                    temperature=0.2,
                    max_tokens=64,
                )
                text = "".join((c.choices[0].delta.content or "") for c in stream if c.choices)
                results.append({"call": call, "ok": True, "text": text})
                continue
            else:
                r = client.chat.completions.create(
                    model=REQUEST_MODEL, messages=messages_for(call), temperature=0.2, max_tokens=64, top_p=0.9
                )
                results.append({"call": call, "ok": True, "text": r.choices[0].message.content})
                continue
        except Exception as e:  # noqa: BLE001 - errors are part of the scenarios
            results.append({"call": call, "ok": False, "error": f"{type(e).__module__}.{type(e).__name__}: {e}"})


def child_openai_v2(name: str, spec: dict) -> list:
    tp, lp = _sdk_providers(f"capture-{name}", logs=True)
    mp = _sdk_meter_provider(f"capture-{name}")
    from opentelemetry.instrumentation.openai_v2 import OpenAIInstrumentor

    OpenAIInstrumentor().instrument(tracer_provider=tp, logger_provider=lp, meter_provider=mp)
    if spec.get("httpx") or "opentelemetry-instrumentation-httpx" in spec["packages"]:
        import openai  # noqa: F401

        # openai >= 3 sends through httpx2; older openai through httpx
        if "httpx2" in sys.modules:
            from opentelemetry.instrumentation.httpx import HTTPX2ClientInstrumentor as Instr
        else:
            from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor as Instr

        Instr().instrument(tracer_provider=tp)
    results: list = []
    _openai_calls(spec["calls"], results)
    tp.force_flush()
    lp.force_flush()
    mp.force_flush()
    return results


def child_openllmetry(name: str, spec: dict) -> list:
    tp, lp = _sdk_providers(f"capture-{name}", logs=True)
    mp = _sdk_meter_provider(f"capture-{name}")
    from opentelemetry.instrumentation.openai import OpenAIInstrumentor

    kwargs = {"use_attributes": False} if name.endswith("_legacy") else {}
    OpenAIInstrumentor(**kwargs).instrument(tracer_provider=tp, logger_provider=lp, meter_provider=mp)
    results: list = []
    _openai_calls(spec["calls"], results)
    tp.force_flush()
    lp.force_flush()
    mp.force_flush()
    return results


def child_openinference(name: str, spec: dict) -> list:
    tp, _ = _sdk_providers(f"capture-{name}")
    from openinference.instrumentation.openai import OpenAIInstrumentor

    OpenAIInstrumentor().instrument(tracer_provider=tp)
    results: list = []
    _openai_calls(spec["calls"], results)
    tp.force_flush()
    return results


def child_litellm_sdk(name: str, spec: dict) -> list:
    import asyncio

    import litellm

    litellm.callbacks = ["otel"]
    base = os.environ["CAPTURE_UPSTREAM"] + "/v1"
    results: list = []
    common = dict(model=f"openai/{REQUEST_MODEL}", api_base=base, api_key="sk-fake-capture", temperature=0.2,
                  max_tokens=64, num_retries=0)

    def sync_call(call):
        if call.startswith("stream"):
            resp = litellm.completion(messages=messages_for(call), stream=True,
                                      stream_options={"include_usage": True}, **common)
            return "".join((c.choices[0].delta.content or "") for c in resp if c.choices)
        return litellm.completion(messages=messages_for(call), **common).choices[0].message.content

    async def async_call(call):
        if call.startswith("stream"):
            resp = await litellm.acompletion(messages=messages_for(call), stream=True,
                                             stream_options={"include_usage": True}, **common)
            parts = []
            async for c in resp:
                if c.choices:
                    parts.append(c.choices[0].delta.content or "")
            return "".join(parts)
        r = await litellm.acompletion(messages=messages_for(call), **common)
        return r.choices[0].message.content

    async def run_async():
        for call in spec["calls"]:
            try:
                results.append({"call": call, "ok": True, "text": await async_call(call)})
            except Exception as e:  # noqa: BLE001
                results.append({"call": call, "ok": False,
                                "error": f"{type(e).__module__}.{type(e).__name__}: {e}"})
            await asyncio.sleep(0.5)
        await asyncio.sleep(3)  # logging callbacks are tasks on this loop

    if spec.get("async"):
        asyncio.run(run_async())
    else:
        for call in spec["calls"]:
            try:
                results.append({"call": call, "ok": True, "text": sync_call(call)})
            except Exception as e:  # noqa: BLE001 - errors are part of the scenarios
                results.append({"call": call, "ok": False,
                                "error": f"{type(e).__module__}.{type(e).__name__}: {e}"})
            time.sleep(0.5)  # success/failure callbacks run on background workers
        time.sleep(3)
    _flush_all_tracer_providers()
    return results


def _flush_all_tracer_providers():
    """LiteLLM builds its own TracerProvider(s); flush whatever exists."""
    import gc

    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider

    seen = set()
    cands = [trace.get_tracer_provider()] + [o for o in gc.get_objects() if isinstance(o, TracerProvider)]
    for p in cands:
        if id(p) in seen or not hasattr(p, "force_flush"):
            continue
        seen.add(id(p))
        try:
            p.force_flush(5000)
        except Exception:  # noqa: BLE001
            traceback.print_exc()


# a throwaway key for a proxy that only ever listens on 127.0.0.1 during the capture
PROXY_MASTER_KEY = "sk-capture-7Hq2mZ9vR4tL8wX1cN6bK3pD5fG0jS"

PROXY_CONFIG = """\
model_list:
  - model_name: {model}
    litellm_params:
      model: openai/{model}
      api_base: {upstream}/v1
      api_key: sk-fake-capture
litellm_settings:
  callbacks: ["otel"]
  forward_traceparent_to_llm_provider: true
  num_retries: 0
general_settings:
  master_key: {master_key}
  pass_through_endpoints:
    - path: "/passthrough/v1/chat/completions"
      target: "{upstream}/v1/chat/completions"
      headers:
        Authorization: "Bearer sk-fake-capture"
      forward_headers: true
"""


def child_litellm_proxy(name: str, spec: dict) -> list:
    import httpx

    upstream = os.environ["CAPTURE_UPSTREAM"]
    port = free_port()
    tmp = tempfile.mkdtemp(prefix="capture-litellm-")
    cfg = Path(tmp) / "config.yaml"
    cfg.write_text(PROXY_CONFIG.format(model=REQUEST_MODEL, upstream=upstream, master_key=PROXY_MASTER_KEY))
    logf = open(Path(tmp) / "proxy.log", "w")
    exe = Path(sys.executable).with_name("litellm")
    proc = subprocess.Popen(
        [str(exe), "--config", str(cfg), "--host", "127.0.0.1", "--port", str(port), "--num_workers", "1"],
        stdout=logf,
        stderr=subprocess.STDOUT,
        env=os.environ.copy(),
        start_new_session=True,
    )
    results: list = [{"proxy_port": port}]
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 120
        while time.time() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"litellm proxy exited early rc={proc.returncode}")
            try:
                if httpx.get(base + "/health/liveliness", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        else:
            raise RuntimeError("litellm proxy did not become live")
        # which sockets does it listen on? (must be loopback only)
        results.append({"listening": _listening_sockets(proc.pid)})
        for i, call in enumerate(spec["calls"], start=1):
            headers = {"Authorization": f"Bearer {PROXY_MASTER_KEY}"}
            if call.endswith("_tp"):
                headers["traceparent"] = caller_traceparent(i)
                headers["tracestate"] = "app=capture"
            body = {"model": REQUEST_MODEL, "messages": messages_for(call), "temperature": 0.2, "max_tokens": 64}
            url = base + "/v1/chat/completions"
            if call.startswith("passthrough"):
                url = base + "/passthrough/v1/chat/completions"
            if call.startswith("stream"):
                body["stream"] = True
                body["stream_options"] = {"include_usage": True}
                with httpx.stream("POST", url, json=body, headers=headers, timeout=30) as r:
                    text = "".join(r.iter_text())
                results.append(
                    {"call": call, "status": r.status_code, "caller_traceparent": headers.get("traceparent"),
                     "marker_in_reply": COMPLETION_MARKER in text}
                )
            else:
                r = httpx.post(url, json=body, headers=headers, timeout=30)
                results.append(
                    {"call": call, "status": r.status_code, "caller_traceparent": headers.get("traceparent"),
                     "marker_in_reply": COMPLETION_MARKER in r.text,
                     "body_head": r.text[:200] if r.status_code >= 400 else None}
                )
            time.sleep(0.7)
        time.sleep(4)  # let its BatchSpanProcessor export
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        logf.close()
        results.append({"proxy_returncode": proc.returncode})
    shutil.rmtree(tmp, ignore_errors=True)  # kept (config + proxy.log) only when something above raised
    return results


def _listening_sockets(pid: int) -> list[str]:
    """Listening TCP sockets of pid and its children, from /proc (no extra tools)."""
    pids = {pid}
    try:
        for line in subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True).stdout.split():
            pids.add(int(line))
    except Exception:  # noqa: BLE001
        pass
    inodes = set()
    for p in pids:
        try:
            for fd in os.listdir(f"/proc/{p}/fd"):
                try:
                    t = os.readlink(f"/proc/{p}/fd/{fd}")
                except OSError:
                    continue
                if t.startswith("socket:["):
                    inodes.add(t[8:-1])
        except OSError:
            pass
    out = []
    for fn in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(fn).read_text().splitlines()[1:]
        except OSError:
            continue
        for ln in lines:
            parts = ln.split()
            if parts[3] != "0A" or parts[9] not in inodes:  # 0A = LISTEN
                continue
            hexip, hexport = parts[1].split(":")
            port = int(hexport, 16)
            if len(hexip) == 8:
                ip = ".".join(str(int(hexip[i : i + 2], 16)) for i in (6, 4, 2, 0))
            else:
                ip = "ipv6:" + hexip
            out.append(f"{ip}:{port}")
    return sorted(set(out))


CHILDREN = {
    "a": child_openai_v2,
    "b": child_litellm_sdk,
    "c": child_litellm_proxy,
    "d": None,
}


def run_child(name: str) -> int:
    spec = SCENARIOS[name]
    if os.environ.get("CAPTURE_CALLS"):  # the live matrix (tests/test_live_instrumentations.py) picks its calls
        spec = {**spec, "calls": os.environ["CAPTURE_CALLS"].split(",")}
    if spec["group"] == "d":
        fn = child_openinference if name.startswith("openinference") else child_openllmetry
    else:
        fn = CHILDREN[spec["group"]]
    try:
        results = fn(name, spec)
        rc = 0
    except Exception as e:  # noqa: BLE001
        traceback.print_exc()
        results = [{"fatal": f"{type(e).__name__}: {e}"}]
        rc = 1
    Path(os.environ["CAPTURE_RESULT"]).write_text(json.dumps(results, indent=1))
    return rc


# --------------------------------------------------------------------------------------------------
# parent: orchestrate, then describe captures
# --------------------------------------------------------------------------------------------------

CHILD_ENV_BASE = {
    # no network but loopback: keep litellm from fetching its cost map / telemetry
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    "LITELLM_TELEMETRY": "False",
    "DISABLE_SCHEMA_UPDATE": "True",
    "NO_PROXY": "127.0.0.1,localhost",
    "no_proxy": "127.0.0.1,localhost",
    "OTEL_BSP_SCHEDULE_DELAY": "200",
    "PYTHONUNBUFFERED": "1",
}

# env vars of the parent that must not leak into children (they would change emitter behaviour)
STRIP_ENV_PREFIXES = ("OTEL_", "LITELLM_", "TRACELOOP_", "OPENINFERENCE_", "OPENAI_", "HTTP_PROXY", "HTTPS_PROXY")


def child_env(name: str, otlp: str, upstream: str, result_file: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith(STRIP_ENV_PREFIXES)}
    env.update(CHILD_ENV_BASE)
    env.update(SCENARIOS[name]["env"])
    env["CAPTURE_OTLP"] = otlp
    env["CAPTURE_UPSTREAM"] = upstream
    env["CAPTURE_RESULT"] = result_file
    if SCENARIOS[name]["group"] in ("b", "c"):
        env["OTEL_EXPORTER"] = "otlp_http"
        env["OTEL_ENDPOINT"] = otlp + "/v1/traces"
        env["OTEL_SERVICE_NAME"] = f"capture-{name}"
    return env


def user_env(name: str) -> dict:
    """The env that a user would set (recorded in the manifest, ports elided)."""
    e = dict(SCENARIOS[name]["env"])
    if SCENARIOS[name]["group"] in ("b", "c"):
        e.update({"OTEL_EXPORTER": "otlp_http", "OTEL_ENDPOINT": "http://127.0.0.1:<receiver>/v1/traces",
                  "OTEL_SERVICE_NAME": f"capture-{name}"})
    return e


def versions(pkgs: list[str], python: str | None = None) -> dict:
    if python and Path(python).parent.parent != Path(sys.prefix):
        code = (
            "import json,sys\nfrom importlib import metadata\nout={}\n"
            "for p in sys.argv[1:]:\n try: out[p]=metadata.version(p)\n except Exception: out[p]=None\n"
            "print(json.dumps(out))"
        )
        base = ["opentelemetry-api", "opentelemetry-sdk", "opentelemetry-exporter-otlp-proto-http",
                "opentelemetry-proto"]
        r = subprocess.run([python, "-c", code, *pkgs, *base], capture_output=True, text=True)
        return json.loads(r.stdout)
    from importlib import metadata

    base = ["opentelemetry-api", "opentelemetry-sdk", "opentelemetry-exporter-otlp-proto-http", "opentelemetry-proto"]
    out = {}
    for p in list(pkgs) + base:
        try:
            out[p] = metadata.version(p)
        except metadata.PackageNotFoundError:
            out[p] = None
    return out


def any_value_py(v):
    k = v.WhichOneof("value")
    if k is None:
        return None
    if k == "array_value":
        return [any_value_py(x) for x in v.array_value.values]
    if k == "kvlist_value":
        return {kv.key: any_value_py(kv.value) for kv in v.kvlist_value.values}
    if k == "bytes_value":
        return "<bytes %d>" % len(v.bytes_value)
    return getattr(v, k)


def contains_marker(x) -> list[str]:
    s = json.dumps(x, default=str)
    return [k for k, m in MARKERS.items() if m in s]


def brief_value(v):
    found = contains_marker(v)
    n = len(v) if isinstance(v, str) else len(json.dumps(v, default=str))
    if found:
        return f"<CONTENT {'+'.join(found)}: {type(v).__name__} of {n} chars>"
    if n > 100:
        return f"<{type(v).__name__} of {n} chars>"
    return v


KIND = {0: "UNSPECIFIED", 1: "INTERNAL", 2: "SERVER", 3: "CLIENT", 4: "PRODUCER", 5: "CONSUMER"}
STATUS = {0: "UNSET", 1: "OK", 2: "ERROR"}


def describe_traces(bodies: list[bytes], upstream: list[dict], caller_tps: list[str]) -> dict:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    spans = []
    resources = []
    for bi, b in enumerate(bodies, start=1):
        req = ExportTraceServiceRequest()
        req.ParseFromString(b)
        for rs in req.resource_spans:
            rattrs = {kv.key: any_value_py(kv.value) for kv in rs.resource.attributes}
            if rattrs not in resources:
                resources.append(rattrs)
            for ss in rs.scope_spans:
                for sp in ss.spans:
                    spans.append((bi, ss.scope.name, ss.scope.version, sp))
    by_id = {sp.span_id.hex(): sp for _, _, _, sp in spans}
    caller = {tp.split("-")[2]: tp for tp in caller_tps}
    up_by_span = {}
    for u in upstream:
        if u.get("traceparent"):
            up_by_span.setdefault(u["traceparent"].split("-")[2], []).append(u["seq"])
    out = []
    for bi, scope, scope_v, sp in spans:
        parent = sp.parent_span_id.hex()
        if not parent:
            rel = "root"
        elif parent in by_id:
            rel = f"child of '{by_id[parent].name}' ({parent})"
        elif parent in caller:
            rel = f"child of the CALLER's traceparent span {parent} (remote parent)"
        else:
            rel = f"parent {parent} not in capture (remote)"
        attrs = {kv.key: any_value_py(kv.value) for kv in sp.attributes}
        events = []
        for ev in sp.events:
            eattrs = {kv.key: any_value_py(kv.value) for kv in ev.attributes}
            events.append({"name": ev.name, "attribute_keys": sorted(eattrs),
                           "content_attribute_keys": sorted(k for k, v in eattrs.items() if contains_marker(v))})
        d = {
            "request_file_index": bi,
            "scope": f"{scope} {scope_v}".strip(),
            "name": sp.name,
            "kind": KIND.get(sp.kind, str(sp.kind)),
            "trace_id": sp.trace_id.hex(),
            "span_id": sp.span_id.hex(),
            "parent_span_id": parent or None,
            "parent": rel,
            "trace_state": sp.trace_state or None,
            "duration_ms": round((sp.end_time_unix_nano - sp.start_time_unix_nano) / 1e6, 3),
            "status": STATUS.get(sp.status.code, str(sp.status.code)),
            "status_message": sp.status.message or None,
            # every attribute key; the value when short, else a note ("<CONTENT ...>" = a marker string is in it)
            "attributes": {k: brief_value(v) for k, v in sorted(attrs.items())},
            "content_attribute_keys": sorted(k for k, v in attrs.items() if contains_marker(v)),
            "events": events,
            "links": len(sp.links),
            "upstream_requests_with_this_span_as_traceparent": up_by_span.get(sp.span_id.hex(), []),
        }
        out.append(d)
    return {"resources": resources, "spans": out}


def describe_logs(bodies: list[bytes]) -> list[dict]:
    from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest

    out = []
    for b in bodies:
        req = ExportLogsServiceRequest()
        req.ParseFromString(b)
        for rl in req.resource_logs:
            for sl in rl.scope_logs:
                for lr in sl.log_records:
                    attrs = {kv.key: any_value_py(kv.value) for kv in lr.attributes}
                    body = any_value_py(lr.body)
                    out.append(
                        {
                            "scope": sl.scope.name,
                            "event_name": getattr(lr, "event_name", "") or attrs.get("event.name"),
                            "trace_id": lr.trace_id.hex() or None,
                            "span_id": lr.span_id.hex() or None,
                            "attribute_keys": sorted(attrs),
                            "content_attribute_keys": sorted(k for k, v in attrs.items() if contains_marker(v)),
                            "body_has_content": bool(contains_marker(body)),
                            "body_keys": sorted(body) if isinstance(body, dict) else None,
                        }
                    )
    return out


def describe_metrics(bodies: list[bytes]) -> list[dict]:
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

    out = []
    for b in bodies:
        req = ExportMetricsServiceRequest()
        req.ParseFromString(b)
        for rm in req.resource_metrics:
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    kind = m.WhichOneof("data")
                    data = getattr(m, kind)
                    pts = list(data.data_points)
                    d = {
                        "scope": sm.scope.name,
                        "name": m.name,
                        "unit": m.unit,
                        "type": kind,
                        "data_points": len(pts),
                        "attribute_sets": sorted(
                            {json.dumps({kv.key: any_value_py(kv.value) for kv in p.attributes}, sort_keys=True)
                             for p in pts}
                        ),
                    }
                    if kind == "histogram" and pts:
                        d["explicit_bounds"] = list(pts[0].explicit_bounds)
                        d["counts"] = [p.count for p in pts]
                        d["sums"] = [round(p.sum, 6) for p in pts]
                    elif pts:
                        d["values"] = [p.as_int if p.WhichOneof("value") == "as_int" else p.as_double for p in pts]
                    out.append(d)
    return out


def write_manifest(path: Path, manifest: dict) -> None:
    """Indented JSON, but each span / log record / metric / upstream request on one line (keeps it reviewable)."""
    placeholders = {}

    def compact(x):
        key = f"@@{len(placeholders)}@@"
        placeholders[key] = json.dumps(x, default=str, separators=(", ", ": "))
        return key

    m = json.loads(json.dumps(manifest, default=str))
    for sc in m.get("scenarios", {}).values():
        for field in ("spans", "log_records", "metrics", "upstream_requests", "otlp_requests", "call_results"):
            if isinstance(sc.get(field), list):
                sc[field] = [compact(x) for x in sc[field]]
    text = json.dumps(m, indent=1, default=str)
    for key, val in placeholders.items():
        text = text.replace(json.dumps(key), val)
    path.write_text(text + "\n")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--child")
    ap.add_argument("--only", help="comma-separated scenario names (default: all)")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--out", default=str(HERE))
    args = ap.parse_args()
    if args.child:
        return run_child(args.child)
    if args.list:
        for n, s in SCENARIOS.items():
            print(f"{n:28s} {s['group']}  {s['notes']}")
        return 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    names = args.only.split(",") if args.only else list(SCENARIOS)
    up_srv, up_port = serve(UpstreamHandler)
    otlp_srv, otlp_port = serve(OTLPHandler)
    upstream = f"http://127.0.0.1:{up_port}"
    otlp = f"http://127.0.0.1:{otlp_port}"
    log("fake upstream", upstream, "OTLP receiver", otlp)
    manifest_path = out / "MANIFEST.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    manifest.setdefault("scenarios", {})
    manifest["format"] = {
        "traces": "<scenario>.<n>.binpb = body of the n-th OTLP/HTTP POST /v1/traces (ExportTraceServiceRequest, "
        "protobuf, gzip removed), n from 1 in arrival order",
        "logs": "<scenario>.logs.<n>.binpb = body of the n-th POST /v1/logs (ExportLogsServiceRequest)",
        "metrics": "<scenario>.metrics.<n>.binpb = body of the n-th POST /v1/metrics (ExportMetricsServiceRequest): "
        "the emitter's own client metrics, flushed once at the end (groups a and d only)",
    }
    manifest["markers"] = MARKERS
    manifest["fake_upstream"] = {
        "request_model": REQUEST_MODEL,
        "response_model": RESPONSE_MODEL,
        "usage": {"prompt_tokens": PROMPT_TOKENS, "completion_tokens": COMPLETION_TOKENS},
        "finish_reason": "stop",
        "stream_chunks": ["role chunk (empty content)", "Hi", "! ", COMPLETION_MARKER, "finish_reason=stop",
                          "usage chunk (choices=[]) if stream_options.include_usage", "[DONE]"],
        "first_chunk_delay_s": FIRST_CHUNK_DELAY_S,
        "chunk_delay_s": STREAM_CHUNK_DELAY_S,
        "nonstream_delay_s": NONSTREAM_DELAY_S,
        "calls": "label in '[call=LABEL]' of the user message: *err500* -> HTTP 500, *err400* -> HTTP 400, "
        "else 200; connerr = client pointed at a closed port (nothing reaches the upstream)",
    }
    manifest["python"] = sys.version.split()[0]
    rc_all = 0
    for name in names:
        spec = SCENARIOS[name]
        for old in list(out.glob(f"{name}.*binpb")):
            if re.fullmatch(rf"{re.escape(name)}\.((logs|metrics)\.)?\d+\.binpb", old.name):
                old.unlink()
        with STATE.lock:
            STATE.scenario = name
        res_file = tempfile.mktemp(prefix=f"capture-{name}-", suffix=".json")
        t0 = time.time()
        log("running", name)
        python = sys.executable
        if spec.get("venv"):
            python = str(Path(spec["venv"]) / "bin" / "python")
            if not Path(python).exists():
                log(name, "SKIPPED: venv", spec["venv"], "missing")
                manifest["scenarios"][name] = {"group": spec["group"], "skipped": f"venv {spec['venv']} missing"}
                continue
        p = subprocess.run(
            [python, str(Path(__file__).resolve()), "--child", name],
            env=child_env(name, otlp, upstream, res_file),
            capture_output=True,
            text=True,
            timeout=300,
        )
        time.sleep(1.0)  # late exports
        with STATE.lock:
            STATE.scenario = None
            ups = [dict(u) for u in STATE.upstream if u["scenario"] == name]
            reqs = [r for r in STATE.otlp if r["scenario"] == name]
        try:
            results = json.loads(Path(res_file).read_text())
            os.unlink(res_file)
        except (OSError, ValueError):
            results = [{"fatal": "child wrote no result"}]
        if p.returncode != 0:
            rc_all = 1
            log(name, "child rc", p.returncode, p.stderr[-3000:])
        traces = [r for r in reqs if r["signal"] == "traces"]
        logs_ = [r for r in reqs if r["signal"] == "logs"]
        metrics_ = [r for r in reqs if r["signal"] == "metrics"]
        files, log_files, metric_files = [], [], []
        for i, r in enumerate(metrics_, start=1):
            fn = f"{name}.metrics.{i}.binpb"
            (out / fn).write_bytes(r["body"])
            metric_files.append(fn)
        for i, r in enumerate(traces, start=1):
            fn = f"{name}.{i}.binpb"
            (out / fn).write_bytes(r["body"])
            files.append(fn)
        for i, r in enumerate(logs_, start=1):
            fn = f"{name}.logs.{i}.binpb"
            (out / fn).write_bytes(r["body"])
            log_files.append(fn)
        caller_tps = [r.get("caller_traceparent") for r in results if r.get("caller_traceparent")]
        for u in ups:
            u.pop("scenario", None)
        entry = {
            "group": spec["group"],
            "notes": spec["notes"],
            "packages": versions(spec["packages"], python),
            "venv": spec.get("venv", "/work/capture-venv"),
            "env": user_env(name),
            "calls": spec["calls"],
            "call_results": results,
            "content_expected_in_spans": spec.get("content_expected"),
            "content_expected_in_logs": spec.get("content_expected_logs"),
            "child_returncode": p.returncode,
            "duration_s": round(time.time() - t0, 1),
            "files": files,
            "log_files": log_files,
            "metric_files": metric_files,
            "otlp_requests": [
                {"signal": r["signal"], "path": r["path"], "content_type": r["content_type"],
                 "content_encoding": r["content_encoding"], "user_agent": r["user_agent"], "bytes": len(r["body"])}
                for r in reqs
            ],
            "upstream_requests": ups,
            "caller_traceparents": caller_tps,
        }
        if spec.get("proxy"):
            entry["proxy_config"] = PROXY_CONFIG.format(
                model=REQUEST_MODEL, upstream="http://127.0.0.1:<upstream>", master_key="<throwaway key>"
            )
            entry["proxy_command"] = "litellm --config config.yaml --host 127.0.0.1 --port <free> --num_workers 1"
        if traces:
            d = describe_traces([r["body"] for r in traces], ups, caller_tps)
            entry["resources"] = d["resources"]
            entry["span_count"] = len(d["spans"])
            entry["spans"] = d["spans"]
            entry["markers_found_in_spans"] = sorted(
                {k for r in traces for k, m in MARKERS.items() if m.encode() in r["body"]}
            )
            by_id = {s_["span_id"]: s_ for s_ in d["spans"]}
            for u in ups:
                tp = u.get("traceparent")
                if not tp:
                    u["traceparent_parent"] = None
                    continue
                parent_id = tp.split("-")[2]
                if tp in caller_tps:
                    u["traceparent_parent"] = ("the CALLER's traceparent, forwarded verbatim: an engine span would be a "
                                               "SIBLING of the gateway's spans (same parent)")
                elif parent_id in by_id:
                    sp_ = by_id[parent_id]
                    u["traceparent_parent"] = f"span '{sp_['name']}' ({sp_['kind']}, {parent_id}): an engine span would be its CHILD"
                else:
                    u["traceparent_parent"] = f"span {parent_id} not in the capture"
        else:
            entry["span_count"] = 0
            entry["spans"] = []
            entry["markers_found_in_spans"] = []
        if logs_:
            entry["log_records"] = describe_logs([r["body"] for r in logs_])
            entry["markers_found_in_logs"] = sorted(
                {k for r in logs_ for k, m in MARKERS.items() if m.encode() in r["body"]}
            )
        if metrics_:
            # cumulative temporality: each request repeats the totals so far; describe the last one
            entry["metrics_described_file"] = metric_files[-1]
            entry["metrics"] = describe_metrics([metrics_[-1]["body"]])
        entry["markers_found_in_trace_bytes"] = sorted(
            {k for r in traces for k, m in MARKERS.items() if m.encode() in r["body"]}
        )
        entry["child_stderr_tail"] = [ln for ln in p.stderr.splitlines() if ln.strip()][-15:]
        manifest["scenarios"][name] = entry
        log(name, f"rc={p.returncode} spans={entry['span_count']} files={files} logs={log_files} "
            f"upstream={len(ups)} {time.time() - t0:.1f}s")
        write_manifest(manifest_path, manifest)
    # keep scenario order stable
    manifest["scenarios"] = {k: manifest["scenarios"][k] for k in SCENARIOS if k in manifest["scenarios"]}
    write_manifest(manifest_path, manifest)
    up_srv.shutdown()
    otlp_srv.shutdown()
    return rc_all


if __name__ == "__main__":
    sys.exit(main())
