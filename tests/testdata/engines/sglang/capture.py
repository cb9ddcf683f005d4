"""Capture the OTLP spans SGLang 0.5.23 emits for one request, without a GPU.

Run with the *separate* venv that holds ``sglang==0.5.23`` (installed with
``--no-deps``) plus requirements.txt in this directory::

    python3.11 -m venv /work/sglang-venv
    /work/sglang-venv/bin/pip install --no-deps sglang==0.5.23
    /work/sglang-venv/bin/pip install -r tests/testdata/engines/sglang/requirements.txt
    /work/sglang-venv/bin/python tests/testdata/engines/sglang/capture.py [scenario ...]

What is real and what is not
----------------------------
*Real SGLang code* (imported from the installed wheel, unmodified):
``sglang/srt/observability/trace.py`` (TraceReqContext, process_tracing_init,
trace_set_thread_info, the custom 64-bit id generator, the OTLP exporter
selection), ``sglang/srt/observability/req_time_stats.py``
(APIServerReqTimeStats, SchedulerReqTimeStats, set_time_batch,
set_schedule_time_batch, RequestStage), ``trace_async.py``, ``environ.py``,
``runtime_context.py``, ``utils/poll_timer.py``, ``arg_groups/prefill_buffer_ceiling.py``.

*Loaded from the real source by AST, nothing else of those files executed*
(their modules import torch/triton): ``DisaggregationMode``
(disaggregation/utils.py), ``ForwardMode`` (model_executor/forward_batch_info.py),
``get_bool_env_var`` / ``get_int_env_var`` (utils/common.py).

*Stubbed*: ``observability/metrics_collector.py`` (imports ServerArgs → torch).
Its three classes are only type hints in req_time_stats.py and are used only with
``--enable-metrics``; this capture runs with tracing only (``--enable-trace``).

*Driven by this script*: the call sequence of TokenizerManager / Scheduler /
MultiTokenizerRouter (which need a model).  Every call below cites the line of
SGLang 0.5.23 that makes it; process boundaries are real OS processes and the
hand-off is a real ``pickle`` round trip, as SGLang's ZMQ ``send_pyobj`` does, so
TraceReqContext.__getstate__/__setstate__ run exactly as in a server.  Sleeps
stand in for the work (tokenization, queue wait, forward passes).

Output: one ``<scenario>.binpb`` per scenario = the concatenation of every raw
OTLP/HTTP body the receiver got for that scenario (a concatenation of serialized
``ExportTraceServiceRequest`` messages is itself a valid one: repeated fields
merge), plus ``summary.json`` with the numbers the README quotes.
"""

from __future__ import annotations

import ast
import enum
import gc
import http.server
import importlib.util
import json
import multiprocessing as mp
import os
import pickle
import sys
import threading
import time
import types
from pathlib import Path
from types import SimpleNamespace

HERE = Path(__file__).resolve().parent

# Per-scenario timings (seconds) the sleeps stand in for.
TOKENIZE_S = 0.003
SCHED_RECV_TO_QUEUE_S = 0.001
QUEUE_WAIT_S = 0.030
PREFILL_S = 0.017
DECODE_STEP_S = 0.005
DECODE_STEPS = 8  # tokens after the first
PROMPT_TOKENS = 24
CACHED_TOKENS = 0
MODEL = "Qwen/Qwen3-0.6B"


# --------------------------------------------------------------------------
# Loading SGLang's observability code without torch
# --------------------------------------------------------------------------
def _extract(path: Path, names: set[str], ns: dict) -> None:
    """Exec only the top-level defs/assignments called ``names`` of ``path``."""
    tree = ast.parse(path.read_text(), str(path))
    keep = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name in names:
            keep.append(node)
        elif isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id in names for t in node.targets
        ):
            keep.append(node)
    missing = names - {getattr(n, "name", None) or n.targets[0].id for n in keep}
    assert not missing, f"{path}: {missing} not found"
    exec(compile(ast.Module(body=keep, type_ignores=[]), str(path), "exec"), ns)


