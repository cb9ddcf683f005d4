// A Java SDK peer for tests/test_saying_no.py: exports one batch of vLLM V1 spans through the Java
// SDK's OTLP exporter (OtlpGrpcSpanExporter or OtlpHttpSpanExporter, with their default retry policy)
// and prints the outcome as JSON lines: {"exporting": true} just before the export, then
// {"success": true|false, "error": "...", "seconds": ...}.
//
//   java -cp 'javasdk-peer-1.jar:lib/*' Peer grpc|http HOST:PORT SPANS TIMEOUT_MS [INVALID]
//
// INVALID more spans are sent with all-zero ids, which a receiver rejects through OTLP partial success.

import io.opentelemetry.api.common.AttributeKey;
import io.opentelemetry.api.common.Attributes;
import io.opentelemetry.api.trace.Span;
import io.opentelemetry.api.trace.SpanContext;
import io.opentelemetry.api.trace.SpanKind;
import io.opentelemetry.api.trace.TraceFlags;
import io.opentelemetry.api.trace.TraceState;
import io.opentelemetry.api.trace.Tracer;
import io.opentelemetry.exporter.otlp.http.trace.OtlpHttpSpanExporter;
import io.opentelemetry.exporter.otlp.trace.OtlpGrpcSpanExporter;
import io.opentelemetry.sdk.common.CompletableResultCode;
import io.opentelemetry.sdk.resources.Resource;
import io.opentelemetry.sdk.testing.exporter.InMemorySpanExporter;
import io.opentelemetry.sdk.trace.SdkTracerProvider;
import io.opentelemetry.sdk.trace.data.DelegatingSpanData;
import io.opentelemetry.sdk.trace.data.SpanData;
import io.opentelemetry.sdk.trace.export.SimpleSpanProcessor;
import io.opentelemetry.sdk.trace.export.SpanExporter;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.TimeUnit;

public final class Peer {
  /** A span as the SDK made it, but for its ids: all zero (the SDK itself never makes such a span). */
  private static final class ZeroIds extends DelegatingSpanData {
    ZeroIds(SpanData span) {
      super(span);
    }

    @Override
    public SpanContext getSpanContext() {
      return SpanContext.create("0".repeat(32), "0".repeat(16), TraceFlags.getSampled(), TraceState.getDefault());
    }
  }

  public static void main(String[] args) throws Exception {
    if (args.length < 4) {
      System.err.println("usage: Peer grpc|http HOST:PORT SPANS TIMEOUT_MS [INVALID]");
      System.exit(2);
    }
    String protocol = args[0];
    String endpoint = args[1];
    int count = Integer.parseInt(args[2]);
    long timeoutMs = Long.parseLong(args[3]);
    int invalid = args.length > 4 ? Integer.parseInt(args[4]) : 0;

    InMemorySpanExporter memory = InMemorySpanExporter.create();
    SdkTracerProvider provider = SdkTracerProvider.builder()
        .setResource(Resource.create(Attributes.of(AttributeKey.stringKey("service.name"), "vllm-java-sdk")))
        .addSpanProcessor(SimpleSpanProcessor.create(memory))
        .build();
    Tracer tracer = provider.get("vllm.tracing.otel");
    long start = System.currentTimeMillis();
    for (int i = 0; i < count + invalid; i++) {
      Span span = tracer.spanBuilder("llm_request")
          .setSpanKind(SpanKind.SERVER)
          .setStartTimestamp(start, TimeUnit.MILLISECONDS)
          .setAttribute("gen_ai.latency.time_to_first_token", 0.5)
          .setAttribute("gen_ai.latency.time_in_queue", 0.1)
          .setAttribute("gen_ai.latency.time_in_model_prefill", 0.3)
          .setAttribute("gen_ai.latency.time_in_model_decode", 2.0)
          .setAttribute("gen_ai.latency.e2e", 2.6)
          .setAttribute("gen_ai.response.model", "java-sdk-model")
          .startSpan();
      span.end(start + 2600, TimeUnit.MILLISECONDS);
    }
    provider.forceFlush().join(10, TimeUnit.SECONDS);
    List<SpanData> spans = new ArrayList<>(memory.getFinishedSpanItems());
    if (spans.size() != count + invalid) {
      throw new IllegalStateException("made " + spans.size() + " spans, not " + (count + invalid));
    }
    for (int i = count; i < spans.size(); i++) {
      spans.set(i, new ZeroIds(spans.get(i)));
    }

    Duration timeout = Duration.ofMillis(timeoutMs);
    SpanExporter exporter = protocol.equals("grpc")
        ? OtlpGrpcSpanExporter.builder().setEndpoint("http://" + endpoint).setTimeout(timeout).build()
        : OtlpHttpSpanExporter.builder().setEndpoint("http://" + endpoint + "/v1/traces").setTimeout(timeout).build();
    System.out.println("{\"exporting\": true}");  // the test times its refusals from here
    System.out.flush();
    long began = System.nanoTime();
    CompletableResultCode result = exporter.export(spans).join(timeoutMs + 30_000, TimeUnit.MILLISECONDS);
    double seconds = (System.nanoTime() - began) / 1e9;
    Throwable failure = result.getFailureThrowable();
    String error = result.isSuccess() ? "" : (failure != null ? failure.toString() : "failed");
    System.out.println("{\"success\": " + result.isSuccess() + ", \"error\": \"" + json(error) + "\", \"seconds\": "
        + seconds + "}");
    System.out.flush();
    exporter.shutdown().join(10, TimeUnit.SECONDS);
    provider.shutdown().join(10, TimeUnit.SECONDS);
    System.exit(0);
  }

  private static String json(String text) {
    StringBuilder out = new StringBuilder();
    for (char c : text.toCharArray()) {
      if (c == '"' || c == '\\') {
        out.append('\\').append(c);
      } else if (c < 0x20) {
        out.append(String.format("\\u%04x", (int) c));
      } else {
        out.append(c);
      }
    }
    return out.toString();
  }
}
