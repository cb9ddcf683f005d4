"""The docs: generated references current (`make docs`), every option and counted reason explained,
the site built with `mkdocs build --strict` (a broken link fails), the config's JSON Schema accepting
the repo's example configs and refusing what `otel-llm validate` refuses."""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from otel_llm.config import ConfigError, config_from_dict

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tools import gen_docs  # noqa: E402


# --- staleness and completeness ----------------------------------------------------------------------


def test_generated_docs_are_current() -> None:
    try:
        stale = gen_docs.stale()
    except gen_docs.Undocumented as exc:
        pytest.fail(f"{exc}\n(then regenerate with: {gen_docs.REGENERATE})")
    assert not stale, f"stale generated docs: {', '.join(stale)}; regenerate with: {gen_docs.REGENERATE}"


def test_check_reports_a_stale_file_with_the_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "docs" / "reference" / "metrics.md"
    target.parent.mkdir(parents=True)
    target.write_text("what it said before a metric was added\n")
    monkeypatch.setattr(gen_docs, "ROOT", tmp_path)
    monkeypatch.setattr(gen_docs, "outputs", lambda: {target: "what the declarations say now\n"})
    assert gen_docs.main(["--check"]) == 1
    err = capsys.readouterr().err
    assert "docs/reference/metrics.md" in err and "make docs" in err and "python -m tools.gen_docs" in err
    assert target.read_text() == "what it said before a metric was added\n"  # --check never writes
    assert gen_docs.main([]) == 0
    assert target.read_text() == "what the declarations say now\n"
    assert gen_docs.main(["--check"]) == 0


@dataclasses.dataclass(frozen=True)
class _Inner:
    depth: int = 3


@dataclasses.dataclass(frozen=True)
class _NewComponent:
    documented: bool = True
    added_by_someone: int = 7
    inner: _Inner = dataclasses.field(default_factory=_Inner)


_README = """\
| option | type | default | range | what it does |
|---|---|---|---|---|
| `documented` | bool | `true` | | turns it on |
| `inner` / `inner.depth` | block | | | how deep |
"""


def test_an_option_without_a_meaning_is_named_with_its_readme() -> None:
    options, problems = gen_docs.document("processors.new", _NewComponent, gen_docs.readme_meanings(_README), {},
                                          "otel_llm/processor/new/README.md")
    assert [o.path for o in options] == ["documented", "added_by_someone", "inner", "inner.depth"]
    assert {o.path: o.meaning for o in options}["inner.depth"] == "how deep"
    assert len(problems) == 1
    assert problems[0].startswith("processors.new.added_by_someone: no meaning; add a row `added_by_someone`")
    assert "otel_llm/processor/new/README.md" in problems[0] and "make docs" in problems[0]


def test_a_counted_reason_without_an_explanation_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    scanned = gen_docs.scanned_reasons()
    scanned["otel_llm_spans_malformed_total"].append("reason_added_by_someone")
    monkeypatch.setattr(gen_docs, "scanned_reasons", lambda: scanned)
    with pytest.raises(gen_docs.Undocumented, match=r'reason="reason_added_by_someone".*docs/reasons.yaml'):
        gen_docs.reasons_blocks()


def test_every_malformed_reason_in_the_code_is_on_the_troubleshooting_page() -> None:
    # Found here by a plain text search, independently of the generator's syntax-tree scan.
    in_code = {m for file in (ROOT / "otel_llm").rglob("*.py")
               for m in re.findall(r'MalformedSpan\(\s*"(\w+)"', file.read_text(encoding="utf-8"))}
    assert {"nan_latency", "negative_latency", "absurd_latency", "missing_span"} <= in_code
    page = (ROOT / "docs" / "troubleshooting.md").read_text(encoding="utf-8")
    section = page[page.index("{ #spans-malformed }"):page.index("{ #values-rejected }")]
    assert set(re.findall(r"\| <span id=\"[^\"]+\"></span>`(\w+)` \|", section)) == in_code


def test_every_declared_metric_is_in_the_reference() -> None:
    from otel_llm.processor.llm_metrics.metrics import definitions as d

    page = (ROOT / "docs" / "reference" / "metrics.md").read_text(encoding="utf-8")
    for naming in (d.vllm_naming(131072), d.genai_naming(), d.genai_client_naming(), d.own_naming()):
        for spec in naming.histograms:
            assert f"| `{spec.name}` |" in page
        for counter in naming.counters:
            assert f"| `{counter.name}` |" in page
    # the Prometheus names, as the OTLP translation spells them (the semconv's, written out here)
    for exposed in ("gen_ai_server_time_to_first_token_seconds", "gen_ai_client_token_usage",
                    "gen_ai_server_request_duration_seconds", "vllm:request_success_total"):
        assert f"`{exposed}`" in page


# --- the site -----------------------------------------------------------------------------------


