"""The differential corpus of the engine's `series` module (rust/engine/src/series), written by the
Python reference: seeded random RequestRecords (both sides, every outcome, None values, hostile
label values, weights, segments, exemplars) recorded into ``MetricsRecorder(..., core=None)`` with
the namings as ``processor/llm_metrics/stage.py`` builds them, then exposed by prometheus_client
through ``RecorderCollector`` (text 0.0.4 and OpenMetrics as ``exporter/prometheus/endpoint.py``
asks for them). ``rust/engine/tests/series_differential.rs`` records the same records natively and
must render the same bytes and hold the same state.

Per scenario directory: ``spec.json`` (the declarations as data, by ``service/declarations.py``
``metrics_spec_json``: what the binding hands the engine),
``records.json`` (every field by name, with the exemplar flag and time of each), ``metrics.txt``,
``metrics.om`` (the expositions) and ``snapshot.json`` (every series' counts, sums, exemplars and
exponential buckets). ``floats.json``: floats with Python's ``repr`` and prometheus_client's
``floatToGoString``, and integer quotients.

Floats are written as ``repr`` strings (exact, and NaN/inf survive JSON); ints as JSON numbers.

Regenerate from the repository root (the Python reference, not the compiled core):

    OTEL_LLM_CORE=python PYTHONPATH=. .venv/bin/python rust/engine/tests/data/series/generate.py
"""

from __future__ import annotations

import json
import random
import struct
import sys
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import generate_latest
from prometheus_client.openmetrics import exposition as openmetrics
from prometheus_client.utils import floatToGoString

from otel_llm.pdata.records import RequestRecord, Segment
from otel_llm.processor.llm_metrics.metrics import definitions as d
from otel_llm.processor.llm_metrics.metrics import recorder as recorder_module
from otel_llm.processor.llm_metrics.metrics.exponential import ExponentialState
from otel_llm.processor.llm_metrics.metrics.exposition import RecorderCollector
from otel_llm.processor.llm_metrics.metrics.families import HistogramFamily
from otel_llm.processor.llm_metrics.metrics.recorder import MetricsRecorder
from otel_llm.service.declarations import floats, metrics_spec_json

OUT = Path(__file__).resolve().parent


# --- records -------------------------------------------------------------------------------------

HOSTILE = ['q"uote', "back\\slash", "new\nline", "tab\there", "ünïcødé-模型", "🚀emoji", "", "__overflow__", "le",
           '{x="y"}', "a,b=c", "x" * 40, "y" * 300, "\x00nul", "é" * 20, "é" * 33]
BOUNDS = sorted(set(d.TTFT_BUCKETS + d.TPOT_BUCKETS + d.REQUEST_LATENCY_BUCKETS + d.GENAI_DURATION_BUCKETS
                    + d.CACHE_HIT_RATIO_BUCKETS + d.SPEC_ACCEPTANCE_LENGTH_BUCKETS))
ODD_FLOATS = [0.0, -0.0, -1.5, float("nan"), float("inf"), float("-inf"), 1e300, 5e-324, 2.2250738585072014e-308,
              2.0 ** 1000, 2.0 ** 1001, 1e-9, 0.1 + 0.2]
TOKEN_BOUNDS = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 8192, 10000]
ODD_INTS = [0, 1, -5, 2 ** 53 + 1, 2 ** 62, 2 ** 63 - 1, -(2 ** 63)]
SEGMENT_NAMES = ["preprocess", "queue", "prefill", "decode", "postprocess", "kv_transfer"]
OUTCOMES = ["stop", "length", "abort", "error", "unknown"]
LABELS = ("engine_kind", "service_name", "model", "request_model", "response_model", "operation_name", "provider_name",
          "error_type", "server_address", "server_port", "lora_adapter", "dimension")
FLOAT_FIELDS = ("ttft_s", "tpot_s", "e2e_s", "queue_s", "prefill_s", "decode_s", "inference_s", "gateway_overhead_s",
                "client_overhead_s", "edge_ttft_s")
INT_FIELDS = ("prompt_tokens", "completion_tokens", "cached_tokens", "cache_write_tokens", "reasoning_tokens",
              "spec_accepted_tokens", "spec_draft_tokens", "spec_steps")


