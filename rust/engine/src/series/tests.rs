//! The recorder's rules, one by one, on small declarations (the product's declarations and
//! prometheus_client's exposition are compared whole in `tests/series_differential.rs`).

use std::borrow::Cow;

use proptest::prelude::*;

use super::snapshot::{FamilyKind, SeriesValue};
use super::*;
use crate::record::{RecordField as F, Segment, Side};

/// `tests/data/series/floats.json`, written by `generate.py` from Python: floats with their `repr`
/// and `floatToGoString`, and integer quotients.
pub(crate) fn floats_corpus() -> serde_json::Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/series/floats.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn histogram(name: &str, unit: &str, buckets: &[f64], value: ValueSpec) -> HistogramSpec {
    HistogramSpec {
        name: name.to_string(),
        unit: unit.to_string(),
        description: "Latency.".to_string(),
        buckets: buckets.to_vec(),
        value,
        success_only: false,
        fixed_label: None,
        per_step: None,
        buckets_by_model: Vec::new(),
    }
}

fn counter(name: &str, value: ValueSpec) -> CounterSpec {
    CounterSpec {
        name: name.to_string(),
        unit: "{request}".to_string(),
        description: "Requests.".to_string(),
        value,
        by_outcome: false,
        fixed_label: None,
    }
}

fn naming(histograms: Vec<HistogramSpec>, counters: Vec<CounterSpec>) -> NamingSpec {
    NamingSpec {
        key: "vllm".to_string(),
        side: Side::Server,
        label_names: vec!["model_name".into(), "engine_kind".into(), "service_name".into()],
        labels: vec![LabelSource::Field(F::Model), LabelSource::Field(F::EngineKind), LabelSource::Field(F::ServiceName)],
        histograms,
        counters,
        schema_url: String::new(),
    }
}

fn spec(namings: Vec<NamingSpec>) -> MetricsSpec {
    MetricsSpec {
        namings,
        segments: SegmentsSpec {
            name: "otel_llm_request_segment_seconds".into(),
            unit: "s".into(),
            description: "Segments.".into(),
            buckets: vec![0.1, 1.0],
        },
        dimension_names: Vec::new(),
        series_limit: 100,
        series_limit_bytes: 1 << 24,
        max_label_value_bytes: 256,
        exponential: None,
    }
}

fn record(model: &str) -> Record<'static> {
    let mut record = Record::new([1; 16], [2; 8]);
    record.model = Cow::Owned(model.to_string());
    record.engine_kind = Cow::Borrowed("vllm");
    record.service_name = Cow::Borrowed("svc");
    record.outcome = Cow::Borrowed("stop");
    record
}

fn with_e2e(model: &str, e2e: f64) -> Record<'static> {
    let mut r = record(model);
    r.e2e_s = Some(e2e);
    r
}

fn exposition(series: &Series, openmetrics: bool) -> String {
    let mut out = Vec::new();
    series.render(openmetrics, &mut out);
    String::from_utf8(out).unwrap()
}

fn e2e_histogram() -> HistogramSpec {
    histogram("h_seconds", "s", &[0.25, 0.5], ValueSpec::Field(F::E2eS))
}

fn one_of_each() -> Series {
    Series::new(&spec(vec![naming(vec![e2e_histogram()], vec![counter("c", ValueSpec::Constant(Some(Number::Int(1))))])]))
        .unwrap()
}

fn lines_with<'a>(text: &'a str, prefix: &str) -> Vec<&'a str> {
    text.lines().filter(|line| line.starts_with(prefix)).collect()
}

