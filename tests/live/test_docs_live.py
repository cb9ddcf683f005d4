"""The README's lines, run as shown against a live vLLM 0.32 (tests/support/snippets.py reads them from
the page; only its placeholders are replaced, by the rules there):

- vLLM started with the README's ``vllm-grpc`` line (its service name its served model name, a plaintext
  gRPC endpoint), otel-llm configured with the blocks of ``docs/engines/vllm.md`` and
  ``docs/integrations/litellm.md``;
- the README's openai-v2 snippet in an application that calls vLLM with the real ``openai`` client;
- the README's LiteLLM proxy: its config (a model group aliasing ``hosted_vllm/<served model>``,
  ``forward_traceparent_to_llm_provider``) and its command, the real proxy on loopback, called by the
  same application.

vLLM's own ``/metrics`` are the reference: what each test's calls added to them is what they added to
otel-llm's, family by family, under the same ``model_name``. The openai client, the instrumentations and
LiteLLM run from the capture virtualenv of ``tests/live/instrumentations.sh`` (exact pins).
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from otel_llm.exporter.store.sqlite import StoreReader
from otel_llm.processor.tail_sampling.config import TailSamplingProcessor
from tests.live.test_vllm_live import (  # noqa: F401 - model_dir is a fixture
    FINISHED_FAMILIES,
    TTFT,
    assert_family_equal,
    model_dir,
    poll,
    print_comparison,
)
from tests.live.vllm_server import VllmServer, free_port, is_loopback, listening_sockets, stop_group, wait_healthy
from tests.support.otelllm import RunningServer, Scrape, deep_merge, start_server
from tests.support.snippets import YOUR_SECRET, snippet

pytestmark = pytest.mark.timeout(1500)
LIVE = Path(__file__).resolve().parent
README = "README.md"
# otel-llm on its own defaults (tests/support/otelllm.py decides after 3 s: less than the 5 s the three
# processes' BatchSpanProcessors take, which loses joins) as the pages configure it, and one addition:
# every trace kept, so that each call's row is in the store.
DEFAULTS = TailSamplingProcessor()
AS_SHIPPED = {"processors": {"tail_sampling": {
    "decision_wait": f"{DEFAULTS.decision_wait}s", "grace": f"{DEFAULTS.grace}s",
    "policies": [{"name": "all", "type": "probabilistic", "probabilistic": {"sampling_percentage": 100}}]}}}
# LiteLLM without the network: its model cost map from its package, no telemetry, no schema update
# (tests/testdata/emitters/capture.py's CHILD_ENV_BASE), no Hugging Face Hub (for a "llama-3" model it
# fetches a tokenizer to count tokens, retrying for ~25 s per process, then falls back to tiktoken);
# loopback never through a proxy.
LITELLM_OFFLINE = {"LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_TELEMETRY": "False",
                   "DISABLE_SCHEMA_UPDATE": "True", "HF_HUB_OFFLINE": "1",
                   "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost"}
# The application: the README's openai-v2 snippet, then the test's calls (chat, streaming and not).
CALLS = r'''
import json, os
import openai

client = openai.OpenAI(base_url=os.environ["BASE_URL"], api_key=os.environ["KEY"], max_retries=0, timeout=600)
seen = []
for i in range(int(os.environ["CALLS"])):
    kwargs = dict(model=os.environ["MODEL"], messages=[{"role": "user", "content": f"call {i}: the quick brown fox"}],
                  max_tokens=4 + 3 * i, temperature=1.0, seed=i)
    if i % 2:
        tokens = None
        for chunk in client.chat.completions.create(**kwargs, stream=True, stream_options={"include_usage": True}):
            if chunk.usage is not None:
                tokens = chunk.usage.completion_tokens
        seen.append({"stream": True, "completion_tokens": tokens, "model": None})
    else:
        response = client.chat.completions.create(**kwargs)
        seen.append({"stream": False, "completion_tokens": response.usage.completion_tokens, "model": response.model})
provider.shutdown()
print(json.dumps(seen))
'''


def _instrumentations_python() -> str:
    script = str(LIVE / "instrumentations.sh")
    built = subprocess.run([script, "build", "capture"], capture_output=True, text=True, timeout=900)
    assert built.returncode == 0, built.stderr[-3000:]
    return subprocess.run([script, "path", "capture"], capture_output=True, text=True, check=True).stdout.strip()


@pytest.fixture(scope="module")
def chain(model_dir, tmp_path_factory) -> Iterator[tuple[VllmServer, RunningServer]]:  # noqa: F811
    tmp = tmp_path_factory.mktemp("docs-live")
    config = AS_SHIPPED
    for page, name in (("docs/engines/vllm.md", "vllm-otel-llm-config"),
                       ("docs/integrations/litellm.md", "litellm-otel-llm-config")):
        config = deep_merge(config, yaml.safe_load(snippet(page, name).text))
    otel = start_server(str(tmp / "store"), config)
    started = time.monotonic()
    vllm = VllmServer.documented(README, "vllm-grpc", model_dir, otel.grpc_port, otel.http_port, tmp / "vllm.log")
    try:
        vllm.wait_ready()
        print(f"\nthe README's vLLM line: ready in {time.monotonic() - started:.1f} s")
        yield vllm, otel
    finally:
        vllm.stop()
        otel.stop()


def _delta(after: Scrape, before: Scrape) -> Scrape:
    """What happened between two scrapes of counters and histograms."""
    return Scrape({key: value - before.samples.get(key, 0.0) for key, value in after.samples.items()}, "")


def _application(otel: RunningServer, base_url: str, model: str, calls: int, tmp: Path,
                 key: str = "unused") -> list[dict]:
    script = tmp / "app.py"
    script.write_text(snippet(README, "openai-v2").address("otlp-http", otel.http_port).text + CALLS)
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "OPENAI_"))}
    child = subprocess.run([_instrumentations_python(), str(script)], capture_output=True, text=True, timeout=900,
                           env={**clean, "BASE_URL": base_url, "MODEL": model, "CALLS": str(calls), "KEY": key})
    assert child.returncode == 0, child.stderr[-3000:]
    seen = json.loads(child.stdout.strip().splitlines()[-1])
    assert len(seen) == calls and all(s["completion_tokens"] for s in seen), seen
    return seen


def _served(vllm: VllmServer, otel: RunningServer, before: tuple[Scrape, Scrape], calls: int) -> tuple[Scrape, Scrape]:
    """vLLM's own /metrics and otel-llm's, less what they said before: once vLLM finished ``calls`` more
    requests and otel-llm measured as many (every trace decided)."""
    their_before, our_before = before
    target = their_before.value("vllm:e2e_request_latency_seconds_count") + calls
    theirs = poll(vllm, lambda s: s.value("vllm:e2e_request_latency_seconds_count") == target
                  and s.value("vllm:num_requests_running") == 0, f"vLLM finished {calls} more requests")
    ours = otel.wait_until(
        lambda s: s.value("vllm:e2e_request_latency_seconds_count") - our_before.value(
            "vllm:e2e_request_latency_seconds_count") >= calls and s.value("otel_llm_traces_in_memory") == 0,
        timeout_s=120, what=f"{calls} more vLLM requests measured, every trace decided")
    return _delta(theirs, their_before), _delta(ours, our_before)


def _assert_counted_as_vllm_counts(theirs: Scrape, ours: Scrape, served: str, calls: int) -> None:
    """Every finished-request family and TTFT: vLLM's own buckets and sums, under its own model_name."""
    assert {ls["model_name"] for ls in theirs.label_sets("vllm:e2e_request_latency_seconds_count")} == {served}
    for name in (*FINISHED_FAMILIES, TTFT):
        assert ours.value(name + "_count", model_name=served) == calls, name
        assert_family_equal(name, theirs, ours, served)
    for name in ("vllm:prompt_tokens_total", "vllm:generation_tokens_total"):
        assert ours.value(name, model_name=served) == theirs.value(name, model_name=served) > 0, name
    assert ours.value("vllm:e2e_request_latency_seconds_count") == calls  # under no other model name
    assert ours.value("otel_llm_spans_malformed_total") == 0


