# SPDX-License-Identifier: BSD-3-Clause
# Sourced by the GPU scripts: paths, the --dry-run switch, `run` and `run_logged` (echo the resolved
# command, then run it unless dry), the torch the build links (the image's own wheel), and
# `configure_cuda_build` (the CUDA build's cmake line, with the carried dependencies when present).
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
DRY=0; [[ "${1:-}" == "--dry-run" ]] && DRY=1
BUILD="${BUILD:-$ROOT/build-gpu}"
RESULTS="${OUT:-$BUILD/results}"
PY="${PYTHON:-python3}"
# The -dev packages a GPU image may lack (gloo, Catch2, nlohmann-json, toml++, sentencepiece, zlib, zstd headers
# and libraries, pkg-config) and the tests' tokenizer, made here by benchmarks/gpu/prepare_carry.sh.
CARRY="${CARRY:-$ROOT/build-gpu-deps}"
run() { echo "+ $*"; if ((DRY == 0)); then "$@"; fi; }
# run_logged FILE cmd...: the same, with the command's output (stdout and stderr) also written to FILE.
run_logged() {
  local file="$1"; shift
  echo "+ $* 2>&1 | tee $file"
  if ((DRY == 0)); then "$@" 2>&1 | tee "$file"; fi
}
TORCH_DIR=$("$PY" -c 'import os, torch; print(os.path.dirname(torch.__file__))' 2>/dev/null || echo "<torch>")
# configure_cuda_build [cmake args...]: configures $BUILD with CUDA against $TORCH_DIR (Release, Ninja). The
# carried folder, when there, comes first in CMake's search path and supplies pkg-config.
configure_cuda_build() {
  local carried=()
  if [[ -d "$CARRY" ]]; then
    carried+=("-DCMAKE_PREFIX_PATH=$CARRY")
    [[ -x "$CARRY/bin/pkg-config" ]] && carried+=("-DPKG_CONFIG_EXECUTABLE=$CARRY/bin/pkg-config")
  fi
  run cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTITAN_ENABLE_CUDA=ON \
      -DLIBTORCH_ROOT="$TORCH_DIR" "$@" "${carried[@]}"
}