#[test]
fn a_bound_falls_in_its_own_bucket_and_the_exposition_is_prometheus_clients() {
    let mut series = one_of_each();
    for value in [0.25, 0.5, 0.75] {
        series.record(&with_e2e("m", value), false, 0.0);
    }
    // Costs (families.py): the histogram 5 lines * (9 + 54 + 110 + 51 label names + 8 values),
    // the counter 1 * (1 + 54 + 64 + 8).
    let labels = "engine_kind=\"vllm\",model_name=\"m\",service_name=\"svc\"";
    let expected = format!(
        "# HELP h_seconds Latency.\n# TYPE h_seconds histogram\n\
         h_seconds_bucket{{engine_kind=\"vllm\",le=\"0.25\",model_name=\"m\",service_name=\"svc\"}} 1.0\n\
         h_seconds_bucket{{engine_kind=\"vllm\",le=\"0.5\",model_name=\"m\",service_name=\"svc\"}} 2.0\n\
         h_seconds_bucket{{engine_kind=\"vllm\",le=\"+Inf\",model_name=\"m\",service_name=\"svc\"}} 3.0\n\
         h_seconds_count{{{labels}}} 3.0\nh_seconds_sum{{{labels}}} 1.5\n\
         # HELP c_total Requests.\n# TYPE c_total counter\nc_total{{{labels}}} 3.0\n\
         # HELP otel_llm_request_segment_seconds Segments.\n# TYPE otel_llm_request_segment_seconds histogram\n\
         # HELP otel_llm_series_overflow_total Observations sent to a metric's overflow series because its series cap \
         was reached.\n# TYPE otel_llm_series_overflow_total counter\n\
         otel_llm_series_overflow_total{{metric=\"otel_llm_request_segment_seconds\"}} 0.0\n\
         otel_llm_series_overflow_total{{metric=\"h_seconds\"}} 0.0\notel_llm_series_overflow_total{{metric=\"c\"}} 0.0\n\
         # HELP otel_llm_label_values_too_long_total Requests whose label value exceeded max_label_value_bytes, by \
         label; their observations went to the overflow series.\n# TYPE otel_llm_label_values_too_long_total counter\n\
         # HELP otel_llm_series_bytes Estimated exposition bytes of the span-derived metrics' series, against \
         series_limit_mib.\n# TYPE otel_llm_series_bytes gauge\n\
         otel_llm_series_bytes{{state=\"used\"}} 1287.0\notel_llm_series_bytes{{state=\"limit\"}} 1.6777216e+07\n"
    );
    assert_eq!(exposition(&series, false), expected);
    assert_eq!(series.budget().used, 1160 + 127);
}

#[test]
fn openmetrics_adds_units_and_the_latest_exemplar_of_each_bucket() {
    let mut series = one_of_each();
    let mut first = with_e2e("m", 0.25);
    first.trace_id = [0xab; 16];
    series.record(&first, true, 1_700_000_000.5);
    series.record(&with_e2e("m", 0.2), true, 1_700_000_001.25);
    series.record(&with_e2e("m", 0.75), false, 1_700_000_002.0);
    let om = exposition(&series, true);
    assert!(om.starts_with("# HELP h_seconds Latency.\n# TYPE h_seconds histogram\n# UNIT h_seconds seconds\n"), "{om}");
    let buckets = lines_with(&om, "h_seconds_bucket");
    assert_eq!(buckets[0],
               "h_seconds_bucket{engine_kind=\"vllm\",le=\"0.25\",model_name=\"m\",service_name=\"svc\"} 2.0 # \
                {span_id=\"0202020202020202\",trace_id=\"01010101010101010101010101010101\"} 0.2 1700000001.25");
    assert_eq!(buckets[1], "h_seconds_bucket{engine_kind=\"vllm\",le=\"0.5\",model_name=\"m\",service_name=\"svc\"} 2.0");
    assert_eq!(buckets[2], "h_seconds_bucket{engine_kind=\"vllm\",le=\"+Inf\",model_name=\"m\",service_name=\"svc\"} 3.0",
               "a record of a trace not kept leaves no exemplar");
    assert!(om.contains("# HELP c Requests.\n# TYPE c counter\nc_total{"), "{om}");
    assert!(!exposition(&series, false).contains(" # {"), "text 0.0.4 has no exemplars");
}

