//! `TraceBuffer` against the Python reference (`TraceAssembler`): the workloads
//! `tests/data/buffer/generate.py` ran on Python, replayed here operation by operation, must hand
//! on the same completions in the same calls of the next stage, in the same order (trace, reason,
//! late, the spans and which copy of each, the prior decision), and leave the same state (pending
//! traces and spans, counters, held traces, lag, the decision cache) after every operation, and
//! `overdue` must give the traces Python's gave. Spans come from three senders: each sender's spans
//! carry a resource of their own, as a real sender's do (its service.name is a resource attribute).
//!
//! The next stage is played here as the generator's plays it: it decides every trace it is handed
//! (not late) whose id's byte sum is not a multiple of 3, and the buffer's completions are handed
//! to it as Python's `_hand_on_added` and `_complete` hand them: an `add`'s late spans in one call,
//! then completions in runs of `COMPLETION_BATCH`, each followed by the late spans parked for its traces.

use std::collections::HashMap;

use otel_llm_engine::buffer::{AssemblySettings, Completion, Reason, Remembered, TraceBuffer, COMPLETION_BATCH};
use otel_llm_engine::model::{Decision, NameId, NewSpan, SpanId, TraceData, TraceId, SPAN_KIND_SERVER};
use serde_json::{json, Value};

const POLICIES: [&str; 3] = ["", "p", "restored"];
/// The generator's `SENDERS`, by index.
const SENDERS: [&str; 3] = ["svc", "app-a", "app-b"];

fn policy(name: &str) -> NameId {
    NameId(POLICIES.iter().position(|p| *p == name).unwrap_or_else(|| panic!("policy {name:?}")) as u16)
}

fn span_id(number: u64) -> SpanId {
    number.to_be_bytes()
}

fn number(span_id: &SpanId) -> u64 {
    u64::from_be_bytes(*span_id)
}

fn hex_id(text: &str) -> TraceId {
    let mut id = [0u8; 16];
    for (i, byte) in id.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&text[2 * i..2 * i + 2], 16).unwrap();
    }
    id
}

fn f64_of(value: &Value) -> f64 {
    value.as_f64().unwrap()
}

fn u64_of(value: &Value) -> u64 {
    value.as_u64().unwrap()
}

struct Replay {
    buffer: TraceBuffer,
    traces: Vec<TraceId>,
    index: HashMap<TraceId, usize>,
    /// Each copy sent (its start time) -> whether it is an engine span.
    engine: HashMap<u64, bool>,
}

impl Replay {
    fn spans(&self, trace: &TraceData) -> Value {
        trace.spans.iter().map(|s| json!([number(&s.span_id), s.start_unix_ns])).collect()
    }

    fn prior(remembered: &Remembered) -> Value {
        let mut measured: Vec<u64> = remembered.measured.as_slice().iter().map(number).collect();
        measured.sort_unstable();
        json!([remembered.decision.keep, POLICIES[remembered.decision.policy.0 as usize], measured, remembered.taken])
    }

    /// The next stage's `consume_batch`: what it was handed, and its decisions remembered.
    fn consume(&mut self, batch: Vec<Completion>) -> Value {
        let mut seen = Vec::new();
        let mut decided = Vec::new();
        for completion in &batch {
            let trace = &completion.trace;
            seen.push(json!([completion.reason.as_str(), completion.late, self.index[&trace.trace_id],
                             self.spans(trace), completion.prior.as_ref().map(Replay::prior)]));
            let sum: u32 = trace.trace_id.iter().map(|b| u32::from(*b)).sum();
            if !completion.late && !sum.is_multiple_of(3) {
                let mut measured: Vec<SpanId> = trace.spans.iter()
                    .filter(|s| self.engine[&s.start_unix_ns])
                    .map(|s| s.span_id)
                    .collect();
                measured.sort_unstable();
                let keep = sum.is_multiple_of(2);
                let decision = Decision { keep, rate_limited: false, policy: policy("p"), threshold: NameId(0) };
                decided.push((trace.trace_id, Remembered::new(decision, &measured)));
            }
        }
        for (trace_id, remembered) in decided {
            self.buffer.remember(&trace_id, remembered);
        }
        Value::Array(seen)
    }

