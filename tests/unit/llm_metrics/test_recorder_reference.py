"""The recorder's compiled observers against a plain reference written here: every naming, both
sides, per-model buckets, fixed labels, per-step values, counters by outcome, segments, weights,
exemplars, too-long label values, the series cap's overflow and exponential buckets, over random
records. The reference walks each spec of each naming and finds each bucket by a linear scan, so a
wrong unrolled spec, a shared key, an inlined value or a skipped overflow count shows as a difference."""

from __future__ import annotations

import random
from typing import Any

import pytest

from otel_llm.internal import core as native_core
from otel_llm.pdata.records import Outcome, RequestRecord, Segment, Side
from otel_llm.processor.llm_metrics.metrics.definitions import (
    SEGMENT_METRIC,
    Naming,
    adapter_naming,
    genai_client_naming,
    genai_naming,
    own_cache_naming,
    own_naming,
    prometheus_label_name,
    vllm_cache_naming,
    vllm_naming,
)
from otel_llm.processor.llm_metrics.metrics.exponential import ExponentialState
from otel_llm.processor.llm_metrics.metrics.families import CounterFamily, HistogramFamily, HistogramSeries
from otel_llm.processor.llm_metrics.metrics.recorder import MetricsRecorder
from tests.support.records import as_core_record

OVERFLOW = ("__overflow__",)
MAX_LABEL_BYTES = 24
LIMIT = 6  # series per family: small, so random label values fill it and overflow


def _bucket(bounds: tuple[float, ...], value: float) -> int:
    """The first bucket whose upper bound is >= value (le semantics), by a linear scan."""
    for index, bound in enumerate(bounds):
        if value <= bound:
            return index
    return len(bounds)


