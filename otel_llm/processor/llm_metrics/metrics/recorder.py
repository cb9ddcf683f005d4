"""Records each request once, in every enabled naming, from the same ``RequestRecord``."""

from __future__ import annotations

import threading
import time
from bisect import bisect_left
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from otel_llm.internal import core as native_core
from otel_llm.pdata.records import Outcome, RequestRecord
from otel_llm.processor.llm_metrics.metrics.accounting import Accounting
from otel_llm.processor.llm_metrics.metrics.definitions import (
    SEGMENT_METRIC,
    CounterSpec,
    Constant,
    Difference,
    Either,
    Field,
    Fields,
    HistogramSpec,
    Naming,
    Ratio,
    UnlessAtMost,
    prometheus_label_name,
)
from otel_llm.processor.llm_metrics.metrics.families import (
    CounterFamily,
    Exemplar,
    HistogramFamily,
    HistogramSeries,
    Key,
    SeriesBudget,
)

_FAILED = Outcome.FAILED
DEFAULT_SERIES_LIMIT_BYTES = 16 * 1024 * 1024
DEFAULT_MAX_LABEL_VALUE_BYTES = 256
# Records observed per taking of the recorder's lock in ``record_many`` (~2-3 us each with the core).
RECORD_MANY_CHUNK = 512


@dataclass(slots=True)
class _BoundHistogram:
    spec: HistogramSpec
    family: HistogramFamily
    key_suffix: Key  # the spec's fixed label value, if it has one


@dataclass(slots=True)
class _BoundCounter:
    spec: CounterSpec
    family: CounterFamily
    key_suffix: Key = ()  # the spec's fixed label value, if it has one

    @property
    def extra_label_names(self) -> tuple[str, ...]:
        """Its label names after the naming's: the fixed label's, then ``finished_reason``."""
        return ((self.spec.fixed_label[0],) if self.spec.fixed_label else ()) + (
            ("finished_reason",) if self.spec.by_outcome else ())


@dataclass(slots=True)
class ExposedHistogram:
    """One histogram family as exposed: several specs may observe into it (``fixed_label``)."""

    spec: HistogramSpec  # the first of them: name, unit, description, buckets
    family: HistogramFamily
    label_names: tuple[str, ...]


@dataclass(slots=True)
class BoundNaming:
    naming: Naming
    label_names: tuple[str, ...]  # naming labels + configured dimensions
    histograms: list[_BoundHistogram]
    counters: list[_BoundCounter]
    exposed: list[ExposedHistogram]


def _bind(naming: Naming, dimension_names: tuple[str, ...], series_limit: int, budget: SeriesBudget) -> BoundNaming:
    label_names = naming.label_names + dimension_names
    exposed: dict[str, ExposedHistogram] = {}
    histograms = []
    for spec in naming.histograms:
        shared = exposed.get(spec.name)
        if shared is None:
            extra = (spec.fixed_label[0],) if spec.fixed_label else ()
            exposed_labels = tuple(prometheus_label_name(n) for n in label_names + extra) + ("le",)
            shared = exposed[spec.name] = ExposedHistogram(
                spec, HistogramFamily(spec.name, spec.buckets, series_limit, budget, exposed_labels,
                                      dict(spec.buckets_by_model)),
                label_names + extra)
        histograms.append(_BoundHistogram(spec, shared.family, (spec.fixed_label[1],) if spec.fixed_label else ()))
    counter_labels = tuple(prometheus_label_name(n) for n in label_names) + ("finished_reason",)
    counters = [_BoundCounter(c, CounterFamily(c.name, series_limit, budget, label_names=counter_labels + (
                    (prometheus_label_name(c.fixed_label[0]),) if c.fixed_label else ())),
                              (c.fixed_label[1],) if c.fixed_label else ())
                for c in naming.counters]
    return BoundNaming(naming, label_names, histograms, counters, list(exposed.values()))


def _same_labels(a: BoundNaming, b: BoundNaming) -> bool:
    """Whether two namings build the same label key from a record (the same label names, and the
    same function or the same declared fields): their series can share one key lookup."""
    if a.label_names != b.label_names:
        return False
    fa, fb = a.naming.labels, b.naming.labels
    return fa is fb or (isinstance(fa, Fields) and fa == fb)


