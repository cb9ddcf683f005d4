"""``/api/ui/status``: running components, the self-telemetry that explains loss and refusal (read
from the same registry ``/metrics`` serves), the store's size and retention, and the effective
config with secrets masked."""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any

from prometheus_client import CollectorRegistry

MASK = "••••••"
_SECRET_KEY = re.compile(r"(token|passw|secret|api[-_.]?key|authorization|credential|cookie|private[-_.]?key)", re.I)
# A password in a URL (scheme://user:password@host) and a secret-looking query parameter's value.
_URL_PASSWORD = re.compile(r"(?<=://)([^/@\s:]*):([^/@\s]*)@")
_URL_SECRET_PARAM = re.compile(r"([?&][^=&#\s]*(?:token|passw|secret|key|auth|signature|sig)[^=&#\s]*=)([^&#\s]*)", re.I)
_SECTIONS = (
    ("intake", re.compile(r"receiv|refus|reject|malformed|accepted|admission|intake|memory|connection|spans_dropped|"
                          r"unmatched|request_body|bytes_in")),
    ("sampling", re.compile(r"trace|decision|sampl|policy|late|evict|assembl")),
    ("exporters", re.compile(r"export|queue|send|retry|push")),
    ("store", re.compile(r"store")),
)


def mask(value: Any, key: str = "") -> Any:
    """Values of secret-looking keys (not ``*_file`` paths) and of every header map are masked."""
    if isinstance(value, dict):
        if key == "headers":
            return {k: MASK for k in value}
        return {k: mask(v, str(k)) for k, v in value.items()}
    if isinstance(value, list):
        return [mask(v, key) for v in value]
    if key and _SECRET_KEY.search(key) and not key.endswith("_file") and value not in ("", None, False):
        return MASK
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, str) and ("://" in value or "?" in value):
        value = _URL_PASSWORD.sub(lambda m: f"{m.group(1)}:{MASK}@", value)
        value = _URL_SECRET_PARAM.sub(lambda m: f"{m.group(1)}{MASK}", value)
    return value


def effective_config(config: Any) -> Any:
    if config is None:
        return {}
    is_instance = dataclasses.is_dataclass(config) and not isinstance(config, type)
    data = dataclasses.asdict(config) if is_instance else dict(config)
    return mask(data)


def _section(name: str) -> str:
    for section, pattern in _SECTIONS:
        if section == "store" and pattern.search(name):
            return "store"
    for section, pattern in _SECTIONS:
        if pattern.search(name):
            return section
    return "other"


def self_telemetry(registry: CollectorRegistry) -> list[dict[str, Any]]:
    """Every ``otel_llm_*`` counter and gauge (histograms are the product's data, not its health)."""
    out = []
    for family in registry.collect():
        if not family.name.startswith("otel_llm_") or family.type not in ("counter", "gauge", "unknown"):
            continue
        samples = []
        for sample in family.samples:
            if sample.name.endswith("_created"):
                continue
            value = sample.value
            samples.append({"name": sample.name, "labels": dict(sample.labels),
                            "value": value if math.isfinite(value) else str(value)})
        out.append({"name": family.name, "type": family.type, "help": family.documentation,
                    "section": _section(family.name), "samples": samples})
    out.sort(key=lambda f: (f["section"], f["name"]))
    return out


def components_of(service: Any) -> list[dict[str, Any]]:
    """What a running ``Service`` has configured, and whether each part is running."""
    if service is None:
        return []
    if isinstance(getattr(service, "components", None), dict):  # a component Host: "exporters.store" -> component
        out_host: list[dict[str, Any]] = []
        for path, component in sorted(service.components.items()):
            port = getattr(component, "port", 0)
            problem = component.problem() if callable(getattr(component, "problem", None)) else None
            out_host.append({"kind": path.split(".", 1)[0].rstrip("s"), "name": path,
                             "detail": problem or (f"port {port}" if isinstance(port, int) and port else ""),
                             "running": problem is None and (service.ready.is_set() if hasattr(service, "ready") else True)})
        return out_host
    started = set(getattr(service, "_started", set()))
    out: list[dict[str, Any]] = []
    ingest = getattr(service, "ingest", None)
    if ingest is not None:
        for protocol, port in (("grpc", getattr(service, "grpc_port", 0)), ("http", getattr(service, "http_port", 0))):
            if port:
                out.append({"kind": "receiver", "name": f"otlp/{protocol}", "detail": f"port {port}",
                            "running": "ingest" in started and not getattr(service, "failed", False)})
    out.append({"kind": "processor", "name": "pipeline (llm_metrics, tail_sampling, redaction)", "detail": "",
                "running": "pipeline" in started})
    store = getattr(service, "store", None)
    if store is not None:
        problem = store.problem() if hasattr(store, "problem") else None
        out.append({"kind": "exporter", "name": "store", "detail": problem or str(getattr(store, "path", "")),
                    "running": "store" in started and problem is None})
    for exporter in getattr(service, "trace_exporters", []) or []:
        out.append({"kind": "exporter", "name": getattr(exporter, "name", "otlp"), "detail": "traces",
                    "running": "exporters" in started})
    for exporter in getattr(service, "metrics_exporters", []) or []:
        out.append({"kind": "exporter", "name": getattr(exporter, "name", "otlp_metrics"), "detail": "metrics",
                    "running": "metrics_exporters" in started})
    if getattr(service, "intake_log", None) is not None:
        out.append({"kind": "receiver", "name": "intake_log", "detail": "", "running": "intake_log" in started})
    prometheus = getattr(service, "prometheus", None)
    if prometheus is not None:
        out.append({"kind": "exporter", "name": "prometheus", "detail": f"port {prometheus.port}",
                    "running": "prometheus" in started})
    return out
