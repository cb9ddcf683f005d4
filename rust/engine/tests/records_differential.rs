//! The engine's `RecordBuilder` against the Python reference's own records: every trace of the
//! corpus `tests/data/records/generate.py` wrote (the engine fixtures, the emitter captures, the
//! bench workload and seeded random traces, each through Python's real adapter stage and
//! `records_of_trace`) is rebuilt here as the engine buffers it, and must give Python's records,
//! field for field and bit for bit, and its malformed requests; or, where the corpus says Python's
//! reading met something the engine leaves to Python, be declined for the first such reason.

use std::collections::HashMap;
use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};

use otel_llm_engine::model::{Kind, NewSpan, Observation, Schema, ShapeInfo, TraceData, Value};
use otel_llm_engine::record::{Record, Segment};
use otel_llm_engine::records::{Built, Decline, Dimension, RecordBuilder, RecordSettings, ResourceModelRule, TenantRule};
use flate2::read::GzDecoder;
use serde_json::Value as Json;

fn data_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/records")
}

fn base64(text: &str) -> Vec<u8> {
    fn digit(c: u8) -> u32 {
        match c {
            b'A'..=b'Z' => u32::from(c - b'A'),
            b'a'..=b'z' => u32::from(c - b'a') + 26,
            b'0'..=b'9' => u32::from(c - b'0') + 52,
            b'+' => 62,
            b'/' => 63,
            _ => panic!("not base64: {c}"),
        }
    }
    let mut out = Vec::with_capacity(text.len() * 3 / 4);
    for chunk in text.as_bytes().chunks(4) {
        let digits: Vec<u32> = chunk.iter().filter(|&&c| c != b'=').map(|&c| digit(c)).collect();
        let mut word = 0u32;
        for (i, d) in digits.iter().enumerate() {
            word |= d << (18 - 6 * i);
        }
        out.extend_from_slice(&word.to_be_bytes()[1..digits.len()]);
    }
    out
}

fn hex(text: &str) -> Vec<u8> {
    (0..text.len()).step_by(2).map(|i| u8::from_str_radix(&text[i..i + 2], 16).unwrap()).collect()
}

