//! What Python declares as data, compiled: the engine's whole configuration
//! (`otel_llm/service/declarations.py` `engine_declaration`, handed over as JSON at start-up), and
//! in it the shape table (`adapters/shapes.py` `declaration()`). One table, two interpreters:
//! Python's `classify` and `shapes::ShapeTable::read`; nothing about an engine's attributes is
//! written here or there but in the table, so adding an attribute an emitter sends is a row in
//! Python's table.
//!
//! Every error names what was wrong and where (`shapes[3].reads[2]: unknown reading "x"`): the
//! declaration is ours, so an error is a bug, and start-up refuses it rather than reading spans
//! wrongly. The sections other than the table are read as the differential corpora read them
//! (the same forms, written by the same Python functions).

use std::collections::HashMap;

use serde_json::{Map, Value as Json};

use crate::accounting::{AccountingSettings, AccountingSpec, AccountingSpecs, Objectives, Price};
use crate::buffer::AssemblySettings;
use crate::decide::{PolicyConfig, PolicyMetric, Rule, SamplerConfig};
use crate::engine::{AccountingConfig, EngineConfig, TableConfig};
use crate::ingest::IngestSettings;
use crate::kept::Redaction;
use crate::model::{Kind, Schema, ShapeInfo};
use crate::record::{known_field, RecordField, Side};
use crate::records::{Dimension, RecordSettings, ResourceModelRule, TenantRule};
use crate::series::{
    CounterSpec, ExponentialLimits, HistogramSpec, LabelSource, MetricsSpec, NamingSpec, Number, SegmentsSpec, ValueSpec,
};
use crate::shapes::{Afterwards, Candidates, Read, RuleDef, ShapeDef, ShapeTable};

/// The engine's configuration from `engine_declaration()`'s JSON.
pub fn engine_config(json: &str) -> Result<EngineConfig, String> {
    let root: Json = serde_json::from_str(json).map_err(|e| format!("the engine declaration is not JSON: {e}"))?;
    let root = object(&root, "the engine declaration")?;
    let section = |name: &str| field(root, name, "the engine declaration");
    let table_json = serde_json::to_string(section("table")?).map_err(|e| e.to_string())?;
    let table = shape_table(&table_json)?;
    let ShapeTable { schema, shapes, rules, candidates, .. } = table;
    Ok(EngineConfig {
        table: TableConfig { schema, shapes, rules, candidates },
        ingest: ingest(section("ingest")?)?,
        assembly: assembly(section("assembly")?)?,
        records: record_settings(section("records")?)?,
        carried: Vec::new(),
        sampler: match section("sampler")? {
            Json::Null => None,
            sampler => Some(sampler_config(sampler)?),
        },
        metrics: metrics_spec(section("metrics")?)?,
        accounting: match section("accounting")? {
            Json::Null => None,
            accounting => Some(accounting_config(accounting)?),
        },
        redaction: redaction(section("redaction")?)?,
        write_kept: flag(section("write_kept")?, "write_kept")?,
        shards: count(section("shards")?, "shards")?,
        clock_start_s: float(section("clock_start_s")?, "clock_start_s")?,
    })
}

fn ingest(json: &Json) -> Result<IngestSettings, String> {
    let at = "ingest";
    let o = object(json, at)?;
    Ok(IngestSettings {
        max_attributes: count(field(o, "max_attributes", at)?, at)?,
        max_value_bytes: count(field(o, "max_value_bytes", at)?, at)?,
        max_latency_s: float(field(o, "max_latency_s", at)?, at)?,
        max_tokens: field(o, "max_tokens", at)?.as_i64().ok_or("ingest: max_tokens is an int")?,
        abs_tolerance_s: float(field(o, "abs_tolerance_s", at)?, at)?,
        rel_tolerance: float(field(o, "rel_tolerance", at)?, at)?,
    })
}

fn assembly(json: &Json) -> Result<AssemblySettings, String> {
    let at = "assembly";
    let o = object(json, at)?;
    Ok(AssemblySettings {
        decision_wait_s: float(field(o, "decision_wait_s", at)?, at)?,
        grace_s: float(field(o, "grace_s", at)?, at)?,
        max_open_call_wait_s: float(field(o, "max_open_call_wait_s", at)?, at)?,
        max_open_calls_per_sender: count(field(o, "max_open_calls_per_sender", at)?, at)?,
        max_traces: count(field(o, "max_traces", at)?, at)?,
        max_spans_per_trace: u32::try_from(count(field(o, "max_spans_per_trace", at)?, at)?)
            .map_err(|_| "assembly: max_spans_per_trace past 2^32".to_owned())?,
        decided_cache_size: count(field(o, "decided_cache_size", at)?, at)?,
    })
}

