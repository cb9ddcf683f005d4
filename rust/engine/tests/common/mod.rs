//! What the corpus replays share: reading the values the Python generators wrote.

use serde_json::Value;

/// A float a generator wrote as its Python `repr` (a string, NaN and infinities included, as
/// JSON numbers cannot say them; `null` for None): `str::parse` reads a `repr` back to the same float.
pub fn float(value: &Value) -> Option<f64> {
    let text = value.as_str()?;
    Some(match text {
        "nan" => f64::NAN,
        "inf" => f64::INFINITY,
        "-inf" => f64::NEG_INFINITY,
        _ => text.parse().unwrap_or_else(|_| panic!("not a float: {text}")),
    })
}

pub fn text(value: &Value) -> &str {
    value.as_str().unwrap_or_else(|| panic!("not a string: {value}"))
}

/// Bytes a generator wrote in hex (`bytes.hex()`).
pub fn hex_bytes<const N: usize>(hex: &str) -> [u8; N] {
    assert_eq!(hex.len(), 2 * N, "{hex}");
    std::array::from_fn(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap())
}

/// A corpus file of `tests/data`, parsed.
pub fn corpus(name: &str) -> Value {
    let path = format!("{}/tests/data/{name}/corpus.json", env!("CARGO_MANIFEST_DIR"));
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))).unwrap()
}
