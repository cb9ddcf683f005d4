//! The span-derived metrics as data (`llm_metrics/metrics/definitions.py`): namings, histogram and
//! counter declarations, value expressions and label sources, and the recorder's limits
//! (`recorder.py` `MetricsRecorder.__init__`). The binding builds a `MetricsSpec` from the Python
//! declarations once; `Series::new` checks it and compiles it.

use std::fmt;

use crate::record::{RecordField, Side};

/// Everything `MetricsRecorder(namings, dimension_names, series_limit, series_limit_bytes,
/// max_label_value_bytes)` is given, plus `keep_exponential`'s limits when an exporter asked for
/// exponential buckets before the first record.
#[derive(Clone, Debug, PartialEq)]
pub struct MetricsSpec {
    /// In the recorder's order (`stage.py` `recorder_of`): series are created, and draw on the
    /// byte budget, in this order.
    pub namings: Vec<NamingSpec>,
    /// `definitions.SEGMENT_METRIC`.
    pub segments: SegmentsSpec,
    /// The configured extra dimensions' label names, in config order.
    pub dimension_names: Vec<String>,
    /// Label sets per family (the overflow series counts among them, as `len(family.series)` does).
    pub series_limit: usize,
    /// `SeriesBudget`'s limit: estimated exposition bytes over every family.
    pub series_limit_bytes: u64,
    pub max_label_value_bytes: usize,
    /// `keep_exponential(max_size, max_scale)`; `None`: no series keeps exponential buckets.
    pub exponential: Option<ExponentialLimits>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExponentialLimits {
    pub max_size: usize,
    pub max_scale: i32,
}

/// `definitions.Naming`.
#[derive(Clone, Debug, PartialEq)]
pub struct NamingSpec {
    pub key: String,
    pub side: Side,
    /// OTel attribute names; the Prometheus label names are derived (`prometheus_label_name`).
    pub label_names: Vec<String>,
    /// `Fields(...)`: one source per label name, in label order.
    pub labels: Vec<LabelSource>,
    pub histograms: Vec<HistogramSpec>,
    pub counters: Vec<CounterSpec>,
    /// The conventions' schema URL its metrics are pushed under over OTLP ("" = none).
    pub schema_url: String,
}

/// A label value as `definitions.Fields` reads it: a text field of the record, or
/// `Either(first, fallback)` (`record.first or record.fallback`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LabelSource {
    Field(RecordField),
    Either(RecordField, RecordField),
}

/// `definitions.HistogramSpec`.
#[derive(Clone, Debug, PartialEq)]
pub struct HistogramSpec {
    pub name: String,
    pub unit: String,
    pub description: String,
    pub buckets: Vec<f64>,
    pub value: ValueSpec,
    pub success_only: bool,
    /// One more label with a fixed value; specs of one naming with the same name share a family.
    pub fixed_label: Option<(String, String)>,
    /// Observed once per value of this sequence field instead of `value` (`per_step=Field(...)`).
    pub per_step: Option<RecordField>,
    /// (model label, buckets): series of those models use their own buckets.
    pub buckets_by_model: Vec<(String, Vec<f64>)>,
}

/// `definitions.CounterSpec`.
#[derive(Clone, Debug, PartialEq)]
pub struct CounterSpec {
    pub name: String,
    pub unit: String,
    pub description: String,
    pub value: ValueSpec,
    /// Adds the `finished_reason` label (the record's outcome).
    pub by_outcome: bool,
    pub fixed_label: Option<(String, String)>,
}

/// `definitions.SEGMENT_METRIC`: one observation per segment of a record, whatever its side.
#[derive(Clone, Debug, PartialEq)]
pub struct SegmentsSpec {
    pub name: String,
    pub unit: String,
    pub description: String,
    pub buckets: Vec<f64>,
}

/// A number as Python holds it: an `int` or a `float` (they compare and convert differently).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Number {
    Int(i64),
    Float(f64),
}