fn record_settings(json: &Json) -> Result<RecordSettings, String> {
    let at = "records";
    let o = object(json, at)?;
    let map = |json: &Json, at: &str| -> Result<HashMap<String, String>, String> {
        object(json, at)?.iter().map(|(k, v)| Ok((k.clone(), text(v, at)?.to_owned()))).collect()
    };
    Ok(RecordSettings {
        resource_model_rules: array(field(o, "resource_model_rules", at)?, at)?.iter().map(|rule| {
            let pair = array(rule, at)?;
            let [attribute, values] = pair.as_slice() else { return Err(format!("{at}: [attribute, values] expected")) };
            Ok(ResourceModelRule { attribute: text(attribute, at)?.to_owned(), values: map(values, at)? })
        }).collect::<Result<_, String>>()?,
        default_model: text(field(o, "default_model", at)?, at)?.to_owned(),
        default_operation: text(field(o, "default_operation", at)?, at)?.to_owned(),
        model_from_service_name: flag(field(o, "model_from_service_name", at)?, at)?,
        edge_ttft_attributes: texts(field(o, "edge_ttft_attributes", at)?, at)?,
        first_token_events: texts(field(o, "first_token_events", at)?, at)?,
        dimensions: array(field(o, "dimensions", at)?, at)?.iter().map(|d| {
            let parts = array(d, at)?;
            let [name, attribute, allowed, other] = parts.as_slice() else {
                return Err(format!("{at}: [name, attribute, allowed, other] expected"));
            };
            Ok(Dimension { name: text(name, at)?.to_owned(), attribute: text(attribute, at)?.to_owned(),
                           allowed: texts(allowed, at)?.into_iter().collect(), other: text(other, at)?.to_owned() })
        }).collect::<Result<_, String>>()?,
        tenant: match field(o, "tenant", at)? {
            Json::Null => None,
            tenant => {
                let parts = array(tenant, at)?;
                let [attributes, allowed, other] = parts.as_slice() else {
                    return Err(format!("{at}: tenant [attributes, allowed, other] expected"));
                };
                Some(TenantRule { attributes: texts(attributes, at)?, allowed: texts(allowed, at)?.into_iter().collect(),
                                  other: text(other, at)?.to_owned() })
            }
        },
        max_latency_s: float(field(o, "max_latency_s", at)?, at)?,
        lora_adapters: map(field(o, "lora_adapters", at)?, at)?,
        compensated_sum: flag(field(o, "compensated_sum", at)?, at)?,
    })
}

fn policy_metric(json: &Json, at: &str) -> Result<PolicyMetric, String> {
    let name = text(json, at)?;
    PolicyMetric::parse(name).ok_or_else(|| format!("{at}: no policy metric {name:?}"))
}

fn limits(json: &Json, at: &str) -> Result<Vec<(PolicyMetric, f64)>, String> {
    object(json, at)?.iter().map(|(name, limit)| {
        let metric = PolicyMetric::parse(name).ok_or_else(|| format!("{at}: no policy metric {name:?}"))?;
        Ok((metric, float(limit, at)?))
    }).collect()
}

