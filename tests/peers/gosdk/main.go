// A Go SDK peer for tests/test_saying_no.py: exports one batch of vLLM V1 spans through the Go
// SDK's OTLP trace exporter (otlptracegrpc or otlptracehttp, default retry settings) and prints
// the outcome as one JSON line: {"error": "...", "seconds": ...}.
//
//	gosdkpeer grpc|http HOST:PORT SPANS TIMEOUT_SECONDS
package main

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

func main() {
	if len(os.Args) != 5 {
		fmt.Fprintln(os.Stderr, "usage: gosdkpeer grpc|http HOST:PORT SPANS TIMEOUT_SECONDS")
		os.Exit(2)
	}
	protocol, endpoint := os.Args[1], os.Args[2]
	count, _ := strconv.Atoi(os.Args[3])
	seconds, _ := strconv.Atoi(os.Args[4])
	timeout := time.Duration(seconds) * time.Second
	ctx := context.Background()
	var exporter sdktrace.SpanExporter
	var err error
	if protocol == "grpc" {
		exporter, err = otlptracegrpc.New(ctx, otlptracegrpc.WithEndpoint(endpoint), otlptracegrpc.WithInsecure(),
			otlptracegrpc.WithTimeout(timeout))
	} else {
		exporter, err = otlptracehttp.New(ctx, otlptracehttp.WithEndpoint(endpoint), otlptracehttp.WithInsecure(),
			otlptracehttp.WithTimeout(timeout))
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	res := resource.NewSchemaless(attribute.String("service.name", "vllm-go-sdk"))
	start := time.Now()
	stubs := make(tracetest.SpanStubs, 0, count)
	for i := 0; i < count; i++ {
		var tid trace.TraceID
		var sid trace.SpanID
		_, _ = rand.Read(tid[:])
		_, _ = rand.Read(sid[:])
		stubs = append(stubs, tracetest.SpanStub{
			Name:        "llm_request",
			SpanKind:    trace.SpanKindServer,
			SpanContext: trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled}),
			StartTime:   start,
			EndTime:     start.Add(2600 * time.Millisecond),
			Attributes: []attribute.KeyValue{
				attribute.Float64("gen_ai.latency.time_to_first_token", 0.5),
				attribute.Float64("gen_ai.latency.time_in_queue", 0.1),
				attribute.Float64("gen_ai.latency.time_in_model_prefill", 0.3),
				attribute.Float64("gen_ai.latency.time_in_model_decode", 2.0),
				attribute.Float64("gen_ai.latency.e2e", 2.6),
				attribute.String("gen_ai.response.model", "go-sdk-model"),
			},
			Resource: res,
		})
	}
	began := time.Now()
	err = exporter.ExportSpans(ctx, stubs.Snapshots())
	out := map[string]any{"error": "", "seconds": time.Since(began).Seconds()}
	if err != nil {
		out["error"] = err.Error()
	}
	_ = exporter.Shutdown(ctx)
	line, _ := json.Marshal(out)
	fmt.Println(string(line))
}