/// A spec's value, declared as data (`definitions.Field`, `Constant`, `Difference`, `Ratio`,
/// `UnlessAtMost`; `IfSet` is the data form of `adapter_naming`'s lambdas
/// `lambda r: <then> if r.<field> else None`).
#[derive(Clone, Debug, PartialEq)]
pub enum ValueSpec {
    /// `Field(name)`: the field as it is.
    Field(RecordField),
    /// `Constant(value)` (`None`: nothing observed).
    Constant(Option<Number>),
    /// `Difference(minuend, subtrahend)`: `None` where either is `None`.
    Difference(RecordField, RecordField),
    /// `Ratio(numerator, denominator, offset)`: `None` where the numerator is `None` or the
    /// denominator is `None` or zero.
    Ratio { numerator: RecordField, denominator: RecordField, offset: Option<f64> },
    /// `UnlessAtMost(name, guard, limit)`: `None` where the guard is not `None` and `<= limit`.
    UnlessAtMost { field: RecordField, guard: RecordField, limit: i64 },
    /// `then` where the field is truthy (a non-empty text, a non-zero number), else `None`.
    IfSet { field: RecordField, then: Box<ValueSpec> },
}

/// Why a `MetricsSpec` cannot be recorded natively (the binding keeps the Python recorder then).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpecError(pub String);

impl fmt::Display for SpecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for SpecError {}

/// `exponential.py`'s bounds on the limits (`MIN_MAX_SIZE`, `MAX_MAX_SIZE`, `MIN_SCALE`,
/// `MAX_SCALE`): outside them the SDK mappings refuse the scale, or downscaling never fits.
pub const MIN_MAX_SIZE: usize = 2;
pub const MAX_MAX_SIZE: usize = 16384;
pub const MIN_SCALE: i32 = -10;
pub const MAX_SCALE: i32 = 20;

impl ExponentialLimits {
    pub(crate) fn check(self) -> Result<(), SpecError> {
        if !(MIN_MAX_SIZE..=MAX_MAX_SIZE).contains(&self.max_size) || !(MIN_SCALE..=MAX_SCALE).contains(&self.max_scale) {
            return Err(SpecError(format!(
                "exponential limits max_size {} (expected {MIN_MAX_SIZE}..={MAX_MAX_SIZE}), max_scale {} (expected \
                 {MIN_SCALE}..={MAX_SCALE})",
                self.max_size, self.max_scale
            )));
        }
        Ok(())
    }

    /// `keep_exponential`'s merge with limits asked for before: the larger of each.
    pub(crate) fn merged(self, other: Option<ExponentialLimits>) -> ExponentialLimits {
        match other {
            None => self,
            Some(old) => ExponentialLimits { max_size: self.max_size.max(old.max_size), max_scale: self.max_scale.max(old.max_scale) },
        }
    }
}

/// Whether `field` is one of the record's texts (what a label reads).
pub(crate) fn is_text_field(field: RecordField) -> bool {
    use RecordField as F;
    matches!(
        field,
        F::EngineKind
            | F::Adapter
            | F::ServiceName
            | F::Model
            | F::ModelSource
            | F::RequestModel
            | F::ResponseModel
            | F::OperationName
            | F::ProviderName
            | F::Outcome
            | F::Side
            | F::OperationSource
            | F::ErrorType
            | F::ServerAddress
            | F::ServerPort
            | F::Tenant
            | F::LoraAdapter
            | F::LoraBaseModel
    )
}

/// Whether reading `field` can give a value at all (`Record::get` answers `None` for the ids and
/// the lists of texts, which Python's value functions never read as numbers).
fn is_readable(field: RecordField) -> bool {
    use RecordField as F;
    !matches!(
        field,
        F::TraceId
            | F::SpanId
            | F::EdgeSpanId
            | F::JoinedSpanId
            | F::Segments
            | F::Dimensions
            | F::Rejected
            | F::SegmentsMissing
            | F::NotMeasurable
            | F::SegmentsDerived
    )
}

impl ValueSpec {
    fn check(&self, what: &str) -> Result<(), SpecError> {
        let fields: Vec<RecordField> = match self {
            ValueSpec::Field(f) => vec![*f],
            ValueSpec::Constant(_) => vec![],
            ValueSpec::Difference(a, b) => vec![*a, *b],
            ValueSpec::Ratio { numerator, denominator, .. } => vec![*numerator, *denominator],
            ValueSpec::UnlessAtMost { field, guard, .. } => vec![*field, *guard],
            ValueSpec::IfSet { field, then } => {
                then.check(what)?;
                vec![*field]
            }
        };
        match fields.iter().find(|f| !is_readable(**f)) {
            Some(field) => Err(SpecError(format!("{what}: the value reads {field:?}, which is not a number"))),
            None => Ok(()),
        }
    }
}