class _Plan:
    """The namings of one side that build the same label key, resolved for the recording loop: per
    histogram (value, success only, per step, bounds, family, fixed label value), per counter (value,
    by outcome, family), and a cache from a record's label key to the series each histogram observes
    into (``None`` until its first observation, so a series exists only once observed, as before)."""

    __slots__ = ("bounds", "labels", "label_names", "hists", "counters", "cache", "cache_limit")

    def __init__(self, bounds: list[BoundNaming], series_limit: int) -> None:
        self.bounds = bounds
        self.labels = bounds[0].naming.labels
        self.label_names = tuple(prometheus_label_name(n) for n in bounds[0].label_names)
        self.hists = tuple((h.spec.value, h.spec.success_only, h.spec.per_step, h.family.bounds, h.family,
                            h.key_suffix) for bound in bounds for h in bound.histograms)
        self.counters = tuple((c.spec.value, c.spec.by_outcome, c.family, c.key_suffix)
                              for bound in bounds for c in bound.counters)
        # Per key: the series of each histogram (None until first observed), then whether each is
        # the overflow series, then the name of a label whose value is too long ("" if none).
        self.cache: dict[Key, list[Any]] = {}
        # The cache only saves lookups: bounded whatever the label keys (a hostile flood clears it).
        self.cache_limit = 4 * series_limit + 64


def _inline(value: Callable[..., Any]) -> str | None:
    """Source for what ``value(record)`` returns, when it is declared as a field or a constant
    (``definitions.Field``, ``Constant``): most specs, read without a call."""
    if isinstance(value, Field):
        return f"record.{value.name}"
    if isinstance(value, Constant):
        return repr(value.value)
    return None


def _fields_tuple(labels: Callable[..., Any]) -> str | None:
    """Source for ``labels(record)`` when its values are declared as fields (``definitions.Fields``)."""
    if not isinstance(labels, Fields):
        return None
    return "(" + ", ".join(f"(record.{name.first} or record.{name.fallback})" if isinstance(name, Either)
                           else f"record.{name}" for name in labels.names) + ",)"


Observer = Callable[[RequestRecord, float, bool, Key, str, str, float], str]


def _compile(side: str, bounds: list[BoundNaming], series_limit: int,
             new_slots: Callable[[_Plan, Key], list[Any]], core: ModuleType | None = None) -> tuple[Observer, Observer]:
    """One side's recording loop unrolled for its namings' specs, as Python source generated once
    (as ``dataclasses`` and ``namedtuple`` build their methods): ``observe(record, weight, succeeded,
    dimensions, trace_id, span_id, now)`` records ``record`` in every naming of
    ``side`` and returns the first label too long for a series ("" if none); the second function
    returned is the same with exemplars (for kept traces).

    A record pays no per-spec tuple unpacking, branch on a spec's options or call for a plain field
    read, and namings with the same labels share one key and one cache lookup. Per observation it
    does exactly what the loop over specs did, in the same order (series are created, and draw on
    the byte budget, in that order): the same bucket, count, sum, exemplar and overflow counting.

    With the compiled ``core``, the same loop is the core's ``Observer``, run from ``_native_ops``'
    plan (the series it observes into are then the core's ``HistogramSeries``)."""
    plans: list[_Plan] = []
    group_of: list[int] = []
    for bound in bounds:
        for number, plan in enumerate(plans):
            if _same_labels(plan.bounds[0], bound):
                plan.bounds.append(bound)
                group_of.append(number)
                break
        else:
            group_of.append(len(plans))
            plans.append(_Plan([bound], series_limit))
    plans = [_Plan(plan.bounds, series_limit) for plan in plans]  # hists and counters of every member
    if core is not None:
        ops, shared = _native_ops(bounds, group_of, plans)
        return tuple(core.Observer(ops, shared, new_slots, MetricsRecorder._resolve, Exemplar,
                                   CounterFamily.OVERFLOW, with_exemplars) for with_exemplars in (False, True))
    scope: dict[str, Any] = {"bisect_left": bisect_left, "Exemplar": Exemplar, "OVERFLOW": CounterFamily.OVERFLOW,
                             "new_slots": new_slots, "resolve": MetricsRecorder._resolve}
    exec(compile(_source(bounds, group_of, plans, scope, exemplars=False) + "\n\n"  # noqa: S102
                 + _source(bounds, group_of, plans, scope, exemplars=True), f"<observe {side}>", "exec"), scope)
    return scope["observe"], scope["observe_with_exemplars"]