fn hex_of(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A float as Python's `repr` wrote it: parsed, it is the same double.
fn float(text: &str) -> f64 {
    match text {
        "nan" => f64::NAN,
        "inf" => f64::INFINITY,
        "-inf" => f64::NEG_INFINITY,
        _ => text.parse().unwrap_or_else(|_| panic!("not a float: {text}")),
    }
}

fn same_float(expected: &Json, actual: Option<f64>) -> bool {
    match (expected, actual) {
        (Json::Null, None) => true,
        (Json::String(text), Some(value)) => {
            let wanted = float(text);
            wanted.to_bits() == value.to_bits() || (wanted.is_nan() && value.is_nan())
        }
        _ => false,
    }
}

fn string(json: &Json) -> &str {
    json.as_str().unwrap_or_else(|| panic!("not a string: {json}"))
}

fn strings(json: &Json) -> Vec<&str> {
    json.as_array().unwrap().iter().map(string).collect()
}

fn schema_of(json: &Json) -> Schema {
    Schema::new(json.as_array().unwrap().iter().map(|field| {
        (string(&field[0]).to_owned(), Kind::parse(string(&field[1])).unwrap())
    }).collect()).unwrap()
}

fn settings_of(json: &Json) -> RecordSettings {
    let texts = |json: &Json| strings(json).into_iter().map(str::to_owned).collect::<Vec<_>>();
    let map = |json: &Json| json.as_object().unwrap().iter().map(|(k, v)| (k.clone(), string(v).to_owned()))
        .collect::<HashMap<_, _>>();
    RecordSettings {
        resource_model_rules: json["resource_model_rules"].as_array().unwrap().iter()
            .map(|rule| ResourceModelRule { attribute: string(&rule[0]).to_owned(), values: map(&rule[1]) }).collect(),
        default_model: string(&json["default_model"]).to_owned(),
        default_operation: string(&json["default_operation"]).to_owned(),
        model_from_service_name: json["model_from_service_name"].as_bool().unwrap(),
        edge_ttft_attributes: texts(&json["edge_ttft_attributes"]),
        first_token_events: texts(&json["first_token_events"]),
        dimensions: json["dimensions"].as_array().unwrap().iter().map(|d| Dimension {
            name: string(&d[0]).to_owned(), attribute: string(&d[1]).to_owned(),
            allowed: texts(&d[2]).into_iter().collect(), other: string(&d[3]).to_owned(),
        }).collect(),
        tenant: match &json["tenant"] {
            Json::Null => None,
            t => Some(TenantRule { attributes: texts(&t[0]), allowed: texts(&t[1]).into_iter().collect(),
                                   other: string(&t[2]).to_owned() }),
        },
        max_latency_s: float(string(&json["max_latency_s"])),
        lora_adapters: map(&json["lora_adapters"]),
        compensated_sum: json["compensated_sum"].as_bool().unwrap(),
    }
}

fn shapes() -> Vec<ShapeInfo> {
    let text = fs::read_to_string(data_dir().join("shapes.json")).unwrap();
    let json: Json = serde_json::from_str(&text).unwrap();
    json.as_array().unwrap().iter().map(|shape| ShapeInfo {
        adapter: string(&shape["adapter"]).to_owned(),
        engine_kind: string(&shape["engine_kind"]).to_owned(),
        part: string(&shape["part"]).to_owned(),
        may_be_gateway: shape["may_be_gateway"].as_bool().unwrap(),
        python_records: shape["python_records"].as_bool().unwrap(),
    }).collect()
}

fn observation(schema: &Schema, json: &Json) -> Observation {
    let mut observation = Observation::new(json["shape"].as_u64().unwrap() as u16);
    for (name, value) in json["values"].as_object().unwrap() {
        let id = schema.id(name).unwrap_or_else(|| panic!("no field {name}"));
        let value = match schema.kind(id) {
            Kind::Float => Value::Float(float(string(value))),
            Kind::Int => Value::Int(value.as_i64().unwrap()),
            Kind::Text => Value::Text(string(value).to_owned()),
            Kind::Flag => Value::Flag(value.as_bool().unwrap()),
            Kind::Floats => Value::Floats(strings(value).into_iter().map(float).collect()),
            Kind::Texts => Value::Texts(strings(value).into_iter().map(str::to_owned).collect()),
        };
        observation.set(id, value);
    }
    observation
}

/// A file's origins: (resource bytes, scope bytes, service name).
type Origins = Vec<(Vec<u8>, Vec<u8>, String)>;

fn trace_of(schema: &Schema, origins: &Origins, case: &Json) -> TraceData {
    let trace_id: [u8; 16] = hex(string(&case["trace_id"])).try_into().unwrap();
    let mut data = TraceData::new(trace_id);
    for span in case["spans"].as_array().unwrap() {
        let payload = base64(string(&span["payload"]));
        let observation = match &span["obs"] {
            Json::Null => None,
            obs => Some(observation(schema, obs)),
        };
        let origin = &origins[span["origin"].as_u64().unwrap() as usize];
        let span_id: [u8; 8] = hex(string(&span["id"])).try_into().unwrap();
        let parent = span["parent"].as_str().map(|p| <[u8; 8]>::try_from(hex(p)).unwrap());
        data.put(&NewSpan {
            span_id, parent_span_id: parent, kind: span["kind"].as_i64().unwrap() as i32,
            status_code: span["status"].as_i64().unwrap() as i32, start_unix_ns: span["start"].as_u64().unwrap(),
            end_unix_ns: span["end"].as_u64().unwrap(), payload: &payload, trace_state: string(&span["trace_state"]),
            resource: &origin.0, scope: &origin.1, service_name: &origin.2, observation: observation.as_ref(),
            attrs_kept: span["attrs_kept"].as_bool().unwrap(),
        });
    }
    data
}

/// The fields of `record` that differ from the Python record `expected` (`record_json`'s encoding:
/// an object of its fields here).
fn differences(expected: &Json, record: &Record<'_>) -> Vec<String> {
    let mut out = Vec::new();
    let mut check = |name: &str, same: bool| {
        if !same {
            out.push(format!("{name}: expected {}", expected[name]));
        }
    };
    let id = |name: &str, value: Option<&[u8]>| string(&expected[name]) == hex_of(value.unwrap_or(&[]));
    let text = |name: &str, value: &str| string(&expected[name]) == value;
    let int = |name: &str, value: Option<i64>| expected[name].as_i64() == value;
    let texts = |name: &str, value: &[std::borrow::Cow<'_, str>]| {
        strings(&expected[name]) == value.iter().map(|t| t.as_ref()).collect::<Vec<_>>()
    };
    check("trace_id", id("trace_id", Some(&record.trace_id)));
    check("span_id", id("span_id", Some(&record.span_id)));
    check("edge_span_id", id("edge_span_id", record.edge_span_id.as_ref().map(|s| &s[..])));
    check("joined_span_id", id("joined_span_id", record.joined_span_id.as_ref().map(|s| &s[..])));
    for (name, value) in [
        ("engine_kind", &record.engine_kind), ("adapter", &record.adapter), ("service_name", &record.service_name),
        ("model", &record.model), ("model_source", &record.model_source), ("request_model", &record.request_model),
        ("response_model", &record.response_model), ("operation_name", &record.operation_name),
        ("provider_name", &record.provider_name), ("outcome", &record.outcome),
        ("operation_source", &record.operation_source), ("error_type", &record.error_type),
        ("server_address", &record.server_address), ("server_port", &record.server_port), ("tenant", &record.tenant),
        ("lora_adapter", &record.lora_adapter), ("lora_base_model", &record.lora_base_model),
    ] {
        check(name, text(name, value));
    }
    check("side", text("side", record.side.as_str()));
    check("start_unix_ns", int("start_unix_ns", Some(record.start_unix_ns)));
    for (name, value) in [
        ("ttft_s", record.ttft_s), ("tpot_s", record.tpot_s), ("e2e_s", record.e2e_s), ("queue_s", record.queue_s),
        ("prefill_s", record.prefill_s), ("decode_s", record.decode_s), ("inference_s", record.inference_s),
        ("gateway_overhead_s", record.gateway_overhead_s), ("client_overhead_s", record.client_overhead_s),
        ("edge_ttft_s", record.edge_ttft_s), ("weight", Some(record.weight)),
    ] {
        check(name, same_float(&expected[name], value));
    }
    for (name, value) in [
        ("prompt_tokens", record.prompt_tokens), ("completion_tokens", record.completion_tokens),
        ("cached_tokens", record.cached_tokens), ("cache_write_tokens", record.cache_write_tokens),
        ("reasoning_tokens", record.reasoning_tokens), ("spec_accepted_tokens", record.spec_accepted_tokens),
        ("spec_draft_tokens", record.spec_draft_tokens), ("spec_steps", record.spec_steps),
    ] {
        check(name, int(name, value));
    }
    for (name, value) in [
        ("dimensions", &record.dimensions), ("rejected", &record.rejected), ("segments_missing", &record.segments_missing),
        ("not_measurable", &record.not_measurable), ("segments_derived", &record.segments_derived),
    ] {
        check(name, texts(name, value));
    }
    let itl = expected["itl_s"].as_array().unwrap();
    check("itl_s", itl.len() == record.itl_s.len()
        && itl.iter().zip(&record.itl_s).all(|(e, v)| same_float(e, Some(*v))));
    let segments: Vec<Segment<'_>> = expected["segments"].as_array().unwrap().iter().map(|s| Segment {
        name: string(&s[0]).to_owned().into(), start_unix_ns: s[1].as_i64().unwrap(), end_unix_ns: s[2].as_i64().unwrap(),
    }).collect();
    check("segments", segments == record.segments);
    check("extra", record.extra.is_empty());
    out
}

