"""Rewrites imports and paths from the old module layout to the component layout (tools/layout_map.txt).

Re-runnable: a file already on the new layout is left as it is. Usage: python tools/relayout.py FILE...
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

MAP = [line.split() for line in (Path(__file__).parent / "layout_map.txt").read_text().splitlines() if line.strip()]


def dotted(path: str) -> str:
    return path.removesuffix(".py").removesuffix("/__init__").replace("/", ".")


RULES: list[tuple[re.Pattern[str], str]] = []
# "from otel_llm.pkg import module" for modules that moved
for old, new in MAP:
    old_mod, new_mod = dotted(old), dotted(new)
    old_pkg, _, old_name = old_mod.rpartition(".")
    new_pkg, _, new_name = new_mod.rpartition(".")
    alias = "" if old_name == new_name else f" as {old_name}"
    RULES.append((re.compile(rf"\bfrom {re.escape(old_pkg)} import {old_name}\b(?! as)"),
                  f"from {new_pkg} import {new_name}{alias}"))
for old, new in sorted(MAP, key=lambda m: -len(dotted(m[0]))):
    ahead = r"(?![\w.])" if dotted(new).startswith(dotted(old) + ".") else r"(?![\w])"
    RULES.append((re.compile(rf"(?<![\w.]){re.escape(dotted(old))}{ahead}"), dotted(new)))
    RULES.append((re.compile(rf"(?<![\w/]){re.escape(old)}"), new))
RULES.append((re.compile(r"(?<![\w.])otel_llm\.simulate(?![\w])"), "otel_llm_simulate"))
RULES.append((re.compile(r"(?<![\w/])otel_llm/simulate/"), "otel_llm_simulate/"))

for name in sys.argv[1:]:
    path = Path(name)
    text = path.read_text()
    new_text = text
    for pattern, replacement in RULES:
        new_text = pattern.sub(replacement, new_text)
    if new_text != text:
        path.write_text(new_text)
        print("rewrote", name)
