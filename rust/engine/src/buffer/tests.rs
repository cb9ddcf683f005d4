//! The buffer's rules one by one (each expectation follows from `assembler.py`'s code, cited), and
//! property tests of its bounds and accounting. `tests/buffer_python.rs` replays workloads the
//! Python reference ran and compares everything it handed on.

use super::*;
use crate::model::{NameId, SPAN_KIND_SERVER};

fn tid(n: u8) -> TraceId {
    [n; 16]
}

fn sid(n: u8) -> SpanId {
    [0, 0, 0, 0, 0, 0, 1, n]
}

fn new_span(id: u8, parent: Option<u8>, kind: i32, copy: u64) -> NewSpan<'static> {
    NewSpan {
        span_id: sid(id), parent_span_id: parent.map(sid), kind, status_code: 0, start_unix_ns: copy,
        end_unix_ns: copy + 1, payload: b"", trace_state: "", resource: b"r", scope: b"s", service_name: "svc",
        observation: None, attrs_kept: true,
    }
}

fn engine(trace: u8, id: u8, parent: Option<u8>) -> Incoming<'static> {
    Incoming { trace_id: tid(trace), span: new_span(id, parent, SPAN_KIND_SERVER, 1), is_engine: true }
}

fn other(trace: u8, id: u8, parent: Option<u8>) -> Incoming<'static> {
    Incoming { trace_id: tid(trace), span: new_span(id, parent, SPAN_KIND_SERVER, 1), is_engine: false }
}

fn client(trace: u8, id: u8, parent: Option<u8>) -> Incoming<'static> {
    Incoming { trace_id: tid(trace), span: new_span(id, parent, SPAN_KIND_CLIENT, 1), is_engine: false }
}