#[test]
fn series_of_a_model_with_its_own_buckets_use_them() {
    let mut tokens = histogram("tok", "{token}", &[1.0, 2.0, 5.0], ValueSpec::Field(F::PromptTokens));
    tokens.buckets_by_model = vec![("big".into(), vec![10.0, 100.0])];
    let mut series = Series::new(&spec(vec![naming(vec![tokens], vec![])])).unwrap();
    let mut big = record("big");
    big.prompt_tokens = Some(50);
    let mut small = record("m");
    small.prompt_tokens = Some(5);
    series.record(&big, false, 0.0);
    series.record(&small, false, 0.0);
    let text = exposition(&series, false);
    assert_eq!(lines_with(&text, "tok_bucket{engine_kind=\"vllm\",le=").len(), 3 + 4);
    assert!(text.contains("tok_bucket{engine_kind=\"vllm\",le=\"10.0\",model_name=\"big\",service_name=\"svc\"} 0.0\n"));
    assert!(text.contains("tok_bucket{engine_kind=\"vllm\",le=\"100.0\",model_name=\"big\",service_name=\"svc\"} 1.0\n"));
    assert!(text.contains("tok_bucket{engine_kind=\"vllm\",le=\"5.0\",model_name=\"m\",service_name=\"svc\"} 1.0\n"),
            "an int equal to a bound is in that bound's bucket");
    assert!(text.contains("tok_bucket{engine_kind=\"vllm\",le=\"2.0\",model_name=\"m\",service_name=\"svc\"} 0.0\n"));
}

#[test]
fn success_only_skips_failed_requests() {
    let mut ttft = histogram("ttft_seconds", "s", &[1.0], ValueSpec::Field(F::TtftS));
    ttft.success_only = true;
    let mut series = Series::new(&spec(vec![naming(vec![ttft, e2e_histogram()], vec![])])).unwrap();
    for outcome in ["abort", "error", "stop", "unknown", "length"] {
        let mut r = with_e2e("m", 0.1);
        r.ttft_s = Some(0.5);
        r.outcome = Cow::Borrowed(outcome);
        series.record(&r, false, 0.0);
    }
    let text = exposition(&series, false);
    assert!(text.contains("ttft_seconds_count{engine_kind=\"vllm\",model_name=\"m\",service_name=\"svc\"} 3.0\n"), "{text}");
    assert!(text.contains("h_seconds_count{engine_kind=\"vllm\",model_name=\"m\",service_name=\"svc\"} 5.0\n"));
}

#[test]
fn per_step_observes_each_value_and_no_other() {
    let mut itl = histogram("itl_seconds", "s", &[0.15], ValueSpec::Constant(None));
    itl.per_step = Some(F::ItlS);
    let mut series = Series::new(&spec(vec![naming(vec![itl], vec![])])).unwrap();
    let mut r = record("m");
    r.itl_s = vec![0.1, 0.2, 0.15];
    series.record(&r, false, 0.0);
    series.record(&record("m"), false, 0.0); // no steps: nothing
    let text = exposition(&series, false);
    assert!(text.contains("itl_seconds_bucket{engine_kind=\"vllm\",le=\"0.15\",model_name=\"m\",service_name=\"svc\"} 2.0\n"));
    assert!(text.contains("itl_seconds_count{engine_kind=\"vllm\",model_name=\"m\",service_name=\"svc\"} 3.0\n"));
}

#[test]
fn fixed_labels_share_one_family_in_creation_order() {
    let mut input = histogram("gen_ai.client.token.usage", "{token}", &[10.0], ValueSpec::Field(F::PromptTokens));
    input.fixed_label = Some(("gen_ai.token.type".into(), "input".into()));
    let mut output = histogram("gen_ai.client.token.usage", "{token}", &[10.0], ValueSpec::Field(F::CompletionTokens));
    output.fixed_label = Some(("gen_ai.token.type".into(), "output".into()));
    let mut series = Series::new(&spec(vec![naming(vec![input, output], vec![])])).unwrap();
    let mut r = record("m");
    r.completion_tokens = Some(20);
    series.record(&r, false, 0.0); // output only: its series first
    r.prompt_tokens = Some(3);
    series.record(&r, false, 0.0);
    let text = exposition(&series, false);
    assert!(text.starts_with("# HELP gen_ai_client_token_usage Latency.\n# TYPE gen_ai_client_token_usage histogram\n"));
    let counts = lines_with(&text, "gen_ai_client_token_usage_count");
    assert_eq!(counts, vec![
        "gen_ai_client_token_usage_count{engine_kind=\"vllm\",gen_ai_token_type=\"output\",model_name=\"m\",service_name=\"svc\"} 2.0",
        "gen_ai_client_token_usage_count{engine_kind=\"vllm\",gen_ai_token_type=\"input\",model_name=\"m\",service_name=\"svc\"} 1.0",
    ]);
    let snapshot = series.snapshot();
    assert_eq!(snapshot.families[0].label_names, vec!["model_name", "engine_kind", "service_name", "gen_ai.token.type"]);
    assert_eq!(snapshot.families[0].series[0].key, vec!["m", "vllm", "svc", "output"]);
}

