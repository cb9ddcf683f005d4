//! `composite.sglang`: an SGLang request's unified layout read from its root span and the stage
//! spans below it (queue = `prefill_waiting`, prefill = `prefill_forward`, decode =
//! `decode_forward` or its `decode_loop`s, preprocess = the tokenizer's stages, kv_transfer = the
//! PD transfer stages); without the scheduler's spans (sglang#38210), the root's attributes only.
//! A stage span's stage is its name (the adapter's `mark("stage")`).

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};

use crate::model::{ObsView, STATUS_CODE_ERROR};
use crate::record::{outcome, Record};

use super::build::ABORTED;
use super::timings::{ns, python_sum, Bounds};
use super::{Decline, Fail, TraceView};

/// `Part.SGLANG_STAGE`.
pub(super) const STAGE_PART: &str = "sglang_stage";
/// `composite.MAX_PARTS`: spans looked at below one root.
const MAX_PARTS: usize = 4096;
/// `composite._PREPROCESS_STAGES`, `_KV_STAGES`, `QUEUE_AND_PREFILL`, `KV_TRANSFER`.
const PREPROCESS_STAGES: [&str; 3] = ["tokenize", "api_server_dispatch", "request_process"];
const KV_STAGES: [&str; 2] = ["prefill_transfer_kv_cache", "decode_transferred"];
const QUEUE_AND_PREFILL: &str = "queue_and_prefill";
const KV_TRANSFER: &str = "kv_transfer";

impl<'t> TraceView<'t> {
    /// `composite.descendants`: the spans below `root`, breadth first (each span's children in
    /// the trace's order), at most `MAX_PARTS`.
    fn descendants(&self, root: usize) -> Vec<usize> {
        let mut found = Vec::new();
        // The spans of this request's tree, not of the trace: a trace of many roots costs each its own.
        let mut seen: HashSet<usize> = HashSet::from([root]);
        let mut frontier = vec![root];
        while !frontier.is_empty() && found.len() < MAX_PARTS {
            let mut following = Vec::new();
            for span in frontier {
                for &child in self.children(&self.slot(span).span_id) {
                    if seen.insert(child) {
                        found.push(child);
                        following.push(child);
                    }
                }
            }
            frontier = following;
        }
        found.truncate(MAX_PARTS);
        found
    }

    /// `composite._seconds`: a part's duration; `MalformedSpan` where its times make none.
    fn part_seconds(&self, at: usize) -> Result<f64, Fail> {
        let slot = self.slot(at);
        if slot.start_unix_ns == 0 || slot.end_unix_ns < slot.start_unix_ns {
            return Err(Fail::Malformed("invalid_span_times"));
        }
        Ok((slot.end_unix_ns - slot.start_unix_ns) as f64 / 1e9)
    }

    /// A stage's spans (by start): their durations summed as Python's `sum()` adds them.
    fn stage_seconds(&self, spans: &[usize]) -> Result<f64, Fail> {
        let mut seconds = Vec::with_capacity(spans.len());
        for &span in spans {
            seconds.push(self.part_seconds(span)?);
        }
        Ok(python_sum(&seconds, self.builder.settings.compensated_sum))
    }

    /// From the first span's start to the last one's end.
    fn stage_bounds(&self, spans: &[usize]) -> (i128, i128) {
        let (first, last) = (spans[0], spans[spans.len() - 1]);
        (i128::from(self.slot(first).start_unix_ns), i128::from(self.slot(last).end_unix_ns))
    }