fn sampler_config(json: &Json) -> Result<SamplerConfig, String> {
    let at = "sampler";
    let o = object(json, at)?;
    let policies = array(field(o, "policies", at)?, at)?.iter().enumerate().map(|(i, policy)| {
        let at = format!("sampler.policies[{i}]");
        let p = object(policy, &at)?;
        let rule = match text(field(p, "type", &at)?, &at)? {
            "errors" => Rule::Errors,
            "slo" => Rule::Slo {
                thresholds: limits(field(p, "thresholds", &at)?, &at)?,
                per_model: object(field(p, "per_model", &at)?, &at)?.iter()
                    .map(|(model, l)| Ok((model.clone(), limits(l, &at)?))).collect::<Result<_, String>>()?,
            },
            "slowest" => Rule::Slowest {
                metrics: array(field(p, "metrics", &at)?, &at)?.iter().map(|m| policy_metric(m, &at))
                    .collect::<Result<_, _>>()?,
                quantile: float(field(p, "quantile", &at)?, &at)?,
                window_s: float(field(p, "window", &at)?, &at)?,
            },
            "probabilistic" => Rule::Probabilistic { sampling_percentage: float(field(p, "sampling_percentage", &at)?, &at)? },
            other => return Err(format!("{at}: no policy type {other:?}")),
        };
        Ok(PolicyConfig { name: text(field(p, "name", &at)?, &at)?.to_owned(), rule })
    }).collect::<Result<_, String>>()?;
    Ok(SamplerConfig {
        policies,
        traces_per_second: float(field(o, "traces_per_second", at)?, at)?,
        per_model_traces_per_second: float(field(o, "per_model_traces_per_second", at)?, at)?,
        applies_to: texts(field(o, "applies_to", at)?, at)?,
        max_models: count(field(o, "max_models", at)?, at)?,
    })
}

fn record_field(json: &Json, at: &str) -> Result<RecordField, String> {
    let name = text(json, at)?;
    known_field(name).ok_or_else(|| format!("{at}: RequestRecord has no field {name:?}"))
}

fn value_spec(json: &Json, at: &str) -> Result<ValueSpec, String> {
    let o = object(json, at)?;
    let Some((kind, args)) = o.iter().next() else { return Err(format!("{at}: a value declaration expected")) };
    let arg = |i: usize| args.get(i).ok_or_else(|| format!("{at}: {kind} takes more arguments"));
    Ok(match kind.as_str() {
        "field" => ValueSpec::Field(record_field(args, at)?),
        "constant" => ValueSpec::Constant(match args {
            Json::Null => None,
            number => Some(match number.get("int") {
                Some(int) => Number::Int(int.as_i64().ok_or_else(|| format!("{at}: an int constant"))?),
                None => Number::Float(float(&number["float"], at)?),
            }),
        }),
        "difference" => ValueSpec::Difference(record_field(arg(0)?, at)?, record_field(arg(1)?, at)?),
        "ratio" => ValueSpec::Ratio {
            numerator: record_field(arg(0)?, at)?,
            denominator: record_field(arg(1)?, at)?,
            offset: match arg(2)? {
                Json::Null => None,
                offset => Some(float(offset, at)?),
            },
        },
        "unless_at_most" => ValueSpec::UnlessAtMost {
            field: record_field(arg(0)?, at)?, guard: record_field(arg(1)?, at)?,
            limit: arg(2)?.as_i64().ok_or_else(|| format!("{at}: an int limit"))?,
        },
        "if_set" => ValueSpec::IfSet { field: record_field(arg(0)?, at)?, then: Box::new(value_spec(arg(1)?, at)?) },
        other => return Err(format!("{at}: unknown value kind {other:?}")),
    })
}

fn fixed_label(json: &Json, at: &str) -> Result<Option<(String, String)>, String> {
    match json {
        Json::Null => Ok(None),
        pair => {
            let pair = array(pair, at)?;
            let [name, value] = pair.as_slice() else { return Err(format!("{at}: [name, value] expected")) };
            Ok(Some((text(name, at)?.to_owned(), text(value, at)?.to_owned())))
        }
    }
}

