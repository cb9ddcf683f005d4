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
    # A refusal is raised in the code, or declared as a rule's outcome in the shape table.
    in_code = {m for file in (ROOT / "otel_llm").rglob("*.py")
               for m in re.findall(r'(?:MalformedSpan\(|malformed=\()\s*"(\w+)"', file.read_text(encoding="utf-8"))}
    assert {"nan_latency", "negative_latency", "absurd_latency", "missing_span"} <= in_code
    page = (ROOT / "docs" / "troubleshooting.md").read_text(encoding="utf-8")
    section = page[page.index("{ #spans-malformed }"):page.index("{ #values-rejected }")]
    assert set(re.findall(r"\| <span id=\"[^\"]+\"></span>`(\w+)` \|", section)) == in_code


def test_every_declared_metric_is_in_the_reference() -> None:
    from otel_llm.processor.llm_metrics.metrics import definitions as d

    page = (ROOT / "docs" / "reference" / "metrics.md").read_text(encoding="utf-8")
    for naming in (d.vllm_naming(131072), d.vllm_cache_naming(131072), d.genai_naming(), d.genai_client_naming(),
                   d.genai_client_naming("0.1"), d.own_naming(), d.own_cache_naming(), d.adapter_naming()):
        for spec in naming.histograms:
            assert f"| `{spec.name}` |" in page
        for counter in naming.counters:
            assert f"| `{counter.name}` |" in page
    for spec in d.ACCOUNTING_METRICS:
        assert f"| `{spec.name}{'_total' if spec.kind == 'counter' else ''}` |" in page
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