/// What the corpus met, to show each part of it was read and compared.
#[derive(Default, Debug)]
struct Tally {
    traces: usize,
    records: usize,
    client_records: usize,
    malformed: usize,
    declined: HashMap<&'static str, usize>,
    late: usize,
    /// Python's engine records behind a gateway or client, by the rule that named their model.
    engine_models: HashMap<&'static str, usize>,
}

/// Which of `_resolve_model`'s and `_fallback_model`'s rules for an engine behind its callers
/// named the model of Python's record `expected` (under `settings`), if one did.
fn engine_model_rule(expected: &Json, settings: &Json) -> Option<&'static str> {
    if string(&expected["side"]) != "server" || ["genai", "client"].contains(&string(&expected["engine_kind"])) {
        return None;
    }
    let source = string(&expected["model_source"]);
    let caller_named = !string(&expected["request_model"]).is_empty();
    let from_service_name = settings["model_from_service_name"].as_bool().unwrap();
    if source.starts_with("gateway:") || source.starts_with("client:") {
        if !from_service_name && !settings["resource_model_rules"].as_array().unwrap().is_empty() {
            return Some("callers_model_opted_out_past_rules");
        }
        if from_service_name && string(&expected["service_name"]).starts_with("unknown_service") {
            return Some("callers_model_past_placeholder_service");
        }
        return Some("callers_model");
    }
    match source {
        "resource:model.id" if caller_named => Some("resource_rule_over_callers"),
        "resource:service.name" if caller_named => Some("service_name_over_callers"),
        _ => None,
    }
}

