"""The lines a page shows, read from the page by the test that runs them (never a copy in the test).

A page marks a fenced block with an HTML comment on the line right before its fence; Markdown and
MkDocs render the comment as nothing:

    <!-- snippet: vllm-grpc -->
    ```sh
    OTEL_SERVICE_NAME=... vllm serve ...
    ```

``snippet(page, name)`` returns that block. It fails, naming the page and the marker, when the marker
is missing, when the page has it twice, or when no fenced block follows it: a test cannot run a
line the page no longer shows, or a line it guessed.

A test runs the block as shown, except for the placeholders a page shows for what only its reader
knows, each replaced by an explicit rule (``Snippet.replace`` and ``Snippet.address``, which fail
when the page does not show the placeholder: a rule that no longer applies must not pass silently):

- an address: a host the pages use (``127.0.0.1``, ``otelcol``, ``<otel-llm host>``) with a port
  they use — 4317 (otel-llm's OTLP/gRPC), 4318 (its OTLP/HTTP), 8000 (vLLM's API), 4000 (LiteLLM's
  proxy) — becomes ``127.0.0.1`` and the port the test's own process listens on, and so does the
  port a command is told to listen on (``--port 4000``);
- a secret the reader picks, ``sk-<yours>``, becomes one the test makes;
- the model a page serves, ``meta-llama/Llama-3.1-8B-Instruct``, becomes the directory of the tiny
  model with dummy weights the live tests serve (``tests/live/tiny_llama.py``);
- a command a page runs (``vllm``, ``litellm``) becomes the one installed in its cached virtualenv
  (``tests/live/engines.sh``, ``tests/live/instrumentations.sh``).

What a test adds to a command (flags that let vLLM run on a CPU with dummy weights, where it listens)
is appended after the page's words, never spliced into them; each test names its additions.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MARKER = re.compile(r"^\s*<!-- snippet: ([a-z0-9-]+) -->\s*$")
FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})([\w+-]*)\s*$")
PLACEHOLDER_HOSTS = ("127.0.0.1", "otelcol", "<otel-llm host>")
PORTS = {"otlp-grpc": 4317, "otlp-http": 4318, "vllm": 8000, "litellm": 4000}
YOUR_SECRET = "sk-<yours>"


class SnippetError(AssertionError):
    """A page does not show what a test runs from it."""


@dataclass(frozen=True)
class Snippet:
    page: str  # relative to the repository
    name: str
    language: str
    text: str

    def where(self) -> str:
        return f"{self.page} (<!-- snippet: {self.name} -->)"

    def replace(self, placeholder: str, value: str) -> Snippet:
        """Every occurrence of ``placeholder`` replaced by ``value``; fails if the page shows none."""
        if placeholder not in self.text:
            raise SnippetError(f"{self.where()} no longer shows {placeholder!r}:\n{self.text}")
        return Snippet(self.page, self.name, self.language, self.text.replace(placeholder, value))

    def address(self, role: str, port: int) -> Snippet:
        """``<host>:<the page's port for role>`` for any placeholder host, as ``127.0.0.1:port``."""
        shown = PORTS[role]
        pattern = re.compile("(?:" + "|".join(re.escape(h) for h in PLACEHOLDER_HOSTS) + f"):{shown}(?![0-9])")
        if not pattern.search(self.text):
            raise SnippetError(f"{self.where()} shows no {role} address (<host>:{shown}):\n{self.text}")
        return Snippet(self.page, self.name, self.language, pattern.sub(f"127.0.0.1:{port}", self.text))

    def listen_port(self, role: str, port: int) -> Snippet:
        """``--port <the page's port for role>`` as ``--port port``."""
        pattern = re.compile(f"--port([ =]){PORTS[role]}(?![0-9])")
        if not pattern.search(self.text):
            raise SnippetError(f"{self.where()} shows no --port {PORTS[role]} ({role}):\n{self.text}")
        return Snippet(self.page, self.name, self.language, pattern.sub(rf"--port\g<1>{port}", self.text))

    def commands(self) -> list[Command]:
        """The shell commands the block shows, comments dropped and continued lines joined."""
        joined = self.text.replace("\\\n", " ")
        out = []
        for line in joined.splitlines():
            words = shlex.split(line, comments=True)
            if words:
                out.append(Command.parse(words))
        return out

    def command(self) -> Command:
        """The block's one shell command; fails if it shows none or several."""
        found = self.commands()
        if len(found) != 1:
            raise SnippetError(f"{self.where()} shows {len(found)} commands, not one:\n{self.text}")
        return found[0]


@dataclass(frozen=True)
class Command:
    env: dict[str, str]  # the NAME=value words before the program, in order
    argv: list[str]

    @staticmethod
    def parse(words: list[str]) -> Command:
        env: dict[str, str] = {}
        index = 0
        while index < len(words) and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", words[index]):
            name, _, value = words[index].partition("=")
            env[name] = value
            index += 1
        return Command(env, words[index:])

    def program(self, shown: str, path: str) -> list[str]:
        """argv with the page's program ``shown`` run from ``path``; fails if the page runs another."""
        if not self.argv or self.argv[0] != shown:
            raise SnippetError(f"the page's command runs {self.argv[:1]}, not {shown!r}: {self.argv}")
        return [path, *self.argv[1:]]

    def flag(self, name: str) -> str:
        """The value the command gives ``--name`` (``--name value`` or ``--name=value``); fails if absent."""
        for index, word in enumerate(self.argv):
            if word == name and index + 1 < len(self.argv):
                return self.argv[index + 1]
            if word.startswith(name + "="):
                return word.split("=", 1)[1]
        raise SnippetError(f"the page's command gives no {name}: {self.argv}")


def snippet(page: str, name: str) -> Snippet:
    """The fenced block marked ``<!-- snippet: name -->`` in ``page`` (a path relative to the repository)."""
    path = ROOT / page
    lines = path.read_text(encoding="utf-8").splitlines()
    marked = [index for index, line in enumerate(lines) if (m := MARKER.match(line)) and m.group(1) == name]
    if not marked:
        raise SnippetError(f"{page} has no <!-- snippet: {name} --> marker")
    if len(marked) > 1:
        raise SnippetError(f"{page} marks {len(marked)} blocks <!-- snippet: {name} --> "
                           f"(lines {', '.join(str(i + 1) for i in marked)}): which one runs is ambiguous")
    start = marked[0] + 1
    opening = FENCE.match(lines[start]) if start < len(lines) else None
    if opening is None:
        raise SnippetError(f"{page}:{start + 1}: no fenced block right after <!-- snippet: {name} -->")
    indent, fence, language = opening.groups()
    body: list[str] = []
    for line in lines[start + 1:]:
        if line.strip() == fence and line.startswith(indent):
            return Snippet(page, name, language, "\n".join(_dedent(body, indent)) + "\n")
        body.append(line)
    raise SnippetError(f"{page}:{start + 1}: the block after <!-- snippet: {name} --> is never closed")


def _dedent(lines: list[str], indent: str) -> list[str]:
    """A block in a list item is indented with its fence; its lines are the page's less that indent."""
    return [line[len(indent):] if line.startswith(indent) else line for line in lines]


def markers(page: str) -> list[str]:
    """Every snippet name ``page`` marks, in order."""
    text = (ROOT / page).read_text(encoding="utf-8")
    return [m.group(1) for line in text.splitlines() if (m := MARKER.match(line))]
