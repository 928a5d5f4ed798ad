# SPDX-License-Identifier: BSD-3-Clause
# Sourced by the GPU scripts: paths, the --dry-run switch, `run` and `run_logged` (echo the resolved
# command, then run it unless dry), the torch the programs run against (the image's own wheel),
# `configure_cuda_build` (the CUDA build's cmake line, with the carried dependencies when present), and the
# carried programs: which ones, how each is started (`program_wrappers`) and how each shows it starts
# (`programs_start`).
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
DRY=0; [[ "${1:-}" == "--dry-run" ]] && DRY=1
BUILD="${BUILD:-$ROOT/build-gpu}"
RESULTS="${OUT:-$BUILD/results}"
PY="${PYTHON:-python3}"
# What benchmarks/gpu/prepare_carry.sh makes and the device check unpacks: programs.tar.gz (the prebuilt
# programs, their non-torch libraries and the tests' tokenizer), deps.tar.gz (the -dev packages a device
# build needs) and manifest.txt (the commit and build the programs came from).
CARRY="${CARRY:-$ROOT/build-gpu-carry}"
run() { echo "+ $*"; if ((DRY == 0)); then "$@"; fi; }
# run_logged FILE cmd...: the same, with the command's output (stdout and stderr) also written to FILE.
run_logged() {
  local file="$1"; shift
  echo "+ $* 2>&1 | tee $file"
  if ((DRY == 0)); then "$@" 2>&1 | tee "$file"; fi
}
# Found, not imported: an import of torch takes seconds, which every dry run (five per ctest) would pay.
TORCH_DIR=$("$PY" -c 'import importlib.util, os; print(os.path.dirname(importlib.util.find_spec("torch").origin))' \
  2>/dev/null || echo "<torch>")

# The programs the device check runs, each with the arguments that make it print its usage (or, for the
# two that take none, the message it gives without a GPU) and a text that output must contain. Run with no
# GPU visible they touch no device, so the same probe serves the CPU machine that packs them and the GPU
# machine that runs them: a program that prints its text found every library it needs.
PROGRAMS=(titan_cuda_tests nccl_world1 train_llama3 titan-generate titan-plan titan-run bench_step_throughput)
declare -A PROBE_ARGS=([titan_cuda_tests]="" [nccl_world1]="" [train_llama3]="--help" [titan-generate]="--help"
                       [titan-plan]="--help" [titan-run]="--help" [bench_step_throughput]="--help")
declare -A PROBE_TEXT=([titan_cuda_tests]="no CUDA device visible" [nccl_world1]="expected a CUDA device"
                       [train_llama3]="Usage: [--config PRESET]" [titan-generate]="usage: titan-generate"
                       [titan-plan]="usage: titan-plan" [titan-run]="usage: titan-run"
                       [bench_step_throughput]="expected one of --flavor")

# The library folders of $TORCH_DIR's wheel: torch/lib and the NVIDIA wheels beside it (CUDA runtime,
# cuBLAS, NCCL, ...), which the programs find through LD_LIBRARY_PATH wherever the wheel is installed.
torch_library_path() {
  local dirs=("$TORCH_DIR/lib") d
  for d in "$(dirname "$TORCH_DIR")"/nvidia/*/lib; do
    [[ -d "$d" ]] && dirs+=("$d")
  done
  local IFS=:
  echo "${dirs[*]}"
}

# program_wrappers DIR: DIR/bin/<program> starts DIR/libexec/<program> with DIR/lib (the carried libraries)
# and this machine's torch on LD_LIBRARY_PATH. Only the programs see that path: python3 and the tools the
# check calls keep their own libraries.
program_wrappers() {
  local dir="$1" name path
  path="$dir/lib:$(torch_library_path)"
  mkdir -p "$dir/bin"
  for name in "${PROGRAMS[@]}"; do
    [[ -x "$dir/libexec/$name" ]] || continue
    printf '#!/bin/sh\n# made by benchmarks/gpu/common.sh: %s against this machine'"'"'s torch\n' "$name" \
        >"$dir/bin/$name"
    printf 'LD_LIBRARY_PATH="%s${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" exec "%s" "$@"\n' "$path" \
        "$dir/libexec/$name" >>"$dir/bin/$name"
    chmod +x "$dir/bin/$name"
  done
}

# programs_start DIR: runs each of DIR/bin's programs as PROBE_ARGS says with no GPU visible; prints one
# line per program and returns 1 when any did not print its PROBE_TEXT (a library missing or too old).
programs_start() {
  local dir="$1" name output failed=0
  for name in "${PROGRAMS[@]}"; do
    # shellcheck disable=SC2086  # PROBE_ARGS holds zero or one word
    output="$(CUDA_VISIBLE_DEVICES="" timeout 60 "$dir/bin/$name" ${PROBE_ARGS[$name]} 2>&1)"
    if [[ "$output" == *"${PROBE_TEXT[$name]}"* ]]; then
      echo "[programs] $name starts: $(grep -m1 -F -- "${PROBE_TEXT[$name]}" <<<"$output" | cut -c1-100)"
    else
      echo "[programs] $name does not start: expected '${PROBE_TEXT[$name]}' in its output, got:"
      head -5 <<<"$output" | sed 's/^/    /'
      failed=1
    fi
  done
  return "$failed"
}

# configure_cuda_build [cmake args...]: configures $BUILD with CUDA against $TORCH_DIR (Release, Ninja). The
# dependencies folder $DEPS, when there, comes first in CMake's search path and supplies pkg-config.
configure_cuda_build() {
  local carried=() deps="${DEPS:-}"
  if [[ -n "$deps" && ( -d "$deps" || $DRY == 1 ) ]]; then
    carried+=("-DCMAKE_PREFIX_PATH=$deps" "-DPKG_CONFIG_EXECUTABLE=$deps/bin/pkg-config")
  fi
  run cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTITAN_ENABLE_CUDA=ON \
      -DLIBTORCH_ROOT="$TORCH_DIR" "$@" "${carried[@]}"
}