fn metrics_spec(json: &Json) -> Result<MetricsSpec, String> {
    let at = "metrics";
    let o = object(json, at)?;
    let namings = array(field(o, "namings", at)?, at)?.iter().enumerate().map(|(i, naming)| {
        let at = format!("metrics.namings[{i}]");
        let n = object(naming, &at)?;
        let side = text(field(n, "side", &at)?, &at)?;
        Ok(NamingSpec {
            key: text(field(n, "key", &at)?, &at)?.to_owned(),
            side: Side::parse(side).ok_or_else(|| format!("{at}: no side {side:?}"))?,
            label_names: texts(field(n, "label_names", &at)?, &at)?,
            labels: array(field(n, "labels", &at)?, &at)?.iter().map(|label| match label {
                Json::Array(pair) => match pair.as_slice() {
                    [first, fallback] => Ok(LabelSource::Either(record_field(first, &at)?, record_field(fallback, &at)?)),
                    _ => Err(format!("{at}: a label is a field or [field, fallback]")),
                },
                name => Ok(LabelSource::Field(record_field(name, &at)?)),
            }).collect::<Result<_, String>>()?,
            histograms: array(field(n, "histograms", &at)?, &at)?.iter().map(|h| {
                let h = object(h, &at)?;
                let name = text(field(h, "name", &at)?, &at)?;
                let at = format!("{at}.{name}");
                Ok(HistogramSpec {
                    name: name.to_owned(),
                    unit: text(field(h, "unit", &at)?, &at)?.to_owned(),
                    description: text(field(h, "description", &at)?, &at)?.to_owned(),
                    buckets: floats(field(h, "buckets", &at)?, &at)?,
                    value: value_spec(field(h, "value", &at)?, &at)?,
                    success_only: flag(field(h, "success_only", &at)?, &at)?,
                    fixed_label: fixed_label(field(h, "fixed_label", &at)?, &at)?,
                    per_step: match field(h, "per_step", &at)? {
                        Json::Null => None,
                        step => Some(record_field(step, &at)?),
                    },
                    buckets_by_model: array(field(h, "buckets_by_model", &at)?, &at)?.iter().map(|pair| {
                        let pair = array(pair, &at)?;
                        let [model, bounds] = pair.as_slice() else { return Err(format!("{at}: [model, buckets] expected")) };
                        Ok((text(model, &at)?.to_owned(), floats(bounds, &at)?))
                    }).collect::<Result<_, String>>()?,
                })
            }).collect::<Result<_, String>>()?,
            counters: array(field(n, "counters", &at)?, &at)?.iter().map(|c| {
                let c = object(c, &at)?;
                let name = text(field(c, "name", &at)?, &at)?;
                let at = format!("{at}.{name}");
                Ok(CounterSpec {
                    name: name.to_owned(),
                    unit: text(field(c, "unit", &at)?, &at)?.to_owned(),
                    description: text(field(c, "description", &at)?, &at)?.to_owned(),
                    value: value_spec(field(c, "value", &at)?, &at)?,
                    by_outcome: flag(field(c, "by_outcome", &at)?, &at)?,
                    fixed_label: fixed_label(field(c, "fixed_label", &at)?, &at)?,
                })
            }).collect::<Result<_, String>>()?,
            schema_url: text(field(n, "schema_url", &at)?, &at)?.to_owned(),
        })
    }).collect::<Result<_, String>>()?;
    let segments = object(field(o, "segments", at)?, "metrics.segments")?;
    let seg_at = "metrics.segments";
    Ok(MetricsSpec {
        namings,
        segments: SegmentsSpec {
            name: text(field(segments, "name", seg_at)?, seg_at)?.to_owned(),
            unit: text(field(segments, "unit", seg_at)?, seg_at)?.to_owned(),
            description: text(field(segments, "description", seg_at)?, seg_at)?.to_owned(),
            buckets: floats(field(segments, "buckets", seg_at)?, seg_at)?,
        },
        dimension_names: texts(field(o, "dimension_names", at)?, at)?,
        series_limit: count(field(o, "series_limit", at)?, at)?,
        series_limit_bytes: count(field(o, "series_limit_bytes", at)?, at)? as u64,
        max_label_value_bytes: count(field(o, "max_label_value_bytes", at)?, at)?,
        exponential: match field(o, "exponential", at)? {
            Json::Null => None,
            pair => {
                let pair = array(pair, at)?;
                let [size, scale] = pair.as_slice() else { return Err(format!("{at}: exponential [max_size, max_scale]")) };
                Some(ExponentialLimits {
                    max_size: count(size, at)?,
                    max_scale: scale.as_i64().and_then(|s| i32::try_from(s).ok()).ok_or("metrics: max_scale")?,
                })
            }
        },
    })
}

fn objectives(json: &Json, at: &str) -> Result<Option<Objectives>, String> {
    if json.is_null() {
        return Ok(None);
    }
    let o = object(json, at)?;
    let optional = |name: &str| -> Result<Option<f64>, String> {
        match field(o, name, at)? {
            Json::Null => Ok(None),
            value => float(value, at).map(Some),
        }
    };
    Ok(Some(Objectives { ttft_s: optional("ttft_s")?, tpot_s: optional("tpot_s")?, e2e_s: optional("e2e_s")?,
                         target: optional("target")? }))
}