def load_sglang():
    if "sglang.srt.observability.req_time_stats" in sys.modules:
        return
    spec = importlib.util.find_spec("sglang")  # does not run sglang/__init__.py
    root = Path(list(spec.submodule_search_locations)[0])
    srt = root / "srt"

    def pkg(name, path):
        m = types.ModuleType(name)
        m.__path__ = [str(path)]
        sys.modules[name] = m
        return m

    pkg("sglang", root)  # skip sglang/__init__.py (frontend language, HF patches)
    utils = pkg("sglang.srt.utils", srt / "utils")  # skip utils/__init__ (torch)
    import logging

    ns = {"os": os, "logger": logging.getLogger("sglang.srt.utils.common")}
    _extract(srt / "utils/common.py",
             {"get_bool_env_var", "get_int_env_var", "_warned_bool_env_var_keys"}, ns)
    utils.get_bool_env_var = ns["get_bool_env_var"]
    utils.get_int_env_var = ns["get_int_env_var"]

    m = types.ModuleType("sglang.srt.disaggregation.utils")
    ns = {"Enum": enum.Enum}
    _extract(srt / "disaggregation/utils.py", {"DisaggregationMode"}, ns)
    m.DisaggregationMode = ns["DisaggregationMode"]
    sys.modules[m.__name__] = m

    m = types.ModuleType("sglang.srt.model_executor.forward_batch_info")
    ns = {"IntEnum": enum.IntEnum, "auto": enum.auto}
    _extract(srt / "model_executor/forward_batch_info.py", {"ForwardMode"}, ns)
    m.ForwardMode = ns["ForwardMode"]
    sys.modules[m.__name__] = m

    # trace.py TraceReqContext.abort() imports BaseFinishReason lazily.
    m = types.ModuleType("sglang.srt.managers.schedule_batch")
    ns = {}
    _extract(srt / "managers/schedule_batch.py", {"BaseFinishReason"}, ns)
    m.BaseFinishReason = ns["BaseFinishReason"]
    sys.modules[m.__name__] = m

    m = types.ModuleType("sglang.srt.observability.metrics_collector")
    for cls in ("EncoderMetricsCollector", "SchedulerMetricsCollector",
                "TokenizerMetricsCollector"):
        setattr(m, cls, type(cls, (), {}))
    sys.modules[m.__name__] = m

    import sglang.srt.observability.req_time_stats  # noqa: F401  (real file)


def init_process(endpoint: str, thread_label: str, **ranks):
    """What every SGLang process does at start-up when --enable-trace is set:
    http_server.py:321-330 (tokenizer), scheduler.py:6347-6357 (scheduler)."""
    load_sglang()
    from sglang.srt.observability import trace as T

    T.process_tracing_init(endpoint, None, trace_modules="request")
    if thread_label:
        T.trace_set_thread_info(thread_label, **ranks)
    return T


def flush():
    from opentelemetry import trace

    trace.get_tracer_provider().force_flush()


class RecordingCollector:
    """Stand-in for SchedulerMetricsCollector (metrics_collector.py imports torch)."""

    def __init__(self):
        self.observed = []

    def observe_per_stage_req_latency(self, stage, latency):
        self.observed.append((stage, latency))

    def observe_queue_time(self, latency):
        self.observed.append(("queue_time", latency))


