#!/usr/bin/env bash
# Set everything up, then run the embedded demo (`tidelake demo`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/tidelake demo "$@"
