"""Which implementation of the per-span hot path runs: the compiled core (``otel_llm._core``, built
from ``rust/`` by ``pip install`` when cargo is present) or the pure-Python reference.

``OTEL_LLM_CORE`` chooses: ``auto`` (the default: native when the extension imports, else Python),
``python`` (the reference, always available) or ``native`` (refuse to start without the extension).
``OTEL_LLM_REQUIRE_NATIVE=1`` (set by ``make test``) makes ``auto`` refuse too, so a suite run that
silently lost the extension fails instead of comparing Python with itself.
"""

from __future__ import annotations

import os
from types import ModuleType

NATIVE = "native"
PYTHON = "python"
CHOICES = ("auto", NATIVE, PYTHON)
ENV = "OTEL_LLM_CORE"
REQUIRE_ENV = "OTEL_LLM_REQUIRE_NATIVE"


class CoreUnavailable(RuntimeError):
    pass


def _import_extension() -> tuple[ModuleType | None, str]:
    try:
        from otel_llm import _core  # type: ignore[attr-defined]
    except ImportError as exc:
        return None, str(exc)
    module: ModuleType = _core
    return module, ""


def select(choice: str | None = None) -> tuple[ModuleType | None, str]:
    """(the extension or ``None``, why the Python path runs when it does)."""
    choice = (choice if choice is not None else os.environ.get(ENV, "auto")).strip().lower() or "auto"
    if choice not in CHOICES:
        raise CoreUnavailable(f"{ENV}={choice!r}: expected one of {', '.join(CHOICES)}")
    if choice == PYTHON:
        return None, f"{ENV}=python"
    module, error = _import_extension()
    if module is None and (choice == NATIVE or os.environ.get(REQUIRE_ENV) == "1"):
        required_by = f"{ENV}=native" if choice == NATIVE else f"{REQUIRE_ENV}=1"
        raise CoreUnavailable(f"{required_by} but the compiled core does not import ({error}); "
                              "install a Rust toolchain (cargo) and reinstall otel-llm")
    if module is None:
        return None, f"the compiled core is not installed ({error})"
    return module, ""


_selected: tuple[ModuleType | None, str] | None = None


def active() -> tuple[ModuleType | None, str]:
    """The process's choice, made once (the environment is read at first use)."""
    global _selected
    if _selected is None:
        _selected = select()
    return _selected


def implementation() -> str:
    return NATIVE if active()[0] is not None else PYTHON
