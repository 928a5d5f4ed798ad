#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The installed package, as a user outside the titan tree meets it (the ctests in tests/CMakeLists.txt):
#   check_install.sh install  CMAKE BUILD PREFIX          cmake --install of BUILD into PREFIX
#   check_install.sh consumer CMAKE PREFIX WORK           find_package(titan) with titan's prefix only builds and
#                                                         runs tests/install/consumer
#   check_install.sh no-toolkit CMAKE PREFIX WORK CUDA    the same on a machine without a CUDA toolkit: no nvcc
#                                                         on PATH, find_package(CUDAToolkit) finds nothing; the
#                                                         consumer links the CUDA runtime of the torch wheel
#                                                         when titan was built with CUDA (CUDA = 1), none otherwise
#   check_install.sh tools SOURCE PREFIX                  every tool of SOURCE/tools is in PREFIX/bin and starts:
#                                                         --help exits 0 and prints its usage
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
fail() {
  echo "[check_install] $*" >&2
  exit 1
}

# Configures, builds and runs the consumer in WORK/NAME with extra configure arguments; prints the build folder.
build_consumer() {
  local cmake="$1" prefix="$2" build="$3"
  shift 3
  rm -rf "$build"
  mkdir -p "$(dirname "$build")"
  # Paths under the clone hashed relative to it (as the main build's ccache launcher does), so that a fresh
  # clone's consumer is compiled from the cache.
  export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$(cd "$here/../.." && pwd)}" CCACHE_NOHASHDIR=1
  # No build type, so no optimisation: the compile is the umbrella header's parse and instantiation (what is
  # tested), and -O3 on top took a fifth of it (GCC 12: 21 s against 17 s).
  "$cmake" -S "$here/consumer" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE= -DCMAKE_PREFIX_PATH="$prefix" \
    -DCMAKE_CXX_COMPILER_LAUNCHER=ccache "$@" >"$build.configure.log" 2>&1 ||
    { cat "$build.configure.log"; fail "the consumer did not configure"; }
  "$cmake" --build "$build" >"$build.build.log" 2>&1 || { tail -40 "$build.build.log"; fail "the consumer did not build"; }
  local out
  out="$("$build/consumer")" || fail "the consumer exited with $?"
  echo "$out"
  grep -q 'consumer: .* parameters, AC(3 modules)' <<<"$out" || fail "expected the consumer's plan line, got: $out"
}

# The CUDA runtime the consumer's link line names (empty: none).
linked_cudart() { grep -o '[^ ]*libcudart[^ ]*' "$1/build.ninja" | sort -u || true; }

case "${1:-}" in
  install)
    rm -rf "$4"
    "$2" --install "$3" --prefix "$4" >/dev/null
    ;;
  consumer)
    build_consumer "$2" "$3" "$4/consumer"
    ;;
  no-toolkit)
    cmake="$2" prefix="$3" build="$4/no-toolkit" cuda="$5"
    # PATH without any folder holding nvcc; no variable that points FindCUDAToolkit at a toolkit.
    path=""
    IFS=: read -ra dirs <<<"$PATH"
    for d in "${dirs[@]}"; do [[ -x "$d/nvcc" ]] || path="${path:+$path:}$d"; done
    PATH="$path" && export PATH
    unset CUDACXX CUDA_PATH CUDA_HOME CUDAToolkit_ROOT
    command -v nvcc >/dev/null && fail "expected no nvcc on PATH, got $(command -v nvcc)"
    build_consumer "$cmake" "$prefix" "$build" -DCMAKE_DISABLE_FIND_PACKAGE_CUDAToolkit=ON
    cudart="$(linked_cudart "$build")"
    if [[ "$cuda" == 1 ]]; then
      [[ "$cudart" == */nvidia/*/libcudart.so.* ]] ||
        fail "expected the consumer to link the torch wheel's libcudart (nvidia/.../libcudart.so.N), got '$cudart'"
    else
      [[ -z "$cudart" ]] || fail "expected no CUDA runtime in a CPU-only titan's consumer, got '$cudart'"
    fi
    echo "linked CUDA runtime: ${cudart:-none}"
    ;;
  tools)
    source="$2" prefix="$3" count=0
    for program in "$source"/tools/titan_*; do
      name="$(basename "${program%.cpp}")"
      name="${name//_/-}"
      [[ -x "$prefix/bin/$name" ]] || fail "expected $name in $prefix/bin (tools/CMakeLists.txt installs it), got none"
      # The installed program alone: no library path from the build.
      out="$(env -u LD_LIBRARY_PATH "$prefix/bin/$name" --help 2>&1)" || fail "$name --help exited with $?: $out"
      grep -q "^usage: $name" <<<"$out" || fail "expected $name --help to start with 'usage: $name', got: ${out:0:300}"
      echo "$name starts"
      count=$((count + 1))
    done
    ((count >= 9)) || fail "expected every tool of $source/tools (9 or more), found $count"
    ;;
  *)
    fail "expected install, consumer, no-toolkit or tools, got '${1:-}'"
    ;;
esac
