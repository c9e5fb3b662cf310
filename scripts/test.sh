#!/usr/bin/env bash
# The test suite: set up .venv if needed, then run pytest. Extra arguments go to pytest
# (e.g. `-m "not slow"` for the quick tier).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/setup.sh"
cd "$root"
exec .venv/bin/python -m pytest "$@"
