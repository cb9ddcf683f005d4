"""``otel-llm``: serve, validate."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
import time
from typing import Any

from otel_llm import __version__
from otel_llm.config import (ConfigError, check_certificates, config_warnings, load_config, parse_duration,
                             running_extensions)
from otel_llm.internal.runtime import raise_fd_limit, tune_gc

EXIT_CONFIG = 2  # the config cannot run (also what `validate` rejects)
EXIT_ENVIRONMENT = 1  # the machine refuses it: a port in use, a key that does not match its certificate


def _serve(args: argparse.Namespace) -> int:
    from otel_llm.service.service import Service

    try:
        config = load_config(args.config)
    except ConfigError as exc:
        print(f"otel-llm: invalid config: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    for warning in config_warnings(config):
        logging.getLogger("otel_llm").warning("%s", warning)
    before, after = raise_fd_limit()  # before anything opens a socket; the receiver processes inherit it
    if after != before:
        logging.getLogger("otel_llm").info("open file limit raised from %d to %d", before, after)
    # Handlers go in before anything listens, so a SIGTERM right after /readyz turns 200 is a clean stop.
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    # What the machine refuses (a port in use, a key that does not match its certificate, a store
    # it cannot open) is one line naming the component and exit 1, within seconds; no traceback.
    try:
        service = Service(config)
        service.start()
    except ConfigError as exc:
        print(f"otel-llm: invalid config: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    except OSError as exc:
        print(f"otel-llm: cannot start: {exc}", file=sys.stderr)
        return EXIT_ENVIRONMENT
    except Exception as exc:  # a bug: still one line for the operator, the traceback at debug level
        logging.getLogger("otel_llm").debug("start-up failed", exc_info=True)
        print(f"otel-llm: cannot start: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_ENVIRONMENT
    # A short GIL switch interval lets the thread that drains the receivers' pipe run promptly
    # while the pipeline worker is busy: with the default 5 ms the pipe filled and Export p99 at
    # 20 000 spans/s rose from ~8.5 to ~12 ms (bench), for ~8 % more throughput at saturation.
    tune_gc(switch_interval_s=0.001)
    parts = []
    if service.grpc_port:
        parts.append(f"OTLP/gRPC :{service.grpc_port}")
    if service.http_port:
        parts.append(f"OTLP/HTTP :{service.http_port}")
    if service.prometheus is not None:
        parts.append(f"metrics :{service.prometheus.port}/metrics")
    ports = {"webview": service.webview.port} if service.webview is not None else {}
    print(f"otel-llm {__version__} ready: {', '.join(parts)}; extensions: {running_extensions(config, ports)}",
          flush=True)
    while not stop.wait(0.5):  # a timed wait lets the main thread run signal handlers promptly
        if service.failed:
            print("otel-llm: an ingest process died; stopping (completing pending traces)", file=sys.stderr,
                  flush=True)
            service.stop()
            return EXIT_ENVIRONMENT
    print("otel-llm: stopping (completing pending traces)", flush=True)
    service.stop()
    return 0


URL_DEFAULT = "http://127.0.0.1:9464"
EXPLAIN_TIMEOUT_S = 30.0


def _validate(args: argparse.Namespace) -> int:
    if args.config_flag is not None:  # `--config FILE`, as `otelcol validate --config=FILE`
        if args.config is not None:
            print("otel-llm validate: give the config file once: FILE or --config FILE", file=sys.stderr)
            return EXIT_CONFIG
        args.config = args.config_flag
    if args.explain:
        if args.config is not None:
            print("otel-llm validate: --explain reads a running instance (--url), not a config file: give one "
                  "or the other", file=sys.stderr)
            return EXIT_CONFIG
        if args.top < 1:
            print(f"otel-llm validate: --top must be at least 1, got {args.top}", file=sys.stderr)
            return EXIT_CONFIG
        if not 0 < args.timeout <= 3600:
            print(f"otel-llm validate: --timeout must be between 0 and 3600 seconds, got {args.timeout:g}",
                  file=sys.stderr)
            return EXIT_CONFIG
        return _explain(args)
    if args.top != 3 or args.url != URL_DEFAULT or args.timeout != EXPLAIN_TIMEOUT_S:
        print("otel-llm validate: --url, --top and --timeout go with --explain", file=sys.stderr)
        return EXIT_CONFIG
    if args.config is None:
        print("otel-llm validate: give a config file, or --explain [--url URL] for a running instance", file=sys.stderr)
        return EXIT_CONFIG
    try:
        config = load_config(args.config)
        check_certificates(config)
    except ConfigError as exc:
        print(f"{args.config}: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    for warning in config_warnings(config):
        print(f"{args.config}: warning: {warning}", file=sys.stderr)
    print(f"{args.config}: ok; extensions: {running_extensions(config)}")
    return 0


def _explain(args: argparse.Namespace) -> int:
    from otel_llm.explain import diagnose, fetch, render

    try:
        exposition = fetch(args.url, deadline_s=args.timeout)
    except OSError as exc:
        print(f"otel-llm: cannot read {args.url.rstrip('/')}/metrics: {exc}", file=sys.stderr)
        return 1
    sys.stdout.write(render(diagnose(exposition), top=args.top))
    return 0


def _reader(args: argparse.Namespace):  # noqa: ANN202 - StoreReader or ApiReader, same methods
    if args.api:
        return ApiReader(args.api)
    from pathlib import Path

    from otel_llm.exporter.store.sqlite import StoreReader

    return StoreReader(Path(args.store))


class ApiReader:
    """The same reads as StoreReader, through a running otel-llm's JSON API."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url.rstrip("/")

    def _get(self, path: str) -> dict[str, Any]:
        import json
        import urllib.error
        import urllib.request

        try:
            with urllib.request.urlopen(self.base_url + path, timeout=10) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as err:
            if err.code == 404:
                return {}
            raise ValueError(json.loads(err.read() or b"{}").get("error", str(err))) from None

    def list_requests(self, **query: object) -> list[dict[str, Any]]:
        import urllib.parse

        params = {k.replace("_unix_ns", ""): v for k, v in query.items() if v is not None}
        return self._get("/api/traces?" + urllib.parse.urlencode(params)).get("traces", [])

    def get_trace(self, trace_id: str) -> dict[str, Any] | None:
        return self._get(f"/api/traces/{trace_id}") or None