class Reference:
    def __init__(self, namings: list[Naming], dimension_names: tuple[str, ...]) -> None:
        self.namings = namings
        self.dimension_names = dimension_names
        # family name -> key -> [counts, total, count, exemplars, exponential]
        self.hists: dict[str, dict[tuple[str, ...], list[Any]]] = {}
        self.hist_overflowed: dict[str, int] = {}
        self.counters: dict[str, dict[tuple[str, ...], float]] = {}
        self.counter_overflowed: dict[str, int] = {}
        self.too_long: dict[str, int] = {}

    def _first_too_long(self, key: tuple[str, ...], names: tuple[str, ...]) -> str:
        for position, value in enumerate(key):
            if len(value.encode("utf-8")) > MAX_LABEL_BYTES:
                return names[position] if position < len(names) else "dimension"
        return ""

    def _admit(self, series: dict, key: tuple[str, ...]) -> tuple[tuple[str, ...], bool]:
        if key in series:
            return key, key == OVERFLOW
        if len(series) < LIMIT:
            return key, False
        return OVERFLOW, True

    def _observe(self, name: str, bounds: tuple[float, ...], own_bounds: tuple[float, ...], key: tuple[str, ...],
                 forced_overflow: bool, value: float, weight: float, exemplar: tuple[str, str] | None) -> None:
        """``own_bounds``: the bounds of the key's own series (a model's), ``bounds`` the overflow series'."""
        series = self.hists.setdefault(name, {})
        key, overflow = (OVERFLOW, True) if forced_overflow else self._admit(series, key)
        if key != OVERFLOW:
            bounds = own_bounds
        state = series.get(key)
        if state is None:
            state = series[key] = [[0.0] * (len(bounds) + 1), 0.0, 0.0, {}, ExponentialState(160, 20)]
        index = _bucket(bounds, value)
        state[0][index] += weight
        state[1] += value * weight
        state[2] += weight
        if exemplar:
            state[3][index] = (exemplar[0], exemplar[1], value)
        state[4].observe(value, weight)
        if overflow:
            self.hist_overflowed[name] = self.hist_overflowed.get(name, 0) + 1

    def _count(self, name: str, key: tuple[str, ...], forced_overflow: bool, amount: float) -> None:
        series = self.counters.setdefault(name, {})
        if forced_overflow:
            key, overflow = OVERFLOW, True
        else:
            key, overflow = self._admit(series, key)
        series[key] = series.get(key, 0.0) + amount
        if overflow:
            self.counter_overflowed[name] = self.counter_overflowed.get(name, 0) + 1

    def record(self, record: RequestRecord, with_exemplars: bool) -> None:
        exemplar = (record.trace_id.hex(), record.span_id.hex()) if with_exemplars else None
        succeeded = record.outcome not in (Outcome.ABORT, Outcome.ERROR)
        first_too_long = ""
        for naming in self.namings:
            if naming.side != record.side:
                continue
            key = naming.labels(record) + record.dimensions
            names = tuple(prometheus_label_name(n) for n in naming.label_names + self.dimension_names)
            too_long = self._first_too_long(key, names)
            first_too_long = first_too_long or too_long
            for spec in naming.histograms if too_long else ():
                # A too-long key takes its naming's overflow series at once, observed or not (as the
                # recorder has always done: the series is there, empty, from the first such key).
                self.hists.setdefault(spec.name, {}).setdefault(
                    OVERFLOW, [[0.0] * (len(spec.buckets) + 1), 0.0, 0.0, {}, ExponentialState(160, 20)])
            for spec in naming.histograms:
                if spec.success_only and not succeeded:
                    continue
                values = spec.per_step(record) if spec.per_step else (spec.value(record),)
                own_bounds = dict(spec.buckets_by_model).get(record.model, spec.buckets)
                fixed = (spec.fixed_label[1],) if spec.fixed_label else ()
                for value in values:
                    if value is not None:
                        self._observe(spec.name, spec.buckets, own_bounds, key + fixed, bool(too_long), value,
                                      record.weight, exemplar)
            for counter in naming.counters:
                amount = counter.value(record)
                if amount is None:
                    continue
                fixed = (counter.fixed_label[1],) if counter.fixed_label else ()
                outcome = (record.outcome,) if counter.by_outcome else ()
                self._count(counter.name, key + fixed + outcome, bool(too_long), amount * record.weight)
        if record.segments:
            base = (record.model, record.engine_kind, record.service_name)
            too_long = self._first_too_long(base + record.dimensions, (
                "model_name", "engine_kind", "service_name") + self.dimension_names)
            first_too_long = first_too_long or too_long
            for name, start, end in record.segments:
                self._observe(SEGMENT_METRIC.name, SEGMENT_METRIC.buckets, SEGMENT_METRIC.buckets,
                              base + (name,) + record.dimensions,
                              bool(too_long), (end - start) / 1e9, record.weight, exemplar)
        if first_too_long:
            self.too_long[first_too_long] = self.too_long.get(first_too_long, 0) + 1


