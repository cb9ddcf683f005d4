//! `segments.py`: a request's numbers validated and what follows from them (`derive_timings`), and
//! its segments laid end to end from the engine span's start (`build_segments`); with Python's
//! float operations in Python's order, and its integers (segment bounds) as `i128`, wide enough
//! for any offset `round(seconds * 1e9)` of a finite duration this crate computes (wider ones are
//! declined; one that leaves `i64` is declined where it reaches a record).

/// `segments.ABS_TOLERANCE_S`, `REL_TOLERANCE`, `MAX_TOKENS_PER_REQUEST`.
const ABS_TOLERANCE_S: f64 = 1e-3;
const REL_TOLERANCE: f64 = 0.01;
const MAX_TOKENS_PER_REQUEST: i64 = 100_000_000;

/// An observation's numbers as `derive_timings` reads them (`EngineObservation`'s fields).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ObservedNumbers {
    pub ttft_s: Option<f64>,
    pub e2e_s: Option<f64>,
    pub queue_s: Option<f64>,
    pub prefill_s: Option<f64>,
    pub decode_s: Option<f64>,
    pub inference_s: Option<f64>,
    pub preprocess_s: Option<f64>,
    pub tpot_s: Option<f64>,
    pub prompt_tokens: Option<i64>,
    pub completion_tokens: Option<i64>,
    /// `"prefill" in obs.derived`, `"decode" in obs.derived`.
    pub prefill_derived: bool,
    pub decode_derived: bool,
}

/// `segments.Timings`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Timings {
    pub ttft_s: Option<f64>,
    pub e2e_s: Option<f64>,
    pub queue_s: Option<f64>,
    pub prefill_s: Option<f64>,
    pub decode_s: Option<f64>,
    pub inference_s: Option<f64>,
    pub preprocess_s: Option<f64>,
    pub postprocess_s: Option<f64>,
    pub tpot_s: Option<f64>,
    pub not_measurable: Vec<&'static str>,
}

/// `segments._check` with `max_latency_s` = infinity (what `timings_and_segments` passes): the
/// reason `MalformedSpan` carries.
fn check(value: Option<f64>) -> Result<(), &'static str> {
    match value {
        Some(v) if v.is_nan() => Err("nan_latency"),
        Some(v) if v.is_infinite() => Err("infinite_latency"),
        Some(v) if v < 0.0 => Err("negative_latency"),
        _ => Ok(()),
    }
}

/// Python's `max(value, 0.0)`: the first argument unless the second is greater (-0.0 stays).
fn at_least_zero(value: f64) -> f64 {
    if 0.0 > value {
        0.0
    } else {
        value
    }
}