def _rows(otel: RunningServer, since_ns: int) -> dict[str, list[dict]]:
    """The store's request rows since ``since_ns``, by trace: one per request, a client call joined to
    its engine request described by the engine's row (redaction/stage.py ``one_per_request``)."""
    otel.service.store.flush()
    by_trace: dict[str, list[dict]] = {}
    for row in StoreReader(otel.service.store.path).list_requests(since_unix_ns=since_ns, limit=1000):
        by_trace.setdefault(row["trace_id"], []).append(row)
    return by_trace


def test_the_readme_openai_v2_snippet_joins_its_calls_to_a_live_vllm(chain, tmp_path):
    vllm, otel = chain
    calls, served, since = 6, vllm.served_model, time.time_ns()
    before = (vllm.scrape(), otel.scrape())
    seen = _application(otel, vllm.base_url + "/v1", served, calls, tmp_path)
    assert {s["model"] for s in seen if not s["stream"]} == {served}  # what vLLM answers
    theirs, ours = _served(vllm, otel, before, calls)
    _assert_counted_as_vllm_counts(theirs, ours, served, calls)
    assert ours.value("vllm:generation_tokens_total") == sum(s["completion_tokens"] for s in seen)
    # Client side: each call once, under the model it asked for; joined with its engine request.
    assert ours.value("gen_ai_client_operation_duration_seconds_count") == calls
    assert ours.value("gen_ai_client_operation_duration_seconds_count", gen_ai_request_model=served) == calls
    assert ours.value("otel_llm_client_overhead_seconds_count") == calls
    rows = _rows(otel, since)
    assert len(rows) == calls, rows
    for trace_rows in rows.values():
        assert [(r["engine_kind"], r["model"], r["model_source"]) for r in trace_rows] == \
            [("vllm", served, "resource:service.name")], trace_rows
    print(f"openai-v2 -> vLLM: {calls} calls; vLLM e2e count "
          f"{theirs.value('vllm:e2e_request_latency_seconds_count'):g}, "
          f"otel-llm {ours.value('vllm:e2e_request_latency_seconds_count'):g}, client side "
          f"{ours.value('gen_ai_client_operation_duration_seconds_count'):g}, joined "
          f"{ours.value('otel_llm_client_overhead_seconds_count'):g}")