def _shared_values(plans: list[_Plan]) -> list[Callable[..., Any]]:
    """A computed value (not a field read) that several specs observe whatever the outcome is
    computed once per record, up front (the value functions are pure functions of the record), in
    this order."""
    uses: dict[int, int] = {}
    for plan in plans:
        for value_of in [h[0] for h in plan.hists if h[2] is None and not h[1]] + [c[0] for c in plan.counters]:
            if _inline(value_of) is None:
                uses[id(value_of)] = uses.get(id(value_of), 0) + 1
    shared: dict[int, Callable[..., Any]] = {}
    for plan in plans:
        for value_of in [h[0] for h in plan.hists if h[2] is None and not h[1]] + [c[0] for c in plan.counters]:
            if uses.get(id(value_of), 0) > 1 and id(value_of) not in shared:
                shared[id(value_of)] = value_of
    return list(shared.values())


def _native_ops(bounds: list[BoundNaming], group_of: list[int], plans: list[_Plan]) -> tuple[list[tuple[Any, ...]], list[Any]]:
    """The compiled core's ``Observer`` plan: the steps ``_source`` writes, in its order, as data
    (the core's ``Observer`` documents the tuples)."""
    shared = _shared_values(plans)
    shared_index = {id(value_of): index for index, value_of in enumerate(shared)}

    def declared(value_of: Callable[..., Any]) -> tuple[str, Any]:
        """A value the core computes itself where it is declared as data, else a call back."""
        if isinstance(value_of, Field):
            return ("field", value_of.name)
        if isinstance(value_of, Constant):
            return ("constant", value_of.value)
        if isinstance(value_of, Difference):
            return ("difference", (value_of.minuend, value_of.subtrahend))
        if isinstance(value_of, Ratio):
            return ("ratio", (value_of.numerator, value_of.denominator, value_of.offset))
        if isinstance(value_of, UnlessAtMost):
            return ("unless_at_most", (value_of.name, value_of.guard, value_of.limit))
        return ("call", value_of)

    def value(value_of: Callable[..., Any]) -> tuple[str, Any]:
        if id(value_of) in shared_index:
            return ("shared", shared_index[id(value_of)])
        return declared(value_of)

    ops: list[tuple[Any, ...]] = []
    hist_offset = [0] * len(plans)
    counter_offset = [0] * len(plans)
    started: set[int] = set()
    for bound, group in zip(bounds, group_of):
        plan = plans[group]
        count = len(plan.hists)
        if group not in started:
            started.add(group)
            fields = ([(name.first, name.fallback) if isinstance(name, Either) else name for name in plan.labels.names]
                      if isinstance(plan.labels, Fields) else None)
            ops.append(("key", group, fields, plan.labels, plan.cache, plan, plan.cache_limit))
        for _ in bound.histograms:
            position = hist_offset[group]
            hist_offset[group] += 1
            value_of, success_only, per_step, family_bounds, family, suffix = plan.hists[position]
            ops.append(("hist", group, position, count, value(value_of), success_only,
                        None if per_step is None else declared(per_step), family, family_bounds,
                        bool(family.bounds_by_model), suffix))
        for _ in bound.counters:
            position = counter_offset[group]
            counter_offset[group] += 1
            value_of, by_outcome, counter_family, counter_suffix = plan.counters[position]
            ops.append(("counter", group, value(value_of), by_outcome, counter_family, counter_family.series,
                        counter_suffix))
    return ops, [declared(value_of) for value_of in shared]


