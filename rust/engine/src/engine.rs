//! The engine: the modules composed as `service/graph.py` `Pipeline` composes the processors, for
//! one traces pipeline. `ingest` is `Pipeline.buffer` (the adapter stage, then the assembler's
//! `add_batch`); `tick` is `TraceAssembler.tick` and `_complete` handing each run of
//! `COMPLETION_BATCH` completions along the chain, in the chain's order:
//!
//! ```text
//! _Entry (counted) -> LlmMetricsStage (records) -> DecisionStage (decide, remember)
//!   -> RedactionStage (kept traces written) -> back in LlmMetricsStage's `finally`: recorded
//! ```
//!
//! then `_hand_on_parked` for the run's traces (their parked late spans, as their own batch).
//!
//! What the engine does not hold (the binding's, or Python's): the intake queue and its worker,
//! the ticker, the intake log's journal, the memory limiter's clock, self-telemetry's registry
//! (the counters here are what it exposes), kept-trace consumers (a kept trace is handed back as
//! bytes and rows), and every trace a module declines (`TickOutput::declined`: Python builds its
//! records and decides it, then `resume`s its decision here so its late spans follow).
//!
//! Locks (std only): one `Mutex` per shard of the trace buffer, one for the chain (sampler, kept
//! writer, names, counters) and one for the series (and accounting). `ingest` takes the shards of
//! its spans, one at a time; `tick` takes the chain's lock (one tick at a time, as Python's
//! `_tick_lock`), then each shard in turn, and the series' lock per run to record;
//! `render`/`snapshot` the series' lock only; an ingest never waits for the chain (its counters
//! are atomics), only for its shards', and so waits for a tick only while that tick takes the
//! ingest's shard's completions along the chain (one shard at a time). Holding the shard through
//! its completions keeps what a tick hands on exactly what `tick_into` and `hand_on_parked` gave
//! (Python releases the assembler's lock during its chain; a span coming meanwhile is parked there
//! and handed on after its run: the same outcome). The order is always chain -> shard -> series,
//! so no two calls wait on each other in a cycle.
//!
//! Where the engine's order is not Python's (each said where it happens): late spans and traces
//! completed to make room go along at the next tick, not during `add_batch` (`_hand_on_added`); a
//! declined trace is decided (`Engine::decide`) after the other traces of its run, not among them,
//! and its parked late spans wait for `resume`; nothing is journaled (`receivers.otlp.intake_log`
//! stays Python's: no completion carries a journaled prior).
//!
//! Shards: `EngineConfig::shards` buffers, a trace's spans always in the same one (a keyed hash of
//! its id, so no sender can aim its traces at one shard). One shard is `TraceAssembler` exactly.
//! With `N` shards each holds `max_traces / N` traces (rounded down: the total stays within
//! `max_traces`), a decision cache of `ceil(decided_cache_size / N)` and a per-sender bound of
//! `ceil(max_open_calls_per_sender / N)` (0 stays 0, "no bound"): a limit is reached per shard,
//! so a shard may complete a trace early while another has room. Within one tick the shards'
//! completions go along the chain shard by shard: a trace's place in the sampler's rolling
//! windows and rate limit, and the order series are first created (their order in `render`), may
//! differ from one shard's order. `shed(fraction)` sheds `int(len * fraction)` of each shard, so
//! in total up to `N - 1` fewer than Python's one count.

use std::collections::hash_map::RandomState;
use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

use crate::accounting::{Accounting, AccountingSettings, AccountingSpecs, ByteBudget};
use crate::accounting::exposition::MetricFamily;
use crate::buffer::{AssemblySettings, Completion, Incoming, Reason, Remembered, TraceBuffer, COMPLETION_BATCH};
use crate::decide::{DecideError, Sampler, SamplerConfig};
use crate::handoff::{ids_of, observation_of, spans_of, SpansData, SupplyError};
use crate::ingest::{read_request, Checked, IngestSettings, Ingested};
use crate::kept::{one_per_request, KeptOut, KeptWriter, Redaction};
use crate::model::{Decision, FieldId, NameId, Names, NewSpan, Observation, Schema, ShapeInfo, SpanId, TraceData, TraceId, DROP};
use crate::record::Record;
use crate::records::{Built, RecordBuilder, RecordSettings};
use crate::series::render::{AccountingFamilies, OVERFLOW_LABEL};
use crate::series::{MetricsSpec, Series, SeriesBudget, Snapshot};
use crate::shapes::{Candidates, RuleDef, ShapeDef, ShapeTable};
use crate::wire::Malformed;

/// `pdata.traces.KEEP_UNSAMPLED`: no tail_sampling in the pipeline, every trace goes on, no policy named.
pub const KEEP_UNSAMPLED: Decision = Decision { keep: true, rate_limited: false, policy: NameId(0), threshold: NameId(0) };

/// The accounting's settings and its families' declarations (`stage.accounting_settings`,
/// `definitions.ACCOUNTING_METRICS`).
#[derive(Clone, Debug)]
pub struct AccountingConfig {
    pub settings: AccountingSettings,
    pub specs: AccountingSpecs,
}

/// The shape table's inputs (`ShapeTable::new`): the observation schema, shapes, rules, candidates.
#[derive(Clone, Debug)]
pub struct TableConfig {
    pub schema: Schema,
    pub shapes: Vec<ShapeDef>,
    pub rules: Vec<RuleDef>,
    pub candidates: Candidates,
}

