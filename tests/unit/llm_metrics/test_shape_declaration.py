"""The shape table as the native engine receives it (``shapes.declaration()``): the JSON the
engine's differential test compiles (``rust/engine/tests/data/shapes/table.json``) is the table
Python reads now, so a row added in Python without regenerating the corpus fails here, naming the
command; and the declaration carries every row of every shape, rule and candidate."""

from __future__ import annotations

import json
from pathlib import Path

from otel_llm.processor.llm_metrics.adapters import shapes

ROOT = Path(__file__).resolve().parents[3]
TABLE = ROOT / "rust" / "engine" / "tests" / "data" / "shapes" / "table.json"


def test_the_engines_corpus_holds_the_table_python_reads() -> None:
    assert json.loads(TABLE.read_text()) == shapes.declaration(), (
        "the shape table changed: run .venv/bin/python rust/engine/tests/data/shapes/generate.py")


def test_the_declaration_carries_every_reading_by_field_name() -> None:
    declared = shapes.declaration()
    assert [name for name, _ in declared["fields"]] == [field.name for field in shapes.FIELDS]
    assert [shape["adapter"] for shape in declared["shapes"]] == list(shapes.SHAPES)
    assert len(declared["rules"]) == len(shapes.RULES)
    vllm = next(shape for shape in declared["shapes"] if shape["adapter"] == "vllm_v1")
    readings = {tuple(fields): read for fields, read in vllm["reads"]}
    assert readings[("prompt_tokens",)] == {
        "how": "count", "keys": ["gen_ai.usage.prompt_tokens", "gen_ai.usage.input_tokens"], "arg": None}
    assert readings[shapes.CACHE_FIELDS]["arg"]["spec_keys"] == list(shapes.SPEC_DECODE_KEYS)
    tgi = next(shape for shape in declared["shapes"] if shape["adapter"] == "tgi")
    operation = next(read for fields, read in tgi["reads"] if fields == ["operation_name"])
    assert operation["arg"] == [[["chat_completions", "chat"]], "text_completion"]
    refusal = next(rule for rule in declared["rules"] if rule["malformed"] is not None)
    assert refusal == {**refusal, "shape": None, "malformed": "missing_latency", "names": ["llm_request"]}
    json.dumps(declared)  # plain data: what the engine is handed is JSON
