"""The terminal views: every string from a span is shown inert (no escape sequence reaches the terminal)."""

from __future__ import annotations

from otel_llm.traceview import render_summary, render_table, render_waterfall, summarize

HOSTILE = "evil\x1b[2J\x1b]0;pwned\x07\nnext"


def test_waterfall_table_and_summary_escape_control_characters():
    trace = {"trace_id": "ab" * 16, "summary": {"model": HOSTILE, "engine_kind": "vllm", "policy": HOSTILE},
             "spans": [{"span_id": "01", "parent_span_id": "", "name": HOSTILE, "start_time_unix_nano": 0,
                        "end_time_unix_nano": 10**9, "attributes": {}}]}
    table = render_table([{"trace_id": "ab" * 16, "model": HOSTILE, "engine_kind": "vllm"}])
    summary = render_summary(summarize(
        '# TYPE vllm:request_success counter\n'
        'vllm:request_success_total{service_name="evil\\nnext",engine_kind="vllm",finished_reason="stop"} 3\n'))
    for text in (render_waterfall(trace), table, summary):
        assert "\x1b" not in text and "\x07" not in text, text
    assert "evil\\x1b[2J" in render_waterfall(trace)
    assert "evil\\nnext" in summary and summary.count("\n") == 2
