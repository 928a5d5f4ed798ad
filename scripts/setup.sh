#!/usr/bin/env bash
# Installs everything titan needs on a fresh Debian machine, then configures and builds it.
# Idempotent and fast when already done (package checks + a requirements stamp + ccache).
#   scripts/setup.sh            install + build into build/
#   scripts/setup.sh --no-build install only
# Env: TITAN_HOME (default ~/.cache/titan) holds the Python venv whose torch wheel is our LibTorch;
#      $TITAN_HOME/pch the precompiled header's source, at one path for every clone (ccache shares its objects);
#      BUILD_DIR (default build); TITAN_CXX (default clang++-19) the C++ compiler of a new build dir;
#      CI=true turns warnings into errors.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TITAN_HOME="${TITAN_HOME:-$HOME/.cache/titan}"
VENV="$TITAN_HOME/venv"
BUILD_DIR="${BUILD_DIR:-$ROOT/build}"
BUILD=1
[[ "${1:-}" == "--no-build" ]] && BUILD=0

log() { printf '[setup] %s\n' "$*"; }

# --- Debian packages ({fmt} comes with the torch wheel: its include dir shadows a system copy) -------------------------------------------------------------------------
APT_PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config git
  clang-19   # the compiler: builds titan in under half GCC 12's time (docs/getting-started.md)
  clang-format   # ctest checks the sources against .clang-format
  python3 python3-venv python3-pip
  python3-dev   # Python.h: torch.compile's CPU backend (inductor) builds C++ kernels that include it (benchmarks/peers --compile)
  nlohmann-json3-dev catch2 libtomlplusplus-dev libsentencepiece-dev
  zlib1g-dev libzstd-dev zstd   # zstd: the data tests compress .zst shards with its CLI
  iproute2 procps   # ip netns / veth: the multi-host tests' hosts; pgrep: their teardown finds what is left
  libgrpc++-dev   # the client of TorchFT's lighthouse (TITAN_WITH_GRPC)
  protobuf-compiler libprotobuf-dev   # protoc (+ timestamp.proto): tests hold that client's bytes to its .proto
  libgloo-dev   # headers only: the torch wheel ships c10d's ProcessGroupGloo.hpp but not the gloo headers it includes
  fortunes fortunes-min   # the default training corpus: real English quotations
  slurmctld slurmd slurm-client munge   # tests/slurm: the sbatch script under a real Slurm in network namespaces
)
missing=()
for pkg in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if ((${#missing[@]})); then
  log "installing Debian packages: ${missing[*]}"
  SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# --- Python venv: the torch wheel (= LibTorch) and the test oracles ---------------------------
REQ="$ROOT/scripts/requirements.txt"
STAMP="$VENV/.titan-requirements.sha256"
# The stamp covers how the packages were installed too, so that a venv from before the bytecode step gets it.
want="$( (cat "$REQ"; echo "uv --compile-bytecode") | sha256sum | cut -d' ' -f1)"
if [[ ! -x "$VENV/bin/python" ]]; then
  log "creating venv $VENV"
  mkdir -p "$TITAN_HOME"
  python3 -m venv "$VENV"
fi
if [[ "$(cat "$STAMP" 2>/dev/null || true)" != "$want" ]]; then
  log "installing Python packages (torch wheel ~3 GB with its CUDA libraries; once per machine)"
  # uv fetches and unpacks the wheels in parallel: 62 s for the whole file where pip took 6.5 min on the same
  # machine (docs/testing.md). It is pinned here, not in requirements.txt, because it installs that file.
  "$VENV/bin/pip" install -q --disable-pip-version-check uv==0.9.30
  # --compile-bytecode: uv, unlike pip, leaves the .pyc files to the first import, so that every Python oracle of
  # a fresh CI run would compile torch and transformers at once, each in its own process (docs/testing.md).
  "$VENV/bin/uv" pip install -q --compile-bytecode --python "$VENV/bin/python" -r "$REQ"
  echo "$want" > "$STAMP"
fi

((BUILD)) || exit 0

# --- configure + build ------------------------------------------------------------------------
export CCACHE_DIR="${CCACHE_DIR:-$HOME/.cache/ccache}"
ccache --max-size=8G >/dev/null 2>&1 || true
WERROR=OFF
[[ "${CI:-}" == "true" ]] && WERROR=ON
CXX_COMPILER="${TITAN_CXX:-clang++-19}"
if [[ ! -f "$BUILD_DIR/build.ninja" ]]; then
  log "configuring $BUILD_DIR with $CXX_COMPILER"
  cmake -S "$ROOT" -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER="$CXX_COMPILER" \
    -DPython3_EXECUTABLE="$VENV/bin/python" -DTITAN_WERROR="$WERROR" -DTITAN_PCH_DIR="$TITAN_HOME/pch" >/dev/null
else
  # CMake cannot change the compiler of a configured tree; say so rather than build with the other one.
  configured="$(sed -n 's/^CMAKE_CXX_COMPILER:[A-Z]*=//p' "$BUILD_DIR/CMakeCache.txt")"
  [[ "$(basename "$configured")" == "$(basename "$CXX_COMPILER")" ]] ||
    log "note: $BUILD_DIR was configured with $configured, not $CXX_COMPILER; remove $BUILD_DIR to switch"
  # A tree configured before titan built its own PCH: give it the shared PCH folder (cmake/TitanPch.cmake).
  grep -q '^TITAN_PCH_DIR:PATH=.' "$BUILD_DIR/CMakeCache.txt" ||
    cmake -S "$ROOT" -B "$BUILD_DIR" -DTITAN_PCH_DIR="$TITAN_HOME/pch" >/dev/null
fi
log "building ($(nproc) jobs)"
cmake --build "$BUILD_DIR" -j"$(nproc)"
log "done: binaries in $BUILD_DIR/bin"
