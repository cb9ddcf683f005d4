// A JS SDK peer for tests/test_saying_no.py: exports one batch of vLLM V1 spans through
// @opentelemetry/exporter-trace-otlp-grpc (0.301, sdk-trace 3.1) and prints the outcome as one JSON
// line: {"code": 0 (SUCCESS) | 1 (FAILED), "error": "...", "seconds": ...}, after a line
// {"exporting": true} just before the export.
//
//   node peer.js HOST:PORT SPANS TIMEOUT_MS
'use strict';
const { TracerProvider, SimpleSpanProcessor, InMemorySpanExporter } = require('@opentelemetry/sdk-trace');
const { OTLPTraceExporter } = require('@opentelemetry/exporter-trace-otlp-grpc');
const { resourceFromAttributes } = require('@opentelemetry/resources');
const { SpanKind } = require('@opentelemetry/api');

const [endpoint, count, timeoutMs] = process.argv.slice(2);
const memory = new InMemorySpanExporter();
const provider = new TracerProvider({
  resource: resourceFromAttributes({ 'service.name': 'vllm-js-sdk' }),
  spanProcessors: [new SimpleSpanProcessor({ exporter: memory })],  // sdk-trace 3.x takes options
});
const tracer = provider.getTracer('vllm.tracing.otel');
const start = Date.now();
for (let i = 0; i < Number(count); i++) {
  const span = tracer.startSpan('llm_request', {
    kind: SpanKind.SERVER,
    startTime: start,
    attributes: {
      'gen_ai.latency.time_to_first_token': 0.5, 'gen_ai.latency.time_in_queue': 0.1,
      'gen_ai.latency.time_in_model_prefill': 0.3, 'gen_ai.latency.time_in_model_decode': 2.0,
      'gen_ai.latency.e2e': 2.6, 'gen_ai.response.model': 'js-sdk-model',
    },
  });
  span.end(start + 2600);
}
const exporter = new OTLPTraceExporter({ url: `http://${endpoint}`, timeoutMillis: Number(timeoutMs) });
provider.forceFlush().then(() => {
  const spans = memory.getFinishedSpans();
  if (spans.length !== Number(count)) throw new Error(`made ${spans.length} spans, not ${count}`);
  console.log(JSON.stringify({ exporting: true }));  // the test times its stall from here
  const began = Date.now();
  exporter.export(spans, (result) => {
    const seconds = (Date.now() - began) / 1000;
    console.log(JSON.stringify({ code: result.code, error: result.error ? String(result.error) : '', seconds }));
    exporter.shutdown().finally(() => process.exit(0));
  });
});
