//! What Python declares as data, compiled: the shape table (`adapters/shapes.py` `declaration()`,
//! handed over as JSON at start-up). One table, two interpreters: Python's `classify` and
//! `shapes::ShapeTable::read`; nothing about an engine's attributes is written here or there but in
//! the table, so adding an attribute an emitter sends is a row in Python's table.
//!
//! Every error names what was wrong and where (`shapes[3].reads[2]: unknown reading "x"`): the
//! table is ours, so an error is a bug, and start-up refuses it rather than reading spans wrongly.

use serde_json::{Map, Value as Json};

use crate::model::{Kind, Schema, ShapeInfo};
use crate::shapes::{Afterwards, Candidates, Read, RuleDef, ShapeDef, ShapeTable};

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