    /// What an operation completed, handed on as Python hands it on (`_hand_on_added`, `_complete`).
    fn hand_on(&mut self, mut out: Vec<Completion>) -> Vec<Value> {
        let mut calls = Vec::new();
        let leading_late = out.iter().take_while(|c| c.late).count();
        let rest = out.split_off(leading_late);
        if !out.is_empty() {
            calls.push(self.consume(out));
        }
        let mut rest = rest.into_iter().peekable();
        while rest.peek().is_some() {
            let chunk: Vec<Completion> = rest.by_ref().take(COMPLETION_BATCH).collect();
            assert!(chunk.iter().all(|c| !c.late), "late spans after a completion in one operation");
            let ids: Vec<TraceId> = chunk.iter().map(|c| c.trace.trace_id).collect();
            calls.push(self.consume(chunk));
            if self.buffer.has_parked() {
                self.buffer.hand_on_parked(&ids);
                let parked = self.buffer.take_completions();
                if !parked.is_empty() {
                    calls.push(self.consume(parked));
                }
            }
        }
        calls
    }

    fn state(&self, now: f64) -> Value {
        let b = &self.buffer;
        let mut completions = serde_json::Map::new();
        for reason in Reason::ALL {
            if b.completions(reason) > 0 {
                completions.insert(reason.as_str().to_owned(), json!(b.completions(reason)));
            }
        }
        let mut completions: Vec<(String, Value)> = completions.into_iter().collect();
        completions.sort_by(|a, c| a.0.cmp(&c.0));
        json!({
            "len": b.len(), "held_spans": b.held_spans(),
            "dropped": b.spans_dropped_over_trace_limit(), "duplicate": b.spans_duplicate(),
            "completions": completions.into_iter().collect::<serde_json::Map<String, Value>>(),
            "held_traces": b.held_traces(), "held_since": b.held_since(),
            "completion_lag": b.completion_lag(now),
            "decisions": b.decisions().iter().map(|(id, r)| {
                let mut prior = Replay::prior(r);
                prior.as_array_mut().unwrap().insert(0, json!(self.index[id]));
                prior
            }).collect::<Vec<_>>(),
        })
    }
}

fn replay(workload: &Value, which: usize) {
    let s = &workload["settings"];
    let settings = AssemblySettings {
        decision_wait_s: f64_of(&s["decision_wait_s"]),
        grace_s: f64_of(&s["grace_s"]),
        max_open_call_wait_s: f64_of(&s["max_open_call_wait_s"]),
        max_open_calls_per_sender: u64_of(&s["max_open_calls_per_sender"]) as usize,
        max_traces: u64_of(&s["max_traces"]) as usize,
        max_spans_per_trace: u64_of(&s["max_spans_per_trace"]) as u32,
        decided_cache_size: u64_of(&s["decided_cache_size"]) as usize,
    };
    let traces: Vec<TraceId> =
        workload["traces"].as_array().unwrap().iter().map(|t| hex_id(t.as_str().unwrap())).collect();
    let index = traces.iter().enumerate().map(|(i, id)| (*id, i)).collect();
    let mut r = Replay { buffer: TraceBuffer::new(settings).unwrap(), traces, index, engine: HashMap::new() };
    let mut taken: Vec<TraceData> = Vec::new();
    for (at, op) in workload["ops"].as_array().unwrap().iter().enumerate() {
        let now = f64_of(&op["now"]);
        let kind = op["op"].as_str().unwrap();
        let mut out: Vec<Completion> = Vec::new();
        match kind {
            "add" => {
                let spans: Vec<Value> = op["spans"].as_array().unwrap().clone();
                let incoming = spans.iter().map(|s| {
                    let copy = u64_of(&s[5]);
                    let is_engine = s[4].as_bool().unwrap();
                    let sender = SENDERS[u64_of(&s[6]) as usize];
                    r.engine.insert(copy, is_engine);
                    otel_llm_engine::buffer::Incoming {
                        trace_id: r.traces[u64_of(&s[0]) as usize],
                        span: NewSpan {
                            span_id: span_id(u64_of(&s[1])), parent_span_id: s[2].as_u64().map(span_id),
                            kind: s[3].as_i64().unwrap_or(i64::from(SPAN_KIND_SERVER)) as i32, status_code: 0,
                            start_unix_ns: copy, end_unix_ns: copy + 1, payload: b"", trace_state: "",
                            resource: sender.as_bytes(), scope: b"", service_name: sender, observation: None,
                            attrs_kept: true,
                        },
                        is_engine,
                    }
                }).collect::<Vec<_>>();
                r.buffer.add_batch(incoming, now);
            }
            "tick" => out = r.buffer.tick(now),
            "shed" => {
                r.buffer.shed(f64_of(&op["fraction"]));
            }
            "take" => {
                let keep = u64_of(&op["keep"]) as u8;
                let picked = r.buffer.take_pending(|t| t.trace_id[0] % 3 == keep);
                let seen: Value = picked.iter().map(|t| json!([r.index[&t.trace_id], r.spans(t)])).collect();
                assert_eq!(seen, op["taken"], "workload {which} op {at}: traces taken");
                if op["complete"].as_bool().unwrap() {
                    r.buffer.complete_now(picked, Reason::Shutdown);
                } else {
                    taken.extend(picked);
                }
            }
            "restore" => {
                let trace_id = r.traces[u64_of(&op["trace"]) as usize];
                let measured: Vec<SpanId> =
                    op["measured"].as_array().unwrap().iter().map(|m| span_id(u64_of(m))).collect();
                let decision =
                    Decision { keep: true, rate_limited: false, policy: policy("restored"), threshold: NameId(0) };
                r.buffer.restore_decisions([(trace_id, Remembered::new(decision, &measured))]);
            }
            "overdue" => {
                let carried: Vec<TraceId> =
                    op["carried"].as_array().unwrap().iter().map(|t| r.traces[u64_of(t) as usize]).collect();
                let seen: Value = r.buffer.overdue(f64_of(&op["seen_before"]), |id| carried.contains(id))
                    .map(|t| json!([r.index[&t.trace_id], r.spans(t)]))
                    .collect();
                assert_eq!(seen, op["overdue"], "workload {which} op {at}: overdue traces");
            }
            "wait" => {}
            "drain" => {
                r.buffer.drain();
            }
            other => panic!("operation {other:?}"),
        }
        out.extend(r.buffer.take_completions());
        let handed = r.hand_on(out);
        let expected = op["handed"].as_array().unwrap();
        for (call, (got, want)) in handed.iter().zip(expected).enumerate() {
            assert_eq!(got, want, "workload {which} op {at} ({kind}): call {call} of the next stage");
        }
        assert_eq!(handed.len(), expected.len(), "workload {which} op {at} ({kind}): calls of the next stage");
        assert_eq!(r.state(now), op["state"], "workload {which} op {at} ({kind}): state after it");
    }
}