#[test]
fn by_outcome_counters_add_finished_reason() {
    let mut success = counter("vllm:request_success", ValueSpec::Constant(Some(Number::Int(1))));
    success.by_outcome = true;
    let mut series = Series::new(&spec(vec![naming(vec![], vec![success])])).unwrap();
    for outcome in ["stop", "length", "stop"] {
        let mut r = record("m");
        r.outcome = Cow::Borrowed(outcome);
        series.record(&r, false, 0.0);
    }
    let text = exposition(&series, false);
    assert_eq!(lines_with(&text, "vllm:request_success_total{"), vec![
        "vllm:request_success_total{engine_kind=\"vllm\",finished_reason=\"stop\",model_name=\"m\",service_name=\"svc\"} 2.0",
        "vllm:request_success_total{engine_kind=\"vllm\",finished_reason=\"length\",model_name=\"m\",service_name=\"svc\"} 1.0",
    ]);
}

#[test]
fn weights_scale_counts_and_sums() {
    let tokens = counter("t", ValueSpec::Field(F::PromptTokens));
    let mut series = Series::new(&spec(vec![naming(vec![e2e_histogram()], vec![tokens])])).unwrap();
    for weight in [0.5, 1.5] {
        let mut r = with_e2e("m", 2.0);
        r.weight = weight;
        r.prompt_tokens = Some(10);
        series.record(&r, false, 0.0);
    }
    let text = exposition(&series, false);
    assert!(text.contains("h_seconds_bucket{engine_kind=\"vllm\",le=\"+Inf\",model_name=\"m\",service_name=\"svc\"} 2.0\n"));
    assert!(text.contains("h_seconds_sum{engine_kind=\"vllm\",model_name=\"m\",service_name=\"svc\"} 4.0\n"));
    assert!(text.contains("t_total{engine_kind=\"vllm\",model_name=\"m\",service_name=\"svc\"} 20.0\n"));
}

#[test]
fn past_the_series_limit_keys_share_the_overflow_series() {
    let mut declared = spec(vec![naming(vec![e2e_histogram()], vec![counter("c", ValueSpec::Field(F::PromptTokens))])]);
    declared.series_limit = 2;
    let mut series = Series::new(&declared).unwrap();
    for model in ["a", "b", "c", "d", "a"] {
        let mut r = with_e2e(model, 0.1);
        r.prompt_tokens = Some(1);
        series.record(&r, false, 0.0);
    }
    let text = exposition(&series, false);
    assert_eq!(lines_with(&text, "h_seconds_count"), vec![
        "h_seconds_count{engine_kind=\"vllm\",model_name=\"a\",service_name=\"svc\"} 2.0",
        "h_seconds_count{engine_kind=\"vllm\",model_name=\"b\",service_name=\"svc\"} 1.0",
        "h_seconds_count{otel_metric_overflow=\"true\"} 2.0",
    ]);
    assert!(text.contains("h_seconds_bucket{le=\"0.25\",otel_metric_overflow=\"true\"} 2.0\n"));
    assert_eq!(lines_with(&text, "c_total"), vec![
        "c_total{engine_kind=\"vllm\",model_name=\"a\",service_name=\"svc\"} 2.0",
        "c_total{engine_kind=\"vllm\",model_name=\"b\",service_name=\"svc\"} 1.0",
        "c_total{otel_metric_overflow=\"true\"} 2.0",
    ]);
    assert!(text.contains("otel_llm_series_overflow_total{metric=\"h_seconds\"} 2.0\n"));
    assert!(text.contains("otel_llm_series_overflow_total{metric=\"c\"} 2.0\n"));
    let snapshot = series.snapshot();
    assert_eq!(snapshot.families[0].series[2].key, vec![OVERFLOW_KEY]);
    assert!(snapshot.families[0].series[2].overflow);
}

