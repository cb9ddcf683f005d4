"""Runs in the Logfire group's virtualenv (tests/live/instrumentations.sh): the real ``openai`` client
instrumented as Logfire's users do (``logfire.configure`` + ``instrument_openai``, version from
LF_VERSION), its HTTP calls instrumented too so the upstream (and the engine behind it) gets the
traceparent, its spans sent to otel-llm through the SDK's OTLP/HTTP exporter. Writes what the
client saw to RESULTS (JSON)."""

import json
import os
import sys
import time

import logfire
import openai
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace.export import BatchSpanProcessor

version = int(os.environ["LF_VERSION"])
logfire.configure(send_to_logfire=False, console=False, service_name=f"app-logfire-v{version}",
                  additional_span_processors=[BatchSpanProcessor(OTLPSpanExporter(endpoint=os.environ["OTLP"] + "/v1/traces"))])
logfire.instrument_httpx()  # openai 3 sends through httpx2, which Logfire 5.4 instruments too
client = openai.OpenAI(base_url=os.environ["UPSTREAM"] + "/v1", api_key="not-a-key", max_retries=0)
# Logfire suppresses every other instrumentation inside its span by default, the HTTP span and its
# traceparent included: an engine is joined to the call only with this off (README: Logfire's row).
logfire.instrument_openai(client, version=version, suppress_other_instrumentation=False)

SYSTEM, PROMPT = os.environ["SYSTEM_MARKER"], os.environ["PROMPT_MARKER"]
results = []
for label in sys.argv[1:]:
    messages = [{"role": "system", "content": f"You are terse. {SYSTEM}"},
                {"role": "user", "content": f"Say hi. {PROMPT} [call={label}]"}]
    started, ok, error, tokens = time.monotonic(), True, None, None
    try:
        if label.startswith("stream"):
            for chunk in client.chat.completions.create(model="gpt-4o-mini", messages=messages, stream=True,
                                                        stream_options={"include_usage": True}):
                if chunk.usage:
                    tokens = chunk.usage.completion_tokens
        else:
            tokens = client.chat.completions.create(model="gpt-4o-mini", messages=messages).usage.completion_tokens
    except openai.APIError as exc:
        ok, error = False, type(exc).__name__
    results.append({"call": label, "ok": ok, "error": error, "s": time.monotonic() - started, "tokens": tokens})
logfire.force_flush()
with open(os.environ["RESULTS"], "w") as f:
    json.dump({"results": results, "versions": {m: sys.modules[m].__version__ for m in ("logfire", "openai")}}, f)
