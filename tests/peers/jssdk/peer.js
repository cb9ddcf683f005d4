// A JS SDK peer for tests/test_saying_no.py: exports one batch of vLLM V1 spans through
// @opentelemetry/exporter-trace-otlp-grpc or -http (0.301, sdk-trace 3.1; their default retry) and
// prints the outcome as one JSON line: {"code": 0 (SUCCESS) | 1 (FAILED), "error": "...", "seconds": ...},
// after a line {"exporting": true} just before the export.
//
//   node peer.js grpc|http HOST:PORT SPANS TIMEOUT_MS [INVALID]
//
// INVALID more spans are sent with all-zero ids, which a receiver rejects through OTLP partial success.
'use strict';
const { TracerProvider, SimpleSpanProcessor, InMemorySpanExporter } = require('@opentelemetry/sdk-trace');
const { OTLPTraceExporter: GrpcExporter } = require('@opentelemetry/exporter-trace-otlp-grpc');
const { OTLPTraceExporter: HttpExporter } = require('@opentelemetry/exporter-trace-otlp-http');
const { resourceFromAttributes } = require('@opentelemetry/resources');
const { SpanKind } = require('@opentelemetry/api');

const [protocol, endpoint, count, timeoutMs, invalidArg] = process.argv.slice(2);
const invalid = Number(invalidArg || 0);
const total = Number(count) + invalid;
const memory = new InMemorySpanExporter();
const provider = new TracerProvider({
  resource: resourceFromAttributes({ 'service.name': 'vllm-js-sdk' }),
  spanProcessors: [new SimpleSpanProcessor({ exporter: memory })],  // sdk-trace 3.x takes options
});
const tracer = provider.getTracer('vllm.tracing.otel');
const start = Date.now();
for (let i = 0; i < total; i++) {
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
// A span as the SDK made it, but for its ids: all zero (the SDK itself never makes such a span).
const zeroIds = (span) => new Proxy(span, {
  get(target, key) {
    if (key === 'spanContext') {
      return () => ({ ...target.spanContext(), traceId: '0'.repeat(32), spanId: '0'.repeat(16) });
    }
    const value = target[key];
    return typeof value === 'function' ? value.bind(target) : value;
  },
});
const exporter = protocol === 'grpc'
  ? new GrpcExporter({ url: `http://${endpoint}`, timeoutMillis: Number(timeoutMs) })
  : new HttpExporter({ url: `http://${endpoint}/v1/traces`, timeoutMillis: Number(timeoutMs) });
provider.forceFlush().then(() => {
  const spans = memory.getFinishedSpans().map((span, i) => (i < Number(count) ? span : zeroIds(span)));
  if (spans.length !== total) throw new Error(`made ${spans.length} spans, not ${total}`);
  console.log(JSON.stringify({ exporting: true }));  // the test times its refusals from here
  const began = Date.now();
  exporter.export(spans, (result) => {
    const seconds = (Date.now() - began) / 1000;
    console.log(JSON.stringify({ code: result.code, error: result.error ? String(result.error) : '', seconds }));
    exporter.shutdown().finally(() => process.exit(0));
  });
});