class Pools:
    """Label values: a few ordinary ones, a hostile one in one label of a record now and then, and
    with ``wide`` random ones (a flood of label keys)."""

    def __init__(self, rng: random.Random, hostile: float, wide: bool) -> None:
        self.rng = rng
        self.hostile = hostile
        self.wide = wide
        self.hostile_label = ""

    def next_record(self) -> None:
        self.hostile_label = self.rng.choice(LABELS) if self.rng.random() < self.hostile else ""

    def text(self, label: str, normal: list[str]) -> str:
        if label == self.hostile_label:
            return self.rng.choice(HOSTILE)
        if self.wide and self.rng.random() < 0.5:
            return "k" + "".join(self.rng.choice("abcdef") for _ in range(4))
        return self.rng.choice(normal)

    def seconds(self) -> float | None:
        r = self.rng.random()
        if r < 0.15:
            return None
        if r < 0.27:
            return self.rng.choice(BOUNDS)
        if r < 0.31:
            return self.rng.choice(ODD_FLOATS)
        return 10 ** self.rng.uniform(-4, 3.6)

    def tokens(self) -> int | None:
        r = self.rng.random()
        if r < 0.2:
            return None
        if r < 0.32:
            return self.rng.choice(TOKEN_BOUNDS)
        if r < 0.37:
            return self.rng.choice(ODD_INTS)
        return int(10 ** self.rng.uniform(0, 5.3))


def make_record(pools: Pools, dimensions: int) -> RequestRecord:
    rng = pools.rng
    pools.next_record()
    side = "server" if rng.random() < 0.75 else "client"
    outcome = rng.choice(OUTCOMES) if rng.random() > 0.02 else rng.choice(['weird"out', ""])
    fields: dict[str, Any] = {name: pools.seconds() for name in FLOAT_FIELDS}
    fields.update({name: pools.tokens() for name in INT_FIELDS})
    if rng.random() < 0.3 and fields["prompt_tokens"] is not None:  # cached within the prompt, as reported
        fields["cached_tokens"] = rng.randint(0, max(0, min(fields["prompt_tokens"], 10 ** 6)))
    adapter = "" if rng.random() < 0.7 else pools.text("lora_adapter", ["lora-a", "lora-b"])
    segments = []
    for _ in range(rng.choice([0, 0, 1, 3, 5])):
        start = rng.randint(1_700_000_000 * 10 ** 9, 1_800_000_000 * 10 ** 9)
        r = rng.random()
        if r < 0.03:
            start, end = -(2 ** 63), 2 ** 63 - 1
        elif r < 0.08:
            end = start - rng.randint(1, 10 ** 9)  # two clocks
        else:
            end = start + int(10 ** rng.uniform(3, 11.5))
        name = rng.choice(SEGMENT_NAMES[:3]) if rng.random() > 0.04 else rng.choice(SEGMENT_NAMES[3:] + ['seg"x', "s" * 100, ""])
        segments.append(Segment(name, start, end))
    count = dimensions if rng.random() > 0.03 else rng.choice([0, 1, dimensions + 1])
    itl = () if rng.random() < 0.5 else tuple(pools.seconds() or 0.01 for _ in range(rng.randint(1, 8)))
    return RequestRecord(
        trace_id=rng.randbytes(16), span_id=rng.randbytes(8),
        engine_kind=pools.text("engine_kind", ["vllm"] * 9 + ["sglang"]) if side == "server" else "client",
        adapter=rng.choice(["vllm", "sglang", "genai"]),
        service_name=pools.text("service_name", ["svc-a"]),
        model=pools.text("model", ["llama-3-8b", "m-long"] * 4 + ["m-short"]),
        model_source=rng.choice(["span:gen_ai.response.model", "none"]),
        request_model=pools.text("request_model", ["", "llama-3-8b"]),
        response_model=pools.text("response_model", ["", "", "llama-3-8b"]),
        operation_name=pools.text("operation_name", ["chat"]),
        provider_name=pools.text("provider_name", ["vllm"]),
        outcome=outcome,
        side=side,
        operation_source=rng.choice(["span", "default"]),
        error_type=pools.text("error_type", ["", "", "", "timeout"]),
        server_address=pools.text("server_address", ["10.0.0.1"]),
        server_port=pools.text("server_port", ["8000"]),
        start_unix_ns=rng.randint(0, 2 ** 62),
        segments=tuple(segments),
        dimensions=tuple(pools.text("dimension", ["a"] * 9 + ["b"] if i == 0 else ["x"]) for i in range(count)),
        weight=1.0 if rng.random() < 0.65 else rng.choice([0.5, 1.45, 2.0, 0.1, 3.7, 1e-3, 0.0]),
        itl_s=itl,
        tenant=rng.choice(["t1", ""]),
        lora_adapter=adapter,
        lora_base_model="base-1" if adapter else "",
        **fields,
    )


