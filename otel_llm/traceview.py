"""Terminal views of the trace store: a request table and a single trace's waterfall. Pure functions
from the JSON API's shapes to text, so the CLI reads the SQLite file or the API alike."""

from __future__ import annotations

import datetime
from typing import Any

TABLE_COLUMNS = [
    ("trace_id", "TRACE ID", 32), ("model", "MODEL", 24), ("engine_kind", "ENGINE", 6), ("outcome", "OUTCOME", 7),
    ("policy", "KEPT BY", 13), ("ttft_s", "TTFT ms", 9), ("queue_s", "QUEUE ms", 9), ("e2e_s", "E2E ms", 9),
    ("completion_tokens", "OUT TOK", 7),
]


def terminal_safe(text: str) -> str:
    """A string from a span, for a terminal: control characters (escape sequences, newlines) shown
    as escapes, never interpreted."""
    return text if text.isprintable() else "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _cell(key: str, value: Any) -> str:
    if value is None:
        return "-"
    if key.endswith("_s"):
        return f"{value * 1000:.1f}"
    return terminal_safe(str(value))


def render_table(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "no kept requests match\n"
    lines = ["  ".join(title.ljust(width) for _, title, width in TABLE_COLUMNS).rstrip()]
    for row in rows:
        cells = []
        for key, _, width in TABLE_COLUMNS:
            text = _cell(key, row.get(key))
            cells.append(text[:width].ljust(width) if key != "trace_id" else text.ljust(width))
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines) + "\n"


def _depths(spans: list[dict[str, Any]]) -> dict[str, int]:
    parents = {s["span_id"]: s.get("parent_span_id") or "" for s in spans}
    depths: dict[str, int] = {}
    for span_id in parents:
        depth, cursor, seen = 0, parents[span_id], 0
        while cursor in parents and seen < 64:
            depth += 1
            cursor = parents[cursor]
            seen += 1
        depths[span_id] = depth
    return depths


def _ordered(spans: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Depth-first, children after their parent, siblings by start time."""
    ids = {s["span_id"] for s in spans}
    children: dict[str, list[dict[str, Any]]] = {}
    roots = []
    for span in sorted(spans, key=lambda s: (s["start_time_unix_nano"], -s["end_time_unix_nano"])):
        parent = span.get("parent_span_id") or ""
        if parent in ids:
            children.setdefault(parent, []).append(span)
        else:
            roots.append(span)
    out: list[dict[str, Any]] = []
    stack = list(reversed(roots))
    while stack:
        span = stack.pop()
        out.append(span)
        stack.extend(reversed(children.get(span["span_id"], [])))
    return out


def render_waterfall(trace: dict[str, Any], width: int = 60) -> str:
    """One bar per span on a shared time axis; segment spans labelled with their segment; ms durations."""
    spans = trace["spans"]
    if not spans:
        return "empty trace\n"
    start = min(s["start_time_unix_nano"] for s in spans)
    end = max(s["end_time_unix_nano"] for s in spans)
    total = max(end - start, 1)
    depths = _depths(spans)
    summary = trace.get("summary") or {}
    header = [f"trace {trace['trace_id']}  {total / 1e6:.1f} ms"]
    if summary:
        header.append(
            f"model {terminal_safe(str(summary.get('model')))}  engine {terminal_safe(str(summary.get('engine_kind')))}  "
            f"outcome {summary.get('outcome')}  kept by {terminal_safe(str(summary.get('policy')))}  TTFT {_cell('ttft_s', summary.get('ttft_s'))} ms  "
            f"TPOT {_cell('tpot_s', summary.get('tpot_s'))} ms")
        started = datetime.datetime.fromtimestamp(start / 1e9, tz=datetime.timezone.utc)
        header.append(f"started {started.isoformat(timespec='milliseconds')}")
    label_width = 34
    lines = header + [""]
    for span in _ordered(spans):
        segment = (span.get("attributes") or {}).get("otel_llm.segment")
        name = terminal_safe(f"[{segment}]" if segment else str(span["name"]))
        label = ("  " * depths[span["span_id"]] + name)[:label_width].ljust(label_width)
        offset = int((span["start_time_unix_nano"] - start) / total * width)
        length = max(1, round((span["end_time_unix_nano"] - span["start_time_unix_nano"]) / total * width))
        offset = min(offset, width - 1)
        length = min(length, width - offset)
        bar = " " * offset + ("▒" if segment else "█") * length
        duration = (span["end_time_unix_nano"] - span["start_time_unix_nano"]) / 1e6
        status = "  ERROR" if span.get("status_code") == 2 else ""
        lines.append(f"{label} |{bar.ljust(width)}| {duration:10.1f} ms{status}")
    return "\n".join(lines) + "\n"


REQUESTS_FAMILY = "vllm:request_success_total"
UNMEASURED_FAMILY = "otel_llm_service_unmeasured_total"
NOT_MEASURABLE = "not_measurable_"


def summarize(exposition: str) -> list[dict[str, Any]]:
    """Per service, from a /metrics text: the requests counted (by engine) and what was not measured,
    with reasons: spans refused as malformed, and derived intervals not measurable."""
    from prometheus_client.parser import text_string_to_metric_families

    services: dict[str, dict[str, Any]] = {}

    def entry(service: str) -> dict[str, Any]:
        return services.setdefault(service, {"service": service, "engines": set(), "requests": 0.0,
                                             "refused": {}, "not_measurable": {}})

    for family in text_string_to_metric_families(exposition):
        for sample in family.samples:
            labels = sample.labels
            if sample.name == REQUESTS_FAMILY:
                row = entry(labels.get("service_name", ""))
                row["requests"] += sample.value
                row["engines"].add(labels.get("engine_kind", ""))
            elif sample.name == UNMEASURED_FAMILY and sample.value:
                row = entry(labels.get("service_name", ""))
                reason = labels.get("reason", "")
                if reason.startswith(NOT_MEASURABLE):
                    row["not_measurable"][reason[len(NOT_MEASURABLE):]] = sample.value
                else:
                    row["refused"][reason] = sample.value
    return [{**row, "engines": sorted(row["engines"])} for _, row in sorted(services.items())]


def _reasons(counts: dict[str, float]) -> str:
    return ", ".join(f"{terminal_safe(reason)} {count:g}" for reason, count in sorted(counts.items())) or "-"


def render_summary(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "no requests counted yet\n"
    lines = [f"{'SERVICE':<28}  {'ENGINE':<8}  {'REQUESTS':>8}  {'REFUSED':>7}  {'REFUSED BY REASON':<30}  NOT MEASURABLE"]
    for row in rows:
        refused = sum(row["refused"].values())
        service = terminal_safe(row["service"]) or "(none)"
        lines.append(f"{service[:28]:<28}  {(','.join(row['engines']) or '-')[:8]:<8}  {row['requests']:>8g}  "
                     f"{refused:>7g}  {_reasons(row['refused'])[:30]:<30}  {_reasons(row['not_measurable'])}")
    return "\n".join(line.rstrip() for line in lines) + "\n"
