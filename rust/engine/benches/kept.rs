//! The kept-trace writer's cost: `cargo bench -p otel-llm-engine --bench kept`.
//!
//! The bench workload's kept traces (vLLM, SGLang and TGI requests under gateways, with their
//! records and segments: `tests/data/kept/bench.json.gz`) written under the default redaction and
//! under no redaction, a policy and a threshold stamped, many times over. Prints ns per span written, the best of seven repeats
//! (the trace's own spans; segment spans are extra output) and per trace.

use std::time::Instant;

use otel_llm_engine::kept::KeptWriter;

#[path = "../tests/common/mod.rs"]
#[allow(dead_code)] // the readers the corpora share: this one uses a few
mod common;
#[path = "../tests/common/kept_corpus.rs"]
#[allow(dead_code)]
mod kept_corpus;

fn main() {
    let corpus = kept_corpus::Corpus::load("bench");
    let spans: usize = corpus.traces.iter().map(|(data, _)| data.len()).sum();
    // With the records (bridge attributes and segment spans), and without (the spans' own writing).
    for (redaction, with_records) in [("default", true), ("allow_content", true), ("default", false)] {
        let mut writer = KeptWriter::new(&corpus.redactions[redaction]).unwrap();
        let rounds = 20;
        let mut written = 0usize;
        // The best of several repeats: the machine is shared, and a repeat others slowed says nothing.
        let best = (0..7).map(|_| {
            let started = Instant::now();
            for _ in 0..rounds {
                for (data, records) in &corpus.traces {
                    let records = if with_records { records.as_slice() } else { &[] };
                    written += writer.write(data, records, "slowest", "c").unwrap().spans;
                }
            }
            started.elapsed().as_nanos() as f64
        }).fold(f64::INFINITY, f64::min);
        let traces = (rounds * corpus.traces.len()) as f64;
        println!("{redaction:>13}, {}: {:.0} ns per span, {:.0} ns per trace ({} traces of {:.1} spans, {:.1} written)",
                 if with_records { "records" } else { "no records" }, best / (rounds * spans) as f64, best / traces,
                 corpus.traces.len(), spans as f64 / corpus.traces.len() as f64, written as f64 / (7.0 * traces));
    }
}