def _source(bounds: list[BoundNaming], group_of: list[int], plans: list[_Plan], scope: dict[str, Any],
            exemplars: bool) -> str:
    """The observer's source: with ``exemplars``, each observation also links the record's trace."""
    function = "observe_with_exemplars" if exemplars else "observe"
    lines = [f"def {function}(record, weight, succeeded, dimensions, trace_id, span_id, now):", "    too_long = ''"]
    hist_offset = [0] * len(plans)
    counter_offset = [0] * len(plans)
    started: set[int] = set()
    shared: dict[int, str] = {}
    for value_of in _shared_values(plans):
        name = shared[id(value_of)] = f"shared_{len(shared)}"
        scope[name + "_of"] = value_of
        lines.append(f"    {name} = {name}_of(record)")

    def read(value: Callable[..., Any], name: str) -> str:
        inline = _inline(value)
        if inline is not None:
            return inline
        if id(value) in shared:
            return shared[id(value)]
        scope[name] = value
        return f"{name}(record)"

    for bound, group in zip(bounds, group_of):
        plan = plans[group]
        g = group
        count = len(plan.hists)
        if group not in started:
            started.add(group)
            scope[f"labels_{g}"], scope[f"cache_{g}"], scope[f"plan_{g}"] = plan.labels, plan.cache, plan
            lines += [
                f"    key_{g} = {_fields_tuple(plan.labels) or f'labels_{g}(record)'} + dimensions",
                f"    slots_{g} = cache_{g}.get(key_{g})",
                f"    if slots_{g} is None:",
                f"        if len(cache_{g}) >= {plan.cache_limit}:",
                f"            cache_{g}.clear()",
                f"        slots_{g} = cache_{g}[key_{g}] = new_slots(plan_{g}, key_{g})",
                f"    too_long_{g} = slots_{g}[-1]",
                f"    if too_long_{g}:",
                f"        key_{g} = OVERFLOW",
                "        too_long = too_long or too_long_" + str(g),
            ]
        for _ in bound.histograms:
            position = hist_offset[group]
            hist_offset[group] += 1
            value_of, success_only, per_step, family_bounds, family, suffix = plan.hists[position]
            name = f"{g}_{position}"
            scope[f"family_{name}"], scope[f"bounds_{name}"], scope[f"suffix_{name}"] = family, family_bounds, suffix
            indent = "    "
            if success_only:
                lines.append(f"{indent}if succeeded:")
                indent += "    "
            if per_step is None:
                lines += [f"{indent}value = {read(value_of, f'value_{name}')}", f"{indent}if value is not None:"]
            else:
                lines.append(f"{indent}for value in {read(per_step, f'steps_{name}')}:")
            indent += "    "
            # Only a family with per-model buckets has series with bounds of their own.
            series_bounds = f"series.bounds or bounds_{name}" if family.bounds_by_model else f"bounds_{name}"
            series_key = f"key_{g} + suffix_{name}" if suffix else f"key_{g}"
            lines += [
                f"{indent}series = slots_{g}[{position}]",
                f"{indent}if series is None:",
                f"{indent}    series = resolve(slots_{g}, {position}, {count}, family_{name}, {series_key})",
                f"{indent}index = bisect_left({series_bounds}, value)  # le: value == bound falls in that bucket",
                f"{indent}series.counts[index] += weight",
                f"{indent}series.total += value * weight",
                f"{indent}series.count += weight",
                f"{indent}extra = slots_{g}[{count + position}]",
                f"{indent}if extra:",
                f"{indent}    if extra & {_EXPONENTIAL}:",
                f"{indent}        series.exponential.observe(value, weight)",
                f"{indent}    if extra & {_OVERFLOWED}:",
                f"{indent}        family_{name}.overflowed += 1",
            ]
            if exemplars:
                lines.append(f"{indent}series.exemplars[index] = Exemplar(trace_id, span_id, value, now)")
        for _ in bound.counters:
            position = counter_offset[group]
            counter_offset[group] += 1
            value_of, by_outcome, counter_family, counter_suffix = plan.counters[position]
            name = f"{g}_{position}"
            scope[f"counter_{name}"], scope[f"counter_series_{name}"] = counter_family, counter_family.series
            scope[f"counter_suffix_{name}"] = counter_suffix
            counter_key = f"key_{g} + counter_suffix_{name}" if counter_suffix else f"key_{g}"
            if by_outcome:
                counter_key += " + (record.outcome,)"
            lines += [
                f"    amount = {read(value_of, f'counter_value_{name}')}",
                "    if amount is not None:",
                f"        if too_long_{g}:",
                f"            counter_{name}.add_overflow(amount * weight)",
                "        else:",
                f"            counter_key = {counter_key}",
                # CounterFamily.add, inlined for a series that exists already
                f"            current = counter_series_{name}.get(counter_key)",
                "            if current is None:",
                f"                counter_{name}.add(counter_key, amount * weight)",
                "            else:",
                f"                counter_series_{name}[counter_key] = current + amount * weight",
            ]
    lines.append("    return too_long")
    return "\n".join(lines)