def _random_record(rng: random.Random) -> RequestRecord:
    def maybe(value: Any) -> Any:
        return value if rng.random() < 0.75 else None

    def text(choices: list[str]) -> str:
        return rng.choice(choices + ["x" * 30]) if rng.random() < 0.08 else rng.choice(choices)

    side = rng.choice([Side.SERVER, Side.SERVER, Side.CLIENT])
    model = text(["llama", "qwen", "mistral", "big-model", "é-model"])
    prompt = maybe(rng.choice([0, 1, 7, 100, 2000, 9000]))
    # Now and then past int64 (a clock gone wrong, or a hostile span): the core's wider reading.
    start = rng.randrange(10**18, 2 * 10**18) if rng.random() < 0.95 else 2**63 + rng.randrange(-10**9, 10**9)
    segments = tuple(Segment(name, start, start + rng.randrange(0, 5 * 10**9))
                     for name in rng.sample(["queue", "prefill", "decode", "preprocess"], rng.randrange(0, 4)))
    adapter = rng.choice(["", "", "sql-lora"])
    return RequestRecord(
        trace_id=rng.randbytes(16), span_id=rng.randbytes(8), engine_kind="client" if side == Side.CLIENT else
        rng.choice(["vllm", "sglang", "tgi"]), adapter="a", service_name=text(["svc-a", "svc-b"]), model=model,
        model_source="span", request_model=rng.choice(["", model]), response_model=rng.choice(["", model]),
        operation_name="chat", provider_name=rng.choice(["vllm", "openai"]),
        outcome=rng.choice([Outcome.STOP, Outcome.LENGTH, Outcome.ABORT, Outcome.ERROR, Outcome.UNKNOWN]),
        side=side, error_type=rng.choice(["", "timeout"]), server_address="h", server_port="8000",
        ttft_s=maybe(rng.choice([0.0, 0.001, 0.02, 0.5, 10.0, 3000.0, rng.random()])),
        tpot_s=maybe(rng.random() / 10), e2e_s=maybe(rng.random() * 100), queue_s=maybe(rng.random()),
        prefill_s=maybe(rng.random()), decode_s=maybe(rng.random() * 5), inference_s=maybe(rng.random() * 6),
        prompt_tokens=prompt, completion_tokens=maybe(rng.choice([0, 1, 2, 50, 4096])),
        gateway_overhead_s=maybe(rng.random() / 100), client_overhead_s=maybe(rng.random() / 10),
        edge_ttft_s=maybe(rng.random()), segments=segments, dimensions=(text(["gold", "free"]),),
        weight=rng.choice([1.0, 1.0, 2.0, 1.45]),
        cached_tokens=maybe(rng.choice([0, 5, 100])) if prompt is not None else maybe(3),
        cache_write_tokens=maybe(4), reasoning_tokens=maybe(9),
        itl_s=tuple(rng.random() / 20 for _ in range(rng.randrange(0, 4))),
        spec_accepted_tokens=maybe(30), spec_draft_tokens=maybe(40), spec_steps=maybe(rng.choice([0, 10])),
        lora_adapter=adapter, lora_base_model="llama" if adapter else "")


def _core_of(implementation: str) -> Any:
    """The compiled core for "native" (the test is skipped on a machine without one, unless
    ``make test`` requires it), None for the Python observers."""
    if implementation == "python":
        return None
    extension = native_core.active()[0] or native_core.select("auto")[0]
    if extension is None:
        pytest.skip("the compiled core is not built: only the Python observers exist here")
    return extension


@pytest.mark.parametrize("implementation", ["python", "native", "native_records"])
@pytest.mark.parametrize("genai_version", ["1.41", "0.1"])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_compiled_observers_match_the_reference(genai_version: str, seed: int, implementation: str) -> None:
    namings = [vllm_naming(8192, {"qwen": 1000}), vllm_cache_naming(8192, {"qwen": 1000}), genai_naming(genai_version),
               genai_client_naming(genai_version), own_naming(), own_cache_naming(), adapter_naming()]
    # native_records: the core's observers given the core's own records (read by index, not by name).
    core = _core_of("native" if implementation == "native_records" else implementation)
    recorder = MetricsRecorder(namings, ("tier",), LIMIT, max_label_value_bytes=MAX_LABEL_BYTES, core=core)
    recorder.keep_exponential(160, 20)
    reference = Reference(namings, ("tier",))
    rng = random.Random(seed)
    for _ in range(600):
        record = _random_record(rng)
        with_exemplars = rng.random() < 0.3
        recorder.record(as_core_record(record, core) if implementation == "native_records" else record, with_exemplars)
        reference.record(record, with_exemplars)

    got_hists: dict[str, HistogramFamily] = {}
    got_counters: dict[str, CounterFamily] = {}
    for family in recorder.families():
        if isinstance(family, HistogramFamily):
            got_hists[family.name] = family
        else:
            got_counters[family.name] = family
    assert set(reference.hists) <= set(got_hists)
    for name, family in got_hists.items():
        expected = reference.hists.get(name, {})
        assert set(family.series) == set(expected), name
        for key, series in family.series.items():
            counts, total, count, exemplars, exponential = expected[key]
            assert series.counts == counts, (name, key)
            assert series.total == total and series.count == count, (name, key)
            assert {i: (e.trace_id, e.span_id, e.value) for i, e in series.exemplars.items()} == exemplars
            assert series.exponential is not None
            assert series.exponential.positive.counts == exponential.positive.counts, (name, key)
            assert series.exponential.zero_count == exponential.zero_count
        assert family.overflowed == reference.hist_overflowed.get(name, 0), name
    for name, counter_family in got_counters.items():
        assert counter_family.totals() == reference.counters.get(name, {}), name
        assert counter_family.overflowed == reference.counter_overflowed.get(name, 0), name
    assert recorder.too_long == reference.too_long
    # The random records did reach what the test is about.
    assert any(OVERFLOW in f.series for f in got_hists.values())
    assert reference.too_long and sum(reference.hist_overflowed.values()) > 0
    assert any(s.exemplars for f in got_hists.values() for s in f.series.values())
    # Each implementation wrote series of its own kind: the core's observers were the ones compared.
    expected_class = HistogramSeries if core is None else core.HistogramSeries
    assert {type(s) for f in got_hists.values() for s in f.series.values()} == {expected_class}
    expected_counter = float if core is None else core.CounterSeries
    assert {type(v) for f in got_counters.values() for v in f.series.values()} == {expected_counter}


