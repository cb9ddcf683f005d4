//! The writer's rules one by one (what each Python statement does, on the smallest trace that
//! shows it), the single-rule corpus the reference wrote (`tests/data/kept/units.json.gz`:
//! `json.dumps` of floats, `fnmatch` of globs, `reduced_url`), and properties over arbitrary bytes.

use std::borrow::Cow;
use std::io::Read;

use proptest::prelude::*;

use super::rules::{Glob, Rules, Verdict, ALLOWED, BLOCKED, CLASS, GENAI, METADATA, METADATA_URL, NOT_METADATA};
use super::value::{json_float, json_string, Value};
use super::*;
use crate::model::{Decision, NewSpan, Names};
use crate::record::Segment;
use crate::wire::push_varint;

// --- bytes -------------------------------------------------------------------------------------------

fn field(tag: u8, data: &[u8]) -> Vec<u8> {
    let mut out = vec![tag];
    push_varint(&mut out, data.len() as u64);
    out.extend_from_slice(data);
    out
}

fn string_value(text: &str) -> Vec<u8> {
    field(0x0a, text.as_bytes())
}

fn int_value(number: i64) -> Vec<u8> {
    let mut out = vec![0x18];
    push_varint(&mut out, number as u64);
    out
}

/// A `KeyValue` of `key` and an `AnyValue` of these fields.
fn kv(key: &str, value: &[u8]) -> Vec<u8> {
    let mut out = field(0x0a, key.as_bytes());
    out.extend(field(0x12, value));
    out
}

const TRACE: [u8; 16] = [7; 16];

/// A span's bytes as an SDK writes them: ids, name, kind SERVER, times, these attributes and `rest`.
fn span_bytes(id: u8, attributes: &[(&str, Vec<u8>)], rest: &[u8]) -> Vec<u8> {
    let mut out = field(0x0a, &TRACE);
    out.extend(field(0x12, &[id; 8]));
    out.extend(field(0x2a, b"chat"));
    out.extend([0x30, 0x02]);
    out.push(0x39);
    out.extend(1_000u64.to_le_bytes());
    out.push(0x41);
    out.extend(2_000u64.to_le_bytes());
    for (key, value) in attributes {
        out.extend(field(0x4a, &kv(key, value)));
    }
    out.extend_from_slice(rest);
    out
}

fn resource(service: &str) -> Vec<u8> {
    field(0x0a, &kv("service.name", &string_value(service)))
}

fn trace_of(spans: &[Vec<u8>]) -> TraceData {
    trace_with_origins(spans.iter().map(|s| (s.clone(), resource("svc"), field(0x0a, b"scope"))).collect())
}

fn trace_with_origins(spans: Vec<(Vec<u8>, Vec<u8>, Vec<u8>)>) -> TraceData {
    let mut data = TraceData::new(TRACE);
    for (index, (payload, resource, scope)) in spans.iter().enumerate() {
        let mut id = [0xee; 8];
        id[7] = index as u8;
        data.put(&NewSpan {
            span_id: id, parent_span_id: None, kind: 2, status_code: 0, start_unix_ns: 0, end_unix_ns: 0,
            payload, trace_state: "", resource, scope, service_name: "", observation: None, attrs_kept: true,
        });
    }
    data
}

/// `redaction_of(RedactionProcessor())`'s rules in small: content prefixes, the allowlist of a few
/// metadata keys (the URL keys among them), the free-text limit, content events.
fn default_redaction() -> Redaction {
    let strings = |items: &[&str]| items.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    Redaction {
        key_prefixes: strings(&["gen_ai.prompt", "gen_ai.completion", "llm.input_messages"]),
        key_patterns: strings(&["llm.*.messages*"]),
        event_names: strings(&["gen_ai.content.prompt"]),
        max_free_text_bytes: 16,
        allowed_keys: strings(&["exception.stacktrace"]),
        allowed_patterns: strings(&["note.*"]),
        metadata_keys: Some(strings(&["gen_ai.request.model", "error.type", "url.full", "http.route", "service.name"])),
        url_keys: strings(&["url.full"]),
        ..Redaction::default()
    }
}