impl MetricsSpec {
    /// What `Series::new` refuses: anything the Python recorder would raise on at its first record
    /// or exposition, or that this port does not read natively.
    pub(crate) fn check(&self) -> Result<(), SpecError> {
        if let Some(limits) = self.exponential {
            limits.check()?;
        }
        check_metric_name(&histogram_metric_name(&self.segments.name, &self.segments.unit))?;
        for naming in &self.namings {
            if naming.labels.len() != naming.label_names.len() {
                return Err(SpecError(format!(
                    "naming {}: {} label names but {} label sources",
                    naming.key,
                    naming.label_names.len(),
                    naming.labels.len()
                )));
            }
            for source in &naming.labels {
                let (first, fallback) = match *source {
                    LabelSource::Field(f) => (f, f),
                    LabelSource::Either(a, b) => (a, b),
                };
                if !is_text_field(first) || !is_text_field(fallback) {
                    return Err(SpecError(format!("naming {}: a label reads {source:?}, which is not a text", naming.key)));
                }
            }
            for spec in &naming.histograms {
                check_metric_name(&histogram_metric_name(&spec.name, &spec.unit))?;
                spec.value.check(&spec.name)?;
                if let Some(field) = spec.per_step {
                    if !matches!(field, RecordField::ItlS | RecordField::Extra(_)) {
                        return Err(SpecError(format!("{}: per_step reads {field:?}, which is not a sequence", spec.name)));
                    }
                }
            }
            for spec in &naming.counters {
                check_metric_name(&exposed_name(&spec.name, &spec.unit))?;
                spec.value.check(&spec.name)?;
            }
        }
        Ok(())
    }
}

fn check_metric_name(name: &str) -> Result<(), SpecError> {
    if is_legacy_metric_name(name) {
        Ok(())
    } else {
        // prometheus_client would quote (OpenMetrics) or escape (text) it: not ported, and no
        // declared name needs it.
        Err(SpecError(format!("{name:?} is not a legacy Prometheus metric name")))
    }
}

/// `prometheus_client.validation._is_valid_legacy_metric_name` (`^[a-zA-Z_:][a-zA-Z0-9_:]*$`),
/// without the trailing newline `$` lets through (refused: it would break the exposition).
fn is_legacy_metric_name(name: &str) -> bool {
    let mut chars = name.chars();
    match chars.next() {
        Some(c) if c.is_ascii_alphabetic() || c == '_' || c == ':' => {}
        _ => return false,
    }
    chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

/// `definitions._REPEATED.sub("_", pattern.sub("_", name))`: every run of characters outside
/// `keep` becomes one `_`, then every run of `_` one `_`.
fn squeeze(name: &str, keep: impl Fn(char) -> bool) -> String {
    let mut out = String::with_capacity(name.len());
    for c in name.chars() {
        let c = if keep(c) { c } else { '_' };
        if c == '_' && out.ends_with('_') {
            continue;
        }
        out.push(c);
    }
    out
}

/// `definitions.prometheus_label_name`.
pub fn prometheus_label_name(name: &str) -> String {
    squeeze(name, |c| c.is_ascii_alphanumeric() || c == '_')
}

/// `definitions.prometheus_metric_name` (OTLP->Prometheus, UnderscoreEscapingWithSuffixes).
pub fn prometheus_metric_name(name: &str, unit: &str) -> String {
    let mut escaped = squeeze(name, |c| c.is_ascii_alphanumeric() || c == '_' || c == ':');
    let word = if unit.starts_with('{') {
        ""
    } else {
        match unit {
            "s" => "seconds",
            "ms" => "milliseconds",
            "By" => "bytes",
            "1" => "",
            other => other,
        }
    };
    if !word.is_empty() && !escaped.ends_with(&format!("_{word}")) {
        escaped.push('_');
        escaped.push_str(word);
    }
    escaped
}

/// `exposition.exposed_name`: OTel dotted names are translated, vLLM names kept.
pub fn exposed_name(name: &str, unit: &str) -> String {
    if name.contains('.') {
        prometheus_metric_name(name, unit)
    } else {
        name.to_string()
    }
}

/// `exposition._unit_word`: the unit prometheus_client is told (OpenMetrics' `# UNIT`).
pub(crate) fn unit_word(unit: &str) -> &'static str {
    if unit == "s" {
        "seconds"
    } else {
        ""
    }
}

