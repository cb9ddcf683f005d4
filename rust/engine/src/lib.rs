//! otel-llm's native engine: the per-span work on native values. Nothing here knows Python: the
//! binding crate (`rust/src`, the `otel_llm._core` extension) converts at the boundary, and what
//! varies per engine or metric is declared in Python as data and handed over at construction.

pub mod accounting;
pub mod buffer;
pub mod declaration;
pub mod decide;
pub mod engine;
pub mod handoff;
pub mod ingest;
pub mod kept;
pub mod model;
pub mod record;
pub mod records;
pub mod series;
pub mod shapes;
pub mod wire;
