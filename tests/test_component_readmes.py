"""Every option of every component is documented in its folder's README.md (a cheap stand-in for the
Collector's mdatagen): the key paths come from the config dataclasses, never from the READMEs.

For each component the factories discover, its config dataclass is walked (nested dataclasses,
``X | None`` of one, ``list[X]`` of one) and every option's key path relative to the component
(``protocols.grpc.tls.cert_file``, ``policies[].slowest.quantile``) must appear in the README in
backticks. The default of each top-level scalar option must be written, in backticks, on a table
row of that option, as ``format_default`` renders it.
"""

from __future__ import annotations

import dataclasses
import importlib
import math
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import pytest

from otel_llm.component import Factory, Kind, factories
from otel_llm.confmap import ConfigError, Duration, PositiveInt, _Duration, format_duration, parse_duration
from otel_llm.exporter.exporterhelper import config as exporterhelper_config

# --- walking a config dataclass -------------------------------------------------------------------


def _strip_annotated(tp: Any) -> Any:
    return typing.get_args(tp)[0] if typing.get_origin(tp) is Annotated else tp


def _dataclass_in(tp: Any) -> tuple[type | None, str]:
    """The dataclass an option holds (itself, ``X | None`` or ``list[X]``) and the path suffix for it."""
    tp = _strip_annotated(tp)
    origin = typing.get_origin(tp)
    if origin in (types.UnionType, typing.Union):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return _dataclass_in(args[0])
        return None, ""
    if origin is list:
        (item,) = typing.get_args(tp)
        inner, suffix = _dataclass_in(item)
        return (inner, "[]" + suffix) if inner is not None else (None, "")
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return tp, ""
    return None, ""


def option_paths(cls: type, prefix: str = "") -> list[str]:
    """Every option's key path under ``cls``: a block's own path, then its options'."""
    out: list[str] = []
    hints = typing.get_type_hints(cls, include_extras=True)
    for f in dataclasses.fields(cls):
        path = f"{prefix}{f.name}"
        out.append(path)
        inner, suffix = _dataclass_in(hints[f.name])
        if inner is not None:
            out += option_paths(inner, f"{path}{suffix}.")
    return out


def _is_duration(tp: Any) -> bool:
    return typing.get_origin(tp) is Annotated and _Duration in typing.get_args(tp)[1:]


def format_duration_default(seconds: float) -> str:
    """``format_duration``, but as a config may write it: the YAML accepts ns..h, not days."""
    text = format_duration(seconds)
    try:
        parse_duration(text, "")
    except ConfigError:
        text = f"{seconds / 3600:g}h"
    assert math.isclose(parse_duration(text, ""), seconds), f"{text} does not read back as {seconds}s"
    return text


def format_default(tp: Any, value: Any) -> str | None:
    """How a README writes a scalar default, or None for an option that is not a scalar."""
    if _is_duration(tp):
        return format_duration_default(value)
    base = _strip_annotated(tp)
    if base is bool:
        return "true" if value else "false"
    if base is int:
        return str(value)
    if base is float:
        return f"{value:g}"
    if base is str:
        return f'"{value}"'
    return None


def scalar_defaults(cls: type) -> dict[str, str]:
    """Top-level scalar options with a plain default, as ``format_default`` writes it."""
    hints = typing.get_type_hints(cls, include_extras=True)
    out: dict[str, str] = {}
    for f in dataclasses.fields(cls):
        if f.default is dataclasses.MISSING:
            continue
        text = format_default(hints[f.name], f.default)
        if text is not None:
            out[f.name] = text
    return out


def readme_problems(cls: type, readme: str, prefix: str = "") -> list[str]:
    """What ``readme`` fails to document of ``cls``; empty when it documents everything."""
    problems = [f"option `{prefix}{p}` is not in the README" for p in option_paths(cls)
                if f"`{prefix}{p}`" not in readme]
    rows = [line for line in readme.splitlines() if line.lstrip().startswith("|")]
    for name, text in scalar_defaults(cls).items():
        key = f"`{prefix}{name}`"
        own_rows = [r for r in rows if r.split("|")[1].strip() == key]
        if not own_rows:
            problems.append(f"option {key} has no table row of its own")
        elif not any(f"`{text}`" in r for r in own_rows):
            problems.append(f"option {key}: its row does not give the default `{text}`")
    return problems


# --- the components ----------------------------------------------------------------------------


def _components() -> list[tuple[str, Factory[Any]]]:
    return [(f"{kind.value}.{name}", factory) for kind in Kind for name, factory in factories(kind).items()]


def _folder(factory: Factory[Any]) -> Path:
    module = importlib.import_module(factory.create.__module__)
    assert module.__file__ is not None
    return Path(module.__file__).parent


def test_components_are_discovered() -> None:
    found = {path for path, _ in _components()}
    for kind in Kind:
        assert any(p.startswith(f"{kind.value}.") for p in found), f"no {kind.value} discovered"


@pytest.mark.parametrize(("path", "factory"), _components(), ids=[p for p, _ in _components()])
def test_component_readme_documents_every_option(path: str, factory: Factory[Any]) -> None:
    readme_file = _folder(factory) / "README.md"
    assert readme_file.is_file(), f"{path}: no README.md in {readme_file.parent}"
    readme = readme_file.read_text(encoding="utf-8")
    assert f"`{path}`" in readme, f"{path}: the README does not name its component"
    problems = readme_problems(factory.config_class, readme)
    assert not problems, f"{readme_file}:\n  " + "\n  ".join(problems)


STABILITY_LEVELS = ("development", "alpha", "beta", "stable", "deprecated", "unmaintained")  # the Collector's


