#!/usr/bin/env bash
# Runs a Python end-to-end test (tests/e2e/*_test.py) with the project's virtual environment
# (scripts/venv.sh creates it on first use: openai, gguf, numpy, tokenizers from PyPI).
# Usage: tests/e2e/run_python_test.sh TEST.py [ARGS...]
set -euo pipefail
here="$(cd "$(dirname "$0")/../.." && pwd)"
py="$("$here/scripts/venv.sh")"
exec "$py" "$@"
