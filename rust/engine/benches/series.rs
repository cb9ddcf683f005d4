//! What recording a request costs the `series` module, and what a scrape costs: the records of
//! the differential corpus (`tests/data/series/every_naming`: every naming on, two dimensions,
//! exponential buckets), recorded once to make their series, then again and again (the steady
//! state: every label key known), with and without exemplars; then render and snapshot.
//!
//!     cargo bench -p otel-llm-engine --bench series

#[path = "../tests/series_json/mod.rs"]
#[allow(dead_code)]
mod series_json;

use std::hint::black_box;
use std::time::Instant;

use otel_llm_engine::series::Series;

fn main() {
    let directory = series_json::data("every_naming");
    let spec = series_json::metrics_spec(&series_json::read_json(&directory.join("spec.json")));
    let json = series_json::read_json(&directory.join("records.json"));
    let records: Vec<_> = json.as_array().unwrap().iter().map(series_json::record).collect();
    let mut series = Series::new(&spec).unwrap();
    for record in &records {
        series.record(record, false, 1.0);
    }
    for exemplars in [false, true] {
        let passes = 200;
        let started = Instant::now();
        for _ in 0..passes {
            for record in &records {
                series.record(black_box(record), exemplars, 1_700_000_000.0);
            }
        }
        let per_record = started.elapsed().as_nanos() as f64 / (passes * records.len()) as f64;
        println!("record ({} records, exemplars {exemplars}): {per_record:.0} ns per record", records.len());
    }
    for openmetrics in [false, true] {
        let mut out = Vec::new();
        let started = Instant::now();
        let renders = 20;
        for _ in 0..renders {
            out.clear();
            series.render(openmetrics, &mut out);
        }
        let per_render = started.elapsed().as_secs_f64() * 1e3 / f64::from(renders);
        println!("render (openmetrics {openmetrics}): {per_render:.2} ms for {} bytes", out.len());
    }
    let started = Instant::now();
    let snapshot = black_box(series.snapshot());
    println!("snapshot: {:.2} ms for {} families", started.elapsed().as_secs_f64() * 1e3, snapshot.families.len());
}