# --------------------------------------------------------------------------
# Scheduler process (sglang/srt/managers/scheduler.py + batch_result_processor.py)
# --------------------------------------------------------------------------
def scheduler_main(conn, endpoint, scenario):
    init_process(endpoint, "Scheduler", tp_rank=0, dp_rank=None, pp_rank=0)
    from sglang.srt.model_executor.forward_batch_info import ForwardMode
    from sglang.srt.observability import req_time_stats as R

    conn.send_bytes(b"ready")
    msg = pickle.loads(conn.recv_bytes())  # zmq recv_pyobj
    # schedule_batch.py:1387-1392 (Req.__init__)
    req = SimpleNamespace(rid=msg["rid"])
    req.time_stats = R.SchedulerReqTimeStats.new_from_obj(msg["time_stats"])
    # --enable-metrics: SchedulerMetricsCollector (stubbed: it only records the two
    # observations req_time_stats.py:282-286 and :809-813 make; spans are unaffected).
    req.time_stats.set_metrics_collector(RecordingCollector() if scenario.endswith("_metrics") else None)
    req.time_stats.set_scheduler_recv_time()
    conn.send_bytes(pickle.dumps({"scheduler_tracing": req.time_stats.trace_ctx.tracing_enable}))
    time.sleep(SCHED_RECV_TO_QUEUE_S)  # validation, tokenizer-side checks
    # scheduler.py:3493-3494 (_add_request_to_queue)
    req.time_stats.set_wait_queue_entry_time()

    if scenario == "abort_waiting":
        abort = pickle.loads(conn.recv_bytes())  # AbortReq from tokenizer
        assert abort["abort"] == req.rid
        # scheduler.py:5687-5703 (abort_request: pop from waiting_queue,
        # _release_aborted_request, send_abort_output); the Req is then dropped
        # and TraceReqContext.__del__ (trace.py) closes the open thread span.
        conn.send_bytes(pickle.dumps({"rid": req.rid, "abort": True}))
        del req
        gc.collect()
        flush()
        conn.recv_bytes()
        return

    time.sleep(QUEUE_WAIT_S)  # other batches run; request waits in waiting_queue
    # scheduler.py:4332 then scheduler.py:4023
    R.set_time_batch([req], "set_forward_entry_time")
    R.set_schedule_time_batch(SimpleNamespace(reqs=[req], forward_mode=ForwardMode.EXTEND))
    time.sleep(PREFILL_S)  # prefill forward
    # batch_result_processor.py:352 (process_batch_result_prefill)
    req.time_stats.set_prefill_finished_time()
    out = {"rid": req.rid, "finished": False, "completion_tokens": 1,
           "time_stats": [req.time_stats]}
    if msg["stream"]:
        conn.send_bytes(pickle.dumps(out))  # stream_output -> detokenizer -> tokenizer
    aborted = False
    for step in range(DECODE_STEPS):
        if scenario == "abort_running" and conn.poll():
            # scheduler.py:5797-5812 (abort_request, running batch: "Abort method
            # 3: set to_finish = FINISH_ABORT()"); the request finishes at this step.
            assert pickle.loads(conn.recv_bytes())["abort"] == req.rid
            aborted = True
        R.set_schedule_time_batch(SimpleNamespace(reqs=[req], forward_mode=ForwardMode.DECODE))
        time.sleep(DECODE_STEP_S)
        # batch_result_processor.py:1034 (process_batch_result_decode)
        req.time_stats.set_last_decode_finish_time()
        last = step == DECODE_STEPS - 1 or aborted
        if last:
            # batch_result_processor.py:1468 (finished: release KV, completion)
            req.time_stats.set_completion_time()
        out = {"rid": req.rid, "finished": last, "completion_tokens": step + 2,
               "finish_reason": (
                   {"type": "abort", "message": "Aborted", "status_code": None, "err_type": None}
                   if aborted else {"type": "length", "length": DECODE_STEPS + 1}) if last else None,
               "time_stats": [req.time_stats]}
        if msg["stream"] or last:
            conn.send_bytes(pickle.dumps(out))
        if last:
            break
    flush()
    collector = req.time_stats.metrics_collector
    if collector is not None:
        (HERE / f"{scenario}.metrics.json").write_text(json.dumps(
            {"observed_seconds": collector.observed}, indent=2) + "\n")
    conn.recv_bytes()  # wait for "done"


# --------------------------------------------------------------------------
# MultiTokenizerRouter process (managers/multi_tokenizer_mixin.py)
# --------------------------------------------------------------------------
def router_main(up, down, endpoint, init_tracing):
    load_sglang()
    if init_tracing:
        # 0.5.23: MultiTokenizerRouter.__init__ (multi_tokenizer_mixin.py:609-615)
        init_process(endpoint, "")
    up.send_bytes(down.recv_bytes())  # scheduler's "ready"
    # router_worker_obj: recv_pyobj -> send_pyobj (unpickle + re-pickle)
    obj = pickle.loads(up.recv_bytes())
    down.send_bytes(pickle.dumps(obj))
    while True:  # scheduler -> tokenizer direction
        b = down.recv_bytes()
        up.send_bytes(b)
        o = pickle.loads(b)
        if o.get("finished") or o.get("abort"):
            break
    down.send_bytes(up.recv_bytes())  # the tokenizer's "bye"
    if init_tracing:
        flush()


