"""The lines the pages show for engines, gateways and instrumentations are the lines the live tests run.

The live tests read their commands, configs and code from the pages (``tests/support/snippets.py``):
``tests/live/test_vllm_live.py`` runs ``docs/engines/vllm.md``'s vLLM lines, ``tests/live/test_docs_live.py``
the README's vLLM line, openai-v2 snippet and LiteLLM proxy. Here, without an engine: every other
page that shows one of those blocks shows the same lines (a page's own host aside), no line elsewhere
shows a vLLM gRPC endpoint without what makes it plaintext, and the reader fails loudly on a marker
that is missing, doubled or not followed by a block.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from tests.support.snippets import ROOT, Command, Snippet, SnippetError, markers, snippet

# What the live tests run, and the pages that show the same block: each must show it as the live
# test's page does (hosts aside: a page for a fleet says otelcol, another <otel-llm host>).
RUN = {
    "vllm-grpc": ("docs/engines/vllm.md", ("README.md", "docs/getting-started.md")),
    "vllm-http": ("docs/engines/vllm.md", ()),
    "openai-v2": ("README.md", ("docs/integrations/openai-v2.md",)),
    "litellm-config": ("README.md", ("docs/integrations/litellm.md",)),
    "litellm-proxy": ("README.md", ("docs/integrations/litellm.md",)),
}
ADDRESSES = {"vllm-grpc": "otlp-grpc", "vllm-http": "otlp-http", "openai-v2": "otlp-http",
             "litellm-config": "vllm", "litellm-proxy": "otlp-http"}


def _normalized(block: Snippet) -> Snippet:
    """The block with its addresses as the live test writes them (its own port: 1)."""
    return block.address(ADDRESSES[block.name], 1)


@pytest.mark.parametrize("name", list(RUN))
def test_each_page_shows_the_lines_the_live_test_runs(name: str) -> None:
    run_page, others = RUN[name]
    run = _normalized(snippet(run_page, name))
    for page in others:
        shown = _normalized(snippet(page, name))
        if run.language == "sh":
            assert shown.commands() == run.commands(), f"{page} shows other {name} lines than {run_page}"
        else:
            assert shown.text == run.text, f"{page} shows another {name} block than {run_page}"


def test_the_vllm_lines_say_how_to_reach_a_plaintext_receiver() -> None:
    grpc = snippet("docs/engines/vllm.md", "vllm-grpc").command()
    assert grpc.env["OTEL_EXPORTER_OTLP_TRACES_INSECURE"] == "true"
    assert grpc.flag("--otlp-traces-endpoint").startswith("grpc://")
    http = snippet("docs/engines/vllm.md", "vllm-http").command()
    assert http.env["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"] == "http/protobuf"
    assert http.flag("--otlp-traces-endpoint").startswith("http://")
    for command in (grpc, http):  # the served name is the service name: the model label vLLM's /metrics use
        assert command.env["OTEL_SERVICE_NAME"] == command.flag("--served-model-name")


def test_the_readme_names_the_grace_the_litellm_page_runs() -> None:
    grace = yaml.safe_load(snippet("docs/integrations/litellm.md", "litellm-otel-llm-config").text)
    shown = f"processors.tail_sampling.grace: {grace['processors']['tail_sampling']['grace']}"
    assert shown in (ROOT / "README.md").read_text(encoding="utf-8"), shown


def _shown_files() -> list[Path]:
    files = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), *sorted((ROOT / "docs").rglob("*.yaml"))]
    for folder in ("deploy", "collector-config"):
        files += sorted(p for p in (ROOT / folder).rglob("*") if p.suffix in (".md", ".yaml", ".yml", ".txt"))
    return files


def test_no_page_shows_a_vllm_grpc_endpoint_the_live_tests_do_not_run() -> None:
    """A marked vllm-grpc block is checked above; anywhere else a page names a vLLM gRPC endpoint (a Helm
    note, a comment in a config), the same line says OTEL_EXPORTER_OTLP_TRACES_INSECURE=true."""
    bare = []
    for path in _shown_files():
        lines = path.read_text(encoding="utf-8").splitlines()
        inside = False
        for number, line in enumerate(lines, 1):
            if re.match(r"\s*<!-- snippet: vllm-grpc -->", line):
                inside = True
            elif inside and re.match(r"\s*(```|~~~)\s*$", line):
                inside = False
            if not inside and re.search(r"--otlp-traces-endpoint[ =]grpc://", line) \
                    and "OTEL_EXPORTER_OTLP_TRACES_INSECURE=true" not in line:
                bare.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not bare, "vLLM gRPC endpoints shown without OTEL_EXPORTER_OTLP_TRACES_INSECURE=true:\n" + "\n".join(bare)


def test_every_marked_block_is_run_or_shown_as_a_run_one() -> None:
    """A marker no test reads would be a promise nothing keeps."""
    read = {name for name in RUN} | {"vllm-otel-llm-config", "litellm-otel-llm-config"}
    for path in _shown_files():
        if path.suffix == ".md":
            page = str(path.relative_to(ROOT))
            for name in markers(page):
                assert name in read, f"{page} marks {name!r}, which no test runs"


def _page(tmp_path: Path, text: str) -> str:
    page = tmp_path / "page.md"
    page.write_text(text, encoding="utf-8")
    return str(page)


def test_a_missing_doubled_or_unfenced_marker_fails_loudly(tmp_path: Path) -> None:
    with pytest.raises(SnippetError, match="has no <!-- snippet: vllm-grpc --> marker"):
        snippet(_page(tmp_path, "```sh\nvllm serve m\n```\n"), "vllm-grpc")
    doubled = "<!-- snippet: a -->\n```sh\nx\n```\n\n<!-- snippet: a -->\n```sh\ny\n```\n"
    with pytest.raises(SnippetError, match=r"marks 2 blocks <!-- snippet: a --> \(lines 1, 6\)"):
        snippet(_page(tmp_path, doubled), "a")
    with pytest.raises(SnippetError, match="no fenced block right after"):
        snippet(_page(tmp_path, "<!-- snippet: a -->\n\n```sh\nx\n```\n"), "a")
    with pytest.raises(SnippetError, match="never closed"):
        snippet(_page(tmp_path, "<!-- snippet: a -->\n```sh\nx\n"), "a")


def test_a_block_in_a_list_item_and_its_commands(tmp_path: Path) -> None:
    page = _page(tmp_path, "1. Start it:\n\n    <!-- snippet: a -->\n    ```sh\n    # a comment\n"
                           "    A=1 B='two words' prog serve --flag x \\\n      --other=y\n    ```\n")
    block = snippet(page, "a")
    assert block.language == "sh" and block.text.startswith("# a comment\n")
    assert block.command() == Command({"A": "1", "B": "two words"}, ["prog", "serve", "--flag", "x", "--other=y"])
    assert block.command().flag("--other") == "y"
    assert block.command().program("prog", "/venv/bin/prog")[0] == "/venv/bin/prog"
    with pytest.raises(SnippetError, match="runs \\['prog'\\], not 'vllm'"):
        block.command().program("vllm", "/venv/bin/vllm")
    with pytest.raises(SnippetError, match="gives no --missing"):
        block.command().flag("--missing")


def test_a_placeholder_the_page_no_longer_shows_fails_its_rule(tmp_path: Path) -> None:
    block = snippet(_page(tmp_path, "<!-- snippet: a -->\n```sh\nrun --endpoint grpc://otelcol:4317 m/x\n```\n"), "a")
    assert block.address("otlp-grpc", 5).text == "run --endpoint grpc://127.0.0.1:5 m/x\n"
    assert block.replace("m/x", "/tmp/model").text == "run --endpoint grpc://otelcol:4317 /tmp/model\n"
    with pytest.raises(SnippetError, match="shows no otlp-http address"):
        block.address("otlp-http", 5)
    with pytest.raises(SnippetError, match="shows no --port 4000"):
        block.listen_port("litellm", 5)
    proxy = snippet(_page(tmp_path, "<!-- snippet: a -->\n```sh\nlitellm --port 4000 --x=40001\n```\n"), "a")
    assert proxy.listen_port("litellm", 5).text == "litellm --port 5 --x=40001\n"
    with pytest.raises(SnippetError, match="no longer shows 'meta-llama/Llama-3.1-8B-Instruct'"):
        block.replace("meta-llama/Llama-3.1-8B-Instruct", "/tmp/model")
    other_port = snippet(_page(tmp_path, "<!-- snippet: a -->\n```sh\nrun grpc://otelcol:43170\n```\n"), "a")
    with pytest.raises(SnippetError, match="shows no otlp-grpc address"):
        other_port.address("otlp-grpc", 5)
