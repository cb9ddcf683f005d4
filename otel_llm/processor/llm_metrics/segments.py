"""Pure functions from an engine observation to validated latencies and timed segments.

Nothing here reads a clock or a protobuf: the inputs are numbers, the outputs are numbers,
so every rule of DESIGN.md §4 is testable on its own.
"""

from __future__ import annotations

import math
import sys
from typing import Any, NamedTuple

from otel_llm.internal import core as native_core
from otel_llm.pdata.observation import EngineObservation, MalformedSpan
from otel_llm.pdata.records import Segment

# Engines round independently measured intervals; a millisecond, or 1 % of e2e, absorbs that
# without letting a genuinely inconsistent span through.
ABS_TOLERANCE_S = 1e-3
REL_TOLERANCE = 0.01
MAX_TOKENS_PER_REQUEST = 100_000_000


class Timings(NamedTuple):
    """The engine's numbers, validated, with what follows from them. Derived again at completion
    rather than stored on each buffered span: arithmetic is cheaper than ~100 bytes per span. A
    named tuple: built three times per request, and a frozen dataclass's ``__init__`` costs ~4x."""

    ttft_s: float | None
    e2e_s: float | None
    queue_s: float | None
    prefill_s: float | None
    decode_s: float | None
    inference_s: float | None
    preprocess_s: float | None
    postprocess_s: float | None
    tpot_s: float | None
    # Derived intervals that came out negative (the engine's numbers come from two processes and
    # clocks): not measurable for this request, counted, never a reason to drop it.
    not_measurable: tuple[str, ...] = ()


def _check(name: str, value: float | None, max_latency_s: float) -> None:
    if value is None:
        return
    if math.isnan(value):
        raise MalformedSpan("nan_latency", f"{name} is NaN")
    if math.isinf(value):
        raise MalformedSpan("infinite_latency", f"{name} is infinite")
    if value < 0:
        raise MalformedSpan("negative_latency", f"{name} = {value}")
    if value > max_latency_s:
        raise MalformedSpan("absurd_latency", f"{name} = {value} > {max_latency_s}")


_INF = math.inf
# A C call, where ``Segment(...)`` or ``Timings(...)`` runs the named tuple's Python-level ``__new__``:
# one Timings and about five segments per request.
_new_tuple = tuple.__new__
_MAX_FINITE = sys.float_info.max  # "at most this" excludes infinity as "finite and at most infinity" does
_CHECKED = ("ttft_s", "e2e_s", "queue_s", "prefill_s", "decode_s", "inference_s", "preprocess_s", "tpot_s")


def validate_tokens(obs: EngineObservation) -> None:
    for name, value in (("prompt_tokens", obs.prompt_tokens), ("completion_tokens", obs.completion_tokens)):
        if value is not None and not 0 <= value <= MAX_TOKENS_PER_REQUEST:
            raise MalformedSpan("absurd_token_count", f"{name} = {value}")


