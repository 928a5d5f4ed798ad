#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Prepares, on a CPU machine with the CUDA toolkit (scripts/setup.sh's, no GPU needed), the folder that
# travels with the working tree to a GPU machine, so the device check spends its minutes on the GPU and
# none on a build (benchmarks/gpu/device_check.sh finds it at build-gpu-carry/, or $CARRY):
#   programs.tar.gz  the programs the check runs (PROGRAMS in common.sh), built here for sm_90 among
#                    TITAN_CUDA_ARCHS and stripped; the shared libraries they load that are neither torch's
#                    nor the C and C++ runtimes (sentencepiece, zstd, zlib); the tests' BPE tokenizer that
#                    the CPU curves were trained with
#   deps.tar.gz      what a build on the GPU machine would need and its image lacks, for the one case where
#                    the programs do not start there: the headers, libraries, CMake and pkg-config files of
#                    gloo, Catch2, nlohmann-json, toml++, sentencepiece, zlib and zstd (this machine's Debian
#                    packages) and a pkg-config
#   manifest.txt     the commit, build and torch the programs came from, and each program's size and sha256
# It checks that each program starts here (prints its usage: the CUDA runtime loads without a GPU) and that
# the folder and the working tree together stay under 64 MiB, what may travel. Packed with gzip, which every
# image unpacks (xz, under half the size, needs an xz there).
#   benchmarks/gpu/prepare_carry.sh [DEST]      (default build-gpu-carry/, ignored by git)
# BUILD (default build/) is the build the programs come from: configured with CUDA, TITAN_CUDA_ARCHS
# including 90 (its default 89;90;100 does); it builds whatever of them is missing or out of date.
set -euo pipefail
from="${BUILD:-}"
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
DEST="${1:-$CARRY}"
BUILD="${from:-$ROOT/build}"
LIMIT=$((64 << 20))
HEADERS=(libgloo-dev catch2 nlohmann-json3-dev libtomlplusplus-dev libsentencepiece-dev zlib1g-dev libzstd-dev)
LIBS=(libz.so libzstd.so libsentencepiece.so libsentencepiece_train.so)
LIBDIR=/usr/lib/x86_64-linux-gnu
say() { echo "[prepare_carry] $*"; }

cache="$BUILD/CMakeCache.txt"
[[ -f "$cache" ]] || { say "expected a configured build in $BUILD, got no CMakeCache.txt. Run scripts/setup.sh."; exit 1; }
[[ "$(sed -n 's/^TITAN_ENABLE_CUDA:BOOL=//p' "$cache")" == ON ]] ||
  { say "expected $BUILD configured with CUDA (TITAN_ENABLE_CUDA=ON: nvcc found), got it off."; exit 1; }
archs="$(sed -n 's/^TITAN_CUDA_ARCHS:STRING=//p' "$cache")"
grep -qE '(^|;)90' <<<"$archs" ||
  { say "expected TITAN_CUDA_ARCHS of $BUILD to include 90 (H100/H200), got '$archs'." \
        "cmake -B $BUILD -DTITAN_CUDA_ARCHS='89;90;100'"; exit 1; }
[[ "$TORCH_DIR" != "<torch>" ]] || { say "expected torch importable by $PY (PYTHON=), got an ImportError."; exit 1; }
for p in "${HEADERS[@]}" pkgconf-bin libpkgconf3; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" ||
    { say "expected the Debian package $p (scripts/setup.sh installs it), got none."; exit 1; }
done

say "building ${PROGRAMS[*]} and the tests' tokenizer in $BUILD (for $archs)"
cmake --build "$BUILD" --target "${PROGRAMS[@]}" titan_test_tokenizer ${JOBS:+-j "$JOBS"}

stage="$(mktemp -d)"
trap 'rm -rf "$stage"' EXIT
programs="$stage/programs" deps="$stage/deps"
mkdir -p "$programs"/{libexec,lib,tests/assets/tokenizer}
for name in "${PROGRAMS[@]}"; do
  strip --strip-unneeded -o "$programs/libexec/$name" "$BUILD/bin/$name"