/// The name of a histogram's `Metric` as `exposition._histogram` makes it: the exposed name
/// without its unit word, then `Metric.__init__` appends `_<unit>` unless the name ends with it.
pub(crate) fn histogram_metric_name(name: &str, unit: &str) -> String {
    let metric_name = exposed_name(name, unit);
    let word = unit_word(unit);
    if word.is_empty() {
        return metric_name;
    }
    let suffix = format!("_{word}");
    let base = metric_name.strip_suffix(&suffix).unwrap_or(&metric_name);
    if base.ends_with(&suffix) {
        base.to_string()
    } else {
        format!("{base}{suffix}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_names_are_escaped_as_definitions_escapes_them() {
        assert_eq!(prometheus_label_name("gen_ai.request.model"), "gen_ai_request_model");
        assert_eq!(prometheus_label_name("a..b__c"), "a_b_c");
        assert_eq!(prometheus_label_name("ünï"), "_n_");
        assert_eq!(prometheus_label_name("model_name"), "model_name");
    }

    #[test]
    fn metric_names_get_their_unit_word_once() {
        assert_eq!(prometheus_metric_name("gen_ai.server.time_to_first_token", "s"), "gen_ai_server_time_to_first_token_seconds");
        assert_eq!(prometheus_metric_name("gen_ai.client.token.usage", "{token}"), "gen_ai_client_token_usage");
        assert_eq!(prometheus_metric_name("x.y_seconds", "s"), "x_y_seconds");
        assert_eq!(prometheus_metric_name("a.b", "1"), "a_b");
        assert_eq!(prometheus_metric_name("a.b", "By"), "a_b_bytes");
        assert_eq!(prometheus_metric_name("a.b", "ms"), "a_b_milliseconds");
        assert_eq!(prometheus_metric_name("a.b", "tokens"), "a_b_tokens");
        assert_eq!(exposed_name("vllm:e2e_request_latency_seconds", "s"), "vllm:e2e_request_latency_seconds");
        assert_eq!(exposed_name("gen_ai.client.inference.usage.input_tokens", "{token}"),
                   "gen_ai_client_inference_usage_input_tokens");
    }

    #[test]
    fn histogram_names_end_with_their_unit_word() {
        assert_eq!(histogram_metric_name("vllm:time_to_first_token_seconds", "s"), "vllm:time_to_first_token_seconds");
        assert_eq!(histogram_metric_name("vllm:foo", "s"), "vllm:foo_seconds");
        assert_eq!(histogram_metric_name("x_seconds_seconds", "s"), "x_seconds");
        assert_eq!(histogram_metric_name("vllm:request_prompt_tokens", "{token}"), "vllm:request_prompt_tokens");
        assert_eq!(histogram_metric_name("gen_ai.server.request.duration", "s"), "gen_ai_server_request_duration_seconds");
    }

    #[test]
    fn legacy_metric_names() {
        assert!(is_legacy_metric_name("vllm:x_1"));
        assert!(is_legacy_metric_name("_x"));
        assert!(!is_legacy_metric_name("1x"));
        assert!(!is_legacy_metric_name(""));
        assert!(!is_legacy_metric_name("a.b"));
        assert!(!is_legacy_metric_name("a\n"));
    }

    #[test]
    fn exponential_limits_are_bounded_and_merged_upwards() {
        assert!(ExponentialLimits { max_size: 160, max_scale: 20 }.check().is_ok());
        assert!(ExponentialLimits { max_size: 1, max_scale: 20 }.check().is_err());
        assert!(ExponentialLimits { max_size: 16385, max_scale: 20 }.check().is_err());
        assert!(ExponentialLimits { max_size: 2, max_scale: 21 }.check().is_err());
        assert!(ExponentialLimits { max_size: 2, max_scale: -11 }.check().is_err());
        let merged = ExponentialLimits { max_size: 4, max_scale: 20 }.merged(Some(ExponentialLimits { max_size: 160, max_scale: 3 }));
        assert_eq!(merged, ExponentialLimits { max_size: 160, max_scale: 20 });
    }
}