def derive_timings(obs: EngineObservation, max_latency_s: float) -> Timings:
    """Validate the engine's numbers and derive what follows from them; ``obs`` is not changed.

    What the engine measured is refused only when it is impossible on any clock (NaN, negative,
    absurd, TTFT after e2e: both taken by one process). What is *derived* from numbers that two
    processes took on two clocks can come out negative without anything being wrong: vLLM's TTFT
    and e2e are the API server's timestamps as it dequeues outputs, queue/prefill/decode the engine
    core's (tests/testdata/engines/FACTS.md), so preprocess = ttft - queue - prefill and postprocess
    = e2e - ttft - decode carry the change in the API server's lag, negative for about half of a
    live server's requests. Such an interval is not measurable for that request (``not_measurable``),
    and the request is measured with everything else.
    """
    ttft, e2e, queue, prefill, decode = obs.ttft_s, obs.e2e_s, obs.queue_s, obs.prefill_s, obs.decode_s
    inference, preprocess = obs.inference_s, obs.preprocess_s
    not_measurable: tuple[str, ...] = ()
    if obs.derived:
        # An adapter's derived prefill/decode (trtllm-serve: prefill = ttft - queue) is checked as
        # derived: negative is not measurable, not malformed.
        if prefill is not None and "prefill" in obs.derived and prefill < 0:
            prefill, not_measurable = None, not_measurable + ("prefill",)
        if decode is not None and "decode" in obs.derived and decode < 0:
            decode, not_measurable = None, not_measurable + ("decode",)
    # One comparison per value on the common path (NaN fails it, infinity is excluded), written out
    # rather than looped (this runs for every request); the first value that fails is then reported
    # by the checks below, in their order.
    bound = max_latency_s if max_latency_s < _INF else _MAX_FINITE
    tpot = obs.tpot_s
    if not ((ttft is None or 0.0 <= ttft <= bound) and (e2e is None or 0.0 <= e2e <= bound)
            and (queue is None or 0.0 <= queue <= bound) and (prefill is None or 0.0 <= prefill <= bound)
            and (decode is None or 0.0 <= decode <= bound) and (inference is None or 0.0 <= inference <= bound)
            and (preprocess is None or 0.0 <= preprocess <= bound) and (tpot is None or 0.0 <= tpot <= bound)):
        for name in _CHECKED:
            if name in ("prefill_s", "decode_s") and name[:-2] in not_measurable:
                continue
            _check(name, getattr(obs, name), max_latency_s)
    prompt, completion = obs.prompt_tokens, obs.completion_tokens
    if (prompt is not None and not 0 <= prompt <= MAX_TOKENS_PER_REQUEST) or \
            (completion is not None and not 0 <= completion <= MAX_TOKENS_PER_REQUEST):
        validate_tokens(obs)
    tolerance = ABS_TOLERANCE_S + REL_TOLERANCE * (e2e or 0.0)

    if inference is None and prefill is not None and decode is not None:
        inference = prefill + decode
    if ttft is not None and e2e is not None and ttft > e2e + tolerance:
        raise MalformedSpan("inconsistent_latency", f"ttft {ttft} > e2e {e2e}")
    if preprocess is None and ttft is not None and queue is not None and prefill is not None:
        preprocess = ttft - queue - prefill
        if preprocess < -tolerance:
            preprocess, not_measurable = None, not_measurable + ("preprocess",)
        else:
            preprocess = max(preprocess, 0.0)
    postprocess = None
    if e2e is not None and ttft is not None and decode is not None:
        postprocess = e2e - ttft - decode
        if postprocess < -tolerance:
            postprocess, not_measurable = None, not_measurable + ("postprocess",)
        else:
            postprocess = max(postprocess, 0.0)
    elif e2e is not None:
        known: float = 0  # as sum() adds them, in this order
        if preprocess is not None:
            known += preprocess
        if queue is not None:
            known += queue
        if inference is not None:
            known += inference
        if known > e2e + tolerance:
            not_measurable += ("postprocess",)

    if tpot is None and decode is not None and obs.completion_tokens is not None:
        # vLLM's definition (v1/metrics/stats.py): decode / (tokens - 1), and 0 for a request of at
        # most one output token, which vLLM observes too.
        tokens = obs.completion_tokens
        tpot = decode / (tokens - 1) if tokens > 1 else 0.0
    return _new_tuple(Timings, (ttft, e2e, queue, prefill, decode, inference, preprocess, postprocess, tpot,
                                not_measurable))