fn copy(mut incoming: Incoming<'static>, copy: u64) -> Incoming<'static> {
    incoming.span.start_unix_ns = copy;
    incoming
}

fn settings() -> AssemblySettings {
    AssemblySettings { decision_wait_s: 10.0, grace_s: 1.0, ..AssemblySettings::default() }
}

fn buffer(settings: AssemblySettings) -> TraceBuffer {
    TraceBuffer::new(settings).unwrap()
}

/// (trace, reason, late) of each completion, in order.
fn seen(completions: &[Completion]) -> Vec<(u8, &'static str, bool)> {
    completions.iter().map(|c| (c.trace.trace_id[0], c.reason.as_str(), c.late)).collect()
}

fn span_ids(trace: &TraceData) -> Vec<u8> {
    trace.spans.iter().map(|s| s.span_id[7]).collect()
}

fn decision(keep: bool) -> Decision {
    Decision { keep, rate_limited: false, policy: NameId(1), threshold: NameId(0) }
}

#[test]
fn reasons_are_pythons_strings() {
    let strings: Vec<&str> = Reason::ALL.iter().map(|r| r.as_str()).collect();
    assert_eq!(strings, ["ready", "decision_wait", "max_open_call_wait", "open_call_limit", "memory_limit",
                         "memory_pressure", "shutdown", "late"]);
    for reason in Reason::ALL {
        assert_eq!(Reason::parse(reason.as_str()), Some(reason));
    }
    assert_eq!(Reason::parse("Ready"), None);
}

#[test]
fn max_traces_zero_is_refused() {
    assert!(TraceBuffer::new(AssemblySettings { max_traces: 0, ..settings() }).is_err());
    assert!(TraceBuffer::new(AssemblySettings { max_traces: 1, ..settings() }).is_ok());
}

#[test]
fn a_rooted_engine_span_makes_its_trace_ready_after_the_grace() {
    let mut b = buffer(settings());
    b.add_batch([other(1, 1, None), engine(1, 2, Some(1))], 100.0);
    assert!(b.tick(100.999).is_empty());
    assert_eq!(b.completion_lag(100.5), 0.0);
    // Due at exactly now + grace (`_pop_due` waits only while ready_at > now).
    let done = b.tick(101.0);
    assert_eq!(seen(&done), [(1, "ready", false)]);
    assert_eq!(span_ids(&done[0].trace), [1, 2]);
    assert!(b.is_empty());
    assert_eq!(b.completions(Reason::Ready), 1);
}

#[test]
fn a_trace_without_an_engine_span_waits_for_decision_wait() {
    let mut b = buffer(settings());
    b.add(tid(1), new_span(1, None, SPAN_KIND_SERVER, 1), false, 100.0);
    assert!(b.tick(109.999).is_empty());
    assert_eq!(seen(&b.tick(110.0)), [(1, "decision_wait", false)]); // first_seen > deadline: not yet; equal: due
}

#[test]
fn readiness_is_looked_at_once_per_batch_after_all_its_spans() {
    let mut b = buffer(settings());
    // The first engine span is rooted, the second waits for span 9: not ready at the batch's end.
    b.add_batch([other(1, 1, None), engine(1, 2, Some(1)), engine(1, 3, Some(9))], 100.0);
    assert!(b.tick(105.0).is_empty());
    b.add_batch([other(1, 9, Some(1))], 105.0);
    assert!(b.tick(105.5).is_empty()); // ready at 105 + grace
    assert_eq!(seen(&b.tick(106.0)), [(1, "ready", false)]);
}

#[test]
fn a_ready_trace_keeps_its_time_when_an_unrooted_engine_span_follows() {
    // `_update_readiness` sets ready_at once and never takes it back.
    let mut b = buffer(settings());
    b.add_batch([engine(1, 2, None)], 100.0);
    b.add_batch([engine(1, 3, Some(9))], 100.5);
    assert_eq!(seen(&b.tick(101.0)), [(1, "ready", false)]);
}

#[test]
fn missing_parents_arriving_later_resume_every_waiting_walk() {
    let mut b = buffer(settings());
    // Three engine spans wait: two for span 5, one for span 6 (the waiters' map).
    b.add_batch([engine(1, 1, Some(5)), engine(1, 2, Some(5)), engine(1, 3, Some(6))], 100.0);
    b.add_batch([other(1, 5, Some(6))], 101.0);
    assert!(b.tick(110.0 - 1e-9).is_empty());
    b.add_batch([other(1, 6, None)], 102.0);
    assert_eq!(seen(&b.tick(103.0)), [(1, "ready", false)]);
}

/// An engine span under a chain of `depth` ancestors, sent as `order` says; whether it is ready.
fn chain_is_ready(depth: u8, order: &str) -> bool {
    let mut b = buffer(settings());
    let ancestors: Vec<Incoming<'static>> =
        (1..=depth).map(|n| other(1, n, if n > 1 { Some(n - 1) } else { None })).collect();
    let mut now = 100.0;
    match order {
        "together" => {
            let mut all = vec![engine(1, 200, Some(depth))];
            all.extend(ancestors);
            b.add_batch(all, now);
        }
        "nearest-first" => {
            b.add_batch([engine(1, 200, Some(depth))], now);
            for span in ancestors.into_iter().rev() {
                now += 0.01;
                b.add_batch([span], now);
            }
        }
        _ => {
            b.add_batch([engine(1, 200, Some(depth))], now);
            for span in ancestors {
                now += 0.01;
                b.add_batch([span], now);
            }
        }
    }
    let done = b.tick(now + 1.0);
    assert!(done.len() <= 1);
    !done.is_empty()
}

#[test]
fn an_engine_span_is_rooted_up_to_max_ancestry_ancestors_in_any_order() {
    // `_walk` counts ancestors found and stops once MAX_ANCESTRY are found with a parent still named.
    let max = MAX_ANCESTRY as u8;
    for order in ["together", "nearest-first", "root-first"] {
        assert!(chain_is_ready(max - 1, order), "{order}");
        assert!(chain_is_ready(max, order), "{order}");
        assert!(!chain_is_ready(max + 1, order), "{order}");
        assert!(!chain_is_ready(max + 2, order), "{order}");
    }
}

#[test]
fn cycles_never_root_and_complete_at_decision_wait() {
    let mut b = buffer(settings());
    b.add_batch([other(1, 1, Some(2)), other(1, 2, Some(1)), engine(1, 3, Some(1))], 100.0);
    b.add_batch([engine(2, 4, Some(4))], 100.0); // its own parent
    assert!(b.tick(109.0).is_empty());
    assert_eq!(seen(&b.tick(110.0)), [(1, "decision_wait", false), (2, "decision_wait", false)]);
}

#[test]
fn a_redelivered_span_is_a_duplicate_and_replaces_its_first_copy_in_place() {
    let mut b = buffer(settings());
    b.add_batch([other(1, 1, None), copy(other(1, 2, Some(1)), 10), other(1, 3, Some(1))], 100.0);
    let added = b.add_batch([copy(other(1, 2, Some(1)), 20)], 100.0);
    assert_eq!(added, Added { dropped: 0, duplicate: 1 });
    assert_eq!(b.spans_duplicate(), 1);
    assert_eq!(b.held_spans(), 3);
    let done = b.drain();
    assert_eq!(done, 1);
    let out = b.take_completions();
    assert_eq!(seen(&out), [(1, "shutdown", false)]);
    assert_eq!(span_ids(&out[0].trace), [1, 2, 3]);
    assert_eq!(out[0].trace.span(1).start_unix_ns, 20);
}

#[test]
fn a_copy_of_other_engine_ness_replaces_the_first_without_counting_and_is_dropped_at_the_limit() {
    let mut b = buffer(AssemblySettings { max_spans_per_trace: 2, ..settings() });
    b.add_batch([other(1, 1, None)], 100.0);
    let added = b.add_batch([engine(1, 1, None)], 100.0); // conflicting copy: not a duplicate
    assert_eq!(added, Added::default());
    assert_eq!(b.spans_replaced(), 1);
    // The engine copy walked: rooted, so the trace is ready.
    assert_eq!(seen(&b.tick(101.0)), [(1, "ready", false)]);
    b.add_batch([other(2, 1, None), other(2, 2, None)], 102.0);
    let added = b.add_batch([engine(2, 1, None)], 102.0); // full: `elif len >= limit` drops it
    assert_eq!(added, Added { dropped: 1, duplicate: 0 });
    let added = b.add_batch([other(2, 1, None)], 102.0); // a true duplicate is taken even when full
    assert_eq!(added, Added { dropped: 0, duplicate: 1 });
}

#[test]
fn engine_ness_is_kept_per_span_past_the_first_64() {
    let mut b = buffer(settings());
    b.add_batch((0..150).map(|n| other(1, n, None)), 100.0);
    assert_eq!(b.add_batch([engine(1, 130, None)], 100.0), Added::default()); // another engine-ness
    assert_eq!(b.spans_replaced(), 1);
    assert_eq!(b.add_batch([engine(1, 130, None), other(1, 131, None), other(1, 3, None)], 100.0).duplicate, 3);
    assert_eq!(b.add_batch([other(1, 130, None)], 100.0).duplicate, 0);
    assert_eq!(b.spans_replaced(), 2);
}

#[test]
fn spans_past_max_spans_per_trace_are_dropped_and_counted() {
    let mut b = buffer(AssemblySettings { max_spans_per_trace: 3, ..settings() });
    let added = b.add_batch((1..=5).map(|n| other(1, n, None)), 100.0);
    assert_eq!(added, Added { dropped: 2, duplicate: 0 });
    assert_eq!(b.spans_dropped_over_trace_limit(), 2);
    assert_eq!(b.held_spans(), 3);
}

#[test]
fn at_max_traces_a_due_trace_goes_first_as_ready_else_the_oldest_as_memory_limit() {
    let mut b = buffer(AssemblySettings { max_traces: 2, ..settings() });
    b.add_batch([other(1, 1, None)], 100.0);
    b.add_batch([engine(2, 1, None)], 100.0); // ready at 101
    b.add_batch([other(3, 1, None)], 101.0); // trace 2 is due: it goes, not the older 1
    assert_eq!(seen(&b.take_completions()), [(2, "ready", false)]);
    b.add_batch([other(4, 1, None)], 101.0); // none due: the oldest, 1
    assert_eq!(seen(&b.take_completions()), [(1, "memory_limit", false)]);
    assert_eq!(b.len(), 2);
    assert_eq!(b.completions(Reason::MemoryLimit), 1);
}

#[test]
fn a_trace_freed_within_a_batch_leaves_the_readiness_order_of_the_others_as_in_python() {
    // `touched.pop(freed.trace_id)`: trace 1, freed to make room, takes no place in the batch's
    // readiness order, even when a new trace reuses its slot (here trace 4).
    let mut b = buffer(AssemblySettings { max_traces: 2, ..settings() });
    b.add_batch([other(1, 9, Some(8))], 100.0);
    b.add_batch([other(2, 9, Some(8))], 100.0);
    b.add_batch([engine(1, 1, None), engine(3, 1, None), engine(2, 1, None), engine(4, 1, None)], 100.0);
    assert_eq!(seen(&b.take_completions()), [(1, "memory_limit", false), (2, "memory_limit", false)]);
    assert_eq!(seen(&b.tick(101.0)), [(3, "ready", false), (4, "ready", false)]);
}

#[test]
fn stale_ready_entries_are_skipped_and_count_for_the_lag_until_dropped() {
    let mut b = buffer(settings());
    b.add_batch([engine(1, 1, None)], 100.0);
    b.add_batch([engine(2, 1, None)], 100.5);
    assert_eq!(b.shed(0.5), 1); // trace 1 leaves otherwise; its entry stays at the front
    assert_eq!(seen(&b.take_completions()), [(1, "memory_pressure", false)]);
    assert_eq!(b.completion_lag(101.25), 0.25); // measured from the stale front, as Python's
    assert!(b.tick(101.25).is_empty()); // the stale entry is dropped, trace 2 not due yet
    assert_eq!(b.completion_lag(101.25), 0.0);
    assert_eq!(seen(&b.tick(101.5)), [(2, "ready", false)]);
}

#[test]
fn a_late_span_follows_the_remembered_decision() {
    let mut b = buffer(AssemblySettings { max_spans_per_trace: 3, ..settings() });
    b.add_batch([engine(1, 1, None)], 100.0);
    let done = b.tick(101.0);
    assert_eq!(seen(&done), [(1, "ready", false)]);
    b.remember(&tid(1), Remembered::new(decision(true), &[sid(1)]));
    assert_eq!(b.remembered(&tid(1)).map(|r| r.taken), Some(1)); // the spans it was completed with
    // A redelivered engine span already measured: a duplicate. The same id not an engine span: late.
    let added = b.add_batch([engine(1, 1, None), other(1, 1, None), engine(1, 2, Some(1))], 102.0);
    assert_eq!(added, Added { dropped: 0, duplicate: 1 });
    let late = b.take_completions();
    assert_eq!(seen(&late), [(1, "late", true), (1, "late", true)]);
    for completion in &late {
        let prior = completion.prior.as_ref().unwrap();
        assert_eq!(prior.decision, decision(true));
        assert_eq!(prior.taken, 3); // the one object in Python: as after the batch
        assert_eq!(completion.trace.len(), 1);
    }
    // The limit holds for late spans too.
    let added = b.add_batch([engine(1, 3, Some(1))], 102.0);
    assert_eq!(added, Added { dropped: 1, duplicate: 0 });
    assert!(b.take_completions().is_empty());
}

#[test]
fn a_late_spans_prior_outlives_its_decision_forgotten_in_the_same_batch() {
    let mut b = buffer(AssemblySettings { max_traces: 1, decided_cache_size: 1, ..settings() });
    b.add_batch([engine(1, 1, None)], 100.0);
    b.tick(101.0);
    b.remember(&tid(1), Remembered::new(decision(false), &[sid(1)]));
    b.add_batch([other(2, 1, None)], 102.0);
    // Trace 1's late span, then trace 3 makes room: trace 2 is remembered and trace 1 forgotten.
    b.add_batch([other(1, 7, None), other(3, 1, None)], 103.0);
    let out = b.take_completions();
    assert_eq!(seen(&out), [(1, "late", true), (2, "memory_limit", false)]);
    assert_eq!(out[0].prior.as_ref().map(|p| (p.decision, p.taken)), Some((decision(false), 2)));
    assert!(b.remembered(&tid(1)).is_none());
    // Forgotten: its next span starts a new trace (which makes room).
    b.add_batch([other(1, 8, None)], 104.0);
    assert_eq!(seen(&b.take_completions()), [(3, "memory_limit", false)]);
    assert_eq!(b.len(), 1);
}

#[test]
fn spans_of_a_trace_being_decided_are_parked_and_handed_on_with_its_decision() {
    let mut b = buffer(AssemblySettings { max_spans_per_trace: 3, ..settings() });
    b.add_batch([engine(1, 1, None)], 100.0);
    b.add_batch([engine(2, 1, None)], 100.0);
    assert_eq!(seen(&b.tick(101.0)), [(1, "ready", false), (2, "ready", false)]);
    // Both are being decided: their spans wait, up to the limit with the spans they had.
    let added = b.add_batch([other(1, 2, None), other(1, 3, None), other(1, 4, None), other(2, 2, None)], 101.5);
    assert_eq!(added, Added { dropped: 1, duplicate: 0 });
    assert!(b.has_parked() && b.parked_spans() == 3);
    assert!(b.take_completions().is_empty());
    b.remember(&tid(1), Remembered::new(decision(true), &[sid(1)]));
    b.hand_on_parked(&[tid(1), tid(2)]); // trace 2 was not decided (its stage failed): no prior
    let out = b.take_completions();
    assert_eq!(seen(&out), [(1, "late", true), (1, "late", true), (2, "late", true)]);
    assert_eq!(out.iter().map(|c| c.prior.as_ref().map(|p| p.taken)).collect::<Vec<_>>(), [Some(3), Some(3), None]);
    assert_eq!(out.iter().map(|c| span_ids(&c.trace)).collect::<Vec<_>>(), [[2], [3], [2]]);
    assert!(!b.has_parked());
}

#[test]
fn the_decision_cache_forgets_the_oldest_past_its_size() {
    let mut b = buffer(AssemblySettings { decided_cache_size: 2, ..settings() });
    for trace in 1..=3 {
        b.add_batch([engine(trace, 1, None)], 100.0);
    }
    assert_eq!(b.tick(101.0).len(), 3); // trimmed once after the ready traces: 1 forgotten
    for trace in 1..=3 {
        b.remember(&tid(trace), Remembered::new(decision(trace == 2), &[sid(1)]));
    }
    let kept: Vec<u8> = b.decisions().iter().map(|(id, _)| id[0]).collect();
    assert_eq!(kept, [2, 3]); // 1 was forgotten: its decision stays forgotten
    b.add_batch([engine(1, 1, None)], 102.0); // a new trace, not a duplicate
    assert_eq!(b.len(), 1);
    b.add_batch([engine(4, 1, None)], 102.0);
    b.shed(1.0); // two completed: 1 and 4 remembered as completing, 2 and 3 forgotten
    b.take_completions();
    assert!(b.decisions().is_empty());
    b.add_batch([engine(2, 1, None)], 103.0);
    assert_eq!(b.len(), 1);
}

#[test]
fn restored_decisions_take_their_measured_spans_or_what_the_cache_counted() {
    let mut b = buffer(AssemblySettings { decided_cache_size: 2, ..settings() });
    b.restore_decisions([(tid(1), Remembered::new(decision(true), &[sid(1), sid(2)]))]);
    assert_eq!(b.remembered(&tid(1)).map(|r| r.taken), Some(2));
    let added = b.add_batch([engine(1, 2, None), engine(1, 3, None)], 100.0);
    assert_eq!(added.duplicate, 1); // measured by the previous run
    assert_eq!(seen(&b.take_completions()), [(1, "late", true)]);
    assert_eq!(b.remembered(&tid(1)).map(|r| r.taken), Some(3));
    b.restore_decisions([(tid(1), Remembered::new(decision(false), &[]))]);
    assert_eq!(b.remembered(&tid(1)).map(|r| (r.taken, r.decision)), Some((3, decision(false))));
    b.restore_decisions([(tid(2), Remembered::new(decision(true), &[])),
                         (tid(3), Remembered::new(decision(true), &[]))]);
    let kept: Vec<u8> = b.decisions().iter().map(|(id, _)| id[0]).collect();
    assert_eq!(kept, [2, 3]);
}

#[test]
fn a_late_engine_span_measured_by_the_chain_is_a_duplicate_when_it_comes_again() {
    let mut b = buffer(settings());
    b.add_batch([engine(1, 1, None)], 100.0);
    b.tick(101.0);
    b.remember(&tid(1), Remembered::new(decision(true), &[sid(1)]));
    b.add_batch([engine(1, 2, None)], 102.0);
    assert_eq!(seen(&b.take_completions()), [(1, "late", true)]);
    b.add_measured(&tid(1), sid(2));
    assert_eq!(b.add_batch([engine(1, 2, None)], 103.0).duplicate, 1);
    assert_eq!(b.remembered(&tid(1)).unwrap().measured.as_slice(), [sid(1), sid(2)]);
}

#[test]
fn a_call_in_flight_is_held_past_decision_wait_until_max_open_call_wait() {
    let mut b = buffer(AssemblySettings { max_open_call_wait_s: 30.0, ..settings() });
    b.add_batch([client(1, 2, Some(1))], 100.0); // its caller's span 1 is still open
    b.add_batch([other(2, 1, None)], 101.0);
    b.add_batch([client(3, 2, Some(1)), other(3, 1, None)], 102.0); // the caller arrived: not in flight
    assert_eq!(seen(&b.tick(112.0)), [(2, "decision_wait", false), (3, "decision_wait", false)]);
    assert_eq!((b.held_traces(), b.held_since()), (1, Some(100.0)));
    assert!(b.tick(129.0).is_empty());
    assert_eq!(seen(&b.tick(130.0)), [(1, "max_open_call_wait", false)]);
    assert_eq!((b.held_traces(), b.held_since()), (0, None));
}

#[test]
fn a_call_in_flight_is_held_for_decision_wait_after_its_engine_span_only() {
    let mut b = buffer(AssemblySettings { max_open_call_wait_s: 30.0, ..settings() });
    b.add_batch([client(1, 2, Some(1))], 100.0);
    b.add_batch([engine(1, 3, Some(9))], 105.0);
    assert!(b.tick(110.0).is_empty()); // its engine span came after the deadline: held
    assert_eq!(b.held_traces(), 1);
    // decision_wait after the engine span, the call is no longer counted in flight.
    assert_eq!(seen(&b.tick(115.0)), [(1, "decision_wait", false)]);
    assert_eq!(b.held_traces(), 0);
}

#[test]
fn held_traces_leave_with_their_traces_and_the_loop_stops_when_all_are_held() {
    let mut b = buffer(AssemblySettings { max_open_call_wait_s: 30.0, ..settings() });
    b.add_batch([client(1, 2, Some(1))], 100.0);
    b.add_batch([client(2, 2, Some(1))], 100.0);
    assert!(b.tick(111.0).is_empty());
    assert_eq!(b.held_traces(), 2);
    let taken = b.take_pending(|trace| trace.trace_id[0] == 1);
    assert_eq!(taken.len(), 1);
    assert_eq!(b.held_traces(), 1);
    b.shed(1.0);
    assert_eq!(seen(&b.take_completions()), [(2, "memory_pressure", false)]);
    assert_eq!(b.held_traces(), 0);
}

/// `incoming` sent by `sender`: its resource's service.name (each sender's resource its own).
fn by(sender: &'static str, mut incoming: Incoming<'static>) -> Incoming<'static> {
    incoming.span.service_name = sender;
    incoming.span.resource = sender.as_bytes();
    incoming
}

