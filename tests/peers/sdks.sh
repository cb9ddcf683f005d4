#!/usr/bin/env bash
# Builds the client SDK peers of the client table's tests (tests/test_saying_no.py), once, into a cache
# outside the repository (as tests/live/instrumentations.sh does for the Python instrumentations):
#
#   java   tests/peers/javasdk: the OpenTelemetry Java SDK 1.68 and its OTLP exporters (OtlpGrpcSpanExporter,
#          OtlpHttpSpanExporter), built with Maven from Maven Central (Maven's own cache, ~/.m2, holds
#          the downloads); the peer's jar and its dependencies' jars are kept.
#   js     tests/peers/jssdk: the OpenTelemetry JS SDK (sdk-trace 3.1) with exporter-trace-otlp-grpc and
#          exporter-trace-otlp-http 0.301, installed by `npm ci` from its package-lock.json.
#
#   tests/peers/sdks.sh build [group...]   build what is missing (default: both); a no-op when built
#   tests/peers/sdks.sh path group         print the built peer's directory (built or not)
#
# The cache is ${OTEL_LLM_PEERS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/otel-llm/peers}/<group>sdk/<key>/, <key> a
# hash of the peer's files and of its toolchain's version, so a change to either builds again; older keys
# are removed after a build. Cold (empty Maven and npm caches): Java ~30 s, JS ~6 s; 0 s once built.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cache="${OTEL_LLM_PEERS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/otel-llm/peers}"
declare -A FILES=([java]="pom.xml src/main/java/Peer.java" [js]="package.json package-lock.json peer.js")

source_dir() { echo "$here/$1sdk"; }

toolchain() {
  case "$1" in
    java) java -version 2>&1 | head -1; mvn -v 2>/dev/null | head -1 ;;
    js) node --version; npm --version ;;
  esac
}

key() {
  local group="$1" dir f
  dir="$(source_dir "$group")"
  { toolchain "$group"
    for f in ${FILES[$group]}; do echo "== $f"; cat "$dir/$f"; done
  } | sha256sum | cut -c1-16
}

peer_dir() { echo "$cache/$1sdk/$(key "$1")"; }

build_group() {
  local group="$1" out lock started f
  case "$group" in
    java) command -v java >/dev/null && command -v mvn >/dev/null \
            || { echo "sdks: java and mvn are needed to build the Java SDK peer" >&2; return 1; } ;;
    js) command -v node >/dev/null && command -v npm >/dev/null \
          || { echo "sdks: node and npm are needed to install the JS SDK peer" >&2; return 1; } ;;
    *) echo "sdks: unknown group $group" >&2; return 2 ;;
  esac
  out="$(peer_dir "$group")"
  [ -f "$out/.installed" ] && return 0
  mkdir -p "$cache"
  lock="$cache/.$group-sdk.lock"
  exec {fd}>"$lock"
  flock "$fd"                     # two builds at once: the second waits, then finds it built
  if [ ! -f "$out/.installed" ]; then
    started=$(date +%s)
    echo "sdks: building the $group SDK peer into $out"
    rm -rf "$out"
    mkdir -p "$out"
    for f in ${FILES[$group]}; do mkdir -p "$out/$(dirname "$f")"; cp "$(source_dir "$group")/$f" "$out/$f"; done
    if [ "$group" = java ]; then
      (cd "$out" && mvn -q -B -Dstyle.color=never package)
    else
      (cd "$out" && npm ci --no-audit --no-fund --loglevel=error)
    fi
    touch "$out/.installed"
    echo "sdks: $group SDK peer built in $(( $(date +%s) - started )) s"
    find "$cache/${group}sdk" -mindepth 1 -maxdepth 1 -type d ! -path "$out" -exec rm -rf {} +
  fi
  flock -u "$fd"
}

case "${1:-}" in
  build)
    shift
    groups=("$@")
    [ ${#groups[@]} -gt 0 ] || groups=(java js)
    for g in "${groups[@]}"; do build_group "$g"; done
    ;;
  path)
    [ -n "${2:-}" ] && [ -n "${FILES[$2]:-}" ] || { echo "usage: $0 path java|js" >&2; exit 2; }
    peer_dir "$2"
    ;;
  *)
    echo "usage: $0 build [java|js...] | path java|js" >&2; exit 2
    ;;
esac
