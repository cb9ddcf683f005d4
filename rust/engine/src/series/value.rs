//! A spec's value computed from a record as the Python value functions compute it
//! (`definitions.py` `Field`, `Constant`, `Difference`, `Ratio`, `UnlessAtMost`, and `IfSet` for
//! `adapter_naming`'s lambdas), with CPython's number rules: an `int` stays exact through a
//! difference, compares with a float bound exactly, and divides by another `int` correctly rounded.

use std::cmp::Ordering;

use crate::record::{FieldValue, Record, RecordField};

use super::spec::{Number, ValueSpec};

/// A Python number: `int` (wide enough for the difference of two `i64`s) or `float`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Num {
    Int(i128),
    Float(f64),
}

/// What a value function returns: a number, `None`, or a value Python's arithmetic or bisection
/// raises `TypeError` on (a text where a number is needed; no declared spec reads one).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Eval {
    Value(Num),
    Nothing,
    NotANumber,
}

impl Num {
    /// `float(x)`: an `int` rounds to nearest, ties to even, as `PyLong_AsDouble` does.
    pub(crate) fn as_f64(self) -> f64 {
        match self {
            // The same rounding either way; an i64's is one instruction, an i128's a library call.
            Num::Int(v) => match i64::try_from(v) {
                Ok(v) => v as f64,
                Err(_) => v as f64,
            },
            Num::Float(v) => v,
        }
    }

    fn of(number: Number) -> Num {
        match number {
            Number::Int(v) => Num::Int(i128::from(v)),
            Number::Float(v) => Num::Float(v),
        }
    }

    /// `bound < self`, as `bisect_left` compares (an `int` compared exactly, never through a float).
    #[inline]
    pub(crate) fn is_above(self, bound: f64) -> bool {
        match self {
            Num::Float(v) => bound < v,
            // Exact as a float up to 2^53: the float comparison is the exact one.
            Num::Int(v) if v.unsigned_abs() <= 1 << 53 => bound < self.as_f64(),
            Num::Int(v) => compare_float_int(bound, v) == Some(Ordering::Less),
        }
    }
}

/// Python's `float <=> int` comparison: exact, `None` for NaN.
pub(crate) fn compare_float_int(f: f64, i: i128) -> Option<Ordering> {
    if f.is_nan() {
        return None;
    }
    // Every i128 is below 2^127 in magnitude; past that a float (or an infinity) decides alone.
    const LIMIT: f64 = 170_141_183_460_469_231_731_687_303_715_884_105_728.0; // 2^127
    if f >= LIMIT {
        return Some(Ordering::Greater);
    }
    if f < -LIMIT {
        return Some(Ordering::Less);
    }
    let floor = f.floor();
    // Exact: |floor| < 2^127 and a float's floor is an integer.
    let whole = floor as i128;
    Some(match whole.cmp(&i) {
        Ordering::Equal if f > floor => Ordering::Greater,
        order => order,
    })
}

/// Python's `int / int`: the quotient correctly rounded (ties to even), not the quotient of two
/// rounded floats. `b != 0`; `|a|, |b| < 2^65`.
pub(crate) fn int_true_divide(a: i128, b: i128) -> f64 {
    debug_assert!(b != 0);
    let negative = (a < 0) != (b < 0);
    let (a, b) = (a.unsigned_abs(), b.unsigned_abs());
    let magnitude = if a < (1 << 53) && b < (1 << 53) {
        // Both exact as floats: IEEE division rounds the exact quotient once (CPython's fast path).
        a as f64 / b as f64
    } else if a == 0 {
        0.0
    } else {
        // At least 55 significant bits of quotient, the remainder folded into the last as a sticky
        // bit, then one rounding to 53 bits and an exact scaling by a power of two.
        let (a_bits, b_bits) = (128 - a.leading_zeros(), 128 - b.leading_zeros());
        let shift = (55 + b_bits).saturating_sub(a_bits);
        let numerator = a << shift;
        let quotient = (numerator / b) | u128::from(numerator % b != 0);
        quotient as f64 * power_of_two(-(shift as i32))
    };
    if negative {
        -magnitude
    } else {
        magnitude
    }
}

/// `2^exponent`, exactly (`-1022 <= exponent <= 1023`).
pub(crate) fn power_of_two(exponent: i32) -> f64 {
    debug_assert!((-1022..=1023).contains(&exponent));
    f64::from_bits(((exponent + 1023) as u64) << 52)
}

