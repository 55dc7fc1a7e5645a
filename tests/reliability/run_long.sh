#!/usr/bin/env bash
# The long reliability tests (marker `long`, deselected by default): minutes of faults and load.
# .ci/run calls this after the main suite; about 5 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/../.."
exec python -m pytest -q -m long tests/reliability "$@"
