#!/usr/bin/env bash
# The README's test command (CI runs it too): set up, lint, type-check, then the whole test suite
# (with the examples in docstrings).
# Extra arguments go to pytest, e.g. `bash scripts/test.sh -m "not slow"` for a quick loop.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# Debian's chromium renders `nopelab report` pages in a test; without it that test is skipped.
if ! command -v chromium >/dev/null && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  (apt-get update -qq && apt-get install -y -qq --no-install-recommends chromium) >/dev/null 2>&1 \
    || echo "chromium could not be installed: the report's browser test will be skipped" >&2
fi
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy  # the type checker, on src/nopelab (pyproject.toml [tool.mypy])
.venv/bin/python -m pytest -q "$@"