def record_json(record: RequestRecord, with_exemplars: bool, now: float) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in RequestRecord.__dataclass_fields__:
        value = getattr(record, name)
        if isinstance(value, bytes):
            out[name] = value.hex()
        elif name == "segments":
            out[name] = [[s.name, s.start_unix_ns, s.end_unix_ns] for s in value]
        elif name == "itl_s":
            out[name] = floats(value)
        elif isinstance(value, tuple):
            out[name] = list(value)
        elif isinstance(value, float):
            out[name] = repr(value)
        else:
            out[name] = value  # str, int or None
    out["_with_exemplars"] = with_exemplars
    out["_now"] = repr(now)
    return out


# --- expected state ------------------------------------------------------------------------------

def buckets_json(state: Any) -> dict[str, Any]:
    return {"entries": [[index, repr(count)] for index, count in state.counts.items()], "low": state.low,
            "high": state.high}


def exponential_json(state: ExponentialState) -> dict[str, Any]:
    return {"max_size": state.max_size, "scale": state.scale, "zero_count": repr(state.zero_count),
            "positive": buckets_json(state.positive), "negative": buckets_json(state.negative)}


FITTED = (16, 2)  # a smaller exporter's limits: what ExponentialState.fitted makes of each state


def histogram_json(name: str, family: HistogramFamily) -> dict[str, Any]:
    series = []
    for key, s in family.series.items():
        series.append({
            "key": list(key),
            "counts": floats(tuple(s.counts)), "sum": repr(s.total), "count": repr(s.count),
            "bounds": floats(s.bounds or family.bounds),
            "exemplars": [[index, e.trace_id, e.span_id, repr(float(e.value)), repr(e.timestamp)]
                          for index, e in sorted(s.exemplars.items())],
            "exponential": exponential_json(s.exponential) if s.exponential is not None else None,
            "fitted": exponential_json(s.exponential.fitted(*FITTED)) if s.exponential is not None else None,
        })
    return {"name": name, "kind": "histogram", "overflowed": family.overflowed, "series": series}


def snapshot_json(recorder: MetricsRecorder) -> dict[str, Any]:
    families = []
    for bound in recorder.namings:
        for exposed in bound.exposed:
            families.append(histogram_json(exposed.spec.name, exposed.family))
        for counter in bound.counters:
            families.append({"name": counter.spec.name, "kind": "counter", "overflowed": counter.family.overflowed,
                             "series": [{"key": list(key), "value": repr(value)}
                                        for key, value in counter.family.totals().items()]})
    families.append(histogram_json(d.SEGMENT_METRIC.name, recorder.segments))
    return {"families": families, "too_long": sorted(recorder.too_long.items()),
            "budget_used": recorder.budget.used, "budget_limit": recorder.budget.limit,
            "requests_recorded": recorder.requests_recorded}


class Clock:
    """``time`` as the recorder's module sees it: the exemplar time of the record being recorded."""

    def __init__(self) -> None:
        self.now = 0.0

    def time(self) -> float:
        return self.now


def scenario(name: str, seed: int, records: int, namings: list[d.Naming], dimensions: tuple[str, ...],
             series_limit: int, series_limit_bytes: int, max_label_value_bytes: int,
             exponential: tuple[int, int] | None, hostile: float, wide: bool = False) -> None:
    rng = random.Random(seed)
    pools = Pools(rng, hostile, wide)
    recorder = MetricsRecorder(namings, dimensions, series_limit, series_limit_bytes=series_limit_bytes,
                               max_label_value_bytes=max_label_value_bytes, core=None)
    if exponential:
        recorder.keep_exponential(*exponential)
    clock = Clock()
    setattr(recorder_module, "time", clock)  # the exemplars' time
    written = []
    for _ in range(records):
        record = make_record(pools, len(dimensions))
        with_exemplars = rng.random() < 0.4
        clock.now = 1_700_000_000 + rng.uniform(0, 10 ** 6)
        recorder.record(record, with_exemplars)
        written.append(record_json(record, with_exemplars, clock.now))
    registry = CollectorRegistry()
    registry.register(RecorderCollector(recorder))
    directory = OUT / name
    directory.mkdir(exist_ok=True)
    # What the binding hands the engine (service/declarations.py), written by the same function.
    spec = metrics_spec_json(namings, dimensions, series_limit, series_limit_bytes, max_label_value_bytes,
                             exponential)
    (directory / "spec.json").write_text(json.dumps(spec, indent=1) + "\n")
    (directory / "records.json").write_text(json.dumps(written) + "\n")
    (directory / "metrics.txt").write_bytes(generate_latest(registry))
    om: bytes = openmetrics.generate_latest(registry, escaping=openmetrics.ALLOWUTF8)  # type: ignore[no-untyped-call]
    (directory / "metrics.om").write_bytes(om)
    (directory / "snapshot.json").write_text(json.dumps(snapshot_json(recorder)) + "\n")
    print(f"{name}: {records} records, budget {recorder.budget.used}/{recorder.budget.limit}, "
          f"too long {dict(recorder.too_long)}, overflowed "
          f"{sum(f.overflowed for f in recorder.families())}", file=sys.stderr)