def _series_of(family: HistogramFamily, key: Key) -> HistogramSeries:
    """The series ``key`` observes into: its own, or the overflow series once the cap is full (the
    caller counts each observation that goes there in ``family.overflowed``)."""
    series = family.series.get(key)
    if series is None:
        if key != family.OVERFLOW and not family.has_room(key):
            key = family.OVERFLOW
        series = family.series.get(key)
        if series is None:
            series = family.series[key] = family.new_series(key)
    return series


# What an observation does besides its bucket, count and sum, per series (fixed once the series
# exists: exponential buckets are asked for before the first observation), as one flag word so the
# common series (neither) costs one test.
_OVERFLOWED = 1  # it is the overflow series: each observation counts in ``family.overflowed``
_EXPONENTIAL = 2  # it keeps exponential buckets too


def _extra(series: HistogramSeries, overflow: bool) -> int:
    return (_OVERFLOWED if overflow else 0) | (_EXPONENTIAL if series.exponential is not None else 0)


def _too_long(key: Key, names: tuple[str, ...], limit: int) -> str:
    """The name of the first label whose value has more than ``limit`` bytes (UTF-8), or ""."""
    for position, value in enumerate(key):
        if len(value) > limit // 4 and len(value.encode("utf-8", "replace")) > limit:
            return names[position] if position < len(names) else "dimension"
    return ""