@pytest.mark.parametrize(("path", "factory"), _components(), ids=[p for p, _ in _components()])
def test_component_readme_opens_with_its_stability(path: str, factory: Factory[Any]) -> None:
    """As the Collector contrib's READMEs: the first row of the README's first table is its stability
    level (linked to what the levels mean) and what it handles."""
    readme = (_folder(factory) / "README.md").read_text(encoding="utf-8")
    first_row = next(line for line in readme.splitlines() if line.startswith("| ") and not line.startswith("| |"))
    match = re.match(r"\| Stability \| \[(\w+)\]\(\.\./\.\./\.\./docs/compatibility\.md#stability-levels\)(.*)\|$",
                     first_row)
    assert match, f"{path}: the README's first row is not its stability: {first_row}"
    assert match[1] in STABILITY_LEVELS, f"{path}: {match[1]} is not a Collector stability level"
    assert match[2].strip(), f"{path}: say what it handles after the level (traces, metrics, ...)"


def _exporterhelper_blocks() -> dict[str, type]:
    """The option blocks every exporter using exporterhelper shares, by their key (``retry_on_failure``)."""
    shared = {obj for obj in vars(exporterhelper_config).values()
              if isinstance(obj, type) and dataclasses.is_dataclass(obj)
              and obj.__module__ == exporterhelper_config.__name__}
    blocks: dict[str, type] = {}
    for factory in factories(Kind.EXPORTER).values():
        hints = typing.get_type_hints(factory.config_class, include_extras=True)
        for f in dataclasses.fields(factory.config_class):
            inner, _ = _dataclass_in(hints[f.name])
            if inner in shared:
                blocks[f.name] = inner
    return blocks


def test_exporterhelper_readme_documents_shared_options() -> None:
    blocks = _exporterhelper_blocks()
    assert blocks, "no exporter uses the exporterhelper blocks"
    readme = (Path(exporterhelper_config.__file__).parent / "README.md").read_text(encoding="utf-8")
    problems = [p for key, cls in blocks.items() for p in readme_problems(cls, readme, prefix=f"{key}.")]
    assert not problems, "exporterhelper/README.md:\n  " + "\n  ".join(problems)


def test_exporters_index_lists_every_exporter() -> None:
    readme = (Path(importlib.import_module(Kind.EXPORTER.package).__path__[0]) / "README.md").read_text(encoding="utf-8")
    for name, factory in factories(Kind.EXPORTER).items():
        folder = _folder(factory).name
        assert f"({folder}/README.md)" in readme, f"exporter/README.md does not link {folder}/README.md ({name})"
    assert "(exporterhelper/README.md)" in readme


# --- the checker itself -------------------------------------------------------------------------


@dataclass(frozen=True)
class _Leaf:
    depth: int = 3


@dataclass(frozen=True)
class _Item:
    label: str = ""
    leaf: _Leaf | None = None


@dataclass(frozen=True)
class _Synthetic:
    wait: Duration = 90.0
    size: PositiveInt = 7
    ratio: float = 0.5
    on: bool = False
    name: str = ""
    where: str = "here"
    day: Duration = 86400.0
    nested: _Leaf = field(default_factory=_Leaf)
    optional: _Leaf | None = None
    items: list[_Item] = field(default_factory=list)
    tags: dict[str, str] = field(default_factory=dict)


_COMPLETE = """\
| option | type | default | range | meaning |
|---|---|---|---|---|
| `wait` | duration | `90s` | | |
| `size` | int | `7` | | |
| `ratio` | float | `0.5` | | |
| `on` | bool | `false` | | |
| `name` | string | `""` | | |
| `where` | string | `"here"` | | |
| `day` | duration | `24h` | | |
| `nested` / `nested.depth` | | | | |
| `optional`, `optional.depth` | | | | |
| `items`, `items[].label`, `items[].leaf`, `items[].leaf.depth` | | | | |
| `tags` | | | | |
"""


def test_checker_walks_nested_optional_and_list_blocks() -> None:
    assert option_paths(_Synthetic) == [
        "wait", "size", "ratio", "on", "name", "where", "day", "nested", "nested.depth", "optional",
        "optional.depth", "items", "items[].label", "items[].leaf", "items[].leaf.depth", "tags"]
    assert scalar_defaults(_Synthetic) == {"wait": "90s", "size": "7", "ratio": "0.5", "on": "false",
                                           "name": '""', "where": '"here"', "day": "24h"}
    assert readme_problems(_Synthetic, _COMPLETE) == []


@pytest.mark.parametrize("missing", ["`items[].leaf.depth`", "`optional.depth`", "`nested.depth`", "`tags`"])
def test_checker_fails_on_a_missing_option(missing: str) -> None:
    readme = _COMPLETE.replace(missing, "")
    assert readme_problems(_Synthetic, readme) == [f"option {missing} is not in the README"]


def test_checker_fails_on_a_missing_or_wrong_default() -> None:
    wrong = _COMPLETE.replace("| `90s` |", "| `10s` |")
    assert readme_problems(_Synthetic, wrong) == ["option `wait`: its row does not give the default `90s`"]
    no_row = _COMPLETE.replace("| `on` | bool | `false` | | |\n", "Mentions `on` in prose only.\n")
    assert readme_problems(_Synthetic, no_row) == ["option `on` has no table row of its own"]


def test_prefix_applies_to_every_path() -> None:
    keys = set(option_paths(_Synthetic))
    prefixed = re.sub(r"`([^`]+)`", lambda m: f"`q.{m[1]}`" if m[1] in keys else m[0], _COMPLETE)
    assert readme_problems(_Synthetic, prefixed, prefix="q.") == []
    assert "option `q.wait` is not in the README" in readme_problems(_Synthetic, _COMPLETE, prefix="q.")
