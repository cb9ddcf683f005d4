"""Runs in the Logfire or the OpenInference group's virtualenv (tests/live/instrumentations.sh): an
openai-agents Agent (its system prompt in ``instructions``) answering through the real ``openai``
client's chat completions against the local upstream, instrumented as each's users do:
``logfire.instrument_openai_agents()``, or
OpenInference's ``OpenAIAgentsInstrumentor`` and ``OpenAIInstrumentor``. The agents SDK's own
exporter to OpenAI is removed (``set_trace_processors([])``): nothing leaves the machine. Writes
what the client saw to RESULTS (JSON)."""

import json
import os
import sys

import openai
from agents import Agent, OpenAIChatCompletionsModel, Runner, set_trace_processors

GROUP = os.environ["GROUP"]
SYSTEM, PROMPT = os.environ["SYSTEM_MARKER"], os.environ["PROMPT_MARKER"]
set_trace_processors([])  # the agents SDK exports to OpenAI by default
client = openai.AsyncOpenAI(base_url=os.environ["UPSTREAM"] + "/v1", api_key="not-a-key", max_retries=0)

if GROUP == "logfire":
    import logfire
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    logfire.configure(send_to_logfire=False, console=False, service_name="app-logfire-agents",
                      additional_span_processors=[BatchSpanProcessor(OTLPSpanExporter(endpoint=os.environ["OTLP"] + "/v1/traces"))])
    logfire.instrument_openai_agents()  # alone: its own LLM span is what must be counted

    def flush() -> None:
        logfire.force_flush()
else:
    from openinference.instrumentation.openai import OpenAIInstrumentor
    from openinference.instrumentation.openai_agents import OpenAIAgentsInstrumentor
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": "app-openinference-agents"}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=os.environ["OTLP"] + "/v1/traces")))
    OpenAIAgentsInstrumentor().instrument(tracer_provider=provider)
    OpenAIInstrumentor().instrument(tracer_provider=provider)

    def flush() -> None:
        provider.force_flush()

results = []
for label in sys.argv[1:]:
    agent = Agent(name="assistant", instructions=f"You are terse. {SYSTEM}",
                  model=OpenAIChatCompletionsModel(model="gpt-4o-mini", openai_client=client))
    try:
        out = Runner.run_sync(agent, f"Say hi. {PROMPT} [call={label}]")
        results.append({"call": label, "ok": True, "error": None, "output": str(out.final_output)[:200]})
    except Exception as exc:  # noqa: BLE001 - reported to the test
        results.append({"call": label, "ok": False, "error": type(exc).__name__, "output": None})
flush()
with open(os.environ["RESULTS"], "w") as f:
    json.dump({"results": results, "versions": {m: sys.modules[m].__version__ for m in ("openai",)}}, f)
