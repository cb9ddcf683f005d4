#!/usr/bin/env bash
# Installs the application-side instrumentations the live matrix runs (tests/test_live_instrumentations.py),
# once, each group in its own virtualenv in a cache outside the repository (like tests/live/engines.sh):
# their OpenTelemetry SDK pins conflict with each other and with the project's test extras.
#
#   logfire        Pydantic Logfire 5.4.0 (logfire-sdk 5.4.0, its httpx extra for trace propagation) on
#                  openai 3.57.0 and openai-agents 0.24.0.
#   openinference  Arize OpenInference: openinference-instrumentation-openai 0.1.66 and -openai-agents
#                  2.6.0 on openai 3.57.0 and openai-agents 0.24.0, the OTel SDK and its OTLP/HTTP exporter.
#   capture        the emitter captures' own environment (tests/testdata/emitters/requirements.txt, exact
#                  pins, --no-deps): OpenLLMetry 0.62.4, OpenInference openai 0.1.66, openai-v2 2.4b0 with
#                  the httpx instrumentation, LiteLLM 1.110.2, on openai 3.57.0; its scenarios are run by
#                  tests/testdata/emitters/capture.py --child. Keyed by the requirements file's hash too.
#   From PyPI; each group's resolved versions are written to <venv>/versions.txt.
#
#   tests/live/instrumentations.sh build [group]   install what is missing; a no-op when installed
#   tests/live/instrumentations.sh path group      print the virtualenv's python (installed or not)
#
# The cache is ${OTEL_LLM_INSTRUMENTATIONS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/otel-llm/instrumentations}/<group>/r<RECIPE>/
# (RECIPE below: bump it when a pin changes). ~1 min cold, 0 s warm.
set -euo pipefail

cache="${OTEL_LLM_INSTRUMENTATIONS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/otel-llm/instrumentations}"
RECIPE=2
declare -A PINS=(
  [logfire]="logfire[httpx]==5.4.0 logfire-sdk==5.4.0 openai==3.57.0 openai-agents==0.24.0"
  [openinference]="openinference-instrumentation-openai==0.1.66 openinference-instrumentation-openai-agents==2.6.0 openai-agents==0.24.0 openai==3.57.0 opentelemetry-sdk==1.45.2 opentelemetry-exporter-otlp-proto-http==1.45.2"
)

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CAPTURE_REQUIREMENTS="$here/../testdata/emitters/requirements.txt"

venv_dir() {
  if [ "$1" = capture ]; then
    echo "$cache/$1/r$RECIPE-$(sha256sum "$CAPTURE_REQUIREMENTS" | cut -c1-12)"
  else
    echo "$cache/$1/r$RECIPE"
  fi
}

build_group() {
  local group="$1" dir lock started
  [ -n "${PINS[$group]:-}" ] || [ "$group" = capture ] || { echo "instrumentations: unknown group $group" >&2; return 2; }
  dir="$(venv_dir "$group")"
  [ -f "$dir/.installed" ] && return 0
  mkdir -p "$cache"
  lock="$cache/.$group.lock"
  exec {fd}>"$lock"
  flock "$fd"
  if [ ! -f "$dir/.installed" ]; then
    started=$(date +%s)
    echo "instrumentations: installing $group into $dir"
    rm -rf "$dir"
    python3 -m venv "$dir"
    if [ "$group" = capture ]; then
      "$dir/bin/pip" install --quiet --no-deps -r "$CAPTURE_REQUIREMENTS"
    else
      # shellcheck disable=SC2086
      "$dir/bin/pip" install --quiet ${PINS[$group]}
    fi
    "$dir/bin/pip" freeze > "$dir/versions.txt"
    touch "$dir/.installed"
    echo "instrumentations: $group installed in $(( $(date +%s) - started )) s"
  fi
  flock -u "$fd"
}

case "${1:-}" in
  build)
    shift
    groups=("$@")
    [ ${#groups[@]} -gt 0 ] || groups=("${!PINS[@]}" capture)
    for g in "${groups[@]}"; do build_group "$g"; done
    ;;
  path)
    echo "$(venv_dir "$2")/bin/python"
    ;;
  *)
    echo "usage: $0 build [group...] | path group" >&2; exit 2
    ;;
esac