def _traces(args: argparse.Namespace) -> int:
    from otel_llm.exporter.store.sqlite import StoreError
    from otel_llm.traceview import render_table

    since = int((time.time() - args.since) * 1e9) if args.since is not None else None
    try:
        rows = _reader(args).list_requests(model=args.model, outcome=args.outcome, service=args.service,
                                           sort=args.sort, limit=args.limit, since_unix_ns=since)
    except (FileNotFoundError, ValueError, OSError, StoreError) as exc:
        print(f"otel-llm: {exc}", file=sys.stderr)
        return 1
    sys.stdout.write(render_table(rows))
    return 0


def _summary(args: argparse.Namespace) -> int:
    import urllib.request

    from otel_llm.traceview import render_summary, summarize

    try:
        with urllib.request.urlopen(args.api.rstrip("/") + "/metrics", timeout=30) as response:
            text = response.read().decode("utf-8", "replace")
        rows = summarize(text)
    except (OSError, ValueError) as exc:
        print(f"otel-llm: {exc}", file=sys.stderr)
        return 1
    sys.stdout.write(render_summary(rows))
    return 0


def _trace(args: argparse.Namespace) -> int:
    from otel_llm.exporter.store.sqlite import StoreError
    from otel_llm.traceview import render_waterfall

    try:
        trace = _reader(args).get_trace(args.trace_id)
    except (FileNotFoundError, ValueError, OSError, StoreError) as exc:
        print(f"otel-llm: {exc}", file=sys.stderr)
        return 1
    if trace is None:
        print(f"otel-llm: trace {args.trace_id} is not in the store (only kept traces are stored)", file=sys.stderr)
        return 1
    sys.stdout.write(render_waterfall(trace, width=args.width))
    if trace.get("next_span_offset") is not None:  # answers are paged (exporters/store: TRACE_ANSWER_SPANS)
        print(f"otel-llm: showing the first {len(trace['spans'])} of the trace's {trace['span_count']} spans",
              file=sys.stderr)
    return 0