done
# The libraries ldd resolves outside torch's wheel, the CUDA toolkit and the C/C++ runtimes (which a newer
# image has in newer, compatible versions).
venv="$(dirname "$TORCH_DIR")"
ldd "$programs"/libexec/* | awk '$2 == "=>" {print $1, $3}' | sort -u | while read -r soname path; do
  case "$path" in
    "not") say "expected every library of the programs here, got $soname not found"; exit 1 ;;
    "$venv"/*|/usr/local/cuda*) continue ;;
  esac
  case "$soname" in
    libc.so.*|libm.so.*|libdl.so.*|librt.so.*|libpthread.so.*|libutil.so.*|libresolv.so.*|libgcc_s.so.*|libstdc++.so.*)
      continue ;;
  esac
  cp -L "$path" "$programs/lib/$soname"
done
cp "$BUILD/tests/assets/tokenizer/tokenizer.json" "$BUILD/tests/assets/tokenizer/tokenizer_config.json" \
   "$programs/tests/assets/tokenizer/"
# They must start here, through the wrappers the device check makes there, and find every library with their
# RUNPATH (this machine's venv and CUDA toolkit, absent there) ignored.
program_wrappers "$programs"
programs_start "$programs" || { say "expected every program to start here (see above)."; exit 1; }
for name in "${PROGRAMS[@]}"; do
  exe="$programs/libexec/$name"
  missing="$(LD_LIBRARY_PATH="$programs/lib:$(torch_library_path)" /lib64/ld-linux-x86-64.so.2 --inhibit-rpath "$exe" \
             --list "$exe" | grep "not found" || true)"
  [[ -z "$missing" ]] || { say "expected $name's libraries on the wrapper's path alone, got: $missing"; exit 1; }
done
rm -r "$programs/bin"

# The build's dependencies, for a build on the GPU machine. Headers: every file each package installs under
# /usr/include, at the same relative path.
mkdir -p "$deps"/{include,lib/pkgconfig,lib/cmake,share/cmake,bin}
for p in "${HEADERS[@]}"; do
  dpkg -L "$p" | grep '^/usr/include/' | while read -r f; do
    if [[ -f "$f" ]]; then install -D -m 644 "$f" "$deps/include/${f#/usr/include/}"; fi
  done
done
# Libraries as plain files (a link travels only as a link): the name the linker asks for and the soname.
for lib in "${LIBS[@]}"; do
  real="$(readlink -f "$LIBDIR/$lib")"
  soname="$(objdump -p "$real" | awk '/SONAME/ {print $2}')"
  cp -L "$real" "$deps/lib/$lib"
  cp -L "$real" "$deps/lib/$soname"
done
cp -L "$LIBDIR/libpkgconf.so.3" "$deps/lib/"
# CMake package files: their targets find the prefix three folders up, which is the folder (Catch2's also
# names its static main library, which titan does not link but CMake checks is there).
cp /usr/lib/libCatch2WithMain.a "$deps/lib/"
cp -r /usr/lib/cmake/Catch2 "$deps/lib/cmake/"
cp -r /usr/share/cmake/nlohmann_json "$deps/share/cmake/"
# pkg-config files made relative to their folder.
for pc in libzstd sentencepiece; do
  sed -e 's|^prefix=.*|prefix=${pcfiledir}/../..|' -e 's|^exec_prefix=.*|exec_prefix=${prefix}|' \
      -e 's|^libdir=.*|libdir=${prefix}/lib|' -e 's|^includedir=.*|includedir=${prefix}/include|' \
      "$LIBDIR/pkgconfig/$pc.pc" >"$deps/lib/pkgconfig/$pc.pc"
done
cp /usr/bin/pkgconf "$deps/bin/"
cat >"$deps/bin/pkg-config" <<'EOF'
#!/bin/sh
# pkgconf from the carried folder, with its library.
here="$(cd "$(dirname "$0")" && pwd)"
LD_LIBRARY_PATH="$here/../lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" exec "$here/pkgconf" "$@"
EOF
chmod +x "$deps/bin/pkg-config"
# It must answer as the build will ask.
PKG_CONFIG_PATH="$deps/lib/pkgconfig" "$deps/bin/pkg-config" --cflags --libs libzstd sentencepiece >/dev/null

rm -rf "$DEST"
mkdir -p "$DEST"
tar -C "$programs" -czf "$DEST/programs.tar.gz.tmp" libexec lib tests
tar -C "$deps" -czf "$DEST/deps.tar.gz.tmp" .
mv "$DEST/programs.tar.gz.tmp" "$DEST/programs.tar.gz"
mv "$DEST/deps.tar.gz.tmp" "$DEST/deps.tar.gz"
commit="$(git -C "$ROOT" rev-parse --short=12 HEAD 2>/dev/null || echo unknown)"
[[ -z "$(git -C "$ROOT" status --porcelain --untracked-files=no 2>/dev/null)" ]] || commit+=" (with local changes)"
{
  echo "commit: $commit"
  echo "made: $(date -u '+%Y-%m-%d %H:%M UTC') on $(lscpu | sed -n 's/^Model name: *//p' | head -1)"
  echo "build: TITAN_CUDA_ARCHS $archs, $(sed -n 's/^CMAKE_CXX_COMPILER:[A-Z]*=//p' "$cache")," \
       "$("$(sed -n 's/^CMAKE_CUDA_COMPILER:[A-Z]*=//p' "$cache")" --version | tail -1)"
  echo "torch: $("$PY" -c 'import torch; print(torch.__version__)')"
  (cd "$programs" && for f in libexec/* lib/*; do echo "file: $f $(stat -c %s "$f") $(sha256sum "$f" | cut -c1-16)"; done)
} >"$DEST/manifest.txt.tmp"
mv "$DEST/manifest.txt.tmp" "$DEST/manifest.txt"

carried=$(du -sb "$DEST" | cut -f1)
tree=$(cd "$ROOT" && git ls-files -z -co --exclude-standard | xargs -0 stat -c %s 2>/dev/null |
       awk '{s += $1} END {print s + 0}')
total=$((carried + tree))
unpacked=$(du -sb "$programs" | cut -f1)
awk -v d="$DEST" -v c="$carried" -v u="$unpacked" -v t="$tree" 'BEGIN {
  printf "[prepare_carry] %s: %.1f MiB (the programs %.1f MiB unpacked); with the working tree (%.1f MiB): " \
         "%.1f MiB of 64\n", d, c / 2^20, u / 2^20, t / 2^20, (c + t) / 2^20 }'
if ((total >= LIMIT)); then
  say "expected the tree and the folder under 64 MiB, got $total bytes."
  exit 1
fi
if ! (cd "$ROOT" && git check-ignore -q "$DEST" 2>/dev/null); then
  say "note: $DEST is not ignored by git; a carried folder must be (add it to .git/info/exclude)."
fi