#[test]
fn a_spent_byte_budget_sends_new_keys_to_overflow() {
    let mut declared = spec(vec![naming(vec![e2e_histogram()], vec![counter("c", ValueSpec::Constant(Some(Number::Int(1))))])]);
    declared.series_limit_bytes = 1160 + 127; // exactly the series of one model ("m")
    let mut series = Series::new(&declared).unwrap();
    series.record(&with_e2e("m", 0.1), false, 0.0);
    assert_eq!(series.budget().used, 1287);
    series.record(&with_e2e("n", 0.1), false, 0.0);
    series.record(&with_e2e("m", 0.1), false, 0.0);
    assert_eq!(series.budget().used, 1287);
    let text = exposition(&series, false);
    assert!(text.contains("h_seconds_count{otel_metric_overflow=\"true\"} 1.0\n"));
    assert!(text.contains("h_seconds_count{engine_kind=\"vllm\",model_name=\"m\",service_name=\"svc\"} 2.0\n"));
    assert!(text.contains("c_total{otel_metric_overflow=\"true\"} 1.0\n"));
    assert!(text.contains("otel_llm_series_bytes{state=\"used\"} 1287.0\notel_llm_series_bytes{state=\"limit\"} 1287.0\n"));
}

#[test]
fn a_too_long_label_value_takes_no_series_and_is_counted_once() {
    let mut ttft = histogram("ttft_seconds", "s", &[1.0], ValueSpec::Field(F::TtftS));
    ttft.success_only = true;
    let mut other = naming(vec![histogram("x_seconds", "s", &[1.0], ValueSpec::Field(F::E2eS))], vec![]);
    other.key = "otel_llm".into(); // the same labels: one key, one too-long count per record
    let mut declared =
        spec(vec![naming(vec![ttft, e2e_histogram()], vec![counter("c", ValueSpec::Constant(Some(Number::Int(1))))]), other]);
    declared.max_label_value_bytes = 4;
    let mut series = Series::new(&declared).unwrap();
    // 4 bytes fit; 5 bytes, or 3 characters in 6 bytes, do not.
    for (model, outcome) in [("abcd", "stop"), ("éé", "stop"), ("abcde", "abort"), ("ééé", "stop")] {
        let mut r = with_e2e(model, 0.1);
        r.outcome = Cow::Borrowed(outcome);
        series.record(&r, false, 0.0);
    }
    let text = exposition(&series, false);
    assert!(text.contains("h_seconds_count{otel_metric_overflow=\"true\"} 2.0\n"), "{text}");
    // The key made the overflow series of every histogram of its group, observed or not.
    assert!(text.contains("ttft_seconds_count{otel_metric_overflow=\"true\"} 0.0\n"), "{text}");
    assert!(text.contains("c_total{otel_metric_overflow=\"true\"} 2.0\n"));
    assert!(text.contains("otel_llm_label_values_too_long_total{label=\"model_name\"} 2.0\n"));
    assert!(text.contains("otel_llm_series_overflow_total{metric=\"h_seconds\"} 2.0\n"));
    assert!(text.contains("otel_llm_series_overflow_total{metric=\"x_seconds\"} 2.0\n"));
    assert_eq!(lines_with(&text, "h_seconds_count{engine_kind").len(), 2);
}

#[test]
fn a_too_long_value_past_the_named_labels_is_a_dimension() {
    let mut declared = spec(vec![naming(vec![e2e_histogram()], vec![])]);
    declared.dimension_names = vec!["team".into()];
    declared.max_label_value_bytes = 4;
    let mut series = Series::new(&declared).unwrap();
    let mut r = with_e2e("m", 0.1);
    r.dimensions = vec![Cow::Borrowed("ok"), Cow::Borrowed("too-long")]; // one more than declared
    series.record(&r, false, 0.0);
    r.dimensions = vec![Cow::Borrowed("also-too-long")];
    series.record(&r, false, 0.0);
    let text = exposition(&series, false);
    assert!(text.contains("otel_llm_label_values_too_long_total{label=\"dimension\"} 1.0\n"), "{text}");
    assert!(text.contains("otel_llm_label_values_too_long_total{label=\"team\"} 1.0\n"), "{text}");
}