fn accounting_config(json: &Json) -> Result<AccountingConfig, String> {
    let at = "accounting";
    let o = object(json, at)?;
    let s = object(field(o, "settings", at)?, at)?;
    let settings = AccountingSettings {
        tokens: flag(field(s, "tokens", at)?, at)?,
        currency: text(field(s, "currency", at)?, at)?.to_owned(),
        prices: object(field(s, "prices", at)?, at)?.iter().map(|(model, price)| {
            let p = object(price, at)?;
            Ok((model.clone(), Price { input: optional_float(field(p, "input", at)?, at)?,
                                       output: optional_float(field(p, "output", at)?, at)?,
                                       cached_input: optional_float(field(p, "cached_input", at)?, at)? }))
        }).collect::<Result<_, String>>()?,
        default_objectives: objectives(field(s, "default_objectives", at)?, at)?,
        objectives_by_model: object(field(s, "objectives_by_model", at)?, at)?.iter().map(|(model, o)| {
            Ok((model.clone(), objectives(o, at)?.ok_or_else(|| format!("{at}: {model}'s objectives"))?))
        }).collect::<Result<_, String>>()?,
    };
    let families = texts(field(o, "families", at)?, at)?;
    let specs = object(field(o, "specs", at)?, at)?;
    let spec = |position: usize| -> Result<AccountingSpec, String> {
        let name = families.get(position).ok_or_else(|| format!("{at}: five families expected"))?;
        let declared = object(field(specs, name, at)?, at)?;
        Ok(AccountingSpec { name: name.clone(), description: text(field(declared, "description", at)?, at)?.to_owned(),
                            label_names: texts(field(declared, "label_names", at)?, at)? })
    };
    Ok(AccountingConfig {
        settings,
        specs: AccountingSpecs { tenant_tokens: spec(0)?, request_cost: spec(1)?, unpriced_tokens: spec(2)?,
                                 slo_requests: spec(3)?, slo_target: spec(4)? },
    })
}

fn redaction(json: &Json) -> Result<Redaction, String> {
    let at = "redaction";
    let o = object(json, at)?;
    Ok(Redaction {
        key_prefixes: texts(field(o, "key_prefixes", at)?, at)?,
        key_patterns: texts(field(o, "key_patterns", at)?, at)?,
        event_names: texts(field(o, "event_names", at)?, at)?,
        max_free_text_bytes: count(field(o, "max_free_text_bytes", at)?, at)?,
        allowed_keys: texts(field(o, "allowed_keys", at)?, at)?,
        allowed_patterns: texts(field(o, "allowed_patterns", at)?, at)?,
        metadata_keys: match field(o, "metadata_keys", at)? {
            Json::Null => None,
            keys => Some(texts(keys, at)?),
        },
        url_keys: texts(field(o, "url_keys", at)?, at)?,
        status_message_key: text(field(o, "status_message_key", at)?, at)?.to_owned(),
        error_type_key: text(field(o, "error_type_key", at)?, at)?.to_owned(),
    })
}

/// The shape table from `shapes.declaration()`'s JSON.
pub fn shape_table(json: &str) -> Result<ShapeTable, String> {
    let root: Json = serde_json::from_str(json).map_err(|e| format!("the shape table is not JSON: {e}"))?;
    let root = object(&root, "the shape table")?;
    let schema = schema(field(root, "fields", "the shape table")?)?;
    let shapes_json = array(field(root, "shapes", "the shape table")?, "shapes")?;
    let names: Vec<&str> = shapes_json.iter().enumerate()
        .map(|(i, s)| object(s, &format!("shapes[{i}]")).and_then(|o| text(field(o, "adapter", "a shape")?, "adapter")))
        .collect::<Result<_, _>>()?;
    let shapes = shapes_json.iter().enumerate()
        .map(|(i, s)| shape(s, &schema, &format!("shapes[{i}]")))
        .collect::<Result<Vec<_>, _>>()?;
    let rules = array(field(root, "rules", "the shape table")?, "rules")?.iter().enumerate()
        .map(|(i, r)| rule(r, &names, &format!("rules[{i}]")))
        .collect::<Result<Vec<_>, _>>()?;
    let candidates = candidates(field(root, "candidates", "the shape table")?)?;
    ShapeTable::new(schema, shapes, rules, candidates)
}

