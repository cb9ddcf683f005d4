"""``otel-llm``: serve, validate."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading

from otel_llm import __version__
from otel_llm.config import ConfigError, load_config

EXIT_CONFIG = 2


def _serve(args: argparse.Namespace) -> int:
    from otel_llm.service import Service

    try:
        config = load_config(args.config)
    except ConfigError as exc:
        print(f"otel-llm: invalid config: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    # Handlers go in before anything listens, so a SIGTERM right after /readyz turns 200 is a clean stop.
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    service = Service(config)
    try:
        service.start()
    except OSError as exc:
        print(f"otel-llm: {exc}", file=sys.stderr)
        return 1
    parts = []
    if service.grpc is not None:
        parts.append(f"OTLP/gRPC :{service.grpc.port}")
    if service.http is not None:
        parts.append(f"OTLP/HTTP :{service.http.port}")
    if service.prometheus is not None:
        parts.append(f"metrics :{service.prometheus.port}/metrics")
    print(f"otel-llm {__version__} ready: {', '.join(parts)}", flush=True)
    while not stop.wait(0.5):  # a timed wait lets the main thread run signal handlers promptly
        pass
    print("otel-llm: stopping (completing pending traces)", flush=True)
    service.stop()
    return 0


def _validate(args: argparse.Namespace) -> int:
    try:
        load_config(args.config)
    except ConfigError as exc:
        print(f"{args.config}: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    print(f"{args.config}: ok")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="otel-llm", description="OTLP endpoint for LLM inference fleets.")
    parser.add_argument("--version", action="version", version=f"otel-llm {__version__}")
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the receivers, pipeline and exporters")
    serve.add_argument("--config", help="YAML config file (default: the embedded defaults)")
    serve.set_defaults(func=_serve)
    validate = sub.add_parser("validate", help="check a config file and exit (2 if invalid)")
    validate.add_argument("config", help="YAML config file")
    validate.set_defaults(func=_validate)
    from otel_llm.simulate.cli import add_simulate_parser

    add_simulate_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
