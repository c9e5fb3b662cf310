#!/usr/bin/env bash
# The main job: set up .venv if needed, then run it. Extra arguments go to the command.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/setup.sh"
cd "$root"
exec .venv/bin/posttrain train "$@"