fn holding(max_open_calls_per_sender: usize) -> AssemblySettings {
    AssemblySettings { max_open_call_wait_s: 30.0, max_open_calls_per_sender, ..settings() }
}

#[test]
fn a_sender_past_its_bound_has_its_longest_held_trace_completed_as_open_call_limit() {
    let mut b = buffer(holding(2));
    b.add_batch([by("a", client(1, 2, Some(1))), by("a", client(2, 2, Some(1))), by("b", client(3, 2, Some(1))),
                 by("a", client(4, 2, Some(1))), other(5, 1, None)], 100.0);
    // Held in the order examined: 1, 2 (a), 3 (b), 4 takes a to 3 held; after the tick's other
    // completions, a's longest-held goes. b's trace does not count against a.
    assert_eq!(seen(&b.tick(111.0)), [(5, "decision_wait", false), (1, "open_call_limit", false)]);
    assert_eq!((b.held_traces(), b.completions(Reason::OpenCallLimit)), (3, 1));
    b.add_batch([by("a", client(6, 2, Some(1)))], 112.0);
    // 6 takes a past its bound again: its longest-held now is 2, though b's 3 was held before 4.
    assert_eq!(seen(&b.tick(122.5)), [(2, "open_call_limit", false)]);
    assert_eq!(b.held_traces(), 3);
    assert_eq!(b.held_since(), Some(100.0));
    // The rest leave at max_open_call_wait, as without a bound.
    assert_eq!(seen(&b.tick(130.0)), [(3, "max_open_call_wait", false), (4, "max_open_call_wait", false)]);
    assert_eq!(seen(&b.tick(142.0)), [(6, "max_open_call_wait", false)]);
    assert_eq!(b.held_traces(), 0);
}