fn write(redaction: &Redaction, data: &TraceData, records: &[Record<'_>], policy: &str, threshold: &str) -> KeptOut {
    KeptWriter::new(redaction).unwrap().write(data, records, policy, threshold).unwrap()
}

fn counts(content_keys: u64, free_text: u64, content_events: u64, not_allowed: u64, url_reduced: u64) -> RedactionCounts {
    RedactionCounts { content_keys, free_text, content_events, not_allowed, url_reduced }
}

// --- the single-rule corpus ------------------------------------------------------------------------------

fn units() -> serde_json::Value {
    let path = format!("{}/tests/data/kept/units.json.gz", env!("CARGO_MANIFEST_DIR"));
    let mut text = String::new();
    flate2::read::GzDecoder::new(std::fs::File::open(&path).unwrap()).read_to_string(&mut text).unwrap();
    serde_json::from_str(&text).unwrap()
}

#[test]
fn every_float_is_written_as_json_dumps_writes_it_halfway_cases_included() {
    let units = units();
    let mut halfway = 0;
    for pair in units["floats"].as_array().unwrap() {
        let bits = u64::from_str_radix(pair[0].as_str().unwrap(), 16).unwrap().swap_bytes();
        let number = f64::from_bits(bits);
        let mut written = String::new();
        json_float(number, &mut written);
        assert_eq!(written, pair[1].as_str().unwrap(), "{number:e}");
        // Where Rust's own shortest digits are not Python's: the halfway doubles the tie rule decides.
        let mut rust = format!("{:e}", number.abs());
        rust.retain(|c| c != '.');
        let python_digits: String = written.chars().take_while(|c| *c != 'e').filter(char::is_ascii_digit).collect();
        if number.is_finite() && rust.split('e').next().unwrap() != python_digits.trim_start_matches('0').trim_end_matches('0') {
            halfway += 1;
        }
    }
    assert!(halfway > 100, "the corpus holds halfway doubles Rust writes otherwise: {halfway}");
}

#[test]
fn globs_match_the_keys_fnmatch_matches() {
    let units = units();
    let keys: Vec<&str> = units["keys"].as_array().unwrap().iter().map(|k| k.as_str().unwrap()).collect();
    let mut matched = 0;
    for pair in units["globs"].as_array().unwrap() {
        let glob = Glob::new(pair[0].as_str().unwrap()).unwrap();
        let expected: Vec<&str> = pair[1].as_array().unwrap().iter().map(|k| k.as_str().unwrap()).collect();
        let actual: Vec<&str> = keys.iter().copied().filter(|k| glob.matches(k)).collect();
        assert_eq!(actual, expected, "{:?}", pair[0]);
        matched += actual.len();
    }
    assert!(matched > 1000);
}

#[test]
fn urls_are_reduced_as_reduced_url_reduces_them() {
    for pair in units()["urls"].as_array().unwrap() {
        assert_eq!(rules::reduced_url(pair[0].as_str().unwrap()), pair[1].as_str().unwrap(), "{:?}", pair[0]);
    }
}

#[test]
fn a_glob_with_a_character_class_refuses_the_writer() {
    let redaction = Redaction { key_patterns: vec!["x.[ab]*".into()], ..Redaction::default() };
    assert!(KeptWriter::new(&redaction).unwrap_err().contains("x.[ab]*"));
    let redaction = Redaction { allowed_patterns: vec!["[".into()], ..Redaction::default() };
    assert!(KeptWriter::new(&redaction).is_err());
}

// --- JSON ----------------------------------------------------------------------------------------------

#[test]
fn json_strings_escape_as_json_dumps_with_ensure_ascii() {
    let mut out = String::new();
    json_string("q\"\\ \n\r\t\u{8}\u{c}\u{0}\u{1f}\u{7f} é \u{2028} 🦙", &mut out);
    // json.dumps('q"\\ \n\r\t\x08\x0c\x00\x1f\x7f é \u2028 🦙')
    assert_eq!(out, r#""q\"\\ \n\r\t\b\f\u0000\u001f\u007f \u00e9 \u2028 \ud83e\udd99""#);
}

#[test]
fn json_floats_take_repr_notation_and_its_specials() {
    let text = |n: f64| {
        let mut out = String::new();
        json_float(n, &mut out);
        out
    };
    assert_eq!(text(f64::NAN), "NaN");
    assert_eq!(text(f64::INFINITY), "Infinity");
    assert_eq!(text(f64::NEG_INFINITY), "-Infinity");
    assert_eq!(text(-0.0), "-0.0");
    assert_eq!(text(1e16), "1e+16"); // the point past 16 digits
    assert_eq!(text(1e15), "1000000000000000.0");
    assert_eq!(text(1e-5), "1e-05"); // the point at -4
    assert_eq!(text(1e-4), "0.0001");
    assert_eq!(text(0.1 + 0.2), "0.30000000000000004");
    assert_eq!(text(123456789012345678.0), "1.2345678901234568e+17");
    // The double 767159875298070.25, halfway between .2 and .3 (both read back): Python writes the even one.
    assert_eq!(text(767_159_875_298_070.2), "767159875298070.2");
    assert_eq!(text(5e-324), "5e-324");
}

#[test]
fn map_values_keep_a_repeated_keys_first_position_and_last_value() {
    for count in [3usize, 40] {
        // a, b, then the same keys again (count entries): a dict of them
        let entries: Vec<value::Entry> = (0..count).map(|i| value::Entry {
            key: ["a", "b", "c"][i % 3],
            value: Some(Value::Int(i as i64)),
        }).collect();
        let size = entries.iter().map(|e| value::delimited_size(e.size())).sum();
        let mut out = String::new();
        Value::KvList(entries, size).json(&mut out);
        let last = |k: usize| (0..count).filter(|i| i % 3 == k).max().unwrap();
        assert_eq!(out, format!("{{\"a\": {}, \"b\": {}, \"c\": {}}}", last(0), last(1), last(2)));
    }
}

// --- key classes and the rules -----------------------------------------------------------------------

#[test]
fn a_keys_class_is_allowed_then_blocked_then_metadata_or_not_and_genai_marked() {
    let mut rules = Rules::new(&default_redaction()).unwrap();
    assert_eq!(rules.key_class("exception.stacktrace"), ALLOWED);
    assert_eq!(rules.key_class("note.anything"), ALLOWED); // an allowed glob
    assert_eq!(rules.key_class("gen_ai.prompt.0.content"), BLOCKED | GENAI); // a prefix
    assert_eq!(rules.key_class("llm.openai.messages.0"), BLOCKED | GENAI); // a glob
    assert_eq!(rules.key_class("gen_ai.request.model"), METADATA | GENAI);
    assert_eq!(rules.key_class("url.full"), METADATA_URL);
    assert_eq!(rules.key_class("custom.thing"), NOT_METADATA);
    assert_eq!(rules.key_class("openinference.span.kind"), NOT_METADATA | GENAI);
    // Allowed wins over blocked.
    let redaction = Redaction { allowed_keys: vec!["gen_ai.prompt.0".into()], ..default_redaction() };
    let mut rules = Rules::new(&redaction).unwrap();
    assert_eq!(rules.key_class("gen_ai.prompt.0") & CLASS, ALLOWED);
    assert_eq!(rules.key_class("gen_ai.prompt.1") & CLASS, BLOCKED);
    // Without the allowlist every key not blocked is metadata (a URL key reduced only under it).
    let mut open = Rules::new(&Redaction { metadata_keys: None, ..default_redaction() }).unwrap();
    assert_eq!(open.key_class("custom.thing"), METADATA);
}

#[test]
fn the_key_cache_is_bounded_and_never_changes_an_answer() {
    let mut rules = Rules::new(&default_redaction()).unwrap();
    for i in 0..(KEY_CACHE_TEST + 100) {
        let key = format!("custom.{i}");
        assert_eq!(rules.key_class(&key), NOT_METADATA);
    }
    assert_eq!(rules.cached(), KEY_CACHE_TEST);
    assert_eq!(rules.key_class("gen_ai.prompt"), BLOCKED | GENAI); // decided past the bound too
}

const KEY_CACHE_TEST: usize = 4096;

#[test]
fn removes_follows_each_rule_in_order_and_counts_it() {
    let rules = Rules::new(&default_redaction()).unwrap();
    let mut tally = RedactionCounts::default();
    let long = "x".repeat(17);
    let text = Value::Str(&long);
    assert_eq!(rules.removes(Some(&text), ALLOWED, 16, &mut tally), Verdict::Keep); // allowed: whatever it holds
    assert_eq!(rules.removes(Some(&Value::Int(1)), BLOCKED, 0, &mut tally), Verdict::Remove); // blocked: even a number
    assert_eq!(tally, counts(1, 0, 0, 0, 0));
    assert_eq!(rules.removes(Some(&Value::Str("x")), NOT_METADATA, 0, &mut tally), Verdict::Remove);
    for scalar in [Value::Int(5), Value::Double(0.5), Value::Bool(true), Value::Empty] {
        assert_eq!(rules.removes(Some(&scalar), NOT_METADATA, 16, &mut tally), Verdict::Keep);
    }
    assert_eq!(rules.removes(None, NOT_METADATA, 16, &mut tally), Verdict::Keep); // no value field
    assert_eq!(rules.removes(Some(&Value::Bytes(b"x")), NOT_METADATA, 0, &mut tally), Verdict::Remove);
    assert_eq!(tally, counts(1, 0, 0, 2, 0));
    // The free-text limit: its bytes in UTF-8, the limit kept, its successor removed.
    let at_limit = "é".repeat(8); // 16 bytes, 8 characters
    assert_eq!(rules.removes(Some(&Value::Str(&at_limit)), METADATA, 16, &mut tally), Verdict::Keep);
    let past = format!("{at_limit}x");
    assert_eq!(rules.removes(Some(&Value::Str(&past)), METADATA, 16, &mut tally), Verdict::Remove);
    assert_eq!(rules.removes(Some(&Value::Str(&past)), METADATA, 0, &mut tally), Verdict::Keep); // 0: off
    // Bytes by their `ByteSize()`: 14 bytes are 16 with their tag and length.
    assert_eq!(rules.removes(Some(&Value::Bytes(&[0; 14])), METADATA, 16, &mut tally), Verdict::Keep);
    assert_eq!(rules.removes(Some(&Value::Bytes(&[0; 15])), METADATA, 16, &mut tally), Verdict::Remove);
    assert_eq!(tally, counts(1, 2, 0, 2, 0));
    // A metadata URL: reduced (counted), then judged by its reduced length.
    let url = "https://user:pw@host/v1?key=secret";
    assert_eq!(rules.removes(Some(&Value::Str(url)), METADATA_URL, 0, &mut tally),
               Verdict::KeepReduced("https://host/v1".into()));
    assert_eq!(rules.removes(Some(&Value::Str("https://host/v1")), METADATA_URL, 0, &mut tally), Verdict::Keep);
    assert_eq!(rules.removes(Some(&Value::Str(url)), METADATA_URL, 15, &mut tally),
               Verdict::KeepReduced("https://host/v1".into()));
    assert_eq!(rules.removes(Some(&Value::Str(url)), METADATA_URL, 14, &mut tally), Verdict::Remove);
    assert_eq!(tally, counts(1, 3, 0, 2, 3));
    // Without the allowlist, neither the allowlist nor the URL rule applies.
    let open = Rules::new(&Redaction { metadata_keys: None, ..default_redaction() }).unwrap();
    assert_eq!(open.removes(Some(&Value::Str(url)), METADATA_URL, 0, &mut tally), Verdict::Keep);
    assert_eq!(open.removes(Some(&Value::Str("x")), NOT_METADATA, 0, &mut tally), Verdict::Keep);
    assert_eq!(tally, counts(1, 3, 0, 2, 3));
}

// --- spans -----------------------------------------------------------------------------------------------

#[test]
fn a_spans_attributes_are_kept_removed_or_reduced_and_the_row_shows_what_is_kept() {
    let payload = span_bytes(1, &[
        ("gen_ai.request.model", string_value("m")),
        ("gen_ai.prompt", string_value("secret")),
        ("custom.text", string_value("anything")),
        ("custom.count", int_value(3)),
        ("url.full", string_value("https://u:p@h/x?q=1")),
        ("note.long", string_value(&"n".repeat(40))),
        ("http.route", string_value(&"r".repeat(17))),
    ], &[]);
    let out = write(&default_redaction(), &trace_of(&[payload]), &[], "", "");
    assert_eq!(out.rows.len(), 1);
    // A GenAI span (gen_ai.request.model): the 17-byte route is free text; the allowed note is kept.
    assert_eq!(out.rows[0].attributes_json, format!(
        "{{\"gen_ai.request.model\": \"m\", \"custom.count\": 3, \"url.full\": \"https://h/x\", \"note.long\": \"{}\"}}",
        "n".repeat(40)));
    assert_eq!(out.redacted, counts(1, 1, 0, 1, 1));
    assert_eq!(out.spans, 1);
}

#[test]
fn a_span_without_a_genai_key_has_no_free_text_limit() {
    let payload = span_bytes(1, &[("http.route", string_value(&"r".repeat(40)))], &[]);
    let out = write(&default_redaction(), &trace_of(&[payload]), &[], "", "");
    assert_eq!(out.rows[0].attributes_json, format!("{{\"http.route\": \"{}\"}}", "r".repeat(40)));
    assert_eq!(out.redacted, RedactionCounts::default());
}

fn status(message: &str, code: u64) -> Vec<u8> {
    let mut body = field(0x12, message.as_bytes());
    body.push(0x18);
    push_varint(&mut body, code);
    field(0x7a, &body)
}

#[test]
fn a_status_message_the_rules_remove_becomes_the_spans_error_type_or_empty() {
    let redaction = default_redaction();
    let reduced = span_bytes(1, &[("error.type", string_value("TimeoutError"))], &status("prompt was: hello", 2));
    let out = write(&redaction, &trace_of(&[reduced]), &[], "", "");
    assert_eq!((out.rows[0].status_code, out.rows[0].status_message.as_str()), (2, "TimeoutError"));
    assert_eq!(out.redacted, counts(0, 0, 0, 1, 0)); // not_allowed: otel.status_description is not metadata
    // An error.type that is not a string (or absent): the message is emptied, the status kept.
    let emptied = span_bytes(1, &[("error.type", int_value(500))], &status("boom", 2));
    let out = write(&redaction, &trace_of(&[emptied]), &[], "", "");
    assert_eq!((out.rows[0].status_code, out.rows[0].status_message.as_str()), (2, ""));
    // The status written back present with its code alone: `7a 02 18 02`.
    assert!(out.request.windows(4).any(|w| w == [0x7a, 0x02, 0x18, 0x02]));
    // Allowed, the message stays; no allowlist, likewise.
    let allowed = Redaction { allowed_keys: vec!["otel.status_description".into()], ..redaction.clone() };
    let kept = span_bytes(1, &[], &status("boom", 2));
    assert_eq!(write(&allowed, &trace_of(std::slice::from_ref(&kept)), &[], "", "").rows[0].status_message, "boom");
    assert_eq!(write(&Redaction::default(), &trace_of(&[kept]), &[], "", "").rows[0].status_message, "boom");
}

#[test]
fn a_status_message_under_a_url_key_is_counted_reduced_but_kept_whole_as_python_does() {
    let redaction = Redaction {
        metadata_keys: Some(vec!["otel.status_description".into(), "service.name".into()]),
        url_keys: vec!["otel.status_description".into()],
        ..Redaction::default()
    };
    let payload = span_bytes(1, &[], &status("https://u@h/p?q", 1));
    let out = write(&redaction, &trace_of(&[payload]), &[], "", "");
    assert_eq!(out.rows[0].status_message, "https://u@h/p?q");
    assert_eq!(out.redacted, counts(0, 0, 0, 0, 1));
}

fn event(name: &str, attributes: &[(&str, Vec<u8>)]) -> Vec<u8> {
    let mut body = field(0x12, name.as_bytes());
    for (key, value) in attributes {
        body.extend(field(0x1a, &kv(key, value)));
    }
    field(0x5a, &body)
}

fn link(attributes: &[(&str, Vec<u8>)]) -> Vec<u8> {
    let mut body = field(0x0a, &[9; 16]);
    for (key, value) in attributes {
        body.extend(field(0x22, &kv(key, value)));
    }
    field(0x6a, &body)
}

#[test]
fn content_events_lose_every_attribute_other_events_and_links_are_stripped() {
    let mut rest = event("gen_ai.content.prompt", &[("any", string_value("p")), ("n", int_value(1))]);
    rest.extend(event("exception", &[("exception.stacktrace", string_value("t")), ("custom", string_value("c"))]));
    rest.extend(link(&[("custom", string_value("c")), ("http.route", string_value("/r"))]));
    let payload = span_bytes(1, &[], &rest);
    let out = write(&default_redaction(), &trace_of(std::slice::from_ref(&payload)), &[], "", "");
    assert_eq!(out.redacted, counts(0, 0, 2, 2, 0));
    // Without the allowlist, links are not stripped at all (a blocked key in a link is kept).
    let block_lists = Redaction { metadata_keys: None, key_prefixes: vec!["custom".into()], ..default_redaction() };
    let out = write(&block_lists, &trace_of(&[payload]), &[], "", "");
    assert_eq!(out.redacted, counts(1, 0, 2, 0, 0)); // the event's custom only
    assert!(out.request.windows(6).any(|w| w == b"custom"));
}

#[test]
fn resource_and_scope_attributes_pass_the_allowlist_without_the_free_text_rule() {
    let mut resource_bytes = resource("vllm");
    resource_bytes.extend(field(0x0a, &kv("process.command_line", &string_value("python serve --api-key=x"))));
    resource_bytes.extend(field(0x0a, &kv("gen_ai.prompt", &int_value(1))));
    let scope = [field(0x0a, b"s"), field(0x1a, &kv("custom", &string_value(&"c".repeat(40))))].concat();
    let payload = span_bytes(1, &[("gen_ai.request.model", string_value("m"))], &[]);
    let out = write(&default_redaction(), &trace_with_origins(vec![(payload, resource_bytes, scope)]), &[], "", "");
    assert_eq!(out.redacted, counts(1, 0, 0, 2, 0));
    assert_eq!(out.rows[0].service_name, "vllm");
    assert!(!out.request.windows(7).any(|w| w == b"api-key"));
}

#[test]
fn service_name_is_the_first_service_name_attributes_string() {
    let cases: [(Vec<u8>, &str); 4] = [
        ([resource("a"), resource("b")].concat(), "a"),
        (field(0x0a, &kv("service.name", &int_value(3))), ""), // not a string: "", not the next one
        ([field(0x0a, &kv("service.name", &int_value(3))), resource("b")].concat(), ""),
        (Vec::new(), ""),
    ];
    for (resource_bytes, expected) in cases {
        let data = trace_with_origins(vec![(span_bytes(1, &[], &[]), resource_bytes, Vec::new())]);
        assert_eq!(write(&Redaction::default(), &data, &[], "", "").rows[0].service_name, expected);
    }
}

#[test]
fn the_threshold_is_stamped_first_in_the_trace_state_replacing_any_ot_member() {
    let with_state = |state: &str| span_bytes(1, &[], &field(0x1a, state.as_bytes()));
    let stamped = |state: &str, threshold: &str| {
        let out = write(&Redaction::default(), &trace_of(&[with_state(state)]), &[], "", threshold);
        let parts = super::span::read_span(&out.request[out.request.len() - span_len(&out.request)..]).unwrap();
        parts.trace_state.into_owned()
    };
    assert_eq!(stamped("a=b,,ot=x;y,c=d", "c"), "ot=th:c,a=b,c=d");
    assert_eq!(stamped("", "8"), "ot=th:8");
    assert_eq!(stamped(",", "8"), "ot=th:8");
    assert_eq!(stamped("a=b,ot=th:4", ""), "a=b,ot=th:4"); // "" and "0": left as it is
    assert_eq!(stamped("a=b,ot=th:4", "0"), "a=b,ot=th:4");
}

/// The one span of a one-span request: its bytes are the request's tail.
fn span_len(request: &[u8]) -> usize {
    let mut last = 0;
    crate::wire::each_message(request, 0, request.len(), 1, 1, |s, e| {
        crate::wire::each_message(request, s, e, 2, 2, |s, e| {
            crate::wire::each_message(request, s, e, 2, 3, |s, e| {
                last = e - s;
                Ok(())
            })
        })
    }).unwrap();
    last
}

fn server_record(span_id: [u8; 8]) -> Record<'static> {
    let mut record = Record::new(TRACE, span_id);
    record.outcome = Cow::Borrowed("stop");
    record.model_source = Cow::Borrowed("span:gen_ai.response.model");
    record.prompt_tokens = Some(12);
    record.completion_tokens = Some(5);
    record.provider_name = Cow::Borrowed("vllm");
    record.operation_source = Cow::Borrowed("span");
    record.operation_name = Cow::Borrowed("chat");
    record.request_model = Cow::Borrowed("m");
    record.tpot_s = Some(0.0125);
    record.segments_missing = vec![Cow::Borrowed("queue"), Cow::Borrowed("prefill")];
    record.gateway_overhead_s = Some(0.002);
    record
}

#[test]
fn a_records_span_gets_the_bridge_attributes_in_place_or_appended() {
    let payload = span_bytes(1, &[("otel_llm.outcome", string_value("was here")), ("x", int_value(1))], &[]);
    let out = write(&Redaction::default(), &trace_of(&[payload]), &[server_record([1; 8])], "errors", "");
    assert_eq!(out.rows[0].attributes_json, concat!(
        "{\"otel_llm.outcome\": \"stop\", \"x\": 1, \"otel_llm.sampling.policy\": \"errors\", ",
        "\"otel_llm.model_source\": \"span:gen_ai.response.model\", \"gen_ai.usage.input_tokens\": 12, ",
        "\"gen_ai.usage.output_tokens\": 5, \"gen_ai.provider.name\": \"vllm\", \"gen_ai.operation.name\": \"chat\", ",
        "\"gen_ai.request.model\": \"m\", \"otel_llm.time_per_output_token\": 0.0125, ",
        "\"otel_llm.segments_missing\": \"queue,prefill\", \"otel_llm.gateway_overhead\": 0.002}"));
}

#[test]
fn a_decision_is_written_with_its_policy_and_threshold_by_name() {
    let mut names = Names::default();
    let decision = Decision { keep: true, rate_limited: false, policy: names.intern("errors"), threshold: names.intern("c") };
    let data = trace_of(&[span_bytes(1, &[], &field(0x1a, b"a=b"))]);
    let records = [server_record([1; 8])];
    let mut writer = KeptWriter::new(&Redaction::default()).unwrap();
    assert_eq!(writer.write_decision(&data, &records, &decision, &names), writer.write(&data, &records, "errors", "c"));
    let out = writer.write_decision(&data, &records, &decision, &names).unwrap();
    assert!(out.rows[0].attributes_json.contains("\"otel_llm.sampling.policy\": \"errors\""));
    assert!(out.request.windows(13).any(|w| w == b"\x1a\x0bot=th:c,a=b")); // the trace state, field 3
}

#[test]
fn a_client_records_span_gets_the_policy_outcome_and_model_source_only() {
    let mut record = server_record([1; 8]);
    record.side = Side::Client;
    let out = write(&Redaction::default(), &trace_of(&[span_bytes(1, &[], &[])]), &[record], "", "");
    assert_eq!(out.rows[0].attributes_json,
               "{\"otel_llm.outcome\": \"stop\", \"otel_llm.model_source\": \"span:gen_ai.response.model\"}");
}

#[test]
fn a_default_operation_and_empty_texts_are_not_stamped_and_the_last_record_of_a_span_counts() {
    let mut first = server_record([1; 8]);
    first.outcome = Cow::Borrowed("error");
    let mut last = Record::new(TRACE, [1; 8]);
    last.outcome = Cow::Borrowed("abort");
    last.model_source = Cow::Borrowed("none");
    let out = write(&Redaction::default(), &trace_of(&[span_bytes(1, &[], &[])]), &[first, last], "", "");
    assert_eq!(out.rows[0].attributes_json, "{\"otel_llm.outcome\": \"abort\", \"otel_llm.model_source\": \"none\"}");
}

#[test]
fn segments_become_child_spans_with_deterministic_ids_in_the_otel_llm_scope() {
    // hashlib.blake2b(b"\x01" * 16 + b"\x02" * 8 + "queue".encode(), digest_size=8), and two more
    assert_eq!(hex(&segment_span_id(&[1; 16], &[2; 8], "queue")), "bd250fd4da6f4c66");
    assert_eq!(hex(&segment_span_id(b"", b"", "")), "e4a6a0577479b2b4");
    assert_eq!(hex(&segment_span_id(&[1; 16], &[2; 8], "é")), "2a35ac9e1d38e060");
    let mut record = server_record([1; 8]);
    record.segments = vec![Segment { name: Cow::Borrowed("queue"), start_unix_ns: 10, end_unix_ns: 20 },
                           Segment { name: Cow::Borrowed("decode"), start_unix_ns: 0, end_unix_ns: i64::MAX }];
    let data = trace_of(&[span_bytes(1, &[], &[]), span_bytes(2, &[], &[])]);
    let out = write(&Redaction::default(), &data, &[record], "p", "8");
    assert_eq!(out.spans, 4);
    let names: Vec<&str> = out.rows.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names, ["chat", "chat", "queue", "decode"]); // the scope's spans, then the synthesized scope's
    let queue = &out.rows[2];
    assert_eq!(queue.span_id, hex(&segment_span_id(&TRACE, &[1; 8], "queue")));
    assert_eq!((queue.parent_span_id.as_str(), queue.kind, queue.service_name.as_str()), ("0101010101010101", 1, "svc"));
    assert_eq!((queue.start_unix_ns, queue.end_unix_ns), (10, 20));
    assert_eq!(queue.attributes_json, "{\"otel_llm.segment\": \"queue\"}");
    assert!(out.request.windows(10).any(|w| w == [0x0a, 0x0a, 0x0a, 0x08, b'o', b't', b'e', b'l', b'-', b'l']));
    // The same input, the same spans: a replay never duplicates them.
    let mut again = server_record([1; 8]);
    again.segments = vec![Segment { name: Cow::Borrowed("queue"), start_unix_ns: 10, end_unix_ns: 20 },
                          Segment { name: Cow::Borrowed("decode"), start_unix_ns: 0, end_unix_ns: i64::MAX }];
    assert_eq!(write(&Redaction::default(), &data, &[again], "p", "8"), out);
}

