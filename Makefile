# Two set-up commands: `make run` and `make test`. Everything else is optional.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
TSTAMP := $(VENV)/.installed-test

.PHONY: run test bench demo clean services

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/pip install --quiet -e .
	touch $@

$(TSTAMP): $(STAMP)
	$(BIN)/pip install --quiet -e '.[test]'
	touch $@

run: $(STAMP)
	$(BIN)/otel-llm serve $(ARGS)

# The real services the tests use (Debian's prometheus, promtool, docker-compose for config checks).
services:
	@command -v prometheus >/dev/null 2>&1 || { \
	  echo "installing Debian's prometheus package"; \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq prometheus >/dev/null; }
	@# Debian's package starts a system Prometheus on :9090; the tests start their own on free ports.
	@-(systemctl stop prometheus prometheus-node-exporter >/dev/null 2>&1; service prometheus stop >/dev/null 2>&1) || true

test: $(TSTAMP) services
	$(BIN)/python -m pytest $(PYTEST_ARGS)

bench: $(STAMP)
	$(BIN)/python -m bench

clean:
	rm -rf $(VENV) otel-llm-data .pytest_cache
