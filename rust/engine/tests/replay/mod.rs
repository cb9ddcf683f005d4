//! What the end-to-end replays (`engine_declared.rs`, `engine_handoff.rs`) share: reading their
//! gzipped corpora and comparing expositions.

use std::collections::BTreeMap;
use std::fs;
use std::io::Read as _;
use std::path::Path;

use flate2::read::GzDecoder;
use serde_json::Value as Json;

/// A gzipped JSON corpus (`relative` to the crate).
pub fn load(relative: &str) -> Json {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(relative);
    let mut text = String::new();
    GzDecoder::new(fs::File::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display())))
        .read_to_string(&mut text).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// Bytes a generator wrote in hex.
pub fn hex(text: &str) -> Vec<u8> {
    (0..text.len()).step_by(2).map(|i| u8::from_str_radix(&text[i..i + 2], 16).unwrap()).collect()
}

/// An exposition's sample lines (HELP and TYPE lines apart), as a multiset.
pub fn samples(text: &str) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for line in text.lines().filter(|l| !l.is_empty() && !l.starts_with('#')) {
        *out.entry(line.to_owned()).or_insert(0) += 1;
    }
    out
}