# --------------------------------------------------------------------------
# Tokenizer (main process; managers/tokenizer_manager.py)
# --------------------------------------------------------------------------
def span_attrs(rid, out, sampling_params):
    """TokenizerManager.convert_to_span_attrs (tokenizer_manager.py:3944-4012)."""
    from sglang.srt.observability.trace import SpanAttributes as A

    a = {A.GEN_AI_USAGE_COMPLETION_TOKENS: out["completion_tokens"],
         A.GEN_AI_USAGE_PROMPT_TOKENS: PROMPT_TOKENS,
         A.GEN_AI_USAGE_CACHED_TOKENS: CACHED_TOKENS,
         A.GEN_AI_REQUEST_ID: rid}
    if v := sampling_params.get("max_new_tokens"):
        a[A.GEN_AI_REQUEST_MAX_TOKENS] = v
    if v := sampling_params.get("top_p"):
        a[A.GEN_AI_REQUEST_TOP_P] = v
    if v := sampling_params.get("temperature"):
        a[A.GEN_AI_REQUEST_TEMPERATURE] = v
    if v := sampling_params.get("top_k"):
        a[A.GEN_AI_REQUEST_TOP_K] = v
    if v := sampling_params.get("n"):
        a[A.GEN_AI_REQUEST_N] = v
    a[A.GEN_AI_RESPONSE_MODEL] = MODEL
    fr = out.get("finish_reason")
    if fr and fr.get("type"):
        a[A.GEN_AI_RESPONSE_FINISH_REASONS] = json.dumps([fr["type"]])
    return a


def scheduler_first_token_time(created_time, stream, out):
    """TokenizerManager._get_scheduler_first_token_time (tokenizer_manager.py:2800-2809)."""
    if stream or out.get("time_stats") is None:
        return None
    ts = out["time_stats"][0].prefill_finished_time
    if created_time < ts <= time.perf_counter():
        return ts
    return None


def run_tokenizer(scenario, rid, conn, stream, traceparent=None):
    from sglang.srt.disaggregation.utils import DisaggregationMode
    from sglang.srt.observability import req_time_stats as R

    sampling = {"max_new_tokens": DECODE_STEPS + 1, "temperature": 0.7, "top_p": 0.9}
    received_time = time.perf_counter()  # serving_base.py:86 (HTTP handler entry)
    # tokenizer_manager.py:3841-3845 (_init_req_state)
    ts = R.APIServerReqTimeStats(disagg_mode=DisaggregationMode.NULL)
    headers = {"traceparent": traceparent} if traceparent else None
    ts.init_trace_ctx(rid, None, headers)
    ts.set_created_time(received_time)
    time.sleep(TOKENIZE_S)  # tokenizer(...)
    ts.set_tokenize_finish_time()  # tokenizer_manager.py:1660
    # tokenizer_manager.py:1785-1796 (_send_one_request)
    ts.set_api_server_dispatch_time()
    conn.send_bytes(pickle.dumps({"rid": rid, "stream": stream, "time_stats": ts}))
    ts.set_api_server_dispatch_finish_time()
    info = pickle.loads(conn.recv_bytes())

    if scenario == "abort_waiting":
        time.sleep(0.010)  # client disconnects while the request waits
        conn.send_bytes(pickle.dumps({"abort": rid}))  # abort_request -> AbortReq
        pickle.loads(conn.recv_bytes())
        # tokenizer_manager.py:3580-3594 (_handle_abort_req)
        ts.set_finished_time()
        return ts, info

    n_out = 0
    while True:  # handle_loop / _handle_batch_output (tokenizer_manager.py:2733-2752)
        out = pickle.loads(conn.recv_bytes())
        n_out += 1
        if scenario == "abort_running" and n_out == 3:
            conn.send_bytes(pickle.dumps({"abort": rid}))  # client disconnect -> abort_request
        first_output_time = None
        if ts.first_token_time == 0.0:
            first_output_time = time.perf_counter()
            ts.set_first_token_time(
                ts=scheduler_first_token_time(ts.created_time, stream, out) or first_output_time)
            ts.set_last_time(ts=first_output_time)
        else:
            ts.set_last_time()
        if out["finished"]:
            ts.set_finished_time(ts=first_output_time, span_attrs=span_attrs(rid, out, sampling))
            return ts, info