fn schema(json: &Json) -> Result<Schema, String> {
    let fields = array(json, "fields")?.iter().enumerate().map(|(i, f)| {
        let at = format!("fields[{i}]");
        let pair = array(f, &at)?;
        let [name, kind] = pair.as_slice() else { return Err(format!("{at}: [name, kind] expected")) };
        let kind_name = text(kind, &at)?;
        let kind = Kind::parse(kind_name).ok_or_else(|| format!("{at}: unknown kind {kind_name:?}"))?;
        Ok((text(name, &at)?.to_owned(), kind))
    }).collect::<Result<Vec<_>, String>>()?;
    Schema::new(fields)
}

fn shape(json: &Json, schema: &Schema, at: &str) -> Result<ShapeDef, String> {
    let o = object(json, at)?;
    let info = ShapeInfo {
        adapter: text(field(o, "adapter", at)?, at)?.to_owned(),
        engine_kind: text(field(o, "engine_kind", at)?, at)?.to_owned(),
        part: text(field(o, "part", at)?, at)?.to_owned(),
        may_be_gateway: flag(field(o, "may_be_gateway", at)?, at)?,
        python_records: flag(field(o, "python_records", at)?, at)?,
    };
    let reads = array(field(o, "reads", at)?, at)?.iter().enumerate().map(|(i, r)| {
        let at = format!("{at}.reads[{i}]");
        let pair = array(r, &at)?;
        let [fields, read_json] = pair.as_slice() else { return Err(format!("{at}: [fields, read] expected")) };
        let ids = texts(fields, &at)?.into_iter()
            .map(|name| schema.id(&name).ok_or_else(|| format!("{at}: undeclared field {name:?}")))
            .collect::<Result<Vec<_>, _>>()?;
        Ok((ids, read(read_json, &at)?))
    }).collect::<Result<Vec<_>, String>>()?;
    let afterwards = texts(field(o, "afterwards", at)?, at)?.into_iter().map(|name| match name.as_str() {
        "sglang_single_output" => Ok(Afterwards::SglangSingleOutput),
        "tgi_unfinished" => Ok(Afterwards::TgiUnfinished),
        other => Err(format!("{at}: unknown afterwards {other:?}")),
    }).collect::<Result<Vec<_>, _>>()?;
    Ok(ShapeDef {
        info, reads, afterwards,
        python_reading: flag(field(o, "python_reading", at)?, at)?,
        reads_attributes: flag(field(o, "reads_attributes", at)?, at)?,
    })
}

fn read(json: &Json, at: &str) -> Result<Read, String> {
    let o = object(json, at)?;
    let how = text(field(o, "how", at)?, at)?;
    let keys = texts(field(o, "keys", at)?, at)?;
    let arg = field(o, "arg", at)?;
    let one_key = || match keys.as_slice() {
        [key] => Ok(key.clone()),
        _ => Err(format!("{at}: {how} reads one key, given {}", keys.len())),
    };
    let some_keys = || if keys.is_empty() { Err(format!("{at}: {how} reads at least one key")) } else { Ok(keys.clone()) };
    Ok(match how {
        "seconds" => Read::Seconds(some_keys()?),
        "milliseconds" => Read::Milliseconds(some_keys()?),
        "count" => Read::Count(some_keys()?),
        "text" => Read::Text(some_keys()?),
        "first_text" => Read::FirstText(some_keys()?),
        "finish_reason" => Read::FinishReason(one_key()?),
        "rust_duration" => Read::RustDuration(one_key()?),
        "constant" => Read::Constant(text(arg, at)?.to_owned()),
        "by_span_name" => {
            let pair = array(arg, at)?;
            let [mapping, default] = pair.as_slice() else { return Err(format!("{at}: [mapping, default] expected")) };
            Read::BySpanName(pairs(mapping, at)?, text(default, at)?.to_owned())
        }
        "text_or_mapped" => {
            let [key, fallback] = keys.as_slice() else { return Err(format!("{at}: text_or_mapped reads [key, fallback]")) };
            Read::TextOrMapped(key.clone(), fallback.clone(), pairs(arg, at)?)
        }
        "error" => Read::Error,
        "token_events" => Read::TokenEvents,
        "cache_and_spec" => {
            let o = object(arg, at)?;
            let spec = texts(field(o, "spec_keys", at)?, at)?;
            let spec_keys: [String; 3] = spec.try_into().map_err(|_| format!("{at}: three spec_keys expected"))?;
            Read::CacheAndSpec {
                read_keys: texts(field(o, "read_keys", at)?, at)?,
                write_keys: texts(field(o, "write_keys", at)?, at)?,
                spec_keys,
            }
        }
        other => return Err(format!("{at}: unknown reading {other:?}")),
    })
}