/// `segments.derive_timings(obs, inf)`: `Err(reason)` where it raises `MalformedSpan`.
pub fn derive_timings(obs: &ObservedNumbers) -> Result<Timings, &'static str> {
    let (ttft, e2e, queue) = (obs.ttft_s, obs.e2e_s, obs.queue_s);
    let (mut prefill, mut decode) = (obs.prefill_s, obs.decode_s);
    let (mut inference, mut preprocess) = (obs.inference_s, obs.preprocess_s);
    let mut not_measurable: Vec<&'static str> = Vec::new();
    // An adapter's derived prefill/decode is checked as derived: negative is not measurable.
    if obs.prefill_derived && prefill.is_some_and(|v| v < 0.0) {
        prefill = None;
        not_measurable.push("prefill");
    }
    if obs.decode_derived && decode.is_some_and(|v| v < 0.0) {
        decode = None;
        not_measurable.push("decode");
    }
    // `_CHECKED`'s order; a derived interval found not measurable is not checked again.
    check(ttft)?;
    check(e2e)?;
    check(queue)?;
    if !not_measurable.contains(&"prefill") {
        check(obs.prefill_s)?;
    }
    if !not_measurable.contains(&"decode") {
        check(obs.decode_s)?;
    }
    check(inference)?;
    check(preprocess)?;
    check(obs.tpot_s)?;
    for tokens in [obs.prompt_tokens, obs.completion_tokens] {
        if tokens.is_some_and(|n| !(0..=MAX_TOKENS_PER_REQUEST).contains(&n)) {
            return Err("absurd_token_count");
        }
    }
    let tolerance = ABS_TOLERANCE_S + REL_TOLERANCE * e2e.unwrap_or(0.0);
    if inference.is_none() {
        if let (Some(p), Some(d)) = (prefill, decode) {
            inference = Some(p + d);
        }
    }
    if let (Some(t), Some(e)) = (ttft, e2e) {
        if t > e + tolerance {
            return Err("inconsistent_latency");
        }
    }
    if preprocess.is_none() {
        if let (Some(t), Some(q), Some(p)) = (ttft, queue, prefill) {
            let value = t - q - p;
            if value < -tolerance {
                not_measurable.push("preprocess");
            } else {
                preprocess = Some(at_least_zero(value));
            }
        }
    }
    let mut postprocess = None;
    if let (Some(e), Some(t), Some(d)) = (e2e, ttft, decode) {
        let value = e - t - d;
        if value < -tolerance {
            not_measurable.push("postprocess");
        } else {
            postprocess = Some(at_least_zero(value));
        }
    } else if let Some(e) = e2e {
        // As Python adds them to its int 0, in this order.
        let mut known = 0.0;
        for value in [preprocess, queue, inference].into_iter().flatten() {
            known += value;
        }
        if known > e + tolerance {
            not_measurable.push("postprocess");
        }
    }
    let mut tpot = obs.tpot_s;
    if tpot.is_none() {
        if let (Some(d), Some(tokens)) = (decode, obs.completion_tokens) {
            // vLLM's definition: decode / (tokens - 1), 0 for a request of at most one token.
            tpot = Some(if tokens > 1 { d / (tokens - 1) as f64 } else { 0.0 });
        }
    }
    Ok(Timings {
        ttft_s: ttft,
        e2e_s: e2e,
        queue_s: queue,
        prefill_s: prefill,
        decode_s: decode,
        inference_s: inference,
        preprocess_s: preprocess,
        postprocess_s: postprocess,
        tpot_s: tpot,
        not_measurable,
    })
}

/// Offsets of at most this many ns are computed; wider ones (a duration of ~4e19 years) declined.
const MAX_OFFSET_NS: f64 = 1.329_227_995_784_916e36; // 2**120

/// `composite._ns` / `round(seconds * 1e9)`: `None` where Python raises (the product is not
/// finite) or the offset is beyond `MAX_OFFSET_NS`.
pub fn ns(seconds: f64) -> Option<i128> {
    let product = seconds * 1e9;
    (product.abs() <= MAX_OFFSET_NS).then(|| product.round_ties_even() as i128)
}