def _fenced(text: str, language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```$", text, re.M | re.S)


def test_the_readme_is_a_five_minute_path() -> None:
    """Prerequisites, then `make demo` (no GPU), then vLLM with the starter config, then the PromQL
    (with the scrape's source label, and why), then where to look; the quick start's set-up block is
    the two commands, and `make test`'s timings are on the development page, not here."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    quick_start = readme[readme.index("## Quick start"):readme.index("## Then look")]
    order = [quick_start.index(marker) for marker in (
        "**Prerequisites.** Python ≥ 3.11", "make demo", "`otel-llm.yaml`", "--otlp-traces-endpoint")]
    assert order == sorted(order), "prerequisites, make demo, the starter config, then the vLLM lines"
    setup = _fenced(quick_start, "sh")[0]
    assert [line.split("#")[0].strip() for line in setup.splitlines()] == ["make run", "make test"]
    assert (ROOT / "otel-llm.yaml").is_file()
    look = readme[readme.index("## Then look"):readme.index("## Where to look next")]
    queries = re.findall(r"`(histogram_quantile\(.*?)`", look)
    assert queries and all('{source="spans"}' in q for q in queries), queries
    assert "adds both counts of the same requests up" in look  # the why, in one sentence
    assert not re.search(r"\d+ min \d+ s", readme), "make test's timings belong to docs/development.md"
    assert re.search(r"\d+ min \d+ s", (ROOT / "docs" / "development.md").read_text(encoding="utf-8"))


# --- stale claims, checked mechanically -------------------------------------------------------------

# The pages a user reads: the site but for the contributors' history and tests, the README, the component READMEs.
USER_PAGES = sorted([p for p in (ROOT / "docs").rglob("*.md") if p.relative_to(ROOT / "docs").parts[0] != "development"]
                    + [ROOT / "README.md", *(ROOT / "otel_llm").rglob("README.md")])
EVERY_PAGE = sorted({*USER_PAGES, *(ROOT / "docs").rglob("*.md"), ROOT / "ARCHITECTURE.md", ROOT / "CHANGELOG.md"})


def _name(page: Path) -> str:
    return str(page.relative_to(ROOT))


def test_links_of_the_readmes_resolve() -> None:
    """The site checks its own links (`mkdocs build --strict`); the README and the component READMEs
    are read on the repository too, where a relative link must lead to a file."""
    broken = []
    for page in [ROOT / "README.md", *(ROOT / "otel_llm").rglob("README.md")]:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text(encoding="utf-8")):
            if not target.startswith(("http://", "https://")) and not (page.parent / target).exists():
                broken.append(f"{_name(page)}: {target}")
    assert not broken, broken


_BARE_REFERENCE = re.compile(r"(?<!\[)`((?:otel_llm/[\w/]*README\.md)|(?:tests/[\w/]*test_\w+\.py))`(?!\])")


def test_component_readme_and_test_references_are_links() -> None:
    """On the site a component README or a test file named as code text leads nowhere: each is a link
    to the component's page or to the test's section of the tests' page (which the strict build checks)."""
    assert _BARE_REFERENCE.findall("see `tests/test_docs.py` and [`tests/test_x.py`](t.md)") == ["tests/test_docs.py"]
    bare = {_name(page): found for page in (ROOT / "docs").rglob("*.md")
            if (found := _BARE_REFERENCE.findall(page.read_text(encoding="utf-8")))}
    assert not bare, f"make these links (docs/components/*.md, docs/development/tests.md#...): {bare}"


def test_file_references_are_inside_the_repository() -> None:
    """A path a page names as code (`collector-config/prometheus.yml`) is a file or folder of the
    repository; nothing points outside it."""
    tops = {p.name for p in ROOT.iterdir() if not p.name.startswith(".")}
    missing, outside = [], []
    for page in EVERY_PAGE:
        text = page.read_text(encoding="utf-8")
        outside += [f"{_name(page)}: {m}" for m in re.findall(r"(?:\.\./)+shared/\S*|/work/\S*|/home/\S*", text)]
        for token in re.findall(r"`([^`\s]+)`", text):
            first = token.split("/")[0]
            if first not in tops or first == token and "." not in token or re.search(r"[<*{}$]", token):
                continue
            if not (ROOT / token.split(":")[0].split("#")[0].rstrip(".,")).exists():
                missing.append(f"{_name(page)}: {token}")
    assert not outside, f"references outside the repository: {outside}"
    assert not missing, f"not in the repository: {missing}"


def test_no_table_repeats_a_row() -> None:
    repeated = []
    for page in EVERY_PAGE:
        table: list[str] = []
        for line in [*page.read_text(encoding="utf-8").splitlines(), ""]:
            if line.lstrip().startswith("|"):
                table.append(line.strip())
                continue
            rows = [r for r in table if not set(r) <= set("|-: ")]
            repeated += [f"{_name(page)}: {r[:80]}" for r in {r for r in rows if rows.count(r) > 1}]
            table = []
    assert not repeated, repeated


def test_user_pages_carry_no_internal_issue_numbers_or_before_figures() -> None:
    """"Issue 25's runs", "before: 77 MiB" say something to the project's history, nothing to a user:
    the history is under docs/development/ and in CHANGELOG.md."""
    pattern = re.compile(r"\b[Ii]ssues? \d+|\bissue-\d+|\b[Bb]efore:|\bstage (?:one|two|three|[a-z]+teen)\b")
    assert pattern.findall("issue 24's runs; before: 77 MiB; stage nineteen") == ["issue 24", "before:", "stage nineteen"]
    found = {_name(page): hits for page in USER_PAGES if (hits := pattern.findall(page.read_text(encoding="utf-8")))}
    assert not found, found


def _default_ports() -> dict[str, int]:
    from otel_llm.config import load_config

    config = load_config(None)
    def port(endpoint: str) -> int:
        return int(endpoint.rsplit(":", 1)[1])
    return {"grpc": port(config.receivers.otlp.protocols.grpc.endpoint),
            "http": port(config.receivers.otlp.protocols.http.endpoint),
            "metrics": port(config.exporters.prometheus.endpoint), "webview": port(config.extensions.webview.endpoint)}


def test_the_ports_the_front_pages_name_are_the_codes_defaults() -> None:
    ports = _default_ports()
    for page in ("README.md", "docs/getting-started.md"):
        text = (ROOT / page).read_text(encoding="utf-8")
        for said in (f"OTLP/gRPC `:{ports['grpc']}`", f"OTLP/HTTP `:{ports['http']}`",
                     f"on `:{ports['metrics']}`", f"web view on `http://127.0.0.1:{ports['webview']}/`"):
            assert said in text, f"{page}: {said}"


def ports_said_wrong(line: str, metrics_port: int, webview_port: int) -> list[str]:
    """The ports ``line`` gives `/metrics` or the web view ("`/metrics` on :9465", "the web view on
    http://127.0.0.1:9464/") that are not theirs."""
    wrong = []
    for what, port in (("/metrics", metrics_port), ("web view", webview_port)):
        for match in re.finditer(rf"{re.escape(what)}`?[^.;|]{{0,40}}?:(\d{{4,5}})\b", line):
            if int(match[1]) != port:
                wrong.append(f"{what} on :{match[1]}")
    return wrong


def test_no_page_gives_the_web_views_port_for_metrics_or_the_reverse() -> None:
    """The compose ports' table (host ports mapped to the containers' defaults, checked against
    docker-compose.yml below) is left out."""
    ports = _default_ports()
    assert ports_said_wrong("the two replicas' own `/metrics` on :9465 and :9466", 9464, 9465) == ["/metrics on :9465"]
    assert ports_said_wrong("serves `/metrics` on `:9464` and the web view on `http://127.0.0.1:9465/`", 9464, 9465) == []
    wrong = [f"{_name(page)}: {said}" for page in USER_PAGES for line in page.read_text(encoding="utf-8").splitlines()
             if "| otel-llm-" not in line for said in ports_said_wrong(line, ports["metrics"], ports["webview"])]
    assert not wrong, wrong


def test_the_compose_ports_table_is_the_compose_files() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text(encoding="utf-8"))
    published = set()
    for service, spec in compose["services"].items():
        for mapping in spec.get("ports", []):
            *host, _container = str(mapping).split(":")
            published.add((":".join(host), service))
    page = (ROOT / "docs" / "deploying" / "collector.md").read_text(encoding="utf-8")
    table = page[page.index("| host port | service | what |"):]
    rows = set(re.findall(r"^\| ([\d.:]+) \| ([\w-]+) \|", table[:table.index("\n\n")], re.M))
    assert rows == published


# --- a release users can trust ----------------------------------------------------------------------

# The md5 of https://www.apache.org/licenses/LICENSE-2.0.txt, the text the Apache Software Foundation
# publishes (the same file ships in googleapis-common-protos, trio and sniffio, byte for byte).
APACHE_2_0_MD5 = "3b83ef96387f14655fc854ddc3c6bd57"


def test_the_license_is_the_apache_2_0_text_pyproject_names() -> None:
    import hashlib
    import tomllib

    assert hashlib.md5((ROOT / "LICENSE").read_bytes()).hexdigest() == APACHE_2_0_MD5
    assert tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["license"] == "Apache-2.0"


def test_the_changelog_keeps_a_changelog_and_opens_with_the_current_version() -> None:
    import tomllib

    version = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["version"]
    changelog = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    assert changelog.startswith("# Changelog\n") and "https://keepachangelog.com/en/1.1.0/" in changelog
    releases = re.findall(r"^## \[([^\]]+)\] - (\d{4}-\d{2}-\d{2}|Unreleased)$", changelog, re.M)
    assert releases and releases[0][0] == version, releases
    headings = re.findall(r"^## .*$", changelog, re.M)
    assert len(headings) == len(releases), f"a release heading is `## [x.y.z] - YYYY-MM-DD`: {headings}"
    kinds = set(re.findall(r"^### (.+)$", changelog, re.M))
    assert kinds <= {"Added", "Changed", "Deprecated", "Removed", "Fixed", "Security"}, kinds