/// Python's truth test of a field's value (`if r.lora_adapter`).
fn truthy(value: Option<FieldValue<'_>>) -> bool {
    match value {
        None => false,
        Some(FieldValue::Text(t)) => !t.is_empty(),
        Some(FieldValue::Int(v)) => v != 0,
        Some(FieldValue::Float(v)) => v != 0.0,
        Some(FieldValue::Floats(v)) => !v.is_empty(),
    }
}

/// A field read as a number: `Nothing` for `None`, `NotANumber` for a text or a sequence.
fn number(value: Option<FieldValue<'_>>) -> Eval {
    match value {
        None => Eval::Nothing,
        Some(FieldValue::Int(v)) => Eval::Value(Num::Int(i128::from(v))),
        Some(FieldValue::Float(v)) => Eval::Value(Num::Float(v)),
        Some(FieldValue::Text(_)) | Some(FieldValue::Floats(_)) => Eval::NotANumber,
    }
}

fn read(record: &Record<'_>, field: RecordField) -> Eval {
    number(record.get(field))
}

/// The spec's value for `record` (`value(record)` in the generated observer).
pub(crate) fn evaluate(spec: &ValueSpec, record: &Record<'_>) -> Eval {
    match spec {
        ValueSpec::Field(field) => read(record, *field),
        ValueSpec::Constant(None) => Eval::Nothing,
        ValueSpec::Constant(Some(value)) => Eval::Value(Num::of(*value)),
        ValueSpec::Difference(minuend, subtrahend) => match (read(record, *minuend), read(record, *subtrahend)) {
            (Eval::Nothing, _) | (_, Eval::Nothing) => Eval::Nothing,
            (Eval::Value(a), Eval::Value(b)) => Eval::Value(match (a, b) {
                (Num::Int(a), Num::Int(b)) => Num::Int(a - b),
                (a, b) => Num::Float(a.as_f64() - b.as_f64()),
            }),
            _ => Eval::NotANumber,
        },
        ValueSpec::Ratio { numerator, denominator, offset } => {
            let numerator = read(record, *numerator);
            if numerator == Eval::Nothing {
                return Eval::Nothing;
            }
            let denominator_value = record.get(*denominator);
            if !truthy(denominator_value) {
                return Eval::Nothing;
            }
            let quotient = match (numerator, number(denominator_value)) {
                (Eval::Value(Num::Int(a)), Eval::Value(Num::Int(b))) => int_true_divide(a, b),
                (Eval::Value(a), Eval::Value(b)) => a.as_f64() / b.as_f64(),
                _ => return Eval::NotANumber,
            };
            Eval::Value(Num::Float(match offset {
                None => quotient,
                Some(offset) => offset + quotient,
            }))
        }
        ValueSpec::UnlessAtMost { field, guard, limit } => {
            let at_most = match read(record, *guard) {
                Eval::Nothing => false,
                Eval::NotANumber => return Eval::NotANumber,
                Eval::Value(Num::Int(g)) => g <= i128::from(*limit),
                Eval::Value(Num::Float(g)) => {
                    matches!(compare_float_int(g, i128::from(*limit)), Some(Ordering::Less | Ordering::Equal))
                }
            };
            if at_most {
                Eval::Nothing
            } else {
                read(record, *field)
            }
        }
        ValueSpec::IfSet { field, then } => {
            if truthy(record.get(*field)) {
                evaluate(then, record)
            } else {
                Eval::Nothing
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::Text;

    fn record() -> Record<'static> {
        Record::new([1; 16], [2; 8])
    }

    #[test]
    fn int_division_is_correctly_rounded() {
        // Values Python gives (3 / 7, (2**62 + 1) / 3, 1 / 2**62, (2**63 - 1) / (2**53 + 1)).
        assert_eq!(int_true_divide(3, 7), 0.42857142857142855);
        assert_eq!(int_true_divide((1 << 62) + 1, 3), 1.5372286728091292e18);
        assert_eq!(int_true_divide(1, 1 << 62), 2.168404344971009e-19);
        assert_eq!(int_true_divide(i128::from(i64::MAX), (1 << 53) + 1), 1023.9999999999999);
        assert_eq!(int_true_divide(-6, 4), -1.5);
        assert_eq!(int_true_divide(0, -5).to_bits(), (-0.0f64).to_bits());
        // A tie broken by the remainder: (2^54 + 2) / 2 = 2^53 + 1 (exactly halfway between floats):
        // ties to even, 2^53.
        assert_eq!(int_true_divide((1 << 54) + 2, 2), 9007199254740992.0);
        // (2^55 + 4 + 1) / 4 is just above the halfway point 2^53 + 1: rounds up.
        assert_eq!(int_true_divide((1 << 55) + 5, 4), 9007199254740994.0);
    }

    /// `tests/data/series/floats.json`'s quotients: Python's `a / b` of random ints up to 2^63.
    #[test]
    fn int_division_matches_python_on_the_corpus() {
        let corpus = crate::series::tests::floats_corpus();
        let rows = corpus["quotients"].as_array().unwrap();
        assert!(rows.len() > 1000);
        for row in rows {
            let (a, b) = (row[0].as_i64().unwrap(), row[1].as_i64().unwrap());
            let expected: f64 = row[2].as_str().unwrap().parse().unwrap();
            assert_eq!(int_true_divide(i128::from(a), i128::from(b)), expected, "{a} / {b}");
        }
    }

    #[test]
    fn floats_compare_with_ints_exactly() {
        let big = (1i128 << 53) + 1;
        assert_eq!(compare_float_int(9007199254740992.0, big), Some(Ordering::Less));
        assert_eq!(compare_float_int(2.5, 2), Some(Ordering::Greater));
        assert_eq!(compare_float_int(2.0, 2), Some(Ordering::Equal));
        assert_eq!(compare_float_int(-2.5, -2), Some(Ordering::Less));
        assert_eq!(compare_float_int(f64::NAN, 0), None);
        assert_eq!(compare_float_int(f64::INFINITY, i128::MAX), Some(Ordering::Greater));
        assert_eq!(compare_float_int(f64::NEG_INFINITY, i128::MIN), Some(Ordering::Less));
        assert!(Num::Int(big).is_above(9007199254740992.0));
        assert!(!Num::Int(5).is_above(5.0));
        assert!(!Num::Float(f64::NAN).is_above(1.0));
    }

    #[test]
    fn values_follow_the_python_functions() {
        let mut r = record();
        r.prompt_tokens = Some(10);
        r.cached_tokens = Some(4);
        r.completion_tokens = Some(1);
        r.tpot_s = Some(0.5);
        let difference = ValueSpec::Difference(RecordField::PromptTokens, RecordField::CachedTokens);
        assert_eq!(evaluate(&difference, &r), Eval::Value(Num::Int(6)));
        let ratio = ValueSpec::Ratio { numerator: RecordField::CachedTokens, denominator: RecordField::PromptTokens, offset: None };
        assert_eq!(evaluate(&ratio, &r), Eval::Value(Num::Float(0.4)));
        let offset = ValueSpec::Ratio { numerator: RecordField::CachedTokens, denominator: RecordField::PromptTokens, offset: Some(1.0) };
        assert_eq!(evaluate(&offset, &r), Eval::Value(Num::Float(1.4)));
        let unless = ValueSpec::UnlessAtMost { field: RecordField::TpotS, guard: RecordField::CompletionTokens, limit: 1 };
        assert_eq!(evaluate(&unless, &r), Eval::Nothing);
        r.completion_tokens = Some(2);
        assert_eq!(evaluate(&unless, &r), Eval::Value(Num::Float(0.5)));
        r.completion_tokens = None;
        assert_eq!(evaluate(&unless, &r), Eval::Value(Num::Float(0.5)));
        r.prompt_tokens = Some(0);
        assert_eq!(evaluate(&ratio, &r), Eval::Nothing, "a zero denominator is falsy");
        r.cached_tokens = None;
        assert_eq!(evaluate(&difference, &r), Eval::Nothing);
        assert_eq!(evaluate(&ValueSpec::Constant(Some(Number::Int(1))), &r), Eval::Value(Num::Int(1)));
        assert_eq!(evaluate(&ValueSpec::Constant(None), &r), Eval::Nothing);
        assert_eq!(evaluate(&ValueSpec::Field(RecordField::Model), &r), Eval::NotANumber);
    }

    #[test]
    fn differences_of_extreme_ints_stay_exact() {
        let mut r = record();
        r.prompt_tokens = Some(i64::MAX);
        r.cached_tokens = Some(i64::MIN);
        let difference = ValueSpec::Difference(RecordField::PromptTokens, RecordField::CachedTokens);
        assert_eq!(evaluate(&difference, &r), Eval::Value(Num::Int(i128::from(i64::MAX) - i128::from(i64::MIN))));
    }

    #[test]
    fn if_set_observes_only_records_that_name_the_field() {
        let mut r = record();
        r.prompt_tokens = Some(7);
        let spec = ValueSpec::IfSet { field: RecordField::LoraAdapter, then: Box::new(ValueSpec::Field(RecordField::PromptTokens)) };
        assert_eq!(evaluate(&spec, &r), Eval::Nothing);
        r.lora_adapter = Text::Borrowed("a1");
        assert_eq!(evaluate(&spec, &r), Eval::Value(Num::Int(7)));
    }
}