/// Everything the engine is built from: the modules' own settings, as the binding makes them from
/// the configuration and Python's declarations.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// The shape table (`adapters/shapes.py`).
    pub table: TableConfig,
    /// `digest.AttributeLimits` and `derive_timings`' intake bounds.
    pub ingest: IngestSettings,
    /// `tail_sampling`'s buffer (`AssemblySettings`), for the whole engine: see the module's doc
    /// for how `shards` divides it.
    pub assembly: AssemblySettings,
    /// `llm_metrics` (`stage.record_settings`). The engine requires `llm_metrics` in the pipeline:
    /// without it Python's chain builds no records, which this engine does not mirror (the binding
    /// keeps Python's pipeline then).
    pub records: RecordSettings,
    /// Observation fields copied into a record's `extra` (`RecordBuilder::new`'s `carried`).
    pub carried: Vec<(FieldId, FieldId)>,
    /// `tail_sampling`'s policies; `None`: not in the pipeline, every trace kept (`KEEP_UNSAMPLED`).
    pub sampler: Option<SamplerConfig>,
    /// The recorder's namings and limits (`stage.recorder_of`).
    pub metrics: MetricsSpec,
    /// Made only where `recorder_of` makes one: tokens counted, or objectives configured.
    pub accounting: Option<AccountingConfig>,
    /// `redaction` (`stage.redaction_of`).
    pub redaction: Redaction,
    /// Whether the pipeline has kept-trace consumers: `RedactionStage.consume_batch` writes
    /// nothing without one.
    pub write_kept: bool,
    /// Trace buffer shards (at least 1, at most `assembly.max_traces`).
    pub shards: usize,
    /// The monotonic clock (seconds) at construction: the rate limit's buckets start full then.
    pub clock_start_s: f64,
}

/// A native request's counts (`DigestCounts` and `add_batch`'s), by adapter name.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct IngestCounts {
    /// (adapter, spans matched) (`otel_llm_spans_engine`).
    pub matched: Vec<(String, u64)>,
    /// (reason, service name, spans refused) (`otel_llm_spans_malformed`, unmeasured).
    pub malformed: Vec<(String, String, u64)>,
    pub passed_through: u64,
    /// Spans whose ids the receivers refuse: not buffered.
    pub invalid_ids: u64,
    /// Spans given to the buffer (duplicates and dropped included).
    pub buffered: u64,
    /// Redeliveries (`spans_duplicate`).
    pub duplicate: u64,
    /// Past `max_spans_per_trace` (`spans_dropped{reason="max_spans_per_trace"}`).
    pub dropped_over_trace_limit: u64,
    /// Spans of traces already decided: they go along with the decision at the next tick (where
    /// they are counted, as `_Entry` counts late spans).
    pub late: u64,
    /// Spans of traces being decided (completed, not yet decided: by Python, or at the next tick):
    /// they follow the decision.
    pub parked: u64,
    /// Traces completed to make room at `max_traces` (they go along at the next tick).
    pub completed_to_make_room: u64,
}

/// What `ingest` made of one request. Late spans are counted when they go along the chain
/// (`TickOutput::late`), as `_Entry` counts them.
#[derive(Clone, Debug, PartialEq)]
pub enum IngestSummary {
    Native(IngestCounts),
    /// Python reads this request (`Ingested::Python`): nothing of it was buffered.
    Python,
}

/// A kept trace, written: `KeptTrace`'s request bytes and span rows, the request records a
/// store row is written for (`one_per_request`), and the decision.
#[derive(Debug)]
pub struct KeptTrace {
    pub trace_id: TraceId,
    pub written: KeptOut,
    pub records: Vec<Record<'static>>,
    pub decision: Decision,
}

/// A kept trace the writer declined (`kept::Decline`): Python writes it (`kept_trace`).
#[derive(Debug)]
pub struct KeptDeclined {
    pub trace: TraceData,
    pub records: Vec<Record<'static>>,
    pub decision: Decision,
    pub reason: crate::kept::Decline,
}

/// What a tick did.
#[derive(Debug, Default)]
pub struct TickOutput {
    /// Kept traces written, in completion order.
    pub kept: Vec<KeptTrace>,
    /// Kept traces for Python's writer.
    pub kept_declined: Vec<KeptDeclined>,
    /// Completions whose records the builder declined (with the reason), in completion order:
    /// Python builds their records (`Engine::decide` decides a trace, `resume` remembers it,
    /// `record` records them, `add_measured` for a late engine span it measures). Already counted
    /// in `completed` or `late`.
    pub declined: Vec<(Completion, crate::records::Decline)>,
    /// Completed traces by reason (`traces_completed`), late spans apart.
    pub completed: Vec<(Reason, u64)>,
    /// Late spans gone along (`late_spans`).
    pub late: u64,
    /// Records built (declined traces apart) and records measured (recorded into the series).
    pub records_built: u64,
    pub records_measured: u64,
    /// (reason, service name) of each request whose spans made no record, where measured.
    pub malformed: Vec<(&'static str, String)>,
    /// Decisions made now: kept, dropped, rate-limited (`sampling_decisions`).
    pub kept_decisions: u64,
    pub dropped_decisions: u64,
    pub rate_limited: u64,
    /// Traces the sampler failed (`DecideError`): not decided, not remembered, their spans dropped
    /// (`spans_dropped{reason="assembly_error"}`, `spans_failed`), their records still measured.
    pub decide_failed: u64,
    pub spans_failed: u64,
    /// What redaction removed, by `kept::REDACTION_REASONS`.
    pub redacted: [u64; 5],
    /// `LlmMetricsStage.count_measured` of the records measured: requests by (engine kind,
    /// outcome) (`requests_assembled`), values refused by reason (`values_rejected`), intervals not
    /// measurable by (service name, "not_measurable_" + interval) (`count_unmeasured`).
    pub assembled: Vec<((String, String), u64)>,
    pub values_rejected: Vec<(String, u64)>,
    pub unmeasured: Vec<((String, String), u64)>,
}

/// Adds `n` to `key`'s count (first-seen order, as Python's dicts).
fn bump<K: PartialEq>(counts: &mut Vec<(K, u64)>, key: K, n: u64) {
    match counts.iter_mut().find(|(k, _)| *k == key) {
        Some((_, count)) => *count += n,
        None => counts.push((key, n)),
    }
}

impl TickOutput {
    fn completed(&mut self, reason: Reason) {
        bump(&mut self.completed, reason, 1);
    }