#[test]
fn among_many_records_the_last_of_a_span_counts_too() {
    // Past a few records they are looked up by a map: the same answer, the last record of a span id.
    let spans: Vec<Vec<u8>> = (1..=20).map(|id| span_bytes(id, &[], &[])).collect();
    let mut records: Vec<Record> = (1..=20).map(|id| {
        let mut record = Record::new(TRACE, [id; 8]);
        record.outcome = Cow::Owned(format!("outcome {id}"));
        record
    }).collect();
    let mut last = Record::new(TRACE, [3; 8]);
    last.outcome = Cow::Borrowed("the last");
    records.push(last);
    let out = write(&Redaction::default(), &trace_of(&spans), &records, "", "");
    assert!(out.rows[2].attributes_json.starts_with("{\"otel_llm.outcome\": \"the last\""), "{}", out.rows[2].attributes_json);
    assert!(out.rows[19].attributes_json.starts_with("{\"otel_llm.outcome\": \"outcome 20\""));
}

#[test]
fn a_resource_stripped_once_counts_in_every_trace_it_is_in_and_the_cache_stays_bounded() {
    let mut writer = KeptWriter::new(&default_redaction()).unwrap();
    let with_resource = |resource_bytes: Vec<u8>| trace_with_origins(vec![(span_bytes(1, &[], &[]), resource_bytes, Vec::new())]);
    let secret = [resource("svc"), field(0x0a, &kv("process.command_line", &string_value("serve --key=x")))].concat();
    let first = writer.write(&with_resource(secret.clone()), &[], "", "").unwrap();
    // More distinct resources than the cache holds, then the first again: the same request and counts.
    for index in 0..300 {
        let other = [resource(&format!("svc-{index}")), field(0x0a, &kv("custom", &string_value("c")))].concat();
        assert_eq!(writer.write(&with_resource(other), &[], "", "").unwrap().redacted, counts(0, 0, 0, 1, 0));
    }
    assert!(writer.origins.resources.len() <= 256);
    let again = writer.write(&with_resource(secret), &[], "", "").unwrap();
    assert_eq!(again, first);
    assert_eq!(again.redacted, counts(0, 0, 0, 1, 0));
}

