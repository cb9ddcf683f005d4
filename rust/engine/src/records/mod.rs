//! A completed trace's request records: `otel_llm/processor/llm_metrics/requests.py`
//! (`records_of_trace` and what it calls), `segments.py` (`derive_timings`, `build_segments`) and
//! the SGLang part of `composite.py` (`sglang`: a request read from its root and stage spans),
//! ported rule for rule on the trace's native spans and observations.
//!
//! What Python reads by rules this crate does not port, the builder declines (`Built::Declined`,
//! with the reason the caller counts), and Python builds that trace's records: the composite
//! engines and disaggregated pairs (`ShapeInfo::python_records`; Triton, trtllm-serve, Dynamo,
//! llm-d; SGLang prefill/decode pairs), a value Python renders as text with `repr`, a string
//! `float()` reads by rules of its own, a finish reason Unicode lowercasing could change, a
//! non-ASCII upstream trace state, times past `i64`, and the exceptions Python does not catch per
//! request. A decline is always correct; everything built is Python's record, field for field and
//! bit for bit (`tests/records_differential.rs` runs the reference's own records).
//!
//! Spans are named by their slot in the trace (`TraceData` keeps Python's `trace.spans` order).

mod build;
mod join;
mod read;
mod sglang;
mod timings;

use std::cell::{OnceCell, RefCell};
use std::collections::{HashMap, HashSet};

use crate::model::{entry_value, AnyValue, FieldId, Kind, ObsView, Schema, ShapeInfo, SpanId, SpanSlot, TraceData,
                   SPAN_KIND_SERVER};
use crate::record::{Record, Side};

pub use timings::{build_segments, derive_timings, python_sum, ObservedNumbers, Timings};

/// `requests.ResourceModelRule`: a model name from a resource attribute, mapped through `values`,
/// or taken as is when `values` is empty.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ResourceModelRule {
    pub attribute: String,
    pub values: HashMap<String, String>,
}

/// `requests.Dimension`: an extra metric label read from the span, the spans joined with it, then
/// its resource.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Dimension {
    pub name: String,
    pub attribute: String,
    pub allowed: HashSet<String>,
    pub other: String,
}

/// `requests.TenantRule`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TenantRule {
    pub attributes: Vec<String>,
    pub allowed: HashSet<String>,
    pub other: String,
}

/// `requests.RecordSettings`, with what the records read of the digest's settings (the events
/// whose time is a gateway's first token) and of the interpreter (how its `sum()` adds floats).
#[derive(Clone, Debug, PartialEq)]
pub struct RecordSettings {
    pub resource_model_rules: Vec<ResourceModelRule>,
    pub default_model: String,
    pub default_operation: String,
    pub model_from_service_name: bool,
    /// Attributes holding a gateway's time to first token, in seconds (the first a span has).
    pub edge_ttft_attributes: Vec<String>,
    /// Event names whose first occurrence on a SERVER span is its first token
    /// (`DigestSettings.first_token_events`, kept by Python as `FIRST_TOKEN_EVENT`).
    pub first_token_events: Vec<String>,
    pub dimensions: Vec<Dimension>,
    pub tenant: Option<TenantRule>,
    /// The bound every duration read at assembly goes through.
    pub max_latency_s: f64,
    /// A configured LoRA adapter's name -> its base model.
    pub lora_adapters: HashMap<String, String>,
    /// Whether the reference's `sum()` compensates (CPython 3.12 and later): how an SGLang stage
    /// retracted and run again adds up.
    pub compensated_sum: bool,
}

impl Default for RecordSettings {
    /// `RecordSettings()`'s defaults, with the configuration's first-token events.
    fn default() -> RecordSettings {
        RecordSettings {
            resource_model_rules: Vec::new(),
            default_model: String::new(),
            default_operation: String::new(),
            model_from_service_name: false,
            edge_ttft_attributes: vec!["gen_ai.server.time_to_first_token".to_owned()],
            first_token_events: vec!["gen_ai.first_token".to_owned(), "first_token".to_owned()],
            dimensions: Vec::new(),
            tenant: None,
            max_latency_s: 86400.0,
            lora_adapters: HashMap::new(),
            compensated_sum: true,
        }
    }
}