fn rule(json: &Json, shapes: &[&str], at: &str) -> Result<RuleDef, String> {
    let o = object(json, at)?;
    let shape = match field(o, "shape", at)? {
        Json::Null => None,
        name => {
            let name = text(name, at)?;
            Some(shapes.iter().position(|s| *s == name).ok_or_else(|| format!("{at}: undeclared shape {name:?}"))?)
        }
    };
    let malformed = match field(o, "malformed", at)? {
        Json::Null => None,
        reason => Some(text(reason, at)?.to_owned()),
    };
    if shape.is_some() == malformed.is_some() {
        return Err(format!("{at}: a rule gives a shape or a refusal"));
    }
    Ok(RuleDef {
        shape, malformed,
        kinds: ints(field(o, "kinds", at)?, at)?,
        names: texts(field(o, "names", at)?, at)?,
        present: texts(field(o, "present", at)?, at)?,
        absent: texts(field(o, "absent", at)?, at)?,
        any_of: texts(field(o, "any_of", at)?, at)?,
        equals: pairs(field(o, "equals", at)?, at)?,
        is_true: texts(field(o, "true", at)?, at)?,
        no_attributes: flag(field(o, "no_attributes", at)?, at)?,
        has_events: flag(field(o, "has_events", at)?, at)?,
    })
}

fn candidates(json: &Json) -> Result<Candidates, String> {
    let at = "candidates";
    let o = object(json, at)?;
    Ok(Candidates {
        kinds: ints(field(o, "kinds", at)?, at)?,
        names: texts(field(o, "names", at)?, at)?,
        contains: texts(field(o, "contains", at)?, at)?,
        first_words: texts(field(o, "first_words", at)?, at)?,
        prefixes: texts(field(o, "prefixes", at)?, at)?,
    })
}

// --- JSON access with errors that say where ------------------------------------------------------

fn object<'j>(json: &'j Json, at: &str) -> Result<&'j Map<String, Json>, String> {
    json.as_object().ok_or_else(|| format!("{at}: an object expected"))
}

fn field<'j>(o: &'j Map<String, Json>, name: &str, at: &str) -> Result<&'j Json, String> {
    o.get(name).ok_or_else(|| format!("{at}: no {name:?}"))
}

fn array<'j>(json: &'j Json, at: &str) -> Result<&'j Vec<Json>, String> {
    json.as_array().ok_or_else(|| format!("{at}: a list expected"))
}

fn text<'j>(json: &'j Json, at: &str) -> Result<&'j str, String> {
    json.as_str().ok_or_else(|| format!("{at}: a string expected, got {json}"))
}

fn flag(json: &Json, at: &str) -> Result<bool, String> {
    json.as_bool().ok_or_else(|| format!("{at}: true or false expected, got {json}"))
}

fn texts(json: &Json, at: &str) -> Result<Vec<String>, String> {
    array(json, at)?.iter().map(|t| text(t, at).map(str::to_owned)).collect()
}

fn ints(json: &Json, at: &str) -> Result<Vec<i32>, String> {
    array(json, at)?.iter()
        .map(|n| n.as_i64().and_then(|n| i32::try_from(n).ok()).ok_or_else(|| format!("{at}: a span kind expected, got {n}")))
        .collect()
}

fn count(json: &Json, at: &str) -> Result<usize, String> {
    json.as_u64().and_then(|n| usize::try_from(n).ok()).ok_or_else(|| format!("{at}: a count expected, got {json}"))
}

/// A float as Python's `repr` wrote it (bit for bit), or a JSON number.
fn float(json: &Json, at: &str) -> Result<f64, String> {
    match json {
        Json::String(text) => match text.as_str() {
            "nan" => Ok(f64::NAN),
            "inf" => Ok(f64::INFINITY),
            "-inf" => Ok(f64::NEG_INFINITY),
            _ => text.parse().map_err(|_| format!("{at}: not a float: {text:?}")),
        },
        Json::Number(n) => n.as_f64().ok_or_else(|| format!("{at}: not a float: {n}")),
        other => Err(format!("{at}: a float expected, got {other}")),
    }
}