#[test]
fn a_negative_segment_time_is_declined_as_python_raises() {
    let mut record = server_record([1; 8]);
    record.segments = vec![Segment { name: Cow::Borrowed("queue"), start_unix_ns: -1, end_unix_ns: 5 }];
    let mut writer = KeptWriter::new(&Redaction::default()).unwrap();
    assert_eq!(writer.write(&trace_of(&[span_bytes(1, &[], &[])]), &[record], "", ""), Err(Decline::SegmentTime));
}

#[test]
fn what_python_reads_its_own_way_is_declined() {
    let mut writer = KeptWriter::new(&default_redaction()).unwrap();
    let mut decline = |payload: Vec<u8>| writer.write(&trace_of(&[payload]), &[], "", "").unwrap_err();
    let repeated = span_bytes(1, &[("k", string_value("a")), ("k", string_value("b"))], &[]);
    assert_eq!(decline(repeated), Decline::RepeatedKey);
    let two_values = span_bytes(1, &[("k", [string_value("a"), int_value(1)].concat())], &[]);
    assert_eq!(decline(two_values), Decline::ValueShape);
    let strindex = span_bytes(1, &[("k", vec![0x40, 0x03])], &[]);
    assert_eq!(decline(strindex), Decline::ValueShape);
    let key_twice = [span_bytes(1, &[], &[]), field(0x4a, &[field(0x0a, b"a"), field(0x0a, b"b")].concat())].concat();
    assert_eq!(decline(key_twice), Decline::FieldTwice);
    let not_utf8 = [span_bytes(1, &[], &[]), field(0x2a, &[0xff])].concat();
    assert_eq!(decline(not_utf8), Decline::Malformed);
    let truncated = span_bytes(1, &[], &[])[..20].to_vec();
    assert_eq!(decline(truncated), Decline::Malformed);
}