def _add_source(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--store", default="./otel-llm-data", help="trace store directory (default ./otel-llm-data)")
    parser.add_argument("--api", help="read through a running otel-llm instead, e.g. http://127.0.0.1:9464")


def build_parser(simulate: bool = True) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="otel-llm", description="OTLP endpoint for LLM inference fleets.")
    parser.add_argument("--version", action="version", version=f"otel-llm {__version__}")
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the receivers, pipeline and exporters")
    serve.add_argument("--config", help="YAML config file (default: the embedded defaults)")
    serve.set_defaults(func=_serve)
    validate = sub.add_parser("validate", help="check a config file and exit (2 if invalid); with --explain, the "
                              "likeliest reasons a running instance's numbers are missing")
    validate.add_argument("config", nargs="?", help="YAML config file")
    validate.add_argument("--config", dest="config_flag", metavar="FILE",
                          help="YAML config file, as the Collector's `validate --config=FILE` (the same as FILE)")
    validate.add_argument("--explain", action="store_true",
                          help="read a running otel-llm's own counters (--url) and name the likeliest reasons numbers "
                               "are missing, each with its section of docs/troubleshooting.md")
    validate.add_argument("--url", default=URL_DEFAULT,
                          help="with --explain: the otel-llm whose /metrics to read (default: %(default)s)")
    validate.add_argument("--top", type=int, default=3, help="with --explain: how many reasons to show (default: 3)")
    validate.add_argument("--timeout", type=float, default=EXPLAIN_TIMEOUT_S,
                          help="with --explain: seconds to read the whole answer in, however slowly it comes; at "
                               "most 64 MiB of it are read (default: %(default)g)")
    validate.set_defaults(func=_validate)
    traces = sub.add_parser("traces", help="list kept requests from the trace store")
    _add_source(traces)
    traces.add_argument("--model")
    traces.add_argument("--outcome", choices=["stop", "length", "abort", "error", "unknown"])
    traces.add_argument("--service")
    traces.add_argument("--sort", default="start", choices=["start", "ttft", "tpot", "e2e", "queue", "gateway_overhead"],
                        help="largest first (default: newest first)")
    traces.add_argument("--since", type=lambda v: parse_duration(v, "--since"), help="only the last DURATION, e.g. 15m")
    traces.add_argument("--limit", type=int, default=20)
    traces.set_defaults(func=_traces)
    trace = sub.add_parser("trace", help="one kept trace as a terminal waterfall")
    _add_source(trace)
    trace.add_argument("trace_id", help="32 hex digits")
    trace.add_argument("--width", type=int, default=60, help="bar width in characters")
    trace.set_defaults(func=_trace)
    summary = sub.add_parser("summary", help="per service: requests counted, spans refused and intervals not "
                             "measurable, with reasons (from a running otel-llm's /metrics)")
    summary.add_argument("--api", default="http://127.0.0.1:9464",
                         help="the otel-llm whose /metrics to read (default: %(default)s)")
    summary.set_defaults(func=_summary)
    if simulate:
        try:
            from otel_llm_simulate.cli import add_simulate_parser
        except ImportError as exc:  # the simulator is a package of its own beside the server
            raise SystemExit(f"otel-llm simulate: the simulator (otel_llm_simulate) is not installed: {exc}") from None
        add_simulate_parser(sub)
    else:  # listed in --help without importing the simulator and the OTel SDK on every command
        sub.add_parser("simulate", help="send simulated fleet traffic (engines, gateways, clients) over OTLP")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser(simulate="simulate" in argv).parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