#[test]
fn exponential_buckets_scale_down_to_fit() {
    let mut declared = spec(vec![naming(vec![e2e_histogram()], vec![])]);
    declared.exponential = Some(ExponentialLimits { max_size: 4, max_scale: 20 });
    let mut series = Series::new(&declared).unwrap();
    assert!(series.keep_exponential(ExponentialLimits { max_size: 2, max_scale: 3 }).is_ok());
    assert_eq!(series.exponential(), Some(ExponentialLimits { max_size: 4, max_scale: 20 }), "the larger limits");
    series.record(&with_e2e("m", 1.5), false, 0.0);
    series.record(&with_e2e("m", 1000.0), false, 0.0);
    let snapshot = series.snapshot();
    let SeriesValue::Histogram(point) = &snapshot.families[0].series[0].value else { panic!("a histogram") };
    let state = point.exponential.as_ref().expect("exponential buckets kept");
    // (1, 2] and (512, 1024] are 9 doublings apart: 3 buckets of 4 doublings each at scale -2.
    assert_eq!(state.scale, -2);
    assert_eq!(state.positive.dense(), (0, vec![1.0, 0.0, 1.0]));
    assert!(series.keep_exponential(ExponentialLimits { max_size: 160, max_scale: 20 }).is_err(), "after an observation");
}

#[test]
fn segments_are_observed_for_every_side() {
    let mut series = one_of_each();
    let mut r = record("m");
    r.side = Side::Client; // no client naming: only the segments
    r.segments = vec![
        Segment { name: Cow::Borrowed("queue"), start_unix_ns: 0, end_unix_ns: 250_000_000 },
        Segment { name: Cow::Borrowed("decode"), start_unix_ns: 1, end_unix_ns: 2_000_000_001 },
    ];
    series.record(&r, true, 5.0);
    let text = exposition(&series, false);
    assert_eq!(lines_with(&text, "otel_llm_request_segment_seconds_count"), vec![
        "otel_llm_request_segment_seconds_count{engine_kind=\"vllm\",model_name=\"m\",segment=\"queue\",service_name=\"svc\"} 1.0",
        "otel_llm_request_segment_seconds_count{engine_kind=\"vllm\",model_name=\"m\",segment=\"decode\",service_name=\"svc\"} 1.0",
    ]);
    assert!(text.contains(
        "otel_llm_request_segment_seconds_bucket{engine_kind=\"vllm\",le=\"1.0\",model_name=\"m\",segment=\"queue\",service_name=\"svc\"} 1.0\n"));
    assert!(!text.contains("h_seconds_count"), "the server naming did not see a client record");
    assert_eq!(series.requests_recorded(), 1);
}

#[test]
fn a_segment_named_empty_takes_the_later_segments_of_its_key() {
    // recorder.py stores the series of a segment named "" under by_name[""], which the next
    // records of the key read as "every segment goes here" (counted as a too-long "dimension").
    let mut series = one_of_each();
    let segment = |name: &'static str| Segment { name: Cow::Borrowed(name), start_unix_ns: 0, end_unix_ns: 100_000_000 };
    let mut r = record("m");
    r.segments = vec![segment(""), segment("queue")];
    series.record(&r, false, 0.0);
    r.segments = vec![segment("decode")];
    series.record(&r, false, 0.0);
    let text = exposition(&series, false);
    assert_eq!(lines_with(&text, "otel_llm_request_segment_seconds_count"), vec![
        "otel_llm_request_segment_seconds_count{engine_kind=\"vllm\",model_name=\"m\",segment=\"\",service_name=\"svc\"} 2.0",
        "otel_llm_request_segment_seconds_count{engine_kind=\"vllm\",model_name=\"m\",segment=\"queue\",service_name=\"svc\"} 1.0",
    ]);
    assert!(text.contains("otel_llm_label_values_too_long_total{label=\"dimension\"} 1.0\n"), "{text}");
}

#[test]
fn a_flood_of_keys_clears_the_caches_without_changing_the_series() {
    let mut declared = spec(vec![naming(vec![e2e_histogram()], vec![counter("c", ValueSpec::Constant(Some(Number::Int(1))))])]);
    declared.series_limit = 1; // caches of 4 * 1 + 64 entries
    let mut series = Series::new(&declared).unwrap();
    series.record(&with_e2e("m0", 0.1), false, 0.0);
    for n in 1..200 {
        series.record(&with_e2e(&format!("m{n}"), 0.1), false, 0.0);
    }
    series.record(&with_e2e("m0", 0.1), false, 0.0);
    let text = exposition(&series, false);
    assert_eq!(lines_with(&text, "h_seconds_count"), vec![
        "h_seconds_count{engine_kind=\"vllm\",model_name=\"m0\",service_name=\"svc\"} 2.0",
        "h_seconds_count{otel_metric_overflow=\"true\"} 199.0",
    ]);
    assert!(text.contains("otel_llm_series_overflow_total{metric=\"c\"} 199.0\n"));
}