#[test]
fn a_held_trace_counts_against_the_sender_of_its_first_call_in_flight_when_first_held() {
    let mut b = buffer(holding(1));
    // Trace 1's first call in flight (span 2) is a's, its second (span 4) b's: it is a's.
    b.add_batch([by("a", client(1, 2, Some(1))), by("b", client(1, 4, Some(3)))], 100.0);
    b.add_batch([by("b", client(2, 2, Some(1)))], 100.0);
    assert!(b.tick(110.0).is_empty()); // were trace 1 b's, b would be past its bound here
    assert_eq!(b.held_traces(), 2);
    // a's call gets its caller: trace 1 is still in flight through b's span, and still a's.
    b.add_batch([by("a", other(1, 1, None))], 111.0);
    b.add_batch([by("a", client(3, 2, Some(1)))], 111.0);
    assert_eq!(seen(&b.tick(121.0)), [(1, "open_call_limit", false)]);
    assert_eq!(b.held_traces(), 2); // 2 (b) and 3 (a)
}

#[test]
fn an_empty_service_name_is_a_sender_like_any_other() {
    let mut b = buffer(holding(1));
    b.add_batch([by("", client(1, 2, Some(1))), by("", client(2, 2, Some(1))), by("x", client(3, 2, Some(1)))],
                100.0);
    assert_eq!(seen(&b.tick(110.0)), [(1, "open_call_limit", false)]);
    assert_eq!(b.held_traces(), 2);
}

