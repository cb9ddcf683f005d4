"""The native engine's configuration as Python declares it (``service/declarations.py``
``engine_declaration``): the JSON the engine's end-to-end test builds the engine from
(``rust/engine/tests/data/engine/corpus.json.gz``, where that engine's ``/metrics`` equals the
reference pipeline's, sample for sample) is what Python writes for the same configuration now, so
a declaration changed without regenerating the corpus fails here, naming the command."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from otel_llm.component import Kind, Signal
from otel_llm.config import config_from_dict
from otel_llm.service.declarations import engine_declaration

ROOT = Path(__file__).resolve().parents[3]
CORPUS = ROOT / "rust" / "engine" / "tests" / "data" / "engine" / "corpus.json.gz"


def _processors(config: dict[str, Any]) -> dict[str, object]:
    cfg = config_from_dict(config)
    return {name: getattr(cfg.processors, name) for name in cfg.running(Kind.PROCESSOR, Signal.TRACES)}


def test_the_engines_corpus_holds_what_python_declares_now() -> None:
    corpus = json.loads(gzip.decompress(CORPUS.read_bytes()))
    assert set(corpus["scenarios"]) == {"defaults", "everything"}
    for name, scenario in corpus["scenarios"].items():
        now = json.loads(json.dumps(engine_declaration(_processors(scenario["config"]), write_kept=False)))
        assert now == scenario["declaration"], (
            f"{name}: the engine's declaration changed: run .venv/bin/python rust/engine/tests/data/engine/generate.py")


def test_every_setting_the_engine_runs_on_is_declared() -> None:
    declared = engine_declaration(_processors({"processors": {
        "llm_metrics": {"tenant": {"attributes": ["tenant.id"], "values": ["t1"]}, "cost": {"currency": "EUR", "prices": {"m": {"input": 1.0}}},
                        "dimensions": [{"name": "route", "attribute": "http.route", "values": ["/a"]}]},
        "tail_sampling": {"decision_wait": "3s", "rate_limit": {"traces_per_second": 7}}}}),
        write_kept=True, shards=2, exponential=(160, 8))
    assert declared["assembly"]["decision_wait_s"] == "3.0"
    assert declared["sampler"]["traces_per_second"] == "7.0"
    assert declared["records"]["tenant"] == [["tenant.id"], ["t1"], "other"]
    assert declared["records"]["dimensions"] == [["route", "http.route", ["/a"], "other"]]
    assert declared["accounting"]["settings"]["prices"]["m"]["input"] == "1.0"
    assert declared["metrics"]["exponential"] == [160, 8]
    assert (declared["write_kept"], declared["shards"]) == (True, 2)
    assert declared["table"]["shapes"][0]["adapter"] == "vllm_v1"


def test_a_pipeline_the_engine_does_not_run_is_refused() -> None:
    processors = _processors({})
    del processors["llm_metrics"]
    with pytest.raises(ValueError, match="llm_metrics"):
        engine_declaration(processors, write_kept=False)
