"""``otel-llm simulate``: placeholder wired into the CLI; the simulator fills it in."""

from __future__ import annotations

import argparse


def add_simulate_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = sub.add_parser("simulate", help="emit a realistic fleet's traces to an OTLP endpoint")
    parser.set_defaults(func=lambda args: 1)