#[test]
fn a_sender_back_within_its_bound_by_the_end_of_the_tick_loses_nothing_more() {
    let mut b = buffer(holding(1));
    b.add_batch([by("a", client(1, 2, Some(1)))], 100.0);
    b.add_batch([by("a", client(2, 2, Some(1)))], 101.0);
    assert!(b.tick(110.0).is_empty()); // 1 held; 2 not due: pending 2, then 1
    // 2 is held (a: 2 held, past 1), then 1 leaves at max_open_call_wait: a is back at 1.
    assert_eq!(seen(&b.tick(130.0)), [(1, "max_open_call_wait", false)]);
    assert_eq!((b.held_traces(), b.completions(Reason::OpenCallLimit)), (1, 0));
}

#[test]
fn with_no_bound_of_their_own_one_senders_held_traces_wait_for_max_open_call_wait() {
    let mut b = buffer(holding(0));
    b.add_batch((1..=20).map(|trace| by("a", client(trace, 2, Some(1)))), 100.0);
    assert!(b.tick(110.0).is_empty());
    assert_eq!(b.held_traces(), 20);
    let done = b.tick(130.0);
    assert_eq!(done.len(), 20);
    assert!(done.iter().all(|c| c.reason == Reason::MaxOpenCallWait));
    assert_eq!(b.completions(Reason::OpenCallLimit), 0);
}

#[test]
fn a_full_buffer_completes_a_due_trace_then_the_longest_held_then_the_oldest() {
    let mut b = buffer(AssemblySettings { max_traces: 3, ..holding(0) });
    b.add_batch([by("a", client(1, 2, Some(1)))], 100.0);
    b.add_batch([by("b", client(2, 2, Some(1)))], 100.0);
    b.add_batch([other(3, 1, None)], 105.0);
    assert!(b.tick(110.0).is_empty()); // 1 and 2 held, behind 3: the oldest is 3
    b.add_batch([engine(4, 1, None)], 110.0); // none due: the longest-held, 1, not the oldest
    assert_eq!(seen(&b.take_completions()), [(1, "memory_limit", false)]);
    b.add_batch([other(5, 1, None)], 111.5); // 4 due since 111
    assert_eq!(seen(&b.take_completions()), [(4, "ready", false)]);
    b.add_batch([other(6, 1, None)], 111.5);
    assert_eq!(seen(&b.take_completions()), [(2, "memory_limit", false)]);
    assert_eq!(b.held_traces(), 0);
    b.add_batch([other(7, 1, None)], 111.5); // none held: the oldest
    assert_eq!(seen(&b.take_completions()), [(3, "memory_limit", false)]);
    assert_eq!(b.completions(Reason::MemoryLimit), 3);
}

#[test]
fn overdue_gives_the_traces_past_the_cutoff_and_the_carried_ones_in_pending_order_and_leaves_them() {
    let mut b = buffer(holding(0));
    b.add_batch([client(1, 2, Some(1))], 100.0);
    b.add_batch([other(2, 1, None)], 104.0);
    b.add_batch([other(3, 1, None), other(3, 2, Some(1))], 108.0);
    assert!(b.tick(111.0).is_empty()); // 1 held, moved behind 2 and 3
    let ids = |traces: Vec<&TraceData>| traces.iter().map(|t| t.trace_id[0]).collect::<Vec<_>>();
    let none = |_: &TraceId| false;
    // At or before the cutoff (`<=`), in the pending order.
    assert_eq!(ids(b.overdue(101.0, none).collect()), [1]);
    assert_eq!(ids(b.overdue(104.0, none).collect()), [2, 1]);
    assert_eq!(ids(b.overdue(103.999, |id: &TraceId| id[0] == 3).collect()), [3, 1]);
    assert_eq!(ids(b.overdue(f64::NEG_INFINITY, |id: &TraceId| id[0] != 2).collect()), [3, 1]);
    assert_eq!(ids(b.overdue(f64::NAN, none).collect()), Vec::<u8>::new());
    assert_eq!(b.overdue(f64::INFINITY, none).map(|t| t.len()).collect::<Vec<_>>(), [1, 2, 1]);
    // Left in place: nothing completed, nothing counted.
    assert_eq!((b.len(), b.held_spans(), b.held_traces()), (3, 4, 1));
    assert!(b.take_completions().is_empty());
}

#[test]
fn with_max_open_call_wait_off_a_call_in_flight_is_not_held() {
    let mut b = buffer(settings());
    b.add_batch([client(1, 2, Some(1))], 100.0);
    assert_eq!(seen(&b.tick(110.0)), [(1, "decision_wait", false)]);
}