    /// Completions handed along the chain (declined or not).
    pub fn completions(&self) -> u64 {
        self.completed.iter().map(|(_, n)| n).sum::<u64>() + self.late
    }
}

/// The engine's counters since it started (what self-telemetry exposes of it).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Counters {
    pub completed: [u64; Reason::ALL.len()],
    pub late: u64,
    pub declined: u64,
    pub records_built: u64,
    pub records_measured: u64,
    pub kept: u64,
    pub dropped: u64,
    pub rate_limited: u64,
    pub decide_failed: u64,
    pub kept_written: u64,
    pub kept_declined: u64,
    pub requests_native: u64,
    pub requests_python: u64,
    /// Requests Python read and supplied (`Engine::supply`).
    pub requests_supplied: u64,
}

impl Counters {
    pub fn completed(&self, reason: Reason) -> u64 {
        self.completed[Reason::ALL.iter().position(|r| *r == reason).unwrap_or(0)]
    }
}

/// The sampler, the kept writer and the names decisions refer to (the chain's state).
struct Chain {
    sampler: Option<Sampler>,
    writer: KeptWriter,
    names: Names,
    counters: Counters,
}

/// The recorder: both namings' series and the accounting beside them, on one byte budget.
struct Metrics {
    series: Series,
    accounting: Option<Accounting>,
}

/// The series' byte budget as the accounting draws on it (`families.SeriesBudget`, shared).
struct SharedBudget<'b>(&'b mut SeriesBudget);

impl ByteBudget for SharedBudget<'_> {
    fn take(&mut self, cost: u64) -> bool {
        self.0.take(cost)
    }
}

/// The accounting's families where `RecorderCollector.collect` yields them.
struct AccountingView<'a>(&'a Accounting);

impl AccountingFamilies for AccountingView<'_> {
    fn render(&self, openmetrics: bool, out: &mut Vec<u8>) {
        let mut text = String::new();
        self.0.render(openmetrics, &[OVERFLOW_LABEL], &mut text);
        out.extend_from_slice(text.as_bytes());
    }

    fn overflowed(&self, each: &mut dyn FnMut(&str, u64)) {
        for (name, overflowed) in self.0.overflowed() {
            each(name, overflowed);
        }
    }
}

/// The series' snapshot and the accounting's families (`RecorderCollector.collect`'s).
#[derive(Debug)]
pub struct EngineSnapshot {
    pub series: Snapshot,
    pub accounting: Vec<MetricFamily>,
}

/// The pipeline's per-span and per-trace work (`service/graph.py` `Pipeline`).
pub struct Engine {
    table: ShapeTable,
    infos: Vec<ShapeInfo>,
    checked: Checked,
    ingest_settings: IngestSettings,
    builder: RecordBuilder,
    write_kept: bool,
    shards: Vec<Mutex<TraceBuffer>>,
    hasher: RandomState,
    chain: Mutex<Chain>,
    metrics: Mutex<Metrics>,
    /// Requests read natively and handed to Python (atomics: an ingest never waits on the chain).
    requests_native: AtomicU64,
    requests_python: AtomicU64,
    /// Requests Python read and supplied (`supply`).
    requests_supplied: AtomicU64,
}