class MetricsRecorder:
    def __init__(self, namings: list[Naming], dimension_names: tuple[str, ...], series_limit: int,
                 series_limit_bytes: int = DEFAULT_SERIES_LIMIT_BYTES,
                 max_label_value_bytes: int = DEFAULT_MAX_LABEL_VALUE_BYTES, core: ModuleType | None | bool = True) -> None:
        """``series_limit`` label sets per family and ``series_limit_bytes`` of exposition over all
        families; a label value over ``max_label_value_bytes`` never takes a series of its own: its
        observations go to the overflow series, counted in ``too_long`` by label. ``core``: the
        compiled core to record with (``True``: the process's choice, ``internal/core.py``; ``None``
        or ``False``: the Python observers, the reference)."""
        self._core: ModuleType | None = native_core.active()[0] if core is True else (core or None)
        self.dimension_names = dimension_names
        self.budget = SeriesBudget(series_limit_bytes)
        self.max_label_value_bytes = max_label_value_bytes
        self.too_long: dict[str, int] = {}
        self.namings = [_bind(naming, dimension_names, series_limit, self.budget) for naming in namings]
        self._by_side: dict[str, list[BoundNaming]] = {}
        for bound in self.namings:
            self._by_side.setdefault(bound.naming.side, []).append(bound)
        self._observers: dict[str, tuple[Observer, Observer]] = {
            side: _compile(side, bounds, series_limit, self._slots, self._core) for side, bounds in self._by_side.items()}
        self.segment_label_names = ("model_name", "engine_kind", "service_name", "segment") + dimension_names
        self.segments = HistogramFamily(SEGMENT_METRIC.name, SEGMENT_METRIC.buckets, series_limit, self.budget,
                                        self.segment_label_names + ("le",))
        self._segment_cache: dict[Key, dict[str, tuple[HistogramSeries, int]]] = {}
        self._segment_cache_limit = 4 * series_limit + 64
        self._segment_too_long: dict[Key, str] = {}
        self.lock = threading.Lock()
        self._requests_recorded = 0
        self.accounting: Accounting | None = None  # tenant tokens, cost, SLO attainment (when configured)
        # Bucket limit of the native histogram parts a scrape gets (``exporters.prometheus.native_histograms``
        # sets it with ``keep_exponential``); None: a scrape copies none.
        self.native_max_size: int | None = None
        if self._core is not None:  # the core's observers write only the core's series
            for family in self._histogram_families():
                family.series_class = self._core.HistogramSeries
            for bound in self.namings:
                for counter in bound.counters:
                    counter.family.cell_class = self._core.CounterSeries
            self._recording: Any = self._core.Recording(
                self._observers, self.segments.bounds, self.segments, Exemplar, self._segment_cache,
                self._segment_too_long, self.too_long, self._segment_entry, self._resolve_segment, _FAILED, time.time)
        else:
            self._recording = None

    def core_recording(self) -> tuple[Any, threading.Lock] | None:
        """(the core's ``Recording``, the lock it records under) where ``record`` is that call and
        nothing else (no accounting), for the completion lane (``service/lane.py``); else None."""
        if self._recording is None or self.accounting is not None:
            return None
        return self._recording, self.lock

    @property
    def requests_recorded(self) -> int:
        return self._requests_recorded + (self._recording.recorded if self._recording is not None else 0)

    def record(self, record: RequestRecord, with_exemplars: bool = False) -> None:
        """Observe ``record`` in every naming of its side; ``with_exemplars`` only for traces the sampler kept.

        One compiled observer per side (``_compile``): a label key is built once per label shape and
        record, the series it observes into are looked up once per key (``_Plan.cache``), and an
        observation is a bucket index by ``bisect`` and three additions (``HistogramFamily.observe``'s
        arithmetic, inlined). With the compiled core, this whole method is the core's ``Recording``."""
        if self._recording is not None:
            with self.lock:
                self._recording.record(record, with_exemplars)
                if self.accounting is not None:
                    self.accounting.record(record)
            return
        weight = record.weight
        succeeded = record.outcome not in _FAILED  # record.succeeded, inlined
        if with_exemplars:
            trace_id, span_id, now = record.trace_id.hex(), record.span_id.hex(), time.time()
        else:
            trace_id = span_id = ""
            now = 0.0
        dimensions = record.dimensions
        too_long = ""
        with self.lock:
            self._requests_recorded += 1
            observers = self._observers.get(record.side)
            if observers is not None:
                too_long = observers[1 if with_exemplars else 0](record, weight, succeeded, dimensions, trace_id, span_id, now)
            if record.segments:
                base = (record.model, record.engine_kind, record.service_name)
                cache_key = base + dimensions
                by_name = self._segment_cache.get(cache_key)
                if by_name is None:
                    by_name = self._segment_entry(cache_key)
                everything = by_name.get("")
                if everything is not None:
                    too_long = too_long or self._segment_too_long.get(cache_key, "dimension")
                family = self.segments
                bounds = family.bounds
                for name, start_unix_ns, end_unix_ns in record.segments:
                    duration = (end_unix_ns - start_unix_ns) / 1e9
                    resolved = everything or by_name.get(name)
                    if resolved is None:
                        resolved = self._resolve_segment(by_name, base, dimensions, name)
                    series, extra = resolved
                    index = bisect_left(bounds, duration)
                    series.counts[index] += weight
                    series.total += duration * weight
                    series.count += weight
                    if extra:
                        if extra & _EXPONENTIAL:
                            exponential = series.exponential
                            assert exponential is not None
                            exponential.observe(duration, weight)
                        if extra & _OVERFLOWED:
                            family.overflowed += 1
                    if with_exemplars:
                        series.exemplars[index] = Exemplar(trace_id, span_id, duration, now)
            if too_long:
                self.too_long[too_long] = self.too_long.get(too_long, 0) + 1
            if self.accounting is not None:
                self.accounting.record(record)

    def record_many(self, recording: list[tuple[RequestRecord, bool]]) -> None:
        """``record`` for each (record, with_exemplars) in order; with the compiled core, taking the
        lock once per ``RECORD_MANY_CHUNK`` records (a scrape waits for one chunk, ~1 ms, at most)."""
        core_recording = self._recording
        if core_recording is None:
            for record, with_exemplars in recording:
                self.record(record, with_exemplars)
            return
        record_one = core_recording.record
        accounting = self.accounting
        for start in range(0, len(recording), RECORD_MANY_CHUNK):
            if accounting is None:
                with self.lock:
                    core_recording.record_many(recording[start:start + RECORD_MANY_CHUNK])
                continue
            with self.lock:
                for record, with_exemplars in recording[start:start + RECORD_MANY_CHUNK]:
                    record_one(record, with_exemplars)
                    if accounting is not None:
                        accounting.record(record)

    def _segment_entry(self, cache_key: Key) -> dict[str, tuple[HistogramSeries, int]]:
        """A segment label key's new cache entry: segment name -> (series, what else an observation
        does); a key with a label value too long for a series of its own gets "" -> the overflow
        series, which every segment of it then observes into."""
        if len(self._segment_cache) >= self._segment_cache_limit:
            self._segment_cache.clear()
            self._segment_too_long.clear()
        by_name: dict[str, tuple[HistogramSeries, int]] = {}
        self._segment_cache[cache_key] = by_name
        label = _too_long(cache_key, self.segment_label_names[:3] + self.segment_label_names[4:], self.max_label_value_bytes)
        if label:
            overflow_series = _series_of(self.segments, self.segments.OVERFLOW)
            by_name[""] = (overflow_series, _extra(overflow_series, True))
            self._segment_too_long[cache_key] = label
        return by_name

    def _resolve_segment(self, by_name: dict[str, tuple[HistogramSeries, int]], base: Key, dimensions: Key,
                         name: str) -> tuple[HistogramSeries, int]:
        """The series segment ``name`` of a key observes into, cached in the key's entry."""
        family = self.segments
        series = _series_of(family, base + (name,) + dimensions)
        resolved = by_name[name] = (series, _extra(series, series is family.series.get(family.OVERFLOW)))
        return resolved

    def _slots(self, plan: _Plan, key: Key) -> list[Any]:
        """A new cache entry: [series per histogram..., what else each observation does (``_extra``)...,
        the label whose value is too long or ""]. A too-long value resolves to the overflow series at once."""
        count = len(plan.hists)
        slots: list[Any] = [None] * count + [0] * count + [_too_long(key, plan.label_names,
                                                                      self.max_label_value_bytes)]
        if slots[-1]:
            for position, hist in enumerate(plan.hists):
                family = hist[4]
                series = slots[position] = _series_of(family, family.OVERFLOW)
                slots[count + position] = _extra(series, True)
        return slots

    @staticmethod
    def _resolve(slots: list, position: int, count: int, family: HistogramFamily, key: Key) -> HistogramSeries:
        series = slots[position] = _series_of(family, key)
        slots[count + position] = _extra(series, series is family.series.get(family.OVERFLOW))
        return series

    def keep_exponential(self, max_size: int, max_scale: int) -> None:
        """Every histogram series keeps base-2 exponential buckets too, within the largest limits any
        caller asked for (a caller wanting smaller ones downscales a copy: ``ExponentialState.fitted``).
        Called when the components start, before the first request is recorded."""
        with self.lock:
            histograms = self._histogram_families()
            if any(f.series for f in histograms):
                raise RuntimeError("exponential buckets must be asked for before the first observation")
            for family in histograms:
                old = family.exponential
                family.exponential = (max(max_size, old[0]), max(max_scale, old[1])) if old else (max_size, max_scale)

    def _histogram_families(self) -> list[HistogramFamily]:
        return [f for f in self.families() if isinstance(f, HistogramFamily)]

    def families(self) -> list[HistogramFamily | CounterFamily]:
        out: list[HistogramFamily | CounterFamily] = [self.segments]
        for bound in self.namings:
            out.extend(h.family for h in bound.exposed)
            out.extend(c.family for c in bound.counters)
        if self.accounting is not None:
            out.extend(self.accounting.families.values())
        return out