def _state(recorder: MetricsRecorder) -> dict[str, Any]:
    out: dict[str, Any] = {"too_long": dict(recorder.too_long)}
    for family in recorder.families():
        if isinstance(family, HistogramFamily):
            out[family.name] = ({key: (s.counts, s.total, s.count, dict(s.bounds and {"own": s.bounds}),
                                       {i: (e.trace_id, e.span_id, e.value, type(e.value)) for i, e in s.exemplars.items()})
                                 for key, s in family.series.items()}, family.overflowed, list(family.series))
        else:
            out[family.name] = (family.totals(), family.overflowed, list(family.series))
    return out


@pytest.mark.parametrize("seed", [4, 5])
def test_the_cores_observers_are_the_python_observers(seed: int) -> None:
    """Without exponential buckets (the default), on the same records: the same series in the same
    order (each drew on the byte budget in the same order), the same floats bit for bit (a sum's
    rounding is order-dependent), the same exemplar values and types, overflow and too-long counts."""
    namings = [vllm_naming(8192, {"qwen": 1000}), vllm_cache_naming(8192, {"qwen": 1000}), genai_naming("1.41"),
               genai_client_naming("1.41"), own_naming(), own_cache_naming(), adapter_naming()]
    core = _core_of("native")
    # The core's observers read Python's records by name and the core's own (what its record builder
    # makes) by index: a third pair of recorders is given the same records as the core's.
    recorders = [MetricsRecorder(namings, ("tier",), LIMIT, series_limit_bytes=limit, max_label_value_bytes=MAX_LABEL_BYTES,
                                 core=implementation)
                 for implementation in (None, core, core) for limit in (16 * 1024 * 1024, 60_000)]
    rng = random.Random(seed)
    for _ in range(800):
        record = _random_record(rng)
        core_record = as_core_record(record, core)
        with_exemplars = rng.random() < 0.3
        for index, recorder in enumerate(recorders):
            recorder.record(core_record if index >= 4 else record, with_exemplars)
    python_big, python_small, native_big, native_small, own_big, own_small = (_state(r) for r in recorders)
    assert native_big == python_big and own_big == python_big
    assert native_small == python_small and own_small == python_small
    assert python_small != python_big  # the small byte budget did overflow series the large one kept
    assert recorders[3].budget.used == recorders[1].budget.used and recorders[2].budget.used == recorders[0].budget.used


