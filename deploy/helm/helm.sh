#!/usr/bin/env bash
# The real `helm` for the chart's tests, built once from its Go module (helm.sh/helm/v3/cmd/helm,
# via the Go module proxy) into a cache outside the repository, like collector-config/peers.sh:
#
#   deploy/helm/helm.sh path     print where the binary is (building it first when missing)
#   deploy/helm/helm.sh ARGS...  run it: deploy/helm/helm.sh lint deploy/helm/otel-llm
#
# Cache: ${OTEL_LLM_TOOLS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/otel-llm/tools}/helm-<version>/<go version>/helm.
# A helm already on PATH with the same version is used as is. Cold build: ~2 minutes on 2 cores.
set -euo pipefail

HELM_VERSION=3.22.0
cache="${OTEL_LLM_TOOLS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/otel-llm/tools}"

helm_path() {
  if command -v helm >/dev/null 2>&1 && helm version --template '{{.Version}}' 2>/dev/null | grep -qx "v$HELM_VERSION"; then
    command -v helm; return
  fi
  command -v go >/dev/null || [ ! -x /usr/local/go/bin/go ] || export PATH="/usr/local/go/bin:$PATH"
  command -v go >/dev/null || { echo "helm.sh: the Go toolchain is needed to build helm $HELM_VERSION" >&2; exit 1; }
  local dir out started fd
  dir="$cache/helm-$HELM_VERSION/$(go env GOVERSION)"
  out="$dir/helm"
  if [ ! -x "$out" ]; then
    mkdir -p "$dir"
    exec {fd}>"$cache/.helm.lock"
    flock "$fd"
    if [ ! -x "$out" ]; then
      started=$(date +%s)
      echo "helm.sh: building helm $HELM_VERSION into $dir (Go modules from the module proxy)" >&2
      GOBIN="$dir/.bin" CGO_ENABLED=0 GOFLAGS="-trimpath" go install "helm.sh/helm/v3/cmd/helm@v$HELM_VERSION" >&2
      mv -f "$dir/.bin/helm" "$out" && rmdir "$dir/.bin"
      echo "helm.sh: built helm in $(( $(date +%s) - started )) s" >&2
    fi
    flock -u "$fd"
  fi
  echo "$out"
}

case "${1:-}" in
  path) helm_path ;;
  "") echo "usage: $0 path | HELM-ARGS..." >&2; exit 2 ;;
  *) exec "$(helm_path)" "$@" ;;
esac
