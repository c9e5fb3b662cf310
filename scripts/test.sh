#!/usr/bin/env bash
# The test suite: set up .venv if needed, then run pytest. Extra arguments go to pytest
# (e.g. `-m "not slow"` for the quick tier; `-n 0` for one process).
# Two test processes, a file each at a time: most of an end-to-end test's time is a CLI run waiting
# on process starts and imports, so two overlap well even on 2 cores (docs/testing.md). The files go
# out in the order tests/conftest.py gives them, the long ones first (--no-loadscope-reorder).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/setup.sh"
cd "$root"
exec .venv/bin/python -m pytest -n 2 --dist loadfile --no-loadscope-reorder "$@"