/// Why a trace's records are left to Python (counted by the caller, by `as_str`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Decline {
    /// A span of a shape only Python reads (`ShapeInfo::python_records`), or an engine span of a
    /// composite engine other than SGLang.
    PythonShape,
    /// An observation whose shape the shape table does not hold.
    UnknownShape,
    /// A disaggregated pair: trtllm-serve's context and generation spans, SGLang's prefill and
    /// decode roots with one `bootstrap_room`.
    DisaggregatedPair,
    /// An attribute read as text that Python renders with `repr` (a double, a list in a list).
    ReprText,
    /// An attribute read as a number from a string `float()` reads by rules of its own.
    NumberText,
    /// A finish reason that is not ASCII (Unicode lowercasing could make it a known one).
    UnicodeCase,
    /// An upstream trace state with a threshold and non-ASCII text (`str.strip()`'s spaces).
    TraceState,
    /// A time or offset beyond what a record holds (`i64` ns) or this crate computes.
    TimeRange,
    /// Python raises out of `records_of_trace` (a request other than an engine's whose numbers
    /// are malformed, `round()` of an infinite offset): its exception path is Python's.
    Uncaught,
    /// A late completion that is not one span.
    LateShape,
}

impl Decline {
    pub fn as_str(self) -> &'static str {
        match self {
            Decline::PythonShape => "python_shape",
            Decline::UnknownShape => "unknown_shape",
            Decline::DisaggregatedPair => "disaggregated_pair",
            Decline::ReprText => "repr_text",
            Decline::NumberText => "number_text",
            Decline::UnicodeCase => "unicode_case",
            Decline::TraceState => "trace_state",
            Decline::TimeRange => "time_range",
            Decline::Uncaught => "uncaught",
            Decline::LateShape => "late_shape",
        }
    }
}

/// What a request's reading ran into: a decline (the whole trace is Python's), or `MalformedSpan`
/// with its reason (that request gives no record; counted where Python catches it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fail {
    Decline(Decline),
    Malformed(&'static str),
}

impl From<Decline> for Fail {
    fn from(decline: Decline) -> Fail {
        Fail::Decline(decline)
    }
}

/// A trace's request records: server records (engine requests, then gateway-only requests), then
/// client records, and the (reason, service name) of each request whose spans could not make one
/// (`otel_llm_spans_malformed_total`); or declined.
#[derive(Clone, Debug, PartialEq)]
pub enum Built<'t> {
    Records(Vec<Record<'t>>, Vec<(&'static str, String)>),
    Declined(Decline),
}

/// The observation fields the rules read, by their ids in the observation schema.
#[derive(Clone, Debug)]
struct Fields {
    ttft: FieldId,
    e2e: FieldId,
    queue: FieldId,
    prefill: FieldId,
    decode: FieldId,
    inference: FieldId,
    preprocess: FieldId,
    tpot: FieldId,
    prompt: FieldId,
    completion: FieldId,
    max_tokens: FieldId,
    cached: FieldId,
    cache_write: FieldId,
    reasoning: FieldId,
    spec_accepted: FieldId,
    spec_draft: FieldId,
    spec_steps: FieldId,
    request_model: FieldId,
    response_model: FieldId,
    finish_reason: FieldId,
    operation_name: FieldId,
    provider_name: FieldId,
    server_address: FieldId,
    server_port: FieldId,
    error_type: FieldId,
    spec_decode_rejected: FieldId,
    is_error: FieldId,
    itl: FieldId,
    derived: FieldId,
    dispatch_to_first_token: FieldId,
}

impl Fields {
    fn of(schema: &Schema) -> Result<Fields, String> {
        let float = |name| schema.require(name, Kind::Float);
        let int = |name| schema.require(name, Kind::Int);
        let text = |name| schema.require(name, Kind::Text);
        Ok(Fields {
            ttft: float("ttft_s")?,
            e2e: float("e2e_s")?,
            queue: float("queue_s")?,
            prefill: float("prefill_s")?,
            decode: float("decode_s")?,
            inference: float("inference_s")?,
            preprocess: float("preprocess_s")?,
            tpot: float("tpot_s")?,
            prompt: int("prompt_tokens")?,
            completion: int("completion_tokens")?,
            max_tokens: int("max_tokens")?,
            cached: int("cached_tokens")?,
            cache_write: int("cache_write_tokens")?,
            reasoning: int("reasoning_tokens")?,
            spec_accepted: int("spec_accepted_tokens")?,
            spec_draft: int("spec_draft_tokens")?,
            spec_steps: int("spec_steps")?,
            request_model: text("request_model")?,
            response_model: text("response_model")?,
            finish_reason: text("finish_reason")?,
            operation_name: text("operation_name")?,
            provider_name: text("provider_name")?,
            server_address: text("server_address")?,
            server_port: text("server_port")?,
            error_type: text("error_type")?,
            spec_decode_rejected: text("spec_decode_rejected")?,
            is_error: schema.require("is_error", Kind::Flag)?,
            itl: schema.require("itl_s", Kind::Floats)?,
            derived: schema.require("derived", Kind::Texts)?,
            dispatch_to_first_token: float("dispatch_to_first_token_s")?,
        })
    }
}