def test_the_readme_litellm_proxy_between_the_client_and_a_live_vllm(chain, tmp_path):
    """The real openai client (openai-v2) -> the real LiteLLM proxy (the README's config and command) -> the
    live vLLM: one request per call, client, gateway and engine joined; the engine's side counted as vLLM
    counts itself, under vLLM's own model_name, the client's under the alias it asked for. LiteLLM's
    ``litellm_request`` names the model it asked vLLM for as requested, and the alias as the response's."""
    vllm, otel = chain
    config = snippet(README, "litellm-config").address("vllm", vllm.port)
    (tmp_path / "litellm.yaml").write_text(config.text)
    group = yaml.safe_load(config.text)["model_list"][0]
    alias, served = group["model_name"], vllm.served_model
    assert group["litellm_params"]["model"] == f"hosted_vllm/{served}" and alias != served
    port = free_port()
    key = "sk-" + secrets.token_hex(32)
    command = snippet(README, "litellm-proxy").address("otlp-http", otel.http_port).listen_port("litellm", port) \
        .replace(YOUR_SECRET, key).command()
    litellm = str(Path(_instrumentations_python()).with_name("litellm"))
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "LITELLM_", "OPENAI_"))}
    log = (tmp_path / "litellm.log").open("wb")
    proxy = subprocess.Popen(command.program("litellm", litellm), cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT,
                             env={**clean, **LITELLM_OFFLINE, **command.env}, start_new_session=True)
    try:
        wait_healthy("the proxy", proxy, f"http://127.0.0.1:{port}/health/liveliness", tmp_path / "litellm.log", 300)
        sockets = listening_sockets(proxy.pid)
        assert sockets and all(is_loopback(s) for s in sockets), sockets  # --host 127.0.0.1, as shown
        calls, since = 6, time.time_ns()
        before = (vllm.scrape(), otel.scrape())
        seen = _application(otel, f"http://127.0.0.1:{port}/v1", alias, calls, tmp_path, key)
        assert {s["model"] for s in seen if not s["stream"]} == {alias}  # LiteLLM answers with the alias
        theirs, ours = _served(vllm, otel, before, calls)
        _assert_counted_as_vllm_counts(theirs, ours, served, calls)
        assert ours.value("vllm:e2e_request_latency_seconds_count", model_name=alias) == 0
        # What the gateway asked the engine for, and what it answered its caller (LiteLLM's spans).
        assert ours.value("gen_ai_server_request_duration_seconds_count", gen_ai_request_model=served,
                          gen_ai_response_model=alias) == calls
        # The client side: each call once (LiteLLM's own call out is part of it), under the alias it asked for.
        assert ours.value("gen_ai_client_operation_duration_seconds_count") == calls
        assert ours.value("gen_ai_client_operation_duration_seconds_count", gen_ai_request_model=alias,
                          gen_ai_provider_name="openai") == calls
        # Joined: the gateway in front of each engine request, the client call around it.
        assert ours.value("otel_llm_gateway_overhead_seconds_count", model_name=served) == calls
        assert ours.value("otel_llm_client_overhead_seconds_count", model_name=served) == calls
        rows = _rows(otel, since)
        assert len(rows) == calls, rows
        for trace_rows in rows.values():  # one row per call: the engine's, its gateway and client joined
            assert [(r["engine_kind"], r["model"], r["model_source"]) for r in trace_rows] == \
                [("vllm", served, "resource:service.name")], trace_rows
            assert trace_rows[0]["gateway_overhead_s"] is not None, trace_rows
        print(f"openai-v2 -> LiteLLM ({alias}) -> vLLM ({served}): {calls} calls")
        print_comparison(theirs, ours, served)
        client = ours.value("gen_ai_client_operation_duration_seconds_count", gen_ai_request_model=alias)
        print(f"client side {client:g}"
              f" ({alias}), gateway joined {ours.value('otel_llm_gateway_overhead_seconds_count'):g}, client joined "
              f"{ours.value('otel_llm_client_overhead_seconds_count'):g}, store: {len(rows)} rows, one per trace")
    finally:
        stop_group(proxy)
        log.close()

