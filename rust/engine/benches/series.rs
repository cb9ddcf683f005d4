//! What recording a request costs the `series` module, and what a scrape costs: the records of
//! the differential corpus (`tests/data/series/every_naming`: every naming on, two dimensions),
//! recorded once to make their series, then again and again (the steady state: every label key
//! known), with and without exemplars and exponential buckets; then render and snapshot. Each
//! figure is the best of five rounds (the machine is shared).
//!
//!     cargo bench -p otel-llm-engine --bench series

#[path = "../tests/series_json/mod.rs"]
#[allow(dead_code)]
mod series_json;

use std::hint::black_box;
use std::time::Instant;

use otel_llm_engine::record::Record;
use otel_llm_engine::series::{MetricsSpec, Series};

const ROUNDS: usize = 5;

/// The best of `ROUNDS` timings of `work`, in nanoseconds per `per` items.
fn best(per: usize, mut work: impl FnMut()) -> f64 {
    (0..ROUNDS)
        .map(|_| {
            let started = Instant::now();
            work();
            started.elapsed().as_nanos() as f64 / per as f64
        })
        .fold(f64::INFINITY, f64::min)
}

fn recording(spec: &MetricsSpec, records: &[Record<'static>], what: &str) -> Series {
    let mut series = Series::new(spec).unwrap();
    for record in records {
        series.record(record, false, 1.0);
    }
    let passes = 100;
    for exemplars in [false, true] {
        let per_record = best(passes * records.len(), || {
            for _ in 0..passes {
                for record in records {
                    series.record(black_box(record), exemplars, 1_700_000_000.0);
                }
            }
        });
        println!("record, {what}, exemplars {exemplars}: {per_record:.0} ns per record");
    }
    series
}

fn main() {
    let directory = series_json::data("every_naming");
    let mut spec = series_json::metrics_spec(&series_json::read_json(&directory.join("spec.json")));
    let json = series_json::read_json(&directory.join("records.json"));
    let records: Vec<Record<'static>> = json.as_array().unwrap().iter().map(series_json::record).collect();
    println!("{} records of both sides, every naming, two dimensions", records.len());
    let series = recording(&spec, &records, "exponential buckets (160, 20)");
    spec.exponential = None;
    recording(&spec, &records, "no exponential buckets");
    for openmetrics in [false, true] {
        let mut out = Vec::new();
        let per_render = best(1_000_000, || {
            out.clear();
            series.render(openmetrics, &mut out);
        });
        println!("render, openmetrics {openmetrics}: {per_render:.2} ms for {} bytes", out.len());
    }
    let per_snapshot = best(1_000_000, || {
        black_box(series.snapshot());
    });
    println!("snapshot: {per_snapshot:.2} ms");
}
