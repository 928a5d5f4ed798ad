# SPDX-License-Identifier: BSD-3-Clause
# Sourced by the GPU scripts: paths, the --dry-run switch and `run` (echo, then run unless dry), and the
# torch the build links (the image's own wheel).
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
DRY=0; [[ "${1:-}" == "--dry-run" ]] && DRY=1
BUILD="${BUILD:-$ROOT/build-gpu}"
RESULTS="${OUT:-$BUILD/results}"
PY="${PYTHON:-python3}"
run() { echo "+ $*"; if ((DRY == 0)); then "$@"; fi; }
TORCH_DIR=$("$PY" -c 'import os, torch; print(os.path.dirname(torch.__file__))' 2>/dev/null || echo "<torch>")