def build_segments(start_unix_ns: int, t: Timings) -> tuple[Segment, ...]:
    """Segments laid end to end from the engine span's start (the request's arrival).

    Zero-length preprocess/postprocess are omitted, as DESIGN.md §4 says; queue, prefill and
    decode are kept even when zero long so every request has the same waterfall.
    """
    ttft, e2e, queue, prefill, decode, inference, preprocess = t[0], t[1], t[2], t[3], t[4], t[5], t[6]
    if ttft is not None and queue is not None and prefill is not None and decode is not None and e2e is not None:
        # vLLM's full set, most requests: the general steps below, written out into one tuple.
        first_token = start_unix_ns + round(ttft * 1e9)
        prefill_start = first_token - round(prefill * 1e9)
        queue_start = prefill_start - round(queue * 1e9)
        decode_end = first_token + round(decode * 1e9)
        end = start_unix_ns + round(e2e * 1e9)
        if queue_start <= start_unix_ns:
            queue_start = start_unix_ns
            if prefill_start < queue_start:
                prefill_start = queue_start
            if end > decode_end:
                return (_new_tuple(Segment, ("queue", queue_start, prefill_start)),
                        _new_tuple(Segment, ("prefill", prefill_start, first_token)),
                        _new_tuple(Segment, ("decode", first_token, decode_end)),
                        _new_tuple(Segment, ("postprocess", decode_end, end)))
            return (_new_tuple(Segment, ("queue", queue_start, prefill_start)),
                    _new_tuple(Segment, ("prefill", prefill_start, first_token)),
                    _new_tuple(Segment, ("decode", first_token, decode_end)))
        if prefill_start < queue_start:
            prefill_start = queue_start
        if end > decode_end:
            return (_new_tuple(Segment, ("preprocess", start_unix_ns, queue_start)),
                    _new_tuple(Segment, ("queue", queue_start, prefill_start)),
                    _new_tuple(Segment, ("prefill", prefill_start, first_token)),
                    _new_tuple(Segment, ("decode", first_token, decode_end)),
                    _new_tuple(Segment, ("postprocess", decode_end, end)))
        return (_new_tuple(Segment, ("preprocess", start_unix_ns, queue_start)),
                _new_tuple(Segment, ("queue", queue_start, prefill_start)),
                _new_tuple(Segment, ("prefill", prefill_start, first_token)),
                _new_tuple(Segment, ("decode", first_token, decode_end)))
    segments: list[Segment] = []
    cursor = start_unix_ns
    if ttft is not None and queue is not None and prefill is not None:
        first_token = start_unix_ns + round(ttft * 1e9)
        prefill_start = first_token - round(prefill * 1e9)
        queue_start = prefill_start - round(queue * 1e9)
        if queue_start > cursor:
            segments.append(_new_tuple(Segment, ("preprocess", cursor, queue_start)))
        else:
            queue_start = cursor
        if prefill_start < queue_start:
            prefill_start = queue_start
        segments.append(_new_tuple(Segment, ("queue", queue_start, prefill_start)))
        segments.append(_new_tuple(Segment, ("prefill", prefill_start, first_token)))
        cursor = first_token
    elif queue is not None and preprocess is not None:
        # TGI: validation, queue, then one inference interval without a first-token mark.
        if preprocess > 0:
            following = cursor + round(preprocess * 1e9)
            segments.append(_new_tuple(Segment, ("preprocess", cursor, following)))
            cursor = following
        following = cursor + round(queue * 1e9)
        segments.append(_new_tuple(Segment, ("queue", cursor, following)))
        cursor = following
        if inference is not None:
            following = cursor + round(inference * 1e9)
            segments.append(_new_tuple(Segment, ("inference", cursor, following)))
            cursor = following
    elif ttft is not None and prefill is not None:
        # SGLang has no queue attribute: everything before prefill is queue + tokenization.
        first_token = start_unix_ns + round(ttft * 1e9)
        prefill_start = first_token - round(prefill * 1e9)
        if prefill_start > cursor:
            segments.append(_new_tuple(Segment, ("queue", cursor, prefill_start)))
        else:
            prefill_start = cursor
        segments.append(_new_tuple(Segment, ("prefill", prefill_start, first_token)))
        cursor = first_token
    if decode is not None and ttft is not None:
        if not segments:
            # Nothing before the first token is known (no queue/prefill): decode still starts at it.
            cursor = start_unix_ns + round(ttft * 1e9)
        decode_end = cursor + round(decode * 1e9)
        segments.append(_new_tuple(Segment, ("decode", cursor, decode_end)))
        cursor = decode_end
    if e2e is not None and segments:
        end = start_unix_ns + round(e2e * 1e9)
        if end > cursor:
            segments.append(_new_tuple(Segment, ("postprocess", cursor, end)))
    return tuple(segments)


def timings_and_segments(obs: EngineObservation, start_unix_ns: int,
                         with_segments: bool) -> tuple[tuple[Any, ...], tuple[Segment, ...]]:
    """``derive_timings(obs, inf)``'s values in ``Timings``' order and ``build_segments(start_unix_ns, ·)``
    (``()`` without ``with_segments``), as a request's completion needs them. With the compiled core,
    an observation it made whose numbers need no refusal is done there (its timings a plain tuple);
    the functions above are the reference and decide everything else."""
    extension = native_core.active()[0]
    if extension is not None:
        both = extension.timings_and_segments(obs, start_unix_ns, with_segments, Segment)
        if both is not None:
            return both
    t = derive_timings(obs, _INF)
    return t, (build_segments(start_unix_ns, t) if with_segments else ())
