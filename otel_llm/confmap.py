"""Loading a config section into its typed dataclass, as the Collector's confmap does.

Every option is a typed dataclass field with its default; ``load_dataclass`` walks the dataclass, so
an unknown key or a bad value is reported with its full path (``receivers.otlp.protocols.grpc.endpoint``).
A field with a sane range declares it in its class's ``BOUNDS`` (``{field: (low, high)}``, inclusive;
durations in seconds): a value outside breaks something at run time (a C int or a shared int64 that
wraps, a busy loop, a timed wait that raises, a thread per unit, or memory without bound).
"""

from __future__ import annotations

import dataclasses
import math
import re
import types
import typing
from typing import Annotated, Any


class ConfigError(ValueError):
    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}" if path else message)
        self.path = path


class _Duration:
    """``"10s"``, ``"500ms"``, ``"2m"``, ``"1h"`` or a number of seconds."""


class _Endpoint:
    """``host:port`` with a port in 0..65535 (0 picks a free port)."""


class _Positive:
    pass


Duration = Annotated[float, _Duration]
Endpoint = Annotated[str, _Endpoint]
PositiveInt = Annotated[int, _Positive]

_DURATION = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*(ns|us|µs|ms|s|m|h)\s*$")
_DURATION_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


# Every integer fits a C int (gRPC channel options, struct fields on the pipes, shared memory),
# every duration is finite and far below what a timed wait accepts (threading.TIMEOUT_MAX, ~292
# years): fields with a tighter sane range are listed in ``_BOUNDS``.
MAX_INT = 2**31 - 1
MAX_DURATION_S = 10 * 365 * 86400.0


def parse_duration(value: Any, path: str) -> float:
    if isinstance(value, bool):
        raise ConfigError(path, f"expected a duration like 10s or 500ms, got {value!r}")
    try:
        if isinstance(value, (int, float)):
            seconds = float(value)
        elif isinstance(value, str) and (match := _DURATION.match(value)):
            seconds = float(match.group(1)) * _DURATION_UNITS[match.group(2)]
        else:
            raise ConfigError(path, f"expected a duration like 10s or 500ms, got {value!r}")
    except OverflowError:
        seconds = math.inf
    if math.isnan(seconds):
        raise ConfigError(path, f"expected a duration like 10s or 500ms, got {value!r}")
    if seconds < 0:
        raise ConfigError(path, f"duration must not be negative, got {value!r}")
    if seconds > MAX_DURATION_S:
        raise ConfigError(path, f"duration must be finite and at most {format_duration(MAX_DURATION_S)}, got {value!r}")
    return seconds


def format_duration(seconds: float) -> str:
    for unit, size in (("h", 3600.0), ("m", 60.0), ("s", 1.0), ("ms", 1e-3)):
        if seconds >= size and (seconds / size).is_integer():
            return f"{seconds / size:.0f}{unit}"
    return f"{seconds:g}s"


def parse_endpoint(value: Any, path: str) -> str:
    if not isinstance(value, str):
        raise ConfigError(path, f"expected host:port, got {value!r}")
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(path, f"expected host:port with a port 0-65535, got {value!r}")
    if not host:
        raise ConfigError(path, f"expected host:port with a host (use 0.0.0.0 for all interfaces), got {value!r}")
    return value


def split_endpoint(endpoint: str) -> tuple[str, int]:
    host, _, port = endpoint.rpartition(":")
    return host.strip("[]"), int(port)



def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", str(tp))


def _convert(tp: Any, value: Any, path: str) -> Any:
    origin = typing.get_origin(tp)
    if origin is Annotated:
        base, *markers = typing.get_args(tp)
        if _Duration in markers:
            return parse_duration(value, path)
        if _Endpoint in markers:
            return parse_endpoint(value, path)
        converted = _convert(base, value, path)
        if _Positive in markers and converted <= 0:
            raise ConfigError(path, f"must be a positive integer, got {value!r}")
        return converted
    if origin in (types.UnionType, typing.Union):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None:
            # An explicitly empty component (`http:` with no body) means "on, with defaults".
            return _convert(args[0], {}, path) if dataclasses.is_dataclass(args[0]) else None
        return _convert(args[0], value, path)
    if dataclasses.is_dataclass(tp):
        return load_dataclass(tp, value, path)
    if origin is list:
        (item,) = typing.get_args(tp)
        if not isinstance(value, list):
            raise ConfigError(path, f"expected a list, got {value!r}")
        return [_convert(item, v, f"{path}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        _, item = typing.get_args(tp)
        if not isinstance(value, dict):
            raise ConfigError(path, f"expected a mapping, got {value!r}")
        return {str(k): _convert(item, v, f"{path}.{k}") for k, v in value.items()}
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(path, f"expected true or false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(path, f"expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(path, f"expected a number, got {value!r}")
        try:
            number = float(value)
        except OverflowError:
            number = math.inf
        if not math.isfinite(number):
            raise ConfigError(path, f"expected a finite number, got {value!r}")
        return number
    if tp is str:
        if not isinstance(value, (str, int, float)) or isinstance(value, bool):
            raise ConfigError(path, f"expected a string, got {value!r}")
        return str(value)
    raise ConfigError(path, f"unsupported type {_type_name(tp)}")


def load_dataclass(cls: Any, data: Any, path: str) -> Any:
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(path, f"expected a mapping, got {data!r}")
    hints = typing.get_type_hints(cls, include_extras=True)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        key_path = f"{path}.{key}" if path else str(key)
        if key not in names:
            raise ConfigError(key_path, f"unknown key; expected one of: {', '.join(names)}")
        kwargs[key] = _convert(hints[key], value, key_path)
        _check_bounds(cls, key, hints[key], kwargs[key], value, key_path)
    return cls(**kwargs)


def _check_bounds(cls: Any, key: str, tp: Any, converted: Any, raw: Any, path: str) -> None:
    bound = getattr(cls, "BOUNDS", {}).get(key)
    if bound is None:
        if isinstance(converted, int) and not isinstance(converted, bool) and not -MAX_INT - 1 <= converted <= MAX_INT:
            raise ConfigError(path, f"must be at most {MAX_INT}, got {raw!r}")
        return
    low, high = bound
    if not low <= converted <= high:
        if _Duration in typing.get_args(tp):
            low_text, high_text = format_duration(low) if low else "0", format_duration(high)
        else:
            low_text, high_text = (f"{int(n)}" if float(n).is_integer() else f"{n:g}" for n in (low, high))
        raise ConfigError(path, f"must be between {low_text} and {high_text}, got {raw!r}")