def _mkdocs(site_root: Path, out: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(site_root / "mkdocs.yml"),
                           "-d", str(out)], capture_output=True, text=True, env=env, timeout=170)


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    result = _mkdocs(ROOT, tmp_path / "site")
    assert result.returncode == 0, result.stdout + result.stderr
    page = (tmp_path / "site" / "troubleshooting" / "index.html").read_text(encoding="utf-8")
    assert 'id="spans-malformed-nan-latency"' in page and 'id="empty-model-label"' in page
    assert (tmp_path / "site" / "reference" / "config.schema.json").is_file()
    assert (tmp_path / "site" / "webview" / "overview.png").is_file()


def test_a_broken_link_fails_the_build(tmp_path: Path) -> None:
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    shutil.copy(ROOT / "mkdocs.yml", tmp_path / "mkdocs.yml")
    page = tmp_path / "docs" / "migration.md"
    page.write_text(page.read_text(encoding="utf-8") + "\nSee [the old page](no-such-page.md).\n", encoding="utf-8")
    result = _mkdocs(tmp_path, tmp_path / "site")
    assert result.returncode != 0
    assert "no-such-page.md" in result.stdout + result.stderr


# --- the JSON Schema ----------------------------------------------------------------------------

SCHEMA = json.loads((ROOT / "docs" / "reference" / "config.schema.json").read_text(encoding="utf-8"))
VALIDATOR = jsonschema.Draft202012Validator(SCHEMA)


def _merge(base: Any, over: Any) -> Any:
    """Helm's merge of values: maps key by key, anything else replaced."""
    if isinstance(base, dict) and isinstance(over, dict):
        merged = dict(base)
        for key, value in over.items():
            merged[key] = _merge(base.get(key), value) if key in base else value
        return merged
    return copy.deepcopy(over)


def _example_configs() -> dict[str, Any]:
    configs: dict[str, Any] = {"the embedded defaults (no file)": {}}
    for path in ("otel-llm.yaml", "collector-config/otel-llm.yaml", "deploy/docker/otel-llm.yaml", "tests/testdata/minimal.yaml",
                 *(str(p.relative_to(ROOT)) for p in sorted((ROOT / "docs" / "examples").glob("*.yaml")))):
        configs[path] = yaml.safe_load((ROOT / path).read_text(encoding="utf-8"))
    chart = ROOT / "deploy" / "helm" / "otel-llm"
    values = yaml.safe_load((chart / "values.yaml").read_text(encoding="utf-8"))["config"]
    configs["deploy/helm/otel-llm/values.yaml"] = values
    for ci in sorted((chart / "ci").glob("*.yaml")):
        over = (yaml.safe_load(ci.read_text(encoding="utf-8")) or {}).get("config")
        if over:
            configs[str(ci.relative_to(ROOT))] = _merge(values, over)
    return configs


def test_the_schema_is_a_valid_draft_2020_12_schema() -> None:
    assert SCHEMA["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    jsonschema.Draft202012Validator.check_schema(SCHEMA)


@pytest.mark.parametrize(("name", "config"), list(_example_configs().items()), ids=list(_example_configs()))
def test_every_example_config_passes_the_schema_and_validate(name: str, config: Any) -> None:
    errors = [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in VALIDATOR.iter_errors(config)]
    assert not errors, f"{name}:\n  " + "\n  ".join(errors)
    config_from_dict(config)  # and `otel-llm validate` takes it


# Each refused by `otel-llm validate` (config_from_dict), and by the schema.
BAD_CONFIGS = {
    "unknown key": {"processors": {"llm_metrics": {"max_model_length": 8192}}},
    "wrong type": {"receivers": {"otlp": {"protocols": {"grpc": {"endpoint": 4317}}}}},
    "out of bounds": {"processors": {"llm_metrics": {"max_label_value_bytes": 8}}},
    "duration with days": {"exporters": {"store": {"path": "/tmp/x", "retention": "7d"}}},
    "bool as string": {"processors": {"llm_metrics": {"namings": {"vllm": "yes"}}}},
    "old web block": {"exporters": {"prometheus": {"endpoint": "127.0.0.1:9464", "web": {}}}},
}


@pytest.mark.parametrize("name", list(BAD_CONFIGS))
def test_a_bad_config_fails_the_schema_as_it_fails_validate(name: str) -> None:
    bad = BAD_CONFIGS[name]
    with pytest.raises(ConfigError):
        config_from_dict(bad)
    assert list(VALIDATOR.iter_errors(bad)), f"the schema accepts the {name} config that validate refuses"


def test_the_readme_stays_a_front_page() -> None:
    """Read in two minutes: the two commands, the line for vLLM, where to look next; the rest is in docs/."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 150, "README.md is a front page: move the deeper sections into docs/"
    for must in ("make run", "make test", "--otlp-traces-endpoint grpc://", "OTEL_SERVICE_NAME=",
                 "docs/webview/overview.png", "docs/troubleshooting.md"):
        assert must in readme, must
    for link in re.findall(r"\]\((docs/[^)#]+)", readme):  # the site checks its own links; these are GitHub's
        assert (ROOT / link).is_file(), link