#[test]
fn a_trace_of_more_origins_than_it_numbers_is_declined() {
    let mut data = trace_of(&[span_bytes(1, &[], &[])]);
    // `TraceData` shares the last origin's index past `u16::MAX` of them: their spans' origins are unknown.
    data.origins.resize(u16::MAX as usize, crate::model::OriginSlot::default());
    assert_eq!(KeptWriter::new(&Redaction::default()).unwrap().write(&data, &[], "", ""), Err(Decline::Origins));
    data.origins.truncate(u16::MAX as usize - 1);
    assert!(KeptWriter::new(&Redaction::default()).unwrap().write(&data, &[], "", "").is_ok());
}

#[test]
fn spans_are_written_back_in_upbs_order_defaults_left_out_unknown_fields_last() {
    // Name before ids, kind sent as 0, an unknown field, then a kind past 32 bits (upb: its low 32 bits).
    let mut payload = field(0x2a, b"n");
    payload.extend([0x30, 0x00]);
    payload.extend([0xa8, 0x06, 0x07]);
    payload.extend(field(0x12, &[1; 8]));
    payload.extend(field(0x0a, &TRACE));
    payload.push(0x30);
    push_varint(&mut payload, (1u64 << 32) | 3);
    payload.extend(field(0x7a, b"")); // an empty status: present, written back empty
    let out = write(&Redaction::default(), &trace_of(&[payload]), &[], "", "");
    let mut expected = field(0x0a, &TRACE);
    expected.extend(field(0x12, &[1; 8]));
    expected.extend(field(0x2a, b"n"));
    expected.extend([0x30, 0x03, 0x7a, 0x00, 0xa8, 0x06, 0x07]);
    assert!(out.request.ends_with(&field(0x12, &expected)), "{}", hex(&out.request));
    assert_eq!(out.rows[0].kind, 3);
    // A negative kind: ten bytes, sign-extended.
    let negative = [span_bytes(1, &[], &[]), vec![0x30], vec![0xff; 9], vec![0x01]].concat();
    let out = write(&Redaction::default(), &trace_of(&[negative]), &[], "", "");
    assert_eq!(out.rows[0].kind, -1);
    assert!(out.request.windows(11).any(|w| w == [0x30, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01]));
}