#[test]
fn either_falls_back_when_the_first_field_is_empty() {
    let mut genai = naming(vec![histogram("gen_ai.server.request.duration", "s", &[1.0], ValueSpec::Field(F::E2eS))], vec![]);
    genai.label_names = vec!["gen_ai.request.model".into()];
    genai.labels = vec![LabelSource::Either(F::RequestModel, F::Model)];
    let mut series = Series::new(&spec(vec![genai])).unwrap();
    series.record(&with_e2e("configured", 0.5), false, 0.0);
    let mut observed = with_e2e("configured", 0.5);
    observed.request_model = Cow::Borrowed("asked");
    series.record(&observed, false, 0.0);
    let text = exposition(&series, false);
    assert_eq!(lines_with(&text, "gen_ai_server_request_duration_seconds_count"), vec![
        "gen_ai_server_request_duration_seconds_count{gen_ai_request_model=\"configured\"} 1.0",
        "gen_ai_server_request_duration_seconds_count{gen_ai_request_model=\"asked\"} 1.0",
    ]);
}

#[test]
fn hostile_label_values_are_escaped() {
    let mut series = one_of_each();
    series.record(&with_e2e("q\"\\\nz", 0.1), false, 0.0);
    let text = exposition(&series, false);
    assert!(text.contains("c_total{engine_kind=\"vllm\",model_name=\"q\\\"\\\\\\nz\",service_name=\"svc\"} 1.0\n"), "{text}");
}

#[test]
fn the_spec_is_checked() {
    let mut bad_label = naming(vec![], vec![]);
    bad_label.labels[0] = LabelSource::Field(F::PromptTokens);
    assert!(Series::new(&spec(vec![bad_label])).is_err());
    let bad_name = naming(vec![histogram("bad name", "{token}", &[1.0], ValueSpec::Field(F::E2eS))], vec![]);
    assert!(Series::new(&spec(vec![bad_name])).is_err());
    let text_value = naming(vec![], vec![counter("c", ValueSpec::Field(F::Segments))]);
    assert!(Series::new(&spec(vec![text_value])).is_err());
    let mut wrong_step = histogram("s", "s", &[1.0], ValueSpec::Constant(None));
    wrong_step.per_step = Some(F::E2eS);
    assert!(Series::new(&spec(vec![naming(vec![wrong_step], vec![])])).is_err());
    let mut exponential = spec(vec![]);
    exponential.exponential = Some(ExponentialLimits { max_size: 1, max_scale: 20 });
    assert!(Series::new(&exponential).is_err());
    let mut short = naming(vec![], vec![]);
    short.labels.pop();
    assert!(Series::new(&spec(vec![short])).is_err());
}

#[test]
fn a_text_where_a_number_is_declared_is_counted_not_observed() {
    let declared = spec(vec![naming(vec![histogram("h", "{x}", &[1.0], ValueSpec::Field(F::Model))], vec![])]);
    let mut series = Series::new(&declared).unwrap();
    series.record(&record("m"), false, 0.0);
    assert_eq!(series.not_a_number(), 1);
    assert!(series.snapshot().families[0].series.is_empty());
}

/// An accounting module's families, rendered where `RecorderCollector.collect` puts them.
struct Accounting {
    family: CounterFamily,
}

impl AccountingFamilies for Accounting {
    fn render(&self, openmetrics: bool, out: &mut Vec<u8>) {
        render::write_counter(out, openmetrics, "otel_llm_tenant_tokens", "Tokens.",
                              &["model_name".to_string(), "tenant".to_string(), "token_type".to_string()], &self.family);
    }

    fn overflowed(&self, each: &mut dyn FnMut(&str, u64)) {
        each(self.family.name(), self.family.overflowed());
    }
}