def every_naming(genai_version: str) -> list[d.Naming]:
    """``stage.recorder_of`` with every switch on (and LoRA adapters configured)."""
    by_model = {"m-long": 131072, "m-short": 1000}
    return [d.vllm_naming(8192, by_model), d.vllm_cache_naming(8192, by_model), d.genai_naming(genai_version),
            d.genai_client_naming(genai_version), d.own_naming(), d.own_cache_naming(), d.adapter_naming()]


def floats_corpus() -> None:
    rng = random.Random(7)
    values = [0.0, -0.0, float("inf"), float("-inf"), float("nan"), 1e16, 1e15, 9999999999999998.0, 1e-4, 1e-5,
              1e6, 999999.9999999999, 1234567.0, 16777216.0, 5e-324, 1.7976931348623157e308, 0.1, 1 / 3, 2 ** 53,
              2.0 ** 63, 1e22, 1e21, 123456.789]
    for _ in range(3000):
        values.append(struct.unpack("<d", struct.pack("<Q", rng.getrandbits(64)))[0])
    for _ in range(2000):
        values.append(round(10 ** rng.uniform(-8, 20), rng.randint(0, 12)))
    for _ in range(500):
        values.append(float(rng.randint(0, 10 ** rng.randint(1, 19))))
    # Exactly between two shortest decimals (…099.25 reads back from .2 and .3): repr takes the even.
    for _ in range(1000):
        values.append(rng.randint(2 ** 47, 2 ** 52) + rng.choice([0.25, 0.75, 0.125, 0.375, 0.625, 0.875]))
    for _ in range(1000):
        values.append(float(rng.randint(2 ** 53, 2 ** 63)) * rng.choice([0.1, 0.5, 1.45, 3.7, 1e-3]))
    values = [float(v) for v in values]
    rows = [[struct.unpack("<Q", struct.pack("<d", v))[0], repr(v), floatToGoString(v)]  # type: ignore[no-untyped-call]
            for v in values]
    quotients = []
    for _ in range(2000):
        a = rng.randint(-(2 ** 63), 2 ** 63 - 1) >> rng.randint(0, 62)
        b = rng.randint(-(2 ** 63), 2 ** 63 - 1) >> rng.randint(0, 62) or 1
        quotients.append([a, b, repr(a / b)])
    (OUT / "floats.json").write_text(json.dumps({"floats": rows, "quotients": quotients}) + "\n")


def main() -> None:
    floats_corpus()
    scenario("every_naming", seed=1, records=200, namings=every_naming("1.41"), dimensions=("team", "tier"),
             series_limit=500, series_limit_bytes=16 * 1024 * 1024, max_label_value_bytes=64,
             exponential=(160, 20), hostile=0.1)
    scenario("genai_0_1", seed=2, records=150,
             namings=[d.genai_naming("0.1"), d.genai_client_naming("0.1"), d.own_naming(), d.own_cache_naming()],
             dimensions=(), series_limit=500, series_limit_bytes=16 * 1024 * 1024, max_label_value_bytes=256,
             exponential=None, hostile=0.1)
    scenario("tight", seed=3, records=300, namings=every_naming("1.41"), dimensions=("team",), series_limit=3,
             series_limit_bytes=250_000, max_label_value_bytes=16, exponential=(4, 3), hostile=0.3)
    scenario("key_flood", seed=4, records=300, namings=every_naming("0.1"), dimensions=("team",), series_limit=1,
             series_limit_bytes=16 * 1024 * 1024, max_label_value_bytes=32, exponential=(8, 20), hostile=0.1,
             wide=True)


if __name__ == "__main__":
    main()