fn run_file(path: &Path, shapes: &[ShapeInfo], tally: &mut Tally, failures: &mut Vec<String>) {
    let mut text = String::new();
    GzDecoder::new(fs::File::open(path).unwrap()).read_to_string(&mut text).unwrap();
    let json: Json = serde_json::from_str(&text).unwrap();
    let schema = schema_of(&json["schema"]);
    let origins: Origins = json["origins"].as_array().unwrap().iter()
        .map(|o| (base64(string(&o[0])), base64(string(&o[1])), string(&o[2]).to_owned())).collect();
    let fields = strings(&json["record_fields"]);
    assert_eq!(fields.len(), otel_llm_engine::record::RECORD_FIELDS.len(), "RequestRecord's fields changed");
    let as_object = |values: &Json| -> Json {
        Json::Object(fields.iter().zip(values.as_array().unwrap()).map(|(k, v)| (k.to_string(), v.clone())).collect())
    };
    let builders: HashMap<&str, RecordBuilder> = json["settings"].as_object().unwrap().iter()
        .map(|(name, settings)| (name.as_str(), RecordBuilder::new(&schema, settings_of(settings), Vec::new()).unwrap()))
        .collect();
    for case in json["cases"].as_array().unwrap() {
        let name = string(&case["name"]);
        let settings = &json["settings"][string(&case["settings"])];
        let builder = &builders[string(&case["settings"])];
        let data = trace_of(&schema, &origins, case);
        let late = case["late"].as_bool().unwrap();
        let built = if late { builder.build_late(&data, shapes) } else { builder.build(&data, shapes) };
        tally.traces += 1;
        tally.late += usize::from(late);
        let expected = &case["expected"];
        match (built, expected.get("declined")) {
            (Built::Declined(reason), Some(events)) => {
                let events = strings(events);
                if events[0] != reason.as_str() {
                    failures.push(format!("{name}: declined for {}, Python met {events:?}", reason.as_str()));
                }
                *tally.declined.entry(reason.as_str()).or_default() += 1;
            }
            (Built::Declined(reason), None) => {
                failures.push(format!("{name}: declined for {reason:?}; Python's reading needs no such rule"));
            }
            (Built::Records(_, _), Some(events)) => {
                failures.push(format!("{name}: built, but Python met {events}"));
            }
            (Built::Records(records, malformed), None) => {
                let wanted = expected["records"].as_array().unwrap();
                if wanted.len() != records.len() {
                    failures.push(format!("{name}: {} records, Python made {}", records.len(), wanted.len()));
                    continue;
                }
                for (index, (want, record)) in wanted.iter().zip(&records).enumerate() {
                    let want = as_object(want);
                    if let Some(rule) = engine_model_rule(&want, settings) {
                        *tally.engine_models.entry(rule).or_default() += 1;
                    }
                    let differ = differences(&want, record);
                    if !differ.is_empty() {
                        failures.push(format!("{name} record {index}: {differ:?}\n  built: {record:?}"));
                    }
                }
                let wanted_malformed: Vec<(String, String)> = expected["malformed"].as_array().unwrap().iter()
                    .map(|m| (string(&m[0]).to_owned(), string(&m[1]).to_owned())).collect();
                let got: Vec<(String, String)> = malformed.iter().map(|(r, s)| (r.to_string(), s.clone())).collect();
                if wanted_malformed != got {
                    failures.push(format!("{name}: malformed {got:?}, Python's {wanted_malformed:?}"));
                }
                tally.records += records.len();
                tally.client_records += records.iter().filter(|r| r.side.as_str() == "client").count();
                tally.malformed += malformed.len();
            }
        }
    }
}