#[test]
fn shed_completes_the_oldest_fraction_truncated() {
    let mut b = buffer(settings());
    for trace in 1..=5 {
        b.add_batch([other(trace, 1, None)], 100.0);
    }
    assert_eq!(b.shed(0.5), 2); // int(2.5)
    assert_eq!(seen(&b.take_completions()), [(1, "memory_pressure", false), (2, "memory_pressure", false)]);
    assert_eq!(b.shed(f64::NAN), 0);
    assert_eq!(b.shed(-1.0), 0);
    assert_eq!(b.shed(7.0), 3); // Python raises past 1; all of them here
    assert_eq!(b.completions(Reason::MemoryPressure), 5);
}

#[test]
fn taken_traces_leave_undecided_and_complete_now_decides_them() {
    let mut b = buffer(settings());
    for trace in 1..=4 {
        b.add_batch([other(trace, 1, None)], 100.0);
    }
    let taken = b.take_pending(|trace| trace.trace_id[0] % 2 == 0);
    assert_eq!(taken.iter().map(|t| t.trace_id[0]).collect::<Vec<_>>(), [2, 4]);
    assert!(b.take_completions().is_empty());
    b.add_batch([other(2, 2, None)], 101.0); // not late: a new trace
    assert_eq!(b.len(), 3);
    let taken = b.take_pending(|trace| trace.trace_id[0] == 2);
    b.complete_now(taken, Reason::Shutdown);
    assert_eq!(seen(&b.take_completions()), [(2, "shutdown", false)]);
    b.add_batch([other(2, 3, None)], 101.0); // its trace is being decided now: parked
    assert_eq!(b.parked_spans(), 1);
    assert_eq!(b.drain(), 2);
    assert_eq!(seen(&b.take_completions()), [(1, "shutdown", false), (3, "shutdown", false)]);
    assert!(b.is_empty() && b.held_spans() == 0);
}

#[test]
fn tick_hands_on_what_add_completed_before_the_traces_due() {
    let mut b = buffer(AssemblySettings { max_traces: 1, ..settings() });
    b.add_batch([engine(1, 1, None)], 100.0);
    b.add_batch([other(2, 1, None)], 100.5); // trace 1 is not due: memory_limit
    b.add_batch([engine(1, 2, None)], 100.6); // late? no: parked (trace 1 is being decided)
    b.add_batch([engine(3, 1, None)], 100.7);
    assert_eq!(seen(&b.tick(200.0)), [(1, "memory_limit", false), (2, "memory_limit", false), (3, "ready", false)]);
}

#[test]
fn the_heap_is_accounted_and_given_back() {
    let mut b = buffer(settings());
    let empty = b.heap_bytes();
    let payload = vec![0x5a_u8; 300];
    for trace in 0..50u8 {
        for span in 0..4u8 {
            let mut incoming = other(trace, span, None);
            incoming.span.payload = &payload;
            b.add_batch([incoming], 100.0);
        }
    }
    assert!(b.heap_bytes() >= empty + 50 * 4 * 300, "{}", b.heap_bytes());
    b.drain();
    let out = b.take_completions();
    assert_eq!(out.len(), 50);
    assert!(b.heap_bytes() < 50 * 4 * 300 / 4, "{}", b.heap_bytes());
}

#[test]
fn with_no_decision_cache_every_completed_trace_is_forgotten_at_once() {
    let mut b = buffer(AssemblySettings { decided_cache_size: 0, ..settings() });
    b.add_batch([engine(1, 1, None)], 100.0);
    assert_eq!(b.tick(101.0).len(), 1);
    b.remember(&tid(1), Remembered::new(decision(true), &[sid(1)]));
    assert!(b.decisions().is_empty());
    assert_eq!(b.add_batch([engine(1, 1, None)], 102.0), Added::default()); // a new trace, not a duplicate
    assert_eq!(b.len(), 1);
    b.restore_decisions([(tid(2), Remembered::new(decision(true), &[sid(1)]))]);
    assert!(b.remembered(&tid(2)).is_none());
}

#[test]
fn with_no_span_allowed_a_trace_is_pending_empty_until_decision_wait() {
    // Python makes the trace before it finds the span over the limit.
    let mut b = buffer(AssemblySettings { max_spans_per_trace: 0, ..settings() });
    assert_eq!(b.add_batch([engine(1, 1, None)], 100.0), Added { dropped: 1, duplicate: 0 });
    assert_eq!((b.len(), b.held_spans()), (1, 0));
    let done = b.tick(110.0);
    assert_eq!(seen(&done), [(1, "decision_wait", false)]);
    assert!(done[0].trace.is_empty());
    assert_eq!(b.add_batch([engine(1, 2, None)], 111.0), Added { dropped: 1, duplicate: 0 }); // taken 0 >= 0
}

#[test]
fn a_grace_of_zero_makes_a_trace_due_at_the_time_it_became_ready() {
    let mut b = buffer(AssemblySettings { grace_s: 0.0, ..settings() });
    b.add_batch([engine(1, 1, None)], 100.0);
    assert_eq!(seen(&b.tick(100.0)), [(1, "ready", false)]);
}

#[test]
fn absurd_clocks_complete_as_pythons_comparisons_say_and_never_panic() {
    // NaN compares false: `ready_at > now` and `first_seen > deadline` never hold, so all is due.
    let mut b = buffer(settings());
    b.add_batch([engine(1, 1, None)], 100.0);
    b.add_batch([other(2, 1, None)], 100.0);
    assert_eq!(seen(&b.tick(f64::NAN)), [(1, "ready", false), (2, "decision_wait", false)]);
    assert_eq!(b.completion_lag(f64::NAN), 0.0);
    // An infinite decision_wait completes nothing by age; a trace first seen at NaN is always due.
    let mut b = buffer(AssemblySettings { decision_wait_s: f64::INFINITY, ..settings() });
    b.add_batch([other(1, 1, None)], 100.0);
    assert!(b.tick(1e300).is_empty());
    b.add_batch([other(2, 1, None)], f64::NAN);
    assert!(b.tick(1e300).is_empty()); // trace 1 leads and is not due: the NaN one waits behind it
    // inf - inf is NaN: a deadline nothing is later than.
    assert_eq!(seen(&b.tick(f64::INFINITY)), [(1, "decision_wait", false), (2, "decision_wait", false)]);
    let mut b = buffer(settings());
    b.add_batch([engine(1, 1, None)], f64::NAN); // ready at NaN: due at any tick
    assert_eq!(seen(&b.tick(0.0)), [(1, "ready", false)]);
}