# --------------------------------------------------------------------------
# Capture receiver and scenarios
# --------------------------------------------------------------------------
class Receiver(http.server.BaseHTTPRequestHandler):
    bodies: list = []

    def do_POST(self):
        n = int(self.headers.get("Content-Length", 0))
        Receiver.bodies.append((self.path, self.headers.get("Content-Type"), self.rfile.read(n)))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *a):
        pass


SCENARIOS = {
    # name: (stream, multi_tokenizer, router_inits_tracing, traceparent)
    "normal_stream": (True, False, None,
                      "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),
    "normal_nonstream": (False, False, None, None),
    "normal_nonstream_metrics": (False, False, None, None),
    "abort_waiting": (True, False, None, None),
    "abort_running": (True, False, None, None),
    "multi_tokenizer_router_traced": (True, True, True, None),
    "multi_tokenizer_router_untraced": (True, True, False, None),
}
RIDS = {
    "normal_stream": "5e58f0745bc24ddca4183d2f32b687c9",
    "normal_nonstream": "1a2b3c4d5e6f40718293a4b5c6d7e8f9",
    "normal_nonstream_metrics": "99aa88bb77cc66dd55ee44ff33001122",
    "abort_waiting": "deadbeef00114477aabbccddeeff0011",
    "abort_running": "abad1dea99887766554433221100ffee",
    "multi_tokenizer_router_traced": "c0ffee0012345678123456781234abcd",
    "multi_tokenizer_router_untraced": "facade0087654321876543218765dcba",
}


def main():
    os.environ["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"] = "http/protobuf"
    os.environ["SGLANG_OTLP_EXPORTER_SCHEDULE_DELAY_MILLIS"] = "50"
    os.environ.pop("SGLANG_TRACE_ASYNC", None)
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    endpoint = f"http://127.0.0.1:{srv.server_address[1]}/v1/traces"
    ctx = mp.get_context("spawn")
    wanted = sys.argv[1:] or list(SCENARIOS)
    summary_path = HERE / "summary.json"
    summary = json.loads(summary_path.read_text()) if sys.argv[1:] and summary_path.exists() else {}
    for name in wanted:
        stream, multi, router_init, tp = SCENARIOS[name]
        label = "MultiTokenizer-0" if multi else "Tokenizer"
        # One tokenizer process per label (threads_info is per native thread id).
        parent, child = ctx.Pipe()
        tok_parent, tok_child = ctx.Pipe()
        sched = ctx.Process(target=scheduler_main, args=(child, endpoint, name))
        sched.start()
        procs = [sched]
        if multi:
            up_a, up_b = ctx.Pipe()
            router = ctx.Process(target=router_main, args=(up_b, parent, endpoint, router_init))
            router.start()
            procs.append(router)
            tok_conn = up_a
        else:
            tok_conn = parent
        tproc = ctx.Process(target=tokenizer_proc,
                            args=(tok_child, endpoint, label, name, RIDS[name], stream, tp))
        assert tok_conn.recv_bytes() == b"ready"
        start = len(Receiver.bodies)
        tproc.start()
        procs.append(tproc)
        # relay: tokenizer process <-> scheduler/router pipe
        relay(tok_parent, tok_conn, multi)
        for p in procs:
            p.join(timeout=30)
            assert p.exitcode == 0, (name, p)
        time.sleep(0.3)
        bodies = Receiver.bodies[start:]
        assert bodies, name
        (HERE / f"{name}.binpb").write_bytes(b"".join(b for _, _, b in bodies))
        summary[name] = {"otlp_bodies": len(bodies),
                         "paths": sorted({p for p, _, _ in bodies}),
                         "content_types": sorted({c for _, c, _ in bodies})}
    srv.shutdown()
    summary_path.write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
    print(json.dumps(summary, indent=2))


def relay(tok, sched, multi):
    """Forward bytes between the tokenizer process and the scheduler (or router)."""
    done = False
    while not done:
        for src, dst in ((tok, sched), (sched, tok)):
            if src.poll(0.001):
                b = src.recv_bytes()
                if b == b"done":
                    sched.send_bytes(pickle.dumps({"bye": True}))
                    done = True
                    break
                dst.send_bytes(b)


def tokenizer_proc(conn, endpoint, label, scenario, rid, stream, traceparent):
    init_process(endpoint, label)
    ts, info = run_tokenizer(scenario, rid, conn, stream, traceparent)
    flush()
    conn.send_bytes(b"done")


if __name__ == "__main__":
    main()