#[test]
fn equal_resource_bytes_are_one_resource_and_each_origin_one_scope_in_first_met_order() {
    let (a, b) = (resource("a"), resource("b"));
    let (s1, s2) = (field(0x0a, b"s1"), field(0x0a, b"s2"));
    let spans = vec![(span_bytes(1, &[], &[]), a.clone(), s1.clone()), (span_bytes(2, &[], &[]), b.clone(), s1.clone()),
                     (span_bytes(3, &[], &[]), a.clone(), s2.clone()), (span_bytes(4, &[], &[]), a.clone(), s1.clone())];
    let out = write(&Redaction::default(), &trace_with_origins(spans), &[], "", "");
    let order: Vec<(&str, &str)> = out.rows.iter().map(|r| (r.span_id.as_str(), r.service_name.as_str())).collect();
    assert_eq!(order, [("0101010101010101", "a"), ("0404040404040404", "a"), ("0303030303030303", "a"),
                       ("0202020202020202", "b")]);
    let mut resources = 0;
    crate::wire::each_message(&out.request, 0, out.request.len(), 1, 1, |_, _| {
        resources += 1;
        Ok(())
    }).unwrap();
    assert_eq!(resources, 2);
}

#[test]
fn an_empty_trace_is_an_empty_request() {
    let out = write(&default_redaction(), &TraceData::new(TRACE), &[], "p", "8");
    assert_eq!(out, KeptOut { request: Vec::new(), rows: Vec::new(), spans: 0, redacted: RedactionCounts::default() });
}