/// A lock, whatever a panic elsewhere left it as: every module's state is consistent between
/// calls (no call here panics on any input; a poisoned lock is only a bug's, not worth a crash).
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Engine {
    /// The engine of `config`; an error names the setting refused.
    pub fn new(config: EngineConfig) -> Result<Engine, String> {
        let EngineConfig { table, ingest, assembly, records, carried, sampler, metrics, accounting, redaction,
                           write_kept, shards, clock_start_s } = config;
        let TableConfig { schema, shapes, rules, candidates } = table;
        if shards == 0 || shards > assembly.max_traces {
            return Err(format!("shards must be between 1 and max_traces ({}), got {shards}", assembly.max_traces));
        }
        let checked = Checked::new(&schema).map_err(|e| format!("schema: {e}"))?;
        let builder = RecordBuilder::new(&schema, records, carried).map_err(|e| format!("llm_metrics: {e}"))?;
        let table = ShapeTable::new(schema, shapes, rules, candidates).map_err(|e| format!("shapes: {e}"))?;
        let infos = table.infos();
        let per_shard = AssemblySettings {
            max_traces: assembly.max_traces / shards,
            decided_cache_size: assembly.decided_cache_size.div_ceil(shards),
            max_open_calls_per_sender: assembly.max_open_calls_per_sender.div_ceil(shards),
            ..assembly
        };
        let buffers = (0..shards)
            .map(|_| TraceBuffer::new(per_shard).map(Mutex::new))
            .collect::<Result<Vec<_>, String>>()
            .map_err(|e| format!("tail_sampling: {e}"))?;
        let mut names = Names::default();
        let sampler = match &sampler {
            Some(config) => Some(Sampler::new(config, &mut names, clock_start_s).map_err(|e| format!("tail_sampling: {e}"))?),
            None => None,
        };
        let writer = KeptWriter::new(&redaction).map_err(|e| format!("redaction: {e}"))?;
        let series = Series::new(&metrics).map_err(|e| format!("llm_metrics: {}", e.0))?;
        // `recorder_of`: an `Accounting` only where tokens are counted or objectives are configured.
        let accounting = match accounting {
            Some(AccountingConfig { settings, specs })
                if settings.tokens || settings.default_objectives.is_some() || !settings.objectives_by_model.is_empty() =>
            {
                Some(Accounting::new(settings, specs, metrics.series_limit, metrics.max_label_value_bytes)
                    .map_err(|e| format!("llm_metrics: {e}"))?)
            }
            _ => None,
        };
        Ok(Engine {
            table,
            infos,
            checked,
            ingest_settings: ingest,
            builder,
            write_kept,
            shards: buffers,
            hasher: RandomState::new(),
            chain: Mutex::new(Chain { sampler, writer, names, counters: Counters::default() }),
            metrics: Mutex::new(Metrics { series, accounting }),
            requests_native: AtomicU64::new(0),
            requests_python: AtomicU64::new(0),
            requests_supplied: AtomicU64::new(0),
        })
    }

    fn shard_of(&self, trace_id: &TraceId) -> usize {
        if self.shards.len() == 1 {
            return 0;
        }
        (self.hasher.hash_one(trace_id) % self.shards.len() as u64) as usize
    }

    // --- intake ---------------------------------------------------------------------------------

    /// `Pipeline.buffer` for one export request's bytes (`validated`: the receivers' core
    /// validated them): the adapter stage (`read_request`), then each shard's `add_batch` of its
    /// spans, in the request's order. `Err` for bytes that are no request (counted by the caller,
    /// as Python's `DecodeError`); `IngestSummary::Python` where Python must read the request.
    pub fn ingest(&self, data: &[u8], validated: bool, now: f64) -> Result<IngestSummary, Malformed> {
        let read = match read_request(data, validated, &self.table, &self.checked, &self.ingest_settings)? {
            Ingested::Python => {
                self.requests_python.fetch_add(1, Ordering::Relaxed);
                return Ok(IngestSummary::Python);
            }
            Ingested::Native(read) => read,
        };
        let mut counts = IngestCounts {
            matched: read.counts.matched.iter().map(|(shape, n)| (self.infos[*shape].adapter.clone(), *n)).collect(),
            malformed: read.counts.malformed.clone(),
            passed_through: read.counts.passed_through,
            invalid_ids: read.counts.invalid_ids,
            buffered: read.spans.len() as u64,
            ..IngestCounts::default()
        };
        let incoming = |at: usize| {
            let span = &read.spans[at];
            Incoming {
                trace_id: span.trace_id,
                span: read.new_span(at),
                is_engine: span.shape.is_some_and(|shape| self.infos[shape].is_engine()),
            }
        };
        self.add(read.spans.len(), &incoming, &mut counts, now);
        self.requests_native.fetch_add(1, Ordering::Relaxed);
        Ok(IngestSummary::Native(counts))
    }

    /// Each shard's `add_batch` of the `len` spans `incoming` makes, in their order (by shard where
    /// there are several), with what it sent along or held back counted (read around the call).
    fn add<'s>(&self, len: usize, incoming: &dyn Fn(usize) -> Incoming<'s>, counts: &mut IngestCounts, now: f64) {
        let add = |buffer: &mut TraceBuffer, spans: &mut dyn Iterator<Item = Incoming<'s>>, counts: &mut IngestCounts| {
            let made_room = |b: &TraceBuffer| b.completions(Reason::Ready) + b.completions(Reason::MemoryLimit);
            let (waiting, made, parked) = (buffer.waiting_completions(), made_room(buffer), buffer.parked_spans());
            let added = buffer.add_batch(spans, now);
            let made = made_room(buffer) - made;
            counts.duplicate += added.duplicate;
            counts.dropped_over_trace_limit += added.dropped;
            counts.completed_to_make_room += made;
            counts.late += (buffer.waiting_completions() - waiting) as u64 - made;
            counts.parked += buffer.parked_spans().saturating_sub(parked) as u64;
        };
        if self.shards.len() == 1 {
            add(&mut lock(&self.shards[0]), &mut (0..len).map(incoming), counts);
        } else {
            let mut by_shard: Vec<Vec<usize>> = vec![Vec::new(); self.shards.len()];
            for at in 0..len {
                by_shard[self.shard_of(&incoming(at).trace_id)].push(at);
            }
            for (shard, spans) in by_shard.iter().enumerate().filter(|(_, spans)| !spans.is_empty()) {
                add(&mut lock(&self.shards[shard]), &mut spans.iter().map(|&at| incoming(at)), counts);
            }
        }
    }

    /// The spans Python read of a request the engine left to it (`IngestSummary::Python`; the
    /// reference digest's `BufferedSpan`s, see `handoff`), buffered exactly as if the engine had
    /// read them, in their order, and counted as `ingest` counts a request: matched by adapter
    /// (every span with an observation, parts included), passed through (the others), ids the
    /// receivers refuse (not buffered), and the buffer's counts. `malformed` stays empty: Python's
    /// `DigestCounts` counted the spans its digest refused (and those it truncated). Refused whole,
    /// nothing buffered, where a span names an origin not supplied, an adapter no shape has, or a
    /// field the schema does not declare or declares of another kind (`SupplyError` names it).
    pub fn supply(&self, supplied: &SpansData, now: f64) -> Result<IngestCounts, SupplyError> {
        let SpansData { origins, spans } = supplied;
        let schema = &self.table.schema;
        let mut counts = IngestCounts::default();
        // Everything checked and converted before anything is buffered.
        // (ids, observation, position in `spans`) of each span buffered.
        type Admitted = ((TraceId, SpanId, Option<SpanId>), Option<Observation>, usize);
        let mut admitted: Vec<Admitted> = Vec::with_capacity(spans.len());
        for (at, span) in spans.iter().enumerate() {
            if span.origin >= origins.len() {
                return Err(SupplyError::Origin { span: at, origin: span.origin, origins: origins.len() });
            }
            let observation = span.observation.as_ref()
                .map(|data| observation_of(data, schema, &self.infos, at)).transpose()?;
            let Some(ids) = ids_of(span) else {
                counts.invalid_ids += 1;
                continue;
            };
            match &observation {
                Some(observation) => bump(&mut counts.matched, self.infos[observation.shape as usize].adapter.clone(), 1),
                None => counts.passed_through += 1,
            }
            admitted.push((ids, observation, at));
        }
        counts.buffered = admitted.len() as u64;
        let incoming = |i: usize| {
            let ((trace_id, span_id, parent), observation, at) = &admitted[i];
            let span = &spans[*at];
            let origin = &origins[span.origin];
            Incoming {
                trace_id: *trace_id,
                span: NewSpan {
                    span_id: *span_id,
                    parent_span_id: *parent,
                    kind: span.kind,
                    status_code: span.status_code,
                    start_unix_ns: span.start_unix_ns,
                    end_unix_ns: span.end_unix_ns,
                    payload: &span.payload,
                    trace_state: &span.trace_state,
                    resource: &origin.resource,
                    scope: &origin.scope,
                    service_name: &origin.service_name,
                    observation: observation.as_ref(),
                    attrs_kept: span.attrs_kept,
                },
                is_engine: observation.as_ref().is_some_and(|o| self.infos[o.shape as usize].is_engine()),
            }
        };
        self.add(admitted.len(), &incoming, &mut counts, now);
        self.requests_supplied.fetch_add(1, Ordering::Relaxed);
        Ok(counts)
    }

    /// A trace's spans as plain data for Python (`handoff::spans_of` with the engine's schema and
    /// shapes): a declined completion's (`TickOutput::declined`), a kept trace the writer declined
    /// (`KeptDeclined::trace`), any trace taken from the buffer.
    pub fn spans_of(&self, trace: &TraceData) -> SpansData {
        spans_of(trace, &self.table.schema, &self.infos)
    }

    /// The observation schema the engine's shapes were declared with (each field's kind, by name:
    /// what `supply` checks a supplied observation against).
    pub fn schema(&self) -> &Schema {
        &self.table.schema
    }

    /// The shapes of the engine's table, by index (`Observation::shape`).
    pub fn shapes(&self) -> &[ShapeInfo] {
        &self.infos
    }

    // --- completion -----------------------------------------------------------------------------

    /// `TraceAssembler.tick` at `now` (the monotonic clock, seconds), the exemplars stamped with
    /// the wall clock now.
    pub fn tick(&self, now: f64) -> TickOutput {
        let unix = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64());
        self.tick_at(now, unix)
    }

    /// `tick`, with the exemplars' time (`time.time()` in Python) given.
    pub fn tick_at(&self, now: f64, now_unix_s: f64) -> TickOutput {
        let mut out = TickOutput::default();
        let mut due: Vec<Completion> = Vec::new();
        // The chain first (as Python's `_tick_lock`, one tick at a time): a tick waiting for
        // another holds no shard, so no ingest waits for it.
        let mut chain = lock(&self.chain);
        for shard in &self.shards {
            let mut buffer = lock(shard);
            buffer.tick_into(now, &mut due);
            if due.is_empty() {
                continue;
            }
            let mut completions = std::mem::take(&mut due).into_iter();
            loop {
                // `_complete`: runs of COMPLETION_BATCH, each followed by its traces' parked late spans.
                let run: Vec<Completion> = completions.by_ref().take(COMPLETION_BATCH).collect();
                if run.is_empty() {
                    break;
                }
                let ids = self.complete(&mut buffer, &mut chain, run, now, now_unix_s, &mut out);
                buffer.hand_on_parked(ids.iter());
                let parked = buffer.take_completions();
                if !parked.is_empty() {
                    self.complete(&mut buffer, &mut chain, parked, now, now_unix_s, &mut out);
                }
            }
        }
        out
    }

    /// One batch along the chain (`_Entry.consume_batch` and the stages after it). Returns the ids
    /// of the traces (not late spans) whose parked late spans may now go along: all but those
    /// declined, whose decision Python makes and `resume` gives (Python's chain has decided them
    /// when `_hand_on_parked` runs; here their spans stay parked until then).
    fn complete(&self, buffer: &mut TraceBuffer, chain: &mut Chain, batch: Vec<Completion>, now: f64,
                now_unix_s: f64, out: &mut TickOutput) -> Vec<TraceId> {
        // _Entry: counted.
        for completion in &batch {
            if completion.late {
                out.late += 1;
                chain.counters.late += 1;
            } else {
                out.completed(completion.reason);
                let at = Reason::ALL.iter().position(|r| *r == completion.reason).unwrap_or(0);
                chain.counters.completed[at] += 1;
            }
        }
        let shapes = self.infos.as_slice();
        // LlmMetricsStage: each trace's records (`_records`), and what of them to measure.
        let mut states: Vec<State<'_>> = Vec::with_capacity(batch.len());
        // Late engine spans measured in this batch, per trace: Python's stages change the one
        // `Remembered` every late span of a trace refers to.
        let mut measured_late: HashMap<TraceId, Vec<SpanId>> = HashMap::new();
        for completion in &batch {
            let trace = &completion.trace;
            let built = if completion.late {
                self.builder.build_late(trace, shapes)
            } else {
                self.builder.build(trace, shapes)
            };
            let (records, malformed) = match built {
                Built::Declined(reason) => {
                    states.push(State::declined(reason));
                    continue;
                }
                Built::Records(records, malformed) => (records, malformed),
            };
            out.records_built += records.len() as u64;
            chain.counters.records_built += records.len() as u64;
            let mut state = State { records, measure: Vec::new(), decision: None, failed: false, declined: None,
                                    kept: Fate::None };
            let prior = completion.prior.as_ref();
            if completion.late {
                let span_id = trace.span(0).span_id;
                let is_engine = trace.obs(0).and_then(|obs| shapes.get(obs.shape() as usize)).is_some_and(ShapeInfo::is_engine);
                let seen = prior.is_some_and(|p| p.measured.contains(&span_id))
                    || buffer.remembered(&trace.trace_id).is_some_and(|r| r.measured.contains(&span_id))
                    || measured_late.get(&trace.trace_id).is_some_and(|ids| ids.contains(&span_id));
                let measure = (is_engine || !state.records.is_empty()) && !(prior.is_some() && seen);
                if measure {
                    if prior.is_some() {
                        buffer.add_measured(&trace.trace_id, span_id);
                        measured_late.entry(trace.trace_id).or_default().push(span_id);
                    }
                    state.measure = (0..state.records.len()).collect();
                    out.malformed.extend(malformed);
                }
            } else if let Some(prior) = prior {
                state.measure = (0..state.records.len()).filter(|&i| !prior.measured.contains(&state.records[i].span_id)).collect();
            } else {
                state.measure = (0..state.records.len()).collect();
                out.malformed.extend(malformed);
            }
            states.push(state);
        }
        // DecisionStage: the undecided traces decided in order, then each decision followed.
        for (completion, state) in batch.iter().zip(states.iter_mut()) {
            if state.declined.is_some() || completion.late || completion.prior.is_some() {
                continue;
            }
            let Some(sampler) = chain.sampler.as_mut() else { continue };
            match sampler.decide(&completion.trace, &state.records, now) {
                Ok(decision) => state.decision = Some(decision),
                Err(_) => {
                    // Python's trace error (`DecideError::python_fails`); the one failure that is
                    // this port's own (a clock past 2^63 window slices, unreachable) is treated alike.
                    state.failed = true;
                    out.decide_failed += 1;
                    out.spans_failed += completion.trace.len() as u64;
                    chain.counters.decide_failed += 1;
                }
            }
        }
        for (completion, state) in batch.iter().zip(states.iter_mut()) {
            if state.declined.is_some() || state.failed {
                continue;
            }
            let prior = completion.prior.as_ref();
            if completion.late {
                // A late span follows its trace's decision; without one (forgotten) it is not kept.
                state.decision = Some(prior.map_or(DROP, |p| p.decision));
                continue;
            }
            let decision = match prior {
                Some(prior) => prior.decision,
                None if chain.sampler.is_some() => state.decision.unwrap_or(DROP),
                None => KEEP_UNSAMPLED,
            };
            let mut measured: Vec<SpanId> = state.records.iter().map(|r| r.span_id).collect();
            if let Some(prior) = prior {
                measured.extend_from_slice(prior.measured.as_slice());
            }
            buffer.remember(&completion.trace.trace_id, Remembered::new(decision, &measured));
            state.decision = Some(decision);
            if prior.is_some() {
                continue;
            }
            if decision.keep {
                out.kept_decisions += 1;
                chain.counters.kept += 1;
            } else if decision.rate_limited {
                out.rate_limited += 1;
                chain.counters.rate_limited += 1;
            } else {
                out.dropped_decisions += 1;
                chain.counters.dropped += 1;
            }
        }
        // RedactionStage: kept traces written (only where the pipeline has a consumer of them).
        if self.write_kept {
            for (completion, state) in batch.iter().zip(states.iter_mut()) {
                let Some(decision) = state.decision.filter(|d| d.keep && state.declined.is_none() && !state.failed) else {
                    continue;
                };
                let owned = || one_per_request(&state.records).map(|r| r.clone().into_owned()).collect::<Vec<_>>();
                match chain.writer.write_decision(&completion.trace, &state.records, &decision, &chain.names) {
                    Ok(written) => {
                        for (count, (_, removed)) in out.redacted.iter_mut().zip(written.redacted.by_reason()) {
                            *count += removed;
                        }
                        chain.counters.kept_written += 1;
                        state.kept = Fate::Written(KeptTrace { trace_id: completion.trace.trace_id, written,
                                                                records: owned(), decision });
                    }
                    Err(reason) => {
                        chain.counters.kept_declined += 1;
                        state.kept = Fate::Declined(owned(), decision, reason);
                    }
                }
            }
        }
        // LlmMetricsStage's `finally`: every measured record recorded, exemplars for kept traces.
        {
            let mut metrics = lock(&self.metrics);
            let Metrics { series, accounting } = &mut *metrics;
            for state in &states {
                if state.declined.is_some() {
                    continue;
                }
                let kept = state.decision.is_some_and(|d| d.keep);
                for &at in &state.measure {
                    let record = &state.records[at];
                    for reason in &record.rejected {
                        bump(&mut out.values_rejected, reason.to_string(), 1);
                    }
                    for interval in &record.not_measurable {
                        bump(&mut out.unmeasured, (record.service_name.to_string(), format!("not_measurable_{interval}")), 1);
                    }
                    bump(&mut out.assembled, (record.engine_kind.to_string(), record.outcome.to_string()), 1);
                    series.record(record, kept, now_unix_s);
                    if let Some(accounting) = accounting.as_mut() {
                        accounting.record(record, &mut SharedBudget(series.budget_mut()));
                    }
                    out.records_measured += 1;
                    chain.counters.records_measured += 1;
                }
            }
        }
        // What leaves: kept traces in order, the declined ones' completions for Python.
        let fates: Vec<(Option<crate::records::Decline>, Fate)> =
            states.into_iter().map(|state| (state.declined, state.kept)).collect();
        let mut followed = Vec::with_capacity(batch.len());
        for (completion, (declined, fate)) in batch.into_iter().zip(fates) {
            if declined.is_none() && !completion.late {
                followed.push(completion.trace.trace_id);
            }
            if let Some(reason) = declined {
                chain.counters.declined += 1;
                out.declined.push((completion, reason));
                continue;
            }
            match fate {
                Fate::None => {}
                Fate::Written(kept) => out.kept.push(kept),
                Fate::Declined(records, decision, reason) => {
                    out.kept_declined.push(KeptDeclined { trace: completion.trace, records, decision, reason });
                }
            }
        }
        followed
    }

    /// Python decided a declined trace (`DecisionStage._follow`): its decision remembered with the
    /// engine spans its records measured, so its late spans follow it; its parked late spans go
    /// along at the next tick. Nothing for a trace the buffer no longer remembers as completing.
    pub fn resume(&self, trace_id: &TraceId, decision: Decision, measured: &[SpanId]) {
        let mut buffer = lock(&self.shards[self.shard_of(trace_id)]);
        buffer.remember(trace_id, Remembered::new(decision, measured));
        buffer.hand_on_parked(std::iter::once(trace_id));
    }

    /// `DecisionStage` for a declined trace whose records Python built: the engine's sampler decides
    /// it (so its rolling windows and rate limit see all traffic, the declined traces after the
    /// others of their run), counted as the tick counts its own; then `resume` remembers it.
    pub fn decide(&self, trace: &TraceData, records: &[Record<'_>], now: f64) -> Result<Decision, DecideError> {
        let mut chain = lock(&self.chain);
        let Chain { sampler, counters, .. } = &mut *chain;
        let Some(sampler) = sampler.as_mut() else { return Ok(KEEP_UNSAMPLED) };
        let decided = sampler.decide(trace, records, now);
        match decided {
            Ok(decision) if decision.keep => counters.kept += 1,
            Ok(decision) if decision.rate_limited => counters.rate_limited += 1,
            Ok(_) => counters.dropped += 1,
            Err(_) => counters.decide_failed += 1,
        }
        decided
    }

    /// `Remembered.add_measured` for a late engine span Python measured (a declined late
    /// completion): the cache's decision of its trace takes it, so a redelivery is a duplicate.
    pub fn add_measured(&self, trace_id: &TraceId, span_id: SpanId) {
        lock(&self.shards[self.shard_of(trace_id)]).add_measured(trace_id, span_id);
    }

    /// Records Python built for a declined completion (`TickOutput::declined`), recorded as the
    /// metrics stage records its own (`LlmMetricsStage.consume_batch`'s `finally`): into the series
    /// and the accounting, exemplars where the trace was kept (`with_exemplars`).
    pub fn record(&self, records: &[Record<'_>], with_exemplars: bool, now_unix_s: f64) {
        let mut metrics = lock(&self.metrics);
        let Metrics { series, accounting } = &mut *metrics;
        for record in records {
            series.record(record, with_exemplars, now_unix_s);
            if let Some(accounting) = accounting.as_mut() {
                accounting.record(record, &mut SharedBudget(series.budget_mut()));
            }
        }
    }

    /// The id of a policy name or threshold (for `resume`'s decision), interned.
    pub fn intern(&self, name: &str) -> NameId {
        lock(&self.chain).names.intern(name)
    }

    /// The text of a decision's name id.
    pub fn name(&self, id: NameId) -> String {
        lock(&self.chain).names.name(id).to_owned()
    }

    /// The decision remembered for a trace (the decision cache's), if any.
    pub fn remembered(&self, trace_id: &TraceId) -> Option<Remembered> {
        lock(&self.shards[self.shard_of(trace_id)]).remembered(trace_id).cloned()
    }

    // --- restarts -----------------------------------------------------------------------------------

    /// `TraceAssembler.decisions`: the decision caches' decisions, each shard's oldest first, shard
    /// by shard (for a graceful restart).
    pub fn decisions(&self) -> Vec<(TraceId, Remembered)> {
        self.shards.iter().flat_map(|shard| lock(shard).decisions()).collect()
    }

    /// `TraceAssembler.restore_decisions`: a previous run's decisions, each into its trace's shard
    /// (before any span arrives).
    pub fn restore_decisions(&self, decisions: impl IntoIterator<Item = (TraceId, Remembered)>) {
        let mut by_shard: Vec<Vec<(TraceId, Remembered)>> = (0..self.shards.len()).map(|_| Vec::new()).collect();
        for (trace_id, remembered) in decisions {
            by_shard[self.shard_of(&trace_id)].push((trace_id, remembered));
        }
        for (shard, decisions) in self.shards.iter().zip(by_shard) {
            if !decisions.is_empty() {
                lock(shard).restore_decisions(decisions);
            }
        }
    }

    /// `TraceAssembler.take_pending`: the pending traces `pick` picks, removed undecided (a
    /// graceful stop hands them to the next start), each shard's oldest first, shard by shard.
    pub fn take_pending(&self, mut pick: impl FnMut(&TraceData) -> bool) -> Vec<TraceData> {
        self.shards.iter().flat_map(|shard| lock(shard).take_pending(&mut pick)).collect()
    }

    /// `TraceAssembler.complete_now`: traces taken with `take_pending` completed after all (their
    /// hand-over could not be written), each in its shard; they go along at the next tick.
    pub fn complete_now(&self, traces: Vec<TraceData>, reason: Reason) {
        let mut by_shard: Vec<Vec<TraceData>> = (0..self.shards.len()).map(|_| Vec::new()).collect();
        for trace in traces {
            by_shard[self.shard_of(&trace.trace_id)].push(trace);
        }
        for (shard, traces) in self.shards.iter().zip(by_shard) {
            if !traces.is_empty() {
                lock(shard).complete_now(traces, reason);
            }
        }
    }

    /// `TraceAssembler.overdue`: `each` of the pending traces first seen at or before
    /// `seen_before` and those `carried` picks, under each shard's lock in turn.
    pub fn overdue(&self, seen_before: f64, mut carried: impl FnMut(&TraceId) -> bool,
                   mut each: impl FnMut(&TraceData)) {
        for shard in &self.shards {
            let buffer = lock(shard);
            for trace in buffer.overdue(seen_before, &mut carried) {
                each(trace);
            }
        }
    }

    // --- exposition -----------------------------------------------------------------------------

    /// `RecorderCollector.collect` rendered (text 0.0.4, or OpenMetrics without `# EOF`): the
    /// namings' families, the accounting's, the segments', then the recorder's own counters.
    pub fn render(&self, openmetrics: bool) -> String {
        let metrics = lock(&self.metrics);
        let mut out = Vec::new();
        let view = metrics.accounting.as_ref().map(AccountingView);
        metrics.series.render_with(openmetrics, &mut out, view.as_ref().map(|v| v as &dyn AccountingFamilies));
        String::from_utf8(out).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
    }

    /// The series' and the accounting's state now (`take_snapshot`).
    pub fn snapshot(&self) -> EngineSnapshot {
        let metrics = lock(&self.metrics);
        EngineSnapshot {
            series: metrics.series.snapshot(),
            accounting: metrics.accounting.as_ref().map_or_else(Vec::new, |a| a.snapshot(&[OVERFLOW_LABEL])),
        }
    }

    /// The engine's counters since it started.
    pub fn counters(&self) -> Counters {
        let mut counters = lock(&self.chain).counters.clone();
        counters.requests_native = self.requests_native.load(Ordering::Relaxed);
        counters.requests_python = self.requests_python.load(Ordering::Relaxed);
        counters.requests_supplied = self.requests_supplied.load(Ordering::Relaxed);
        counters
    }

    /// Requests the series recorded (`MetricsRecorder.requests_recorded`).
    pub fn requests_recorded(&self) -> u64 {
        lock(&self.metrics).series.requests_recorded()
    }

    // --- the buffer's state -----------------------------------------------------------------------

    fn sum(&self, each: impl Fn(&TraceBuffer) -> usize) -> usize {
        self.shards.iter().map(|shard| each(&lock(shard))).sum()
    }

    /// `TraceAssembler.shed`: each shard's oldest `fraction` completed now (they go along at the
    /// next tick); returns how many.
    pub fn shed(&self, fraction: f64) -> usize {
        self.shards.iter().map(|shard| lock(shard).shed(fraction)).sum()
    }

    /// `TraceAssembler.drain`: every pending trace completed (they go along at the next tick).
    pub fn drain(&self) -> usize {
        self.shards.iter().map(|shard| lock(shard).drain()).sum()
    }

    /// Pending traces (`traces_in_memory`).
    pub fn len(&self) -> usize {
        self.sum(TraceBuffer::len)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Spans of the pending traces.
    pub fn held_spans(&self) -> usize {
        self.sum(TraceBuffer::held_spans)
    }

    /// Traces held for a call in flight (`traces_held_open_calls`).
    pub fn held(&self) -> usize {
        self.sum(TraceBuffer::held_traces)
    }

    /// Heap bytes of every shard's buffer (the memory accounting).
    pub fn heap_bytes(&self) -> usize {
        self.sum(TraceBuffer::heap_bytes)
    }

    /// `TraceAssembler.completion_lag`: the longest over the shards.
    pub fn completion_lag(&self, now: f64) -> f64 {
        self.shards.iter().map(|shard| lock(shard).completion_lag(now)).fold(0.0, f64::max)
    }

    pub fn shards(&self) -> usize {
        self.shards.len()
    }
}

/// A completion's way through one batch.
struct State<'t> {
    records: Vec<Record<'t>>,
    /// Positions in `records` recorded into the series.
    measure: Vec<usize>,
    decision: Option<Decision>,
    failed: bool,
    declined: Option<crate::records::Decline>,
    kept: Fate,
}

impl State<'_> {
    fn declined(reason: crate::records::Decline) -> Self {
        State { records: Vec::new(), measure: Vec::new(), decision: None, failed: false, declined: Some(reason),
                kept: Fate::None }
    }
}

/// What became of a kept trace.
enum Fate {
    None,
    Written(KeptTrace),
    Declined(Vec<Record<'static>>, Decision, crate::kept::Decline),
}

#[cfg(test)]
mod tests;