/// A segment as `build_segments` lays it: (name, start, end).
pub type Bounds = (&'static str, i128, i128);

/// `segments.build_segments(start_unix_ns, t)`; `None` where an offset is not computed (`ns`).
pub fn build_segments(start: i128, t: &Timings) -> Option<Vec<Bounds>> {
    let (ttft, e2e, queue, prefill, decode, inference, preprocess) =
        (t.ttft_s, t.e2e_s, t.queue_s, t.prefill_s, t.decode_s, t.inference_s, t.preprocess_s);
    let mut segments: Vec<Bounds> = Vec::with_capacity(5);
    if let (Some(ttft), Some(queue), Some(prefill), Some(decode), Some(e2e)) = (ttft, queue, prefill, decode, e2e) {
        // vLLM's full set: the steps below written out (Python's own fast layout, same values).
        let first_token = start + ns(ttft)?;
        let mut prefill_start = first_token - ns(prefill)?;
        let mut queue_start = prefill_start - ns(queue)?;
        let decode_end = first_token + ns(decode)?;
        let end = start + ns(e2e)?;
        if queue_start <= start {
            queue_start = start;
        } else {
            segments.push(("preprocess", start, queue_start));
        }
        if prefill_start < queue_start {
            prefill_start = queue_start;
        }
        segments.push(("queue", queue_start, prefill_start));
        segments.push(("prefill", prefill_start, first_token));
        segments.push(("decode", first_token, decode_end));
        if end > decode_end {
            segments.push(("postprocess", decode_end, end));
        }
        return Some(segments);
    }
    let mut cursor = start;
    if let (Some(ttft), Some(queue), Some(prefill)) = (ttft, queue, prefill) {
        let first_token = start + ns(ttft)?;
        let mut prefill_start = first_token - ns(prefill)?;
        let mut queue_start = prefill_start - ns(queue)?;
        if queue_start > cursor {
            segments.push(("preprocess", cursor, queue_start));
        } else {
            queue_start = cursor;
        }
        if prefill_start < queue_start {
            prefill_start = queue_start;
        }
        segments.push(("queue", queue_start, prefill_start));
        segments.push(("prefill", prefill_start, first_token));
        cursor = first_token;
    } else if let (Some(queue), Some(preprocess)) = (queue, preprocess) {
        // TGI: validation, queue, then one inference interval without a first-token mark.
        if preprocess > 0.0 {
            let following = cursor + ns(preprocess)?;
            segments.push(("preprocess", cursor, following));
            cursor = following;
        }
        let following = cursor + ns(queue)?;
        segments.push(("queue", cursor, following));
        cursor = following;
        if let Some(inference) = inference {
            let following = cursor + ns(inference)?;
            segments.push(("inference", cursor, following));
            cursor = following;
        }
    } else if let (Some(ttft), Some(prefill)) = (ttft, prefill) {
        // SGLang has no queue attribute: everything before prefill is queue + tokenization.
        let first_token = start + ns(ttft)?;
        let mut prefill_start = first_token - ns(prefill)?;
        if prefill_start > cursor {
            segments.push(("queue", cursor, prefill_start));
        } else {
            prefill_start = cursor;
        }
        segments.push(("prefill", prefill_start, first_token));
        cursor = first_token;
    }
    if let (Some(decode), Some(ttft)) = (decode, ttft) {
        if segments.is_empty() {
            cursor = start + ns(ttft)?;
        }
        let decode_end = cursor + ns(decode)?;
        segments.push(("decode", cursor, decode_end));
        cursor = decode_end;
    }
    if let Some(e2e) = e2e {
        if !segments.is_empty() {
            let end = start + ns(e2e)?;
            if end > cursor {
                segments.push(("postprocess", cursor, end));
            }
        }
    }
    Some(segments)
}

/// Python's `sum()` of floats (at least one; `0 + x` starts it, exact for the durations summed
/// here, which are never -0.0): left to right, or with CPython 3.12's Neumaier compensation
/// (`Python/bltinmodule.c` `builtin_sum_impl`), as the reference interpreter adds them.
pub fn python_sum(values: &[f64], compensated: bool) -> f64 {
    let Some((&first, rest)) = values.split_first() else { return 0.0 };
    let mut total = 0.0 + first;
    let mut compensation = 0.0;
    for &value in rest {
        let sum = total + value;
        if compensated {
            if total.abs() >= value.abs() {
                compensation += (total - sum) + value;
            } else {
                compensation += (value - sum) + total;
            }
        }
        total = sum;
    }
    if compensated && compensation != 0.0 && compensation.is_finite() {
        total += compensation;
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vllm(ttft: f64, e2e: f64, queue: f64, prefill: f64, decode: f64) -> ObservedNumbers {
        ObservedNumbers { ttft_s: Some(ttft), e2e_s: Some(e2e), queue_s: Some(queue), prefill_s: Some(prefill),
                          decode_s: Some(decode), completion_tokens: Some(11), ..ObservedNumbers::default() }
    }

    #[test]
    fn timings_follow_from_the_numbers() {
        let t = derive_timings(&vllm(0.5, 2.0, 0.125, 0.25, 1.25)).unwrap();
        assert_eq!(t.inference_s, Some(1.5));
        assert_eq!(t.preprocess_s, Some(0.125));
        assert_eq!(t.postprocess_s, Some(0.25));
        assert_eq!(t.tpot_s, Some(0.125));
        assert!(t.not_measurable.is_empty());
        // One output token: tpot 0 (vLLM observes that too); a tpot the engine gave is kept.
        let one = derive_timings(&ObservedNumbers { completion_tokens: Some(1), ..vllm(0.5, 2.0, 0.1, 0.2, 1.0) });
        assert_eq!(one.unwrap().tpot_s, Some(0.0));
        let given = derive_timings(&ObservedNumbers { tpot_s: Some(0.5), ..vllm(0.5, 2.0, 0.1, 0.2, 1.0) });
        assert_eq!(given.unwrap().tpot_s, Some(0.5));
    }

    #[test]
    fn derived_intervals_below_the_tolerance_are_not_measurable() {
        // preprocess = 0.5 - 0.3 - 0.3 = -0.1 < -(0.001 + 0.02): not measurable; postprocess likewise.
        let t = derive_timings(&vllm(0.5, 2.0, 0.3, 0.3, 1.7)).unwrap();
        assert_eq!(t.not_measurable, vec!["preprocess", "postprocess"]);
        assert_eq!((t.preprocess_s, t.postprocess_s), (None, None));
        // Within the tolerance: clamped at zero.
        let t = derive_timings(&vllm(0.5, 2.0, 0.25, 0.26, 1.5)).unwrap();
        assert_eq!(t.preprocess_s, Some(0.0));
        // An adapter's derived prefill below zero: not measurable, not malformed, and not checked.
        let obs = ObservedNumbers { prefill_s: Some(-0.5), prefill_derived: true, ..vllm(0.5, 2.0, 0.1, 0.0, 1.0) };
        let t = derive_timings(&obs).unwrap();
        assert_eq!(t.prefill_s, None);
        assert_eq!(t.not_measurable, vec!["prefill"]);
        assert_eq!(t.inference_s, None);
        // Without decode: postprocess is not measurable when the known parts exceed e2e.
        let obs = ObservedNumbers { e2e_s: Some(1.0), queue_s: Some(0.6), inference_s: Some(0.6),
                                    ..ObservedNumbers::default() };
        assert_eq!(derive_timings(&obs).unwrap().not_measurable, vec!["postprocess"]);
    }

    #[test]
    fn impossible_numbers_are_malformed_in_pythons_order() {
        let bad = |obs: ObservedNumbers| derive_timings(&obs).unwrap_err();
        assert_eq!(bad(ObservedNumbers { ttft_s: Some(f64::NAN), ..vllm(0.5, 2.0, 0.1, 0.2, 1.0) }), "nan_latency");
        assert_eq!(bad(ObservedNumbers { queue_s: Some(-1.0), e2e_s: Some(f64::INFINITY),
                                         ..vllm(0.5, 2.0, 0.1, 0.2, 1.0) }), "infinite_latency");
        assert_eq!(bad(ObservedNumbers { tpot_s: Some(-0.0001), ..vllm(0.5, 2.0, 0.1, 0.2, 1.0) }), "negative_latency");
        assert_eq!(bad(ObservedNumbers { prompt_tokens: Some(100_000_001), ..vllm(0.5, 2.0, 0.1, 0.2, 1.0) }),
                   "absurd_token_count");
        assert_eq!(bad(ObservedNumbers { completion_tokens: Some(-1), ..vllm(0.5, 2.0, 0.1, 0.2, 1.0) }),
                   "absurd_token_count");
        // ttft after e2e beyond 1 ms + 1 %: inconsistent; at the tolerance: taken.
        assert_eq!(bad(vllm(2.0300001, 2.0, 0.1, 0.2, 1.0)), "inconsistent_latency");
        assert!(derive_timings(&vllm(2.0 + (0.001 + 0.02), 2.0, 0.1, 0.2, 0.0)).is_ok());
        assert!(derive_timings(&ObservedNumbers { prompt_tokens: Some(100_000_000), ..vllm(0.5, 2.0, 0.1, 0.2, 1.0) })
            .is_ok());
    }

    #[test]
    fn segments_are_laid_end_to_end() {
        let start = 1_767_225_600_123_456_789i128;
        let t = derive_timings(&vllm(0.5, 2.5, 0.1, 0.3, 1.5)).unwrap();
        let ms = 1_000_000i128;
        assert_eq!(build_segments(start, &t).unwrap(), vec![
            ("preprocess", start, start + 100 * ms),
            ("queue", start + 100 * ms, start + 200 * ms),
            ("prefill", start + 200 * ms, start + 500 * ms),
            ("decode", start + 500 * ms, start + 2000 * ms),
            ("postprocess", start + 2000 * ms, start + 2500 * ms),
        ]);
        // Queue + prefill longer than ttft: the queue starts at the span's start, no preprocess.
        let t = derive_timings(&vllm(0.5, 2.0, 0.3, 0.3, 1.5)).unwrap();
        let laid = build_segments(start, &t).unwrap();
        assert_eq!(laid[0], ("queue", start, start + 200 * ms));
        assert_eq!(laid.len(), 3);
        // TGI: preprocess, queue, inference; SGLang without queue: queue before prefill.
        let tgi = Timings { e2e_s: Some(1.0), preprocess_s: Some(0.0), queue_s: Some(0.25), inference_s: Some(0.5),
                            ..Timings::default() };
        assert_eq!(build_segments(start, &tgi).unwrap(), vec![
            ("queue", start, start + 250 * ms), ("inference", start + 250 * ms, start + 750 * ms),
            ("postprocess", start + 750 * ms, start + 1000 * ms)]);
        let sglang = Timings { ttft_s: Some(0.5), prefill_s: Some(0.25), decode_s: Some(1.0), ..Timings::default() };
        assert_eq!(build_segments(start, &sglang).unwrap(), vec![
            ("queue", start, start + 250 * ms), ("prefill", start + 250 * ms, start + 500 * ms),
            ("decode", start + 500 * ms, start + 1500 * ms)]);
        // Decode alone starts at the first token; e2e alone lays nothing.
        let decode = Timings { ttft_s: Some(0.5), decode_s: Some(1.0), e2e_s: Some(2.0), ..Timings::default() };
        assert_eq!(build_segments(start, &decode).unwrap(), vec![
            ("decode", start + 500 * ms, start + 1500 * ms), ("postprocess", start + 1500 * ms, start + 2000 * ms)]);
        assert_eq!(build_segments(start, &Timings { e2e_s: Some(2.0), ..Timings::default() }).unwrap(), vec![]);
    }

    #[test]
    fn offsets_round_half_even_and_refuse_what_python_cannot_round() {
        assert_eq!(ns(0.5e-9), Some(0)); // 0.5 ns: to even
        assert_eq!(ns(1.5e-9), Some(2));
        assert_eq!(ns(2.5e-9), Some(2));
        assert_eq!(ns(-1.5e-9), Some(-2));
        assert_eq!(ns(1e300), None); // round(inf) raises OverflowError
        assert_eq!(ns(f64::NAN), None);
        assert_eq!(ns(1e20), Some(99_999_999_999_999_991_433_150_857_216)); // the double 1e29, exactly
        let huge = Timings { ttft_s: Some(1e300), decode_s: Some(0.0), ..Timings::default() };
        assert_eq!(build_segments(0, &huge), None);
    }

    #[test]
    fn sums_are_pythons() {
        let values = [0.1, 0.2, 0.3];
        assert_eq!(python_sum(&values, false), (0.1 + 0.2) + 0.3);
        assert_eq!(python_sum(&values, false), 0.6000000000000001);
        assert_eq!(python_sum(&values, true), 0.6); // 3.12's compensated sum() of the same
        assert_eq!(python_sum(&[1e16, 1.0, -1e16], true), 1.0);
        assert_eq!(python_sum(&[1e16, 1.0, -1e16], false), 0.0);
        assert_eq!(python_sum(&[0.25], true), 0.25);
    }
}