#[test]
fn one_row_per_request_a_joined_client_record_described_by_its_server_record() {
    let server = Record::new(TRACE, [1; 8]);
    let mut joined = Record::new(TRACE, [2; 8]);
    joined.side = Side::Client;
    joined.joined_span_id = Some([1; 8]);
    let mut alone = Record::new(TRACE, [3; 8]);
    alone.side = Side::Client;
    let records = [server, joined, alone];
    let kept: Vec<SpanId> = one_per_request(&records).map(|r| r.span_id).collect();
    assert_eq!(kept, [[1; 8], [3; 8]]);
}

#[test]
fn counts_are_by_reason_in_pythons_order() {
    let names: Vec<&str> = counts(1, 2, 3, 4, 5).by_reason().iter().map(|(n, _)| *n).collect();
    assert_eq!(names, ["content_key", "free_text", "content_event", "not_allowed", "url_reduced"]);
    assert_eq!(counts(1, 2, 3, 4, 5).by_reason().map(|(_, n)| n), [1, 2, 3, 4, 5]);
}

// --- properties --------------------------------------------------------------------------------------------

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Any bytes as a span, resource and scope: the writer never panics; what it writes is a valid
    /// request of one row per span, and the same again from a writer whose key cache is warm.
    #[test]
    fn any_bytes_are_written_as_a_valid_request_or_declined(
        payload in proptest::collection::vec(any::<u8>(), 0..200),
        resource_bytes in proptest::collection::vec(any::<u8>(), 0..40),
        attribute in "[a-z._]{0,12}",
        text in "\\PC{0,40}",
    ) {
        let mut spans = vec![(payload, resource_bytes, Vec::new())];
        spans.push((span_bytes(9, &[(&attribute, string_value(&text))], &status(&text, 2)), resource("svc"), Vec::new()));
        let data = trace_with_origins(spans);
        let mut writer = KeptWriter::new(&default_redaction()).unwrap();
        if let Ok(out) = writer.write(&data, &[], "p", "8") {
            prop_assert!(crate::wire::validate(&out.request, 0, out.request.len(), crate::wire::Msg::Request, 1).is_ok());
            prop_assert_eq!(out.rows.len(), out.spans);
            prop_assert_eq!(writer.write(&data, &[], "p", "8"), Ok(out));
        }
    }
}