#[test]
fn max_traces_one_keeps_exactly_one_trace() {
    let mut b = buffer(AssemblySettings { max_traces: 1, ..settings() });
    for trace in 1..=4 {
        b.add_batch([other(trace, 1, None), other(trace, 2, Some(1))], 100.0);
        assert_eq!(b.len(), 1);
    }
    let out = b.take_completions();
    assert_eq!(seen(&out), [(1, "memory_limit", false), (2, "memory_limit", false), (3, "memory_limit", false)]);
    assert!(out.iter().all(|c| c.trace.len() == 2));
}

// --- properties ------------------------------------------------------------------------------------

mod properties {
    use super::*;
    use proptest::prelude::*;

    #[derive(Clone, Debug)]
    enum Op {
        /// (trace, span, parent, engine, client, sender) of each span; `hostile`: each copy draws its own.
        Add(Vec<(u8, u8, Option<u8>, bool, bool, u8)>),
        Tick(f64),
        /// Decide the completions seen so far whose trace id is odd.
        Decide,
        Shed(f64),
        Take(u8),
        CompleteTaken,
        Restore(u8),
    }

    fn op() -> impl Strategy<Value = Op> {
        let span = (0u8..5, 0u8..8, prop::option::of(0u8..10), any::<bool>(), any::<bool>(), 0u8..3);
        prop_oneof![
            6 => prop::collection::vec(span, 1..8).prop_map(Op::Add),
            3 => prop_oneof![Just(0.0), Just(0.3), Just(1.0), Just(2.5), Just(11.0)].prop_map(Op::Tick),
            2 => Just(Op::Decide),
            1 => prop_oneof![Just(0.25), Just(0.5), Just(1.0)].prop_map(Op::Shed),
            1 => (0u8..5).prop_map(Op::Take),
            1 => Just(Op::CompleteTaken),
            1 => (0u8..5).prop_map(Op::Restore),
        ]
    }

    /// Mostly calls in flight (CLIENT spans whose parent, 8 or more, never comes) from three
    /// senders, and time passing: held traces pile up against their senders' bounds and `max_traces`.
    fn calls() -> impl Strategy<Value = Op> {
        let span = (0u8..8, 0u8..4, prop::option::of(0u8..12), prop::bool::weighted(0.2), prop::bool::weighted(0.8),
                    0u8..3);
        prop_oneof![
            6 => prop::collection::vec(span, 1..6).prop_map(Op::Add),
            4 => prop_oneof![Just(0.5), Just(1.0), Just(2.5), Just(4.0)].prop_map(Op::Tick),
            1 => Just(Op::Decide),
            1 => (0u8..8).prop_map(Op::Take),
        ]
    }

    fn holding_settings() -> impl Strategy<Value = AssemblySettings> {
        (1usize..4, 2usize..9).prop_map(|(max_open_calls_per_sender, max_traces)| AssemblySettings {
            decision_wait_s: 3.0, grace_s: 1.0, max_open_call_wait_s: 60.0, max_open_calls_per_sender, max_traces,
            max_spans_per_trace: 4, decided_cache_size: 4,
        })
    }

    fn settings() -> impl Strategy<Value = AssemblySettings> {
        // A long max_open_call_wait lets held traces pile up against their senders' bounds.
        (prop_oneof![Just(0.0), Just(1.0)], prop_oneof![Just(0.0), Just(5.0), Just(60.0)], 0usize..3, 1usize..7,
         1u32..5, 0usize..4)
            .prop_map(|(grace_s, max_open_call_wait_s, max_open_calls_per_sender, max_traces, max_spans_per_trace,
                        decided_cache_size)| {
                AssemblySettings { decision_wait_s: 3.0, grace_s, max_open_call_wait_s, max_open_calls_per_sender,
                                   max_traces, max_spans_per_trace, decided_cache_size }
            })
    }

    const SENDERS: [&str; 3] = ["svc", "a", "b"];

    /// The held traces' links agree with each other and with the pending traces, each sender's
    /// traces are in the order all were held, and no sender has more held than its bound.
    fn check_held(b: &TraceBuffer) {
        let held = &b.held;
        let order: Vec<u32> = held.order(&b.traces).collect();
        assert_eq!(order.len(), held.len());
        let pending: Vec<u32> = b.traces.order().collect();
        let mut prev = NIL;
        for &at in &order {
            let links = b.traces.trace(at).held;
            assert!(links.is_held() && pending.contains(&at));
            assert_eq!(links.prev[ALL], prev);
            prev = at;
        }
        assert_eq!(held.all.tail, prev);
        assert_eq!(pending.iter().filter(|&&at| b.traces.trace(at).held.is_held()).count(), held.len());
        let mut of_senders = 0;
        for (name, &sender) in &held.by_name {
            let list = &held.senders[sender as usize];
            assert_eq!(&list.name, name);
            let (mut at, mut prev, mut walked) = (list.ends.head, NIL, Vec::new());
            while at != NIL {
                let links = b.traces.trace(at).held;
                assert_eq!((links.sender, links.prev[OF_SENDER]), (sender, prev));
                walked.push(at);
                prev = at;
                at = links.next[OF_SENDER];
            }
            assert_eq!((list.ends.tail, list.len), (prev, walked.len()));
            assert!(list.len > 0);
            let places: Vec<usize> = walked.iter().map(|at| order.iter().position(|o| o == at).unwrap()).collect();
            assert!(places.windows(2).all(|pair| pair[0] < pair[1]));
            let bound = b.settings.max_open_calls_per_sender;
            assert!(bound == 0 || list.len <= bound, "{name:?}: {} held, bound {bound}", list.len);
            of_senders += list.len;
        }
        assert_eq!(of_senders, held.len());
        assert_eq!(held.by_name.len() + held.free.len(), held.senders.len());
    }

    /// Every span is in exactly one place; the bounds hold; the buffer's own structures agree.
    struct Ledger {
        added: u64,
        completed_spans: u64,
        late: u64,
        taken_spans: u64,
        completed: Vec<TraceId>,
        taken: Vec<TraceData>,
    }

