//! The trace buffer's cost per span at saturation-like load: `cargo bench -p otel-llm-engine --bench buffer`.
//!
//! Requests of one trace each (a gateway's root and child span, the engine's span under them, and
//! half the time a client span over the root sent later, as its own request), 20 000 new traces per
//! second of the simulated clock, so about as many are pending at once (grace 1 s); the buffer is
//! ticked every 10 ms of it and every completed trace's decision remembered, as the engine does.
//! Prints ns per span added (the whole `add_batch`, ticks and decisions included).

use std::time::Instant;

use otel_llm_engine::buffer::{AssemblySettings, Incoming, Remembered, TraceBuffer};
use otel_llm_engine::model::{NewSpan, SpanId, TraceData, TraceId, DROP, SPAN_KIND_CLIENT, SPAN_KIND_SERVER};

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        // xorshift64*: ids need only look random.
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn trace_id(&mut self) -> TraceId {
        let mut id = [0u8; 16];
        id[..8].copy_from_slice(&self.next().to_le_bytes());
        id[8..].copy_from_slice(&self.next().to_le_bytes());
        id
    }
}

fn span<'a>(payload: &'a [u8], span_id: SpanId, parent: Option<SpanId>, kind: i32) -> NewSpan<'a> {
    NewSpan {
        span_id, parent_span_id: parent, kind, status_code: 0, start_unix_ns: 1_700_000_000_000_000_000,
        end_unix_ns: 1_700_000_001_000_000_000, payload, trace_state: "", resource: b"\x0a\x10service.name=vllm",
        scope: b"\x0a\x04vllm", service_name: "vllm", observation: None, attrs_kept: true,
    }
}

/// The same spans put in a `TraceData` per trace and dropped when it holds them all, without a
/// buffer: what the trace's arena costs by itself, to tell the buffer's own share.
fn arena_only(traces: usize) -> f64 {
    let payload = vec![0x4a_u8; 240];
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let started = Instant::now();
    let mut held: std::collections::VecDeque<TraceData> = std::collections::VecDeque::new();
    for n in 0..traces {
        let mut data = TraceData::new(rng.trace_id());
        let (root, gateway, engine) = (rng.next().to_le_bytes(), rng.next().to_le_bytes(), rng.next().to_le_bytes());
        data.put(&span(&payload, engine, Some(gateway), SPAN_KIND_SERVER));
        data.put(&span(&payload, gateway, Some(root), SPAN_KIND_CLIENT));
        data.put(&span(&payload, root, None, SPAN_KIND_SERVER));
        if n % 2 == 0 {
            data.put(&span(&payload, rng.next().to_le_bytes(), Some([7; 8]), SPAN_KIND_CLIENT));
        }
        held.push_back(data);
        if held.len() > 20_000 {
            std::hint::black_box(held.pop_front());
        }
    }
    started.elapsed().as_secs_f64() * 1e9 / (traces as f64 * 3.5)
}

fn run(traces: usize) -> (f64, usize) {
    let mut buffer = TraceBuffer::new(AssemblySettings::default()).unwrap();
    let payload = vec![0x4a_u8; 240];
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let mut now = 1000.0;
    let mut spans = 0usize;
    let mut late_clients: Vec<TraceId> = Vec::new();
    let mut completions = Vec::new();
    let started = Instant::now();
    for n in 0..traces {
        let trace_id = rng.trace_id();
        let (root, gateway, engine) = (rng.next().to_le_bytes(), rng.next().to_le_bytes(), rng.next().to_le_bytes());
        buffer.add_batch([
            Incoming { trace_id, span: span(&payload, engine, Some(gateway), SPAN_KIND_SERVER), is_engine: true },
            Incoming { trace_id, span: span(&payload, gateway, Some(root), SPAN_KIND_CLIENT), is_engine: false },
            Incoming { trace_id, span: span(&payload, root, None, SPAN_KIND_SERVER), is_engine: false },
        ], now);
        spans += 3;
        if n % 2 == 0 {
            late_clients.push(trace_id);
        }
        if late_clients.len() == 64 {
            for trace_id in late_clients.drain(..) {
                let client = rng.next().to_le_bytes();
                buffer.add(trace_id, span(&payload, client, Some([7; 8]), SPAN_KIND_CLIENT), false, now);
                spans += 1;
            }
        }
        now += 5e-5;
        if n % 200 == 0 {
            buffer.tick_into(now, &mut completions);
            for completion in completions.drain(..) {
                if !completion.late {
                    let measured = [completion.trace.spans[0].span_id];
                    buffer.remember(&completion.trace.trace_id, Remembered::new(DROP, &measured));
                }
            }
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    std::hint::black_box(buffer.take_completions().len());
    (elapsed * 1e9 / spans as f64, buffer.heap_bytes())
}

fn main() {
    run(20_000); // warm up the allocator
    let (mut best, mut arena, mut heap) = (f64::INFINITY, f64::INFINITY, 0);
    for _ in 0..5 {
        let (ns, bytes) = run(400_000);
        best = best.min(ns);
        heap = bytes;
        arena = arena.min(arena_only(400_000));
    }
    println!("buffer: {best:.0} ns per span added (best of 5; 400 000 traces, 20 000 pending), of which the \
              trace's arena alone {arena:.0} ns; {heap} heap bytes at the end");
}
