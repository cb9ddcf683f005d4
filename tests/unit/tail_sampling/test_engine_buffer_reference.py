"""The native engine's trace buffer (``rust/engine/src/buffer.rs``) is tested by cargo against what the
Python reference (``TraceAssembler``) handed on over seeded workloads, recorded in
``rust/engine/tests/data/buffer/workloads.json`` by its generator: the recording must be what the
reference does today, or the engine is held to a stale specification."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

DATA = Path(__file__).resolve().parents[3] / "rust" / "engine" / "tests" / "data" / "buffer"


def test_the_engine_buffers_recorded_reference_is_what_the_python_buffer_does_today() -> None:
    spec = importlib.util.spec_from_file_location("engine_buffer_workloads", DATA / "generate.py")
    assert spec is not None and spec.loader is not None
    generator = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generator)
    recorded = json.loads((DATA / "workloads.json").read_text())
    fresh = json.loads(json.dumps(generator.workloads()))
    assert len(fresh["workloads"]) == len(recorded["workloads"])
    for which, (now, then) in enumerate(zip(fresh["workloads"], recorded["workloads"])):
        if now != then:
            pytest.fail(f"workload {which} differs from the recording: regenerate it (the generator's header says "
                        "how) and make the engine's buffer do what the Python buffer now does")