    impl Ledger {
        fn collect(&mut self, b: &mut TraceBuffer) {
            for completion in b.take_completions() {
                if completion.late {
                    assert_eq!(completion.trace.len(), 1);
                    assert_eq!(completion.reason, Reason::Late);
                    self.late += 1;
                } else {
                    assert!(completion.trace.len() <= b.settings.max_spans_per_trace as usize);
                    assert!(completion.prior.is_none());
                    self.completed_spans += completion.trace.len() as u64;
                    self.completed.push(completion.trace.trace_id);
                }
            }
        }

        fn check(&self, b: &TraceBuffer, consistent_copies: bool) {
            let s = &b.settings;
            assert!(b.len() <= s.max_traces);
            assert!(b.cache.decided.len() <= s.decided_cache_size);
            assert_eq!(b.cache.decided.len(), b.cache.order.len());
            for id in &b.cache.order {
                assert!(b.cache.decided.contains_key(id));
            }
            let mut spans = 0;
            let mut ready = 0;
            for at in b.traces.order() {
                let trace = b.traces.trace(at);
                assert!(trace.data.len() <= s.max_spans_per_trace as usize);
                assert_eq!(b.traces.get(&trace.data.trace_id), Some(at));
                spans += trace.data.len();
                if trace.ready_token != 0 {
                    ready += 1;
                    let entries = b.ready.iter().filter(|(a, t, _)| *a == at && *t == trace.ready_token).count();
                    assert_eq!(entries, 1);
                }
                if consistent_copies {
                    // Each engine span's readiness, walked from scratch (`PendingTrace.is_rooted`).
                    let unrooted = (0..trace.data.len())
                        .filter(|&i| trace.engine.get(i))
                        .filter(|&i| {
                            let chain = trace.data.ancestors(i);
                            trace.data.span(*chain.last().unwrap_or(&i)).has_parent
                        })
                        .count();
                    assert_eq!(trace.unrooted as usize, unrooted);
                    let engine = (0..trace.data.len()).any(|i| trace.engine.get(i));
                    assert_eq!(trace.has_engine_span, engine);
                }
            }
            assert!(ready <= b.ready.len());
            assert_eq!(b.traces.len(), b.traces.order().count());
            assert_eq!(spans, b.held_spans());
            check_held(b);
            let accounted = b.held_spans() as u64 + self.completed_spans + self.late + self.taken_spans
                + b.parked_spans() as u64 + b.spans_dropped_over_trace_limit() + b.spans_duplicate()
                + b.spans_replaced();
            assert_eq!(accounted, self.added);
        }
    }

    fn run(settings: AssemblySettings, ops: Vec<Op>, consistent_copies: bool) {
        let mut b = TraceBuffer::new(settings).unwrap();
        let mut ledger = Ledger { added: 0, completed_spans: 0, late: 0, taken_spans: 0, completed: Vec::new(),
                                  taken: Vec::new() };
        let mut now = 100.0;
        let mut copies = 0u64;
        for op in ops {
            match op {
                Op::Add(spans) => {
                    let incoming: Vec<Incoming<'static>> = spans.into_iter().map(|(trace, span, parent, engine,
                                                                                     client, sender)| {
                        // Consistent copies: a span's parent, kind and engine-ness follow from its ids.
                        let (parent, engine, client, sender) = if consistent_copies {
                            let parent = (span > 0).then(|| (span * 7 + trace) % 10);
                            (parent, span % 3 == 1, span % 4 == 2, (span + trace) % 3)
                        } else {
                            (parent, engine, client, sender)
                        };
                        copies += 1;
                        let kind = if client { SPAN_KIND_CLIENT } else { SPAN_KIND_SERVER };
                        let span = new_span(span, parent, kind, copies);
                        by(SENDERS[sender as usize], Incoming { trace_id: tid(trace), span, is_engine: engine })
                    }).collect();
                    ledger.added += incoming.len() as u64;
                    b.add_batch(incoming, now);
                }
                Op::Tick(step) => {
                    now += step;
                    let due = b.tick(now);
                    b.outbox = due; // collected below with the rest
                }
                Op::Decide => {
                    ledger.collect(&mut b);
                    let decided = std::mem::take(&mut ledger.completed);
                    for chunk in decided.chunks(COMPLETION_BATCH) {
                        for trace_id in chunk.iter().filter(|id| id[0] % 2 == 1) {
                            b.remember(trace_id, Remembered::new(decision(true), &[sid(1)]));
                        }
                        b.hand_on_parked(chunk);
                    }
                }
                Op::Shed(fraction) => {
                    b.shed(fraction);
                }
                Op::Take(trace) => {
                    let taken = b.take_pending(|t| t.trace_id[0] == trace);
                    ledger.taken_spans += taken.iter().map(|t| t.len() as u64).sum::<u64>();
                    ledger.taken.extend(taken);
                }
                Op::CompleteTaken => {
                    let taken = std::mem::take(&mut ledger.taken);
                    ledger.taken_spans -= taken.iter().map(|t| t.len() as u64).sum::<u64>();
                    b.complete_now(taken, Reason::Shutdown);
                }
                Op::Restore(trace) => {
                    b.restore_decisions([(tid(trace), Remembered::new(decision(false), &[sid(2)]))]);
                }
            }
            ledger.collect(&mut b);
            ledger.check(&b, consistent_copies);
        }
        b.drain();
        ledger.collect(&mut b);
        ledger.check(&b, consistent_copies);
        assert!(b.is_empty() && b.held_spans() == 0 && b.held_traces() == 0);
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 600, ..ProptestConfig::default() })]

        #[test]
        fn bounds_hold_and_every_span_is_accounted_once_whatever_the_copies(
            settings in settings(), ops in prop::collection::vec(op(), 1..60)) {
            run(settings, ops, false);
        }

        #[test]
        fn no_sender_holds_more_than_its_bound_and_every_span_is_accounted_once(
            settings in holding_settings(), ops in prop::collection::vec(calls(), 1..60)) {
            run(settings, ops, false);
        }

        #[test]
        fn readiness_kept_incrementally_is_readiness_walked_from_scratch(
            settings in settings(), ops in prop::collection::vec(op(), 1..60)) {
            run(settings, ops, true);
        }
    }
}

