"""``otel-llm simulate``: a realistic fleet's traces, sent to an OTLP endpoint through the real SDK."""

from __future__ import annotations

import argparse
import random
import signal
import sys
import threading
import time
from datetime import UTC, datetime

from otel_llm.confmap import ConfigError, parse_duration
from otel_llm_simulate.runner import format_summary, otlp_exporter_factory, run_plan
from otel_llm_simulate.scenarios import APP_SHARES, DEFAULT_MODELS, SCENARIOS, plan, select_models

EXIT_EXPORT_FAILED = 1
EXIT_INTERRUPTED = 130  # the shell's convention for SIGINT
_DEFAULT_PORTS = {"grpc": 4317, "http": 4318}


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text!r}")
    return value


def _duration(text: str) -> float:
    try:
        value = parse_duration(text, "--duration")
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text!r}")
    return value


def add_simulate_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    scenarios = "; ".join(f"{s.name}: {s.description}" for s in SCENARIOS.values())
    parser = sub.add_parser(
        "simulate",
        help="emit a realistic fleet's traces to an OTLP endpoint",
        description="Send the traces of a simulated LLM fleet (vLLM, SGLang, TGI behind a gateway or a "
        "LiteLLM proxy, and an application tier with GenAI CLIENT spans) to an OTLP endpoint, as their own "
        "SDKs do. The same --seed (with the same other options) "
        f"gives the same traces. Scenarios: {scenarios}.",
    )
    parser.add_argument("--endpoint", help="HOST:PORT of the OTLP receiver (default localhost:4317 for grpc, "
                        "localhost:4318 for http); a URL works too")
    parser.add_argument("--protocol", choices=("grpc", "http"), default="grpc",
                        help="OTLP/gRPC (insecure, as vLLM and SGLang use it) or OTLP/HTTP protobuf to /v1/traces")
    parser.add_argument("--rate", type=_positive_float, default=5.0, help="requests per second (default 5)")
    parser.add_argument("--duration", type=_duration, default=60.0,
                        help="length of the window, e.g. 30s, 2m or seconds (default 60s)")
    parser.add_argument("--seed", type=int,
                        help="random seed: same seed, same traces (default: a new one per run, printed)")
    parser.add_argument("--scenario", choices=sorted(SCENARIOS), default="steady",
                        help="traffic shape (default steady)")
    parser.add_argument("--models", nargs="+", metavar="MODEL",
                        help="only these models (space or comma separated) of: "
                        + ", ".join(m.name for m in DEFAULT_MODELS))
    parser.add_argument("--provisioned-rate", type=_positive_float,
                        help="requests/s the engines are sized for, at ~60%% busy (default: --rate); "
                        "below --rate overloads every model")
    parser.add_argument("--fast", action="store_true",
                        help="send everything at once instead of in real time (the window then ends now)")
    parser.add_argument("--start", type=float, metavar="UNIX_SECONDS",
                        help="start of the window (default: now, or now - duration with --fast); "
                        "fixing it makes runs byte-for-byte reproducible")
    parser.add_argument("--max-requests", type=int, metavar="N", help="send at most N requests")
    parser.add_argument("--export-timeout", type=_duration, default=10.0, help="per OTLP export (default 10s)")
    parser.add_argument("--list", action="store_true", help="list scenarios and models, then exit")
    parser.set_defaults(func=_simulate)


def _list() -> int:
    print("scenarios:")
    for s in SCENARIOS.values():
        print(f"  {s.name:<13} {s.description}")
    print("models:")
    total = sum(m.weight for m in DEFAULT_MODELS)
    for m in DEFAULT_MODELS:
        via = ("via gateway" if m.gateway_share >= 1 else "called directly" if m.gateway_share <= 0
               else f"via gateway {m.gateway_share:.0%}")
        print(f"  {m.name:<24} {m.engine:<15} {m.service_name:<16} share {m.weight / total:.0%}, "
              f"prompt ~{m.prompt_median} tok, output ~{m.output_median} tok, {m.tpot_s * 1000:.0f} ms/token, {via}")
    print("app tier (openai-v2 CLIENT spans; the rest of the traffic comes from uninstrumented callers):")
    notes = {
        "vllm_via_litellm": "of answered vLLM requests: app -> LiteLLM proxy -> vLLM (caller's traceparent forwarded)",
        "vllm_direct": "of answered vLLM requests: app -> vLLM",
        "vllm_via_gateway": "of answered vLLM requests: app -> gateway -> vLLM",
        "other_via_gateway": "of the other non-aborted requests via the gateway (SGLang, TGI, trtllm-serve, its 5xx): "
                             "app -> gateway",
        "sglang_unpropagated": "of answered direct SGLang requests: app without HTTP instrumentation (no traceparent)",
    }
    for path, share in APP_SHARES.items():
        print(f"  {share:>4.0%} {notes.get(path, path)}")
    return 0


def _simulate(args: argparse.Namespace) -> int:
    if args.list:
        return _list()
    names = [n for item in args.models or () for n in item.split(",") if n]
    try:
        models = select_models(names)
    except ValueError as exc:
        print(f"otel-llm simulate: {exc}", file=sys.stderr)
        return 2
    if args.max_requests is not None and args.max_requests < 0:
        print("otel-llm simulate: --max-requests must be >= 0", file=sys.stderr)
        return 2
    endpoint = args.endpoint or f"localhost:{_DEFAULT_PORTS[args.protocol]}"
    # A fixed default seed would make a second run re-send the first run's trace ids, which a
    # running otel-llm has already decided (and so treats as late spans): new seed unless asked.
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1, 1_000_000)
    duration_ns = round(args.duration * 1e9)
    if args.start is not None:
        start_ns = round(args.start * 1e9)
    else:
        # --fast replays a window that has just ended, so no span claims to end in the future.
        start_ns = time.time_ns() - (duration_ns if args.fast else 0)
    the_plan = plan(
        args.scenario, seed=seed, rate=args.rate, duration_s=args.duration, start_ns=start_ns,
        models=models, provisioned_rate=args.provisioned_rate, max_requests=args.max_requests,
    )
    started = datetime.fromtimestamp(start_ns / 1e9, tz=UTC).isoformat(timespec="seconds")
    slots = ", ".join(f"{name} {n}" for name, n in the_plan.slots.items())
    print(
        f"otel-llm simulate: scenario {the_plan.scenario}, seed {seed}, {args.rate:g} req/s for "
        f"{args.duration:g}s from {started} -> {len(the_plan.requests)} requests, "
        f"{args.protocol} {endpoint}{' (fast)' if args.fast else ''}\n"
        f"engine slots (sized for {the_plan.provisioned_rate:g} req/s): {slots}",
        flush=True,
    )

    # SIGINT/SIGTERM end the run cleanly: what is queued is flushed and the summary still printed.
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        result = run_plan(
            the_plan,
            otlp_exporter_factory(endpoint, args.protocol, args.export_timeout),
            realtime=not args.fast,
            stop=stop,
            progress=lambda line: print(f"  {line}", flush=True),
        )
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    print(format_summary(the_plan, result), flush=True)
    if result.interrupted and not result.unreachable:
        return EXIT_INTERRUPTED
    return 0 if result.ok else EXIT_EXPORT_FAILED