/// Builds a completed trace's request records (`requests.records_of_trace`).
#[derive(Clone, Debug)]
pub struct RecordBuilder {
    settings: RecordSettings,
    fields: Fields,
    /// Every observation field's kind (to copy a carried one).
    kinds: Vec<Kind>,
    /// Observation fields copied into `Record::extra` unchanged: (observation field, record field).
    carried: Vec<(FieldId, FieldId)>,
    /// `f"resource:{rule.attribute}"` of each resource model rule.
    resource_sources: Vec<String>,
    /// `"engine:" + source` for every model source a server record can have but `none`/`default`.
    engine_sources: Vec<(String, String)>,
    /// The attributes the rules read of a span (`digest_settings`' kept keys): a span's are read
    /// in one pass.
    attribute_keys: Vec<String>,
}

impl RecordBuilder {
    /// `schema`: the observation schema (`OBSERVATION_FIELDS` natively, see `Fields::of`);
    /// `carried`: fields Python declares beyond those, each with the record field it is copied to.
    pub fn new(schema: &Schema, settings: RecordSettings, carried: Vec<(FieldId, FieldId)>) -> Result<RecordBuilder, String> {
        let fields = Fields::of(schema)?;
        if let Some((field, _)) = carried.iter().find(|(field, _)| field.0 as usize >= schema.len()) {
            return Err(format!("carried field {} is not in the observation schema", field.0));
        }
        let resource_sources: Vec<String> =
            settings.resource_model_rules.iter().map(|rule| format!("resource:{}", rule.attribute)).collect();
        let mut engine_sources: Vec<(String, String)> = build::OBSERVED_MODEL_SOURCES.iter()
            .map(|source| (source.to_string(), format!("engine:{source}"))).collect();
        for source in &resource_sources {
            engine_sources.push((source.clone(), format!("engine:{source}")));
        }
        let mut attribute_keys: Vec<String> = Vec::new();
        let read = ["gen_ai.request.model", "gen_ai.response.model", "http.route", "url.path", "error.type"];
        let configured = settings.edge_ttft_attributes.iter()
            .chain(settings.dimensions.iter().map(|dimension| &dimension.attribute))
            .chain(settings.tenant.iter().flat_map(|tenant| tenant.attributes.iter()));
        for key in read.iter().copied().chain(configured.map(String::as_str)) {
            if !attribute_keys.iter().any(|known| known == key) {
                attribute_keys.push(key.to_owned());
            }
        }
        Ok(RecordBuilder {
            attribute_keys,
            kinds: schema.ids().map(|id| schema.kind(id)).collect(),
            settings,
            fields,
            carried,
            resource_sources,
            engine_sources,
        })
    }

    pub fn settings(&self) -> &RecordSettings {
        &self.settings
    }

    /// `requests.records_of_trace(trace, settings, malformed)`: `shapes` is the shape table the
    /// trace's observations index.
    pub fn build<'t>(&'t self, trace: &'t TraceData, shapes: &'t [ShapeInfo]) -> Built<'t> {
        let view = TraceView::new(self, trace, shapes);
        match view.checked().and_then(|()| view.records_of_trace()) {
            Ok((records, malformed)) => Built::Records(records, malformed),
            Err(decline) => Built::Declined(decline),
        }
    }

    /// The records of a late span's completion (`LlmMetricsStage._records` for `completed.late`):
    /// a late engine span is measured alone; a late GenAI client span (a call that outlived its
    /// trace's wait) on the client side only; anything else gives none.
    pub fn build_late<'t>(&'t self, trace: &'t TraceData, shapes: &'t [ShapeInfo]) -> Built<'t> {
        if trace.len() != 1 {
            return Built::Declined(Decline::LateShape); // Python's `(span,) = ...` raises
        }
        let shape = match trace.obs(0) {
            None => None,
            Some(obs) => match shapes.get(obs.shape() as usize) {
                Some(shape) => Some(shape),
                None => return Built::Declined(Decline::UnknownShape),
            },
        };
        let engine = shape.is_some_and(ShapeInfo::is_engine);
        // `_is_client_call`: a GenAI span that is not a SERVER span.
        let client = !engine
            && shape.is_some_and(|s| s.engine_kind == build::GENAI) && trace.span(0).kind != SPAN_KIND_SERVER;
        if !engine && !client {
            return Built::Records(Vec::new(), Vec::new()); // Python reads nothing of it
        }
        match self.build(trace, shapes) {
            Built::Records(mut records, malformed) => {
                if client {
                    records.retain(|record| record.side == Side::Client);
                }
                Built::Records(records, malformed)
            }
            declined => declined,
        }
    }
}