#[test]
fn accounting_families_share_the_budget_and_render_before_the_segments() {
    let mut series = one_of_each();
    series.record(&with_e2e("m", 0.1), false, 0.0);
    let used = series.budget().used;
    let mut accounting = Accounting {
        family: CounterFamily::new("otel_llm_tenant_tokens", 1, &["model_name", "tenant", "token_type"]),
    };
    accounting.family.add(&["m", "t", "input"], 3.0, series.budget_mut());
    accounting.family.add(&["m", "u", "input"], 1.0, series.budget_mut());
    // 1 line * (22 + 54 + (10 + 4) + (6 + 4) + (10 + 4) + 1 + 1 + 5)
    assert_eq!(series.budget().used, used + 121);
    let mut out = Vec::new();
    series.render_with(false, &mut out, Some(&accounting));
    let text = String::from_utf8(out).unwrap();
    let tokens = text.find("# HELP otel_llm_tenant_tokens_total Tokens.").expect("rendered");
    assert!(tokens > text.find("c_total{").unwrap());
    assert!(tokens < text.find("# HELP otel_llm_request_segment_seconds").unwrap());
    assert!(text.contains(
        "otel_llm_tenant_tokens_total{model_name=\"m\",tenant=\"t\",token_type=\"input\"} 3.0\n\
         otel_llm_tenant_tokens_total{otel_metric_overflow=\"true\"} 1.0\n"));
    assert!(text.contains("otel_llm_series_overflow_total{metric=\"c\"} 0.0\n\
                           otel_llm_series_overflow_total{metric=\"otel_llm_tenant_tokens\"} 1.0\n"));
}

fn arbitrary_record() -> impl Strategy<Value = (usize, Option<f64>, Option<i64>, u8, bool)> {
    let value = prop_oneof![
        Just(None),
        (0usize..3).prop_map(|i| Some([0.25, 0.5, 1.0][i])),
        (-1.0e3..1.0e3f64).prop_map(Some),
    ];
    (0usize..12, value, proptest::option::of(0i64..1000), 1u8..4, any::<bool>())
}

proptest! {
    /// Every observation lands in exactly one series, whose buckets add up to its count; no family
    /// passes its cap (plus the overflow series); the budget is never overdrawn.
    #[test]
    fn observations_are_all_kept_and_bounded(
        records in proptest::collection::vec(arbitrary_record(), 1..120),
        limit in 1usize..6,
        budget in 0u64..12_000,
        long in 2usize..12,
    ) {
        let tokens = counter("t", ValueSpec::Field(F::PromptTokens));
        let mut declared = spec(vec![naming(vec![e2e_histogram()], vec![tokens])]);
        declared.series_limit = limit;
        declared.series_limit_bytes = budget;
        declared.max_label_value_bytes = long;
        let mut series = Series::new(&declared).unwrap();
        let models = ["a", "b", "c", "dddddddddd", "e", "f", "g", "h", "i", "j", "kkkkk", "l"];
        let (mut observed, mut counted) = (0.0, 0.0);
        for (model, e2e, tokens, weight, exemplar) in &records {
            let mut r = record(models[*model]);
            r.e2e_s = *e2e;
            r.prompt_tokens = *tokens;
            r.weight = f64::from(*weight);
            r.segments = vec![Segment { name: Cow::Borrowed("queue"), start_unix_ns: 0, end_unix_ns: 1 }];
            series.record(&r, *exemplar, 1.0);
            prop_assert!(series.budget().used <= budget);
            observed += if e2e.is_some() { f64::from(*weight) } else { 0.0 };
            counted += tokens.map_or(0.0, |t| t as f64 * f64::from(*weight));
        }
        let snapshot = series.snapshot();
        let mut histogram_total = 0.0;
        for family in &snapshot.families {
            prop_assert!(family.series.len() <= limit + 1, "{}: {} series", family.name, family.series.len());
            prop_assert!(family.series.iter().filter(|s| s.overflow).count() <= 1);
            for s in &family.series {
                match &s.value {
                    SeriesValue::Histogram(point) => {
                        prop_assert_eq!(point.counts.len(), point.bounds.len() + 1);
                        prop_assert_eq!(point.counts.iter().sum::<f64>(), point.count);
                        if family.name == "h_seconds" {
                            histogram_total += point.count;
                        }
                    }
                    SeriesValue::Counter(value) => {
                        prop_assert_eq!(family.kind, FamilyKind::Counter);
                        counted -= value;
                    }
                }
            }
        }
        prop_assert_eq!(histogram_total, observed);
        prop_assert_eq!(counted, 0.0);
        prop_assert_eq!(series.requests_recorded(), records.len() as u64);
    }
}