    /// `composite.sglang(record, root, trace)`: what the root's stage spans say of its request,
    /// on the record `build_record` made of the root's observation.
    /// `bounds`: the request's segments, which this lays again.
    pub(super) fn sglang(&self, record: &mut Record<'t>, root: usize, obs: &ObsView<'t>, bounds: &mut Vec<Bounds>)
                         -> Result<(), Fail> {
        let below = self.descendants(root);
        if record.outcome == outcome::UNKNOWN && below.iter().any(|&span| self.slot(span).status_code == STATUS_CODE_ERROR) {
            // Aborted in the queue: the root has no finish reason; the scheduler's thread span is
            // closed with status ERROR.
            record.outcome = Cow::Borrowed(outcome::ABORT);
            if record.error_type.is_empty() {
                record.error_type = Cow::Borrowed(ABORTED);
            }
        }
        let mut stages: HashMap<&'t str, Vec<usize>> = HashMap::new();
        for &span in &below {
            if self.shape(span).is_some_and(|shape| shape.part == STAGE_PART) {
                stages.entry(self.data.name(span)).or_default().push(span);
            }
        }
        for spans in stages.values_mut() {
            spans.sort_by_key(|&span| self.slot(span).start_unix_ns); // stable, as Python's sort
        }
        let stage = |name: &str| stages.get(name).filter(|spans| !spans.is_empty()).map(Vec::as_slice);
        let root_slot = self.slot(root);
        let start = i128::from(root_slot.start_unix_ns);
        let offset = |seconds: f64| ns(seconds).ok_or(Fail::Decline(Decline::TimeRange));
        let end = match record.e2e_s {
            Some(e2e) => start + offset(e2e)?,
            None => i128::from(root_slot.end_unix_ns),
        };
        let mut segments: Vec<Bounds> = Vec::new();
        let mut missing: Vec<&'static str> = Vec::new();
        match (stage("prefill_waiting"), stage("prefill_forward")) {
            (Some(waiting), Some(forward)) => {
                let pre: Vec<usize> = PREPROCESS_STAGES.iter().flat_map(|name| stage(name).unwrap_or(&[])).copied().collect();
                if !pre.is_empty() {
                    let pre_end = pre.iter().map(|&s| i128::from(self.slot(s).end_unix_ns)).max().unwrap_or(0);
                    let pre_start = pre.iter().map(|&s| i128::from(self.slot(s).start_unix_ns)).min().unwrap_or(0).min(start);
                    if pre_end > pre_start {
                        segments.push(("preprocess", pre_start, pre_end));
                    }
                }
                record.queue_s = Some(self.stage_seconds(waiting)?); // one per retraction
                let (first, last) = self.stage_bounds(waiting);
                segments.push(("queue", first, last));
                record.prefill_s = Some(self.stage_seconds(forward)?);
                let (first, last) = self.stage_bounds(forward);
                segments.push(("prefill", first, last));
            }
            _ => {
                // Scheduler spans lost, or a request aborted in the queue: the root's attributes only.
                (record.queue_s, record.prefill_s) = (None, None);
                missing.extend(["queue", "prefill"]);
                let dispatch_to_first = obs.float(self.builder.fields.dispatch_to_first_token);
                if let (Some(ttft), Some(dispatch)) = (record.ttft_s, dispatch_to_first) {
                    if 0.0 <= dispatch && dispatch <= ttft {
                        let handoff = start + offset(ttft - dispatch)?;
                        if handoff > start {
                            segments.push(("preprocess", start, handoff));
                        }
                        segments.push((QUEUE_AND_PREFILL, handoff, start + offset(ttft)?));
                    }
                }
            }
        }
        if let Some(decoding) = stage("decode_forward").or_else(|| stage("decode_loop")) {
            record.decode_s = Some(self.stage_seconds(decoding)?);
            let (first, last) = self.stage_bounds(decoding);
            segments.push(("decode", first, last));
        } else if let (Some(decode), Some(ttft)) = (record.decode_s, record.ttft_s) {
            let first = start + offset(ttft)?;
            segments.push(("decode", first, first + offset(decode)?));
        } else {
            record.decode_s = None;
            missing.push("decode");
        }
        if let Some(moving) = KV_STAGES.iter().find_map(|name| stage(name)) {
            let (first, last) = self.stage_bounds(moving);
            segments.push((KV_TRANSFER, first, last));
        }
        record.inference_s = match (record.prefill_s, record.decode_s) {
            (Some(prefill), Some(decode)) => Some(prefill + decode),
            _ => None,
        };
        // `composite._tpot`.
        record.tpot_s = match (record.decode_s, record.completion_tokens) {
            (Some(decode), Some(tokens)) if tokens > 1 => Some(decode / (tokens - 1) as f64),
            _ => None,
        };
        segments.sort_by_key(|segment| segment.1);
        // `composite._tail`: what follows the last segment to the request's end.
        if let Some(last) = segments.iter().map(|segment| segment.2).max() {
            if end > last {
                segments.push(("postprocess", last, end));
            }
        }
        *bounds = segments;
        record.segments_missing = missing.into_iter().map(Cow::Borrowed).collect();
        Ok(())
    }
}
