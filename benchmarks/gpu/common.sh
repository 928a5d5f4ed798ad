# SPDX-License-Identifier: BSD-3-Clause
# Sourced by the GPU scripts: paths, the --dry-run switch, `run` and `run_logged` (echo the resolved
# command, then run it unless dry), and the torch the build links (the image's own wheel).
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
DRY=0; [[ "${1:-}" == "--dry-run" ]] && DRY=1
BUILD="${BUILD:-$ROOT/build-gpu}"
RESULTS="${OUT:-$BUILD/results}"
PY="${PYTHON:-python3}"
run() { echo "+ $*"; if ((DRY == 0)); then "$@"; fi; }
# run_logged FILE cmd...: the same, with the command's output (stdout and stderr) also written to FILE.
run_logged() {
  local file="$1"; shift
  echo "+ $* 2>&1 | tee $file"
  if ((DRY == 0)); then "$@" 2>&1 | tee "$file"; fi
}
TORCH_DIR=$("$PY" -c 'import os, torch; print(os.path.dirname(torch.__file__))' 2>/dev/null || echo "<torch>")