#[test]
fn the_engine_builds_pythons_records_or_declines_where_its_rules_say() {
    let shapes = shapes();
    let mut failures = Vec::new();
    let mut tallies = Vec::new();
    for file in ["fixtures", "captures", "bench", "random"] {
        let mut tally = Tally::default();
        run_file(&data_dir().join(format!("{file}.json.gz")), &shapes, &mut tally, &mut failures);
        tallies.push((file, tally));
    }
    assert!(failures.is_empty(), "{} differences:\n{}", failures.len(),
            failures.iter().take(40).cloned().collect::<Vec<_>>().join("\n"));
    // Every part of the corpus was read and compared, and each side of every rule met.
    let by_file: HashMap<&str, &Tally> = tallies.iter().map(|(file, tally)| (*file, tally)).collect();
    eprintln!("{tallies:#?}");
    assert!(by_file["fixtures"].records > 0 && by_file["fixtures"].declined.contains_key(Decline::PythonShape.as_str()));
    assert!(by_file["captures"].records > 50 && by_file["captures"].client_records > 20);
    assert!(by_file["bench"].records > 100);
    let random = by_file["random"];
    assert!(random.traces > 2000 && random.records > 1500 && random.client_records > 200, "{random:?}");
    assert!(random.malformed > 20 && random.late > 50, "{random:?}");
    // An engine's record behind a gateway names what the engine served (its resource rule, its
    // service name) before what the gateway named, which is then its request model; or, where its
    // side names none (a placeholder service name, the opt-out), what the gateway named.
    for rule in ["resource_rule_over_callers", "service_name_over_callers", "callers_model",
                 "callers_model_past_placeholder_service", "callers_model_opted_out_past_rules"] {
        assert!(tallies.iter().any(|(_, t)| t.engine_models.get(rule).is_some_and(|n| *n >= 5)), "{rule}: {tallies:?}");
    }
    for reason in [Decline::ReprText, Decline::NumberText, Decline::UnicodeCase, Decline::TraceState,
                   Decline::DisaggregatedPair, Decline::PythonShape, Decline::TimeRange, Decline::Uncaught] {
        assert!(tallies.iter().any(|(_, t)| t.declined.contains_key(reason.as_str())), "no trace declined for {reason:?}");
    }
}

/// A benchmark, not a test of speed (`cargo test --release -p otel-llm-engine --test records_differential
/// -- --ignored --nocapture`): the time to build the records of the bench workload's traces (a
/// gateway and a vLLM span, SGLang and TGI trees), and of the random corpus (every join).
#[test]
#[ignore]
fn benchmark_building_the_corpus() {
    let shapes = shapes();
    for file in ["bench", "random"] {
        let mut text = String::new();
        GzDecoder::new(fs::File::open(data_dir().join(format!("{file}.json.gz"))).unwrap())
            .read_to_string(&mut text).unwrap();
        let json: Json = serde_json::from_str(&text).unwrap();
        let schema = schema_of(&json["schema"]);
        let origins: Origins = json["origins"].as_array().unwrap().iter()
            .map(|o| (base64(string(&o[0])), base64(string(&o[1])), string(&o[2]).to_owned())).collect();
        let builders: HashMap<&str, RecordBuilder> = json["settings"].as_object().unwrap().iter()
            .map(|(name, s)| (name.as_str(), RecordBuilder::new(&schema, settings_of(s), Vec::new()).unwrap())).collect();
        let traces: Vec<(&str, TraceData)> = json["cases"].as_array().unwrap().iter()
            .map(|case| (string(&case["settings"]), trace_of(&schema, &origins, case))).collect();
        let spans: usize = traces.iter().map(|(_, t)| t.len()).sum();
        let rounds: usize = std::env::var("RECORDS_BENCH_ROUNDS").ok().and_then(|r| r.parse().ok()).unwrap_or(200);
        let started = std::time::Instant::now();
        let mut records = 0;
        for _ in 0..rounds {
            for (settings, trace) in &traces {
                if let Built::Records(built, _) = builders[settings].build(trace, &shapes) {
                    records += built.len();
                }
            }
        }
        let elapsed = started.elapsed().as_nanos() as f64;
        eprintln!("{file}: {} traces, {spans} spans: {:.0} ns per trace, {:.0} ns per span, {:.0} ns per record",
                  traces.len(), elapsed / (rounds * traces.len()) as f64, elapsed / (rounds * spans) as f64,
                  elapsed / records.max(1) as f64);
    }
}