#[test]
fn the_buffer_hands_on_what_the_python_buffer_hands_on() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/buffer/workloads.json");
    let data: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let workloads = data["workloads"].as_array().unwrap();
    assert!(workloads.len() >= 100, "{} workloads", workloads.len());
    let (mut seen, mut full_batches, mut parked_handed_on) = ([0usize; Reason::ALL.len()], 0, 0);
    // `add`s that let held traces go without completing a ready one (`_make_room` took held traces);
    // `overdue` answers with traces, and with carried traces only (a cutoff before every first seen).
    let (mut room_from_held, mut overdue, mut carried_only) = (0, 0, 0);
    for (which, workload) in workloads.iter().enumerate() {
        replay(workload, which);
        let mut held = 0;
        for op in workload["ops"].as_array().unwrap() {
            let mut ready = false;
            for call in op["handed"].as_array().unwrap() {
                let call = call.as_array().unwrap();
                full_batches += usize::from(call.len() == COMPLETION_BATCH);
                // Late spans handed on by anything but an `add` were parked for their trace's decision.
                parked_handed_on += usize::from(op["op"] != "add" && call.iter().all(|c| c[1] == true));
                for completion in call {
                    let reason = Reason::parse(completion[0].as_str().unwrap()).unwrap();
                    seen[Reason::ALL.iter().position(|r| *r == reason).unwrap()] += 1;
                    ready |= reason == Reason::Ready;
                }
            }
            let held_after = u64_of(&op["state"]["held_traces"]);
            room_from_held += usize::from(op["op"] == "add" && held_after < held && !ready);
            held = held_after;
            if op["op"] == "overdue" && !op["overdue"].as_array().unwrap().is_empty() {
                overdue += 1;
                carried_only += usize::from(f64_of(&op["seen_before"]) < f64_of(&op["now"]) - 1e8);
            }
        }
    }
    // The workloads reach every way out of the buffer, parked spans and runs past one batch included.
    for (reason, count) in Reason::ALL.iter().zip(seen) {
        assert!(count > 0, "no {} completion in the workloads", reason.as_str());
    }
    assert!(full_batches > 0 && parked_handed_on > 0, "{full_batches} full batches, {parked_handed_on} parked");
    assert!(room_from_held > 0, "no held trace completed to make room");
    assert!(overdue > 0 && carried_only > 0, "{overdue} overdue answers, {carried_only} of carried traces only");
}