/// A trace as the rules read it: its spans, their shapes, the builder's settings, and the
/// attributes read so far.
pub(crate) struct TraceView<'t> {
    builder: &'t RecordBuilder,
    data: &'t TraceData,
    shapes: &'t [ShapeInfo],
    attributes: RefCell<Attributes<'t>>,
    /// The trace's spans by parent, made the first time a join or an SGLang request asks.
    children: OnceCell<HashMap<SpanId, Vec<usize>>>,
}

/// The attributes of the spans read so far, `attribute_keys`' values of each (allocated only when
/// a rule reads one: most traces' records need none).
#[derive(Default)]
struct Attributes<'t> {
    /// Per span: 0 until read, `u32::MAX` when Python kept none, else 1 + where its values start.
    at: Vec<u32>,
    values: Vec<Option<AnyValue<'t>>>,
}

impl<'t> TraceView<'t> {
    fn new(builder: &'t RecordBuilder, data: &'t TraceData, shapes: &'t [ShapeInfo]) -> TraceView<'t> {
        TraceView { builder, data, shapes, attributes: RefCell::new(Attributes::default()), children: OnceCell::new() }
    }

    /// The spans whose parent is `parent`, in the trace's order.
    fn children(&self, parent: &SpanId) -> &[usize] {
        let children = self.children.get_or_init(|| {
            let mut children: HashMap<SpanId, Vec<usize>> = HashMap::new();
            for at in 0..self.data.len() {
                if let Some(parent) = self.data.span(at).parent() {
                    children.entry(*parent).or_default().push(at);
                }
            }
            children
        });
        children.get(parent).map_or(&[], Vec::as_slice)
    }

    fn slot(&self, at: usize) -> &'t SpanSlot {
        self.data.span(at)
    }

    /// The span's observation, if an adapter read one.
    fn obs(&self, at: usize) -> Option<ObsView<'t>> {
        self.data.obs(at)
    }

    /// The shape of the span's observation (`checked` made sure the table holds it).
    fn shape(&self, at: usize) -> Option<&'t ShapeInfo> {
        self.data.obs(at).and_then(|obs| self.shapes.get(obs.shape() as usize))
    }

    /// The span's attribute `key` as Python's records see it (`BufferedSpan.attr` of its kept
    /// attributes): none of a span Python kept no attributes of (`SpanSlot::attrs_kept`, which
    /// ingest sets from the shape table's reading: not a candidate, an SGLang stage, refused). The
    /// keys the rules read are read from a span's bytes in one pass, the first time one is asked for.
    fn attr(&self, at: usize, key: &str) -> Option<AnyValue<'t>> {
        let keys = &self.builder.attribute_keys;
        let Some(wanted) = keys.iter().position(|known| known == key) else {
            return self.data.attr(at, key);
        };
        let mut read = self.attributes.borrow_mut();
        if read.at.is_empty() {
            read.at = vec![0; self.data.len()];
        }
        let start = match read.at[at] {
            0 => {
                if !self.slot(at).attrs_kept {
                    read.at[at] = u32::MAX;
                    return None;
                }
                let start = read.values.len();
                read.values.resize(start + keys.len(), None);
                for (name, entry) in read::entries(self.data.body(at), 9) {
                    if let Some(index) = keys.iter().position(|known| known.as_bytes() == name) {
                        read.values[start + index] = Some(entry_value(entry)); // the last occurrence wins
                    }
                }
                read.at[at] = start as u32 + 1;
                start
            }
            u32::MAX => return None,
            slot => slot as usize - 1,
        };
        read.values[start + wanted]
    }

    /// `requests.is_genai`.
    fn is_genai(&self, at: usize) -> bool {
        self.shape(at).is_some_and(|shape| shape.may_be_gateway)
    }

    /// `requests.is_client_side`: a GenAI span that is not a SERVER span.
    fn is_client_side(&self, at: usize) -> bool {
        self.slot(at).kind != SPAN_KIND_SERVER && self.is_genai(at)
    }

    /// Declines a trace holding a span only Python reads: a shape the table does not hold, one
    /// whose requests Python reads (`python_records`), a composite engine's span other than SGLang's.
    fn checked(&self) -> Result<(), Decline> {
        for at in 0..self.data.len() {
            let Some(obs) = self.data.obs(at) else { continue };
            let Some(shape) = self.shapes.get(obs.shape() as usize) else { return Err(Decline::UnknownShape) };
            if shape.python_records || (shape.is_engine() && build::PYTHON_COMPOSITES.contains(&shape.engine_kind.as_str())) {
                return Err(Decline::PythonShape);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