def test_record_many_records_every_chunk_as_record_does() -> None:
    """The completion chain records a batch's records with ``record_many``, which takes the lock
    once per ``RECORD_MANY_CHUNK``: over two and a half chunks, the same state as one ``record`` per
    record, with the core and without."""
    from otel_llm.processor.llm_metrics.metrics.recorder import RECORD_MANY_CHUNK

    namings = [vllm_naming(8192, {}), genai_naming("1.41"), genai_client_naming("1.41"), own_naming()]
    rng = random.Random(6)
    batch = [(_random_record(rng), rng.random() < 0.3) for _ in range(RECORD_MANY_CHUNK * 5 // 2)]
    states = []
    for implementation in (None, _core_of("native")):
        one_by_one, many = (MetricsRecorder(namings, ("tier",), LIMIT, max_label_value_bytes=MAX_LABEL_BYTES,
                                            core=implementation) for _ in range(2))
        for record, with_exemplars in batch:
            one_by_one.record(record, with_exemplars)
        many.record_many(batch)
        assert _state(many) == _state(one_by_one) and many.requests_recorded == len(batch)
        states.append(_state(many))
    assert states[0] == states[1]


def test_a_misspelled_record_field_fails_where_the_metric_is_declared() -> None:
    from otel_llm.processor.llm_metrics.metrics.definitions import Field, Fields

    with pytest.raises(ValueError, match="RequestRecord has no field 'ttft'"):
        Field("ttft")
    with pytest.raises(ValueError, match="RequestRecord has no field 'engine'"):
        Fields("model", "engine")
    record = _random_record(random.Random(4))
    assert Fields("model", "engine_kind")(record) == (record.model, record.engine_kind)


def test_declared_values_compute_what_the_metrics_define() -> None:
    """The computed values the namings declare as data, on the cases their definitions name (written
    here, not read from the code): no value where a field is missing, a zero denominator, at most
    one output token; the configured default model where a request named none."""
    from otel_llm.processor.llm_metrics.metrics.definitions import Difference, Either, Fields, Ratio, UnlessAtMost

    record = _random_record(random.Random(6))

    def on(**fields: Any) -> RequestRecord:
        for name, value in fields.items():
            setattr(record, name, value)
        return record

    computed, ratio, acceptance = Difference("prompt_tokens", "cached_tokens"), Ratio("cached_tokens", "prompt_tokens"), \
        Ratio("spec_accepted_tokens", "spec_steps", offset=1.0)
    assert computed(on(prompt_tokens=100, cached_tokens=75)) == 25
    assert computed(on(prompt_tokens=None)) is None and computed(on(prompt_tokens=5, cached_tokens=None)) is None
    assert ratio(on(prompt_tokens=100, cached_tokens=75)) == 0.75
    assert ratio(on(prompt_tokens=0, cached_tokens=0)) is None and ratio(on(prompt_tokens=9, cached_tokens=None)) is None
    assert acceptance(on(spec_accepted_tokens=30, spec_steps=10)) == 4.0
    assert acceptance(on(spec_steps=0)) is None and acceptance(on(spec_accepted_tokens=None, spec_steps=3)) is None
    tpot = UnlessAtMost("tpot_s", "completion_tokens", 1)
    assert tpot(on(tpot_s=0.02, completion_tokens=2)) == 0.02 and tpot(on(completion_tokens=None)) == 0.02
    assert tpot(on(completion_tokens=1)) is None and tpot(on(completion_tokens=0)) is None
    labels = Fields("operation_name", Either("request_model", "model"))
    assert labels(on(operation_name="chat", request_model="", model="default-model")) == ("chat", "default-model")
    assert labels(on(request_model="asked")) == ("chat", "asked")
    with pytest.raises(ValueError, match="RequestRecord has no field 'prompt'"):
        Ratio("cached_tokens", "prompt")


def test_the_core_computes_declared_values_as_python_does() -> None:
    """Each declared value kind (``Difference``, ``Ratio`` with and without an offset, ``UnlessAtMost``,
    ``Either`` in a label key), observed and counted by the core's observer and by the Python one on
    the values where arithmetic differs between machine numbers and Python's: integers past 2^53 and
    2^64, negative ones, floats in integer fields, zero denominators, a guard's boundary. The same
    series, sums bit for bit, and exemplar values of the same type (int, float)."""
    from otel_llm.processor.llm_metrics.metrics.definitions import (
        CounterSpec, Difference, Either, Fields, HistogramSpec, Ratio, UnlessAtMost)

    bounds = (-1e15, -1.0, 0.0, 0.5, 1.0, 2.0, 1e6, 1e15)  # within 2^53, as the core takes them
    naming = Naming(
        key="t", label_names=("model_name", "operation"), labels=Fields(Either("request_model", "model"), "operation_name"),
        histograms=(HistogramSpec("t_difference", "1", "", bounds, Difference("prompt_tokens", "cached_tokens")),
                    HistogramSpec("t_ratio", "1", "", bounds, Ratio("cached_tokens", "prompt_tokens")),
                    HistogramSpec("t_offset", "1", "", bounds, Ratio("spec_accepted_tokens", "spec_steps", offset=1.0)),
                    HistogramSpec("t_unless", "s", "", bounds, UnlessAtMost("tpot_s", "completion_tokens", 1))),
        counters=(CounterSpec("t_difference_total", "1", "", Difference("prompt_tokens", "cached_tokens")),
                  CounterSpec("t_ratio_total", "1", "", Ratio("spec_accepted_tokens", "spec_steps", offset=1.0))))
    core = _core_of("native")
    recorders = [MetricsRecorder([naming], (), 64, core=implementation) for implementation in (None, core, core)]
    numbers = [None, 0, 1, 2, -3, 7, 2**53 + 1, 2**64 + 3, -(2**70), 0.5, 1.0, 3.25, True]
    rng = random.Random(7)
    met = {"zero_denominator": 0, "at_most_one": 0, "big": 0, "fallback": 0}
    for _ in range(3000):
        record = _random_record(rng)
        record.side, record.weight = Side.SERVER, rng.choice([1.0, 2.0, 0.3])
        record.prompt_tokens, record.cached_tokens = rng.choice(numbers), rng.choice(numbers)
        record.spec_accepted_tokens, record.spec_steps = rng.choice(numbers), rng.choice(numbers)
        record.completion_tokens, record.tpot_s = rng.choice(numbers), rng.choice([None, 0.01, 2.0])
        record.request_model = rng.choice(["", "asked"])
        met["zero_denominator"] += record.prompt_tokens == 0 and record.cached_tokens is not None
        met["at_most_one"] += record.completion_tokens is not None and record.completion_tokens <= 1
        met["big"] += isinstance(record.prompt_tokens, int) and abs(record.prompt_tokens) > 2**53
        met["fallback"] += record.request_model == ""
        with_exemplars = rng.random() < 0.5
        for recorder, given in zip(recorders, (record, record, as_core_record(record, core))):
            recorder.record(given, with_exemplars)
    python_state, native_state, own_state = (_state(r) for r in recorders)
    assert native_state == python_state and own_state == python_state
    assert all(count > 100 for count in met.values()), met
    difference = python_state["t_difference"][0]
    assert "asked" in {key[0] for key in difference} and {key[0] for key in difference} - {"asked"}  # and fallbacks
    assert {type(e[2]) for s in difference.values() for e in s[4].values()} >= {int, float}


def test_a_recorder_no_longer_referenced_is_collected_with_its_series() -> None:
    """The core's observers and recording hold the recorder's bound methods and caches (a cycle
    through the recorder): the cyclic collector must see through them, or every recorder a process
    builds (one per configuration it serves, one per test) keeps all its series for good."""
    import gc
    import weakref

    core = _core_of("native")
    namings = [vllm_naming(8192), vllm_cache_naming(8192), genai_naming("1.41"), own_naming(), own_cache_naming()]
    recorders = [MetricsRecorder(namings, ("tier",), LIMIT, core=core) for _ in range(3)]
    rng = random.Random(8)
    for recorder in recorders:
        for _ in range(20):
            recorder.record(_random_record(rng), rng.random() < 0.5)
    assert all(any(f.series for f in recorder.families()) for recorder in recorders)
    alive = [weakref.ref(recorder) for recorder in recorders]
    del recorders, recorder
    gc.collect()
    assert [ref() for ref in alive] == [None, None, None]