fn optional_float(json: &Json, at: &str) -> Result<Option<f64>, String> {
    if json.is_null() { Ok(None) } else { float(json, at).map(Some) }
}

fn floats(json: &Json, at: &str) -> Result<Vec<f64>, String> {
    array(json, at)?.iter().map(|f| float(f, at)).collect()
}

fn pairs(json: &Json, at: &str) -> Result<Vec<(String, String)>, String> {
    array(json, at)?.iter().map(|pair| {
        let pair = array(pair, at)?;
        let [key, value] = pair.as_slice() else { return Err(format!("{at}: [key, value] pairs expected")) };
        Ok((text(key, at)?.to_owned(), text(value, at)?.to_owned()))
    }).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINIMAL: &str = r#"{
        "fields": [["ttft_s","float"],["e2e_s","float"],["decode_s","float"],["completion_tokens","int"],
                   ["is_error","flag"],["error_type","text"]],
        "shapes": [{"adapter":"eng","engine_kind":"eng","part":"","may_be_gateway":false,"python_records":false,
                    "python_reading":false,"reads_attributes":true,"afterwards":["tgi_unfinished"],
                    "reads":[[["e2e_s"],{"how":"seconds","keys":["e2e"],"arg":null}],
                             [["is_error","error_type"],{"how":"error","keys":[],"arg":null}]]}],
        "rules": [{"shape":"eng","malformed":null,"kinds":[2],"names":[],"present":["e2e"],"absent":[],
                   "any_of":[],"equals":[["module","x"]],"true":[],"no_attributes":false,"has_events":false}],
        "candidates": {"kinds":[2,3],"names":["req"],"contains":[" Req "],"first_words":["chat"],"prefixes":[]}
    }"#;

    #[test]
    fn a_minimal_table_compiles_with_its_rows() {
        let table = shape_table(MINIMAL).unwrap();
        assert_eq!(table.shapes.len(), 1);
        assert_eq!(table.shapes[0].info.adapter, "eng");
        assert_eq!(table.shapes[0].afterwards, vec![Afterwards::TgiUnfinished]);
        assert_eq!(table.shapes[0].reads[0].1, Read::Seconds(vec!["e2e".into()]));
        assert_eq!(table.rules[0].shape, Some(0));
        assert_eq!(table.rules[0].equals, vec![("module".to_owned(), "x".to_owned())]);
        assert!(table.candidates.matches(1, "chat gpt"));
        assert!(!table.candidates.matches(1, "other"));
    }

    fn refused(edit: (&str, &str)) -> String {
        let json = MINIMAL.replacen(edit.0, edit.1, 1);
        assert_ne!(json, MINIMAL, "the edit {edit:?} must change the table");
        match shape_table(&json) {
            Ok(_) => panic!("{edit:?} accepted"),
            Err(error) => error,
        }
    }

    #[test]
    fn a_wrong_table_is_refused_saying_where() {
        assert!(refused(("\"seconds\"", "\"sekunden\"")).contains("shapes[0].reads[0]: unknown reading"));
        assert!(refused(("[\"e2e_s\"],{", "[\"e3e_s\"],{")).contains("undeclared field \"e3e_s\""));
        assert!(refused(("\"shape\":\"eng\"", "\"shape\":\"other\"")).contains("rules[0]: undeclared shape"));
        assert!(refused(("\"shape\":\"eng\"", "\"shape\":null")).contains("a shape or a refusal"));
        assert!(refused(("\"float\"", "\"double\"")).contains("fields[0]: unknown kind"));
        assert!(refused(("\"tgi_unfinished\"", "\"later\"")).contains("unknown afterwards"));
        assert!(refused(("\"kinds\":[2]", "\"kinds\":[\"2\"]")).contains("a span kind expected"));
        assert!(refused(("{", "[")).contains("not JSON"));
        // A reading given the wrong number of fields is the table's own check (ShapeTable::new).
        assert!(refused(("[[\"is_error\",\"error_type\"]", "[[\"is_error\"]")).contains("a reading of 2 fields"));
    }
}
