#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Prepares the folder that travels with the working tree to a GPU machine whose image has CUDA, torch, CMake,
# ninja and a C++ compiler but not titan's -dev packages: the headers, libraries, CMake and pkg-config files
# of gloo, Catch2, nlohmann-json, toml++, sentencepiece, zlib and zstd (copied from this machine's Debian
# packages, as scripts/setup.sh installs them), a pkg-config, and the tests' tokenizer (the BPE the CPU
# curves were trained with). benchmarks/gpu/device_check.sh finds it at build-gpu-deps/ (or $CARRY).
#   benchmarks/gpu/prepare_carry.sh [DEST]      (default build-gpu-deps/, ignored by git)
# Checks that the folder and the working tree together stay under 64 MiB, what may travel.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
DEST="${1:-$ROOT/build-gpu-deps}"
BUILD="${BUILD:-$ROOT/build}"  # the CPU build that made the tests' tokenizer
LIMIT=$((64 << 20))
HEADERS=(libgloo-dev catch2 nlohmann-json3-dev libtomlplusplus-dev libsentencepiece-dev zlib1g-dev libzstd-dev)
LIBS=(libz.so libzstd.so libsentencepiece.so libsentencepiece_train.so)
LIBDIR=/usr/lib/x86_64-linux-gnu

for p in "${HEADERS[@]}" pkgconf-bin libpkgconf3; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" ||
    { echo "[prepare_carry] expected the Debian package $p (scripts/setup.sh installs it), got none."; exit 1; }
done
if [[ ! -f "$BUILD/tests/assets/tokenizer/tokenizer.json" ]]; then
  echo "[prepare_carry] building the tests' tokenizer in $BUILD"
  cmake --build "$BUILD" --target titan_test_tokenizer
fi

rm -rf "$DEST"
mkdir -p "$DEST"/{include,lib/pkgconfig,lib/cmake,share/cmake,bin,tokenizer}
# Headers: every file each package installs under /usr/include, at the same relative path.
for p in "${HEADERS[@]}"; do
  dpkg -L "$p" | grep '^/usr/include/' | while read -r f; do
    if [[ -f "$f" ]]; then install -D -m 644 "$f" "$DEST/include/${f#/usr/include/}"; fi
  done
done
# Libraries as plain files (a link travels only as a link): the name the linker asks for and the soname.
for lib in "${LIBS[@]}"; do
  real="$(readlink -f "$LIBDIR/$lib")"
  soname="$(objdump -p "$real" | awk '/SONAME/ {print $2}')"
  cp -L "$real" "$DEST/lib/$lib"
  cp -L "$real" "$DEST/lib/$soname"
done
cp -L "$LIBDIR/libpkgconf.so.3" "$DEST/lib/"
# CMake package files: their targets find the prefix three folders up, which is $DEST (Catch2's also names
# its static main library, which titan does not link but CMake checks is there).
cp /usr/lib/libCatch2WithMain.a "$DEST/lib/"
cp -r /usr/lib/cmake/Catch2 "$DEST/lib/cmake/"
cp -r /usr/share/cmake/nlohmann_json "$DEST/share/cmake/"
# pkg-config files made relative to their folder.
for pc in libzstd sentencepiece; do
  sed -e 's|^prefix=.*|prefix=${pcfiledir}/../..|' -e 's|^exec_prefix=.*|exec_prefix=${prefix}|' \
      -e 's|^libdir=.*|libdir=${prefix}/lib|' -e 's|^includedir=.*|includedir=${prefix}/include|' \
      "$LIBDIR/pkgconfig/$pc.pc" >"$DEST/lib/pkgconfig/$pc.pc"
done
cp /usr/bin/pkgconf "$DEST/bin/"
cat >"$DEST/bin/pkg-config" <<'EOF'
#!/bin/sh
# pkgconf from the carried folder, with its library.
here="$(cd "$(dirname "$0")" && pwd)"
LD_LIBRARY_PATH="$here/../lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" exec "$here/pkgconf" "$@"
EOF
chmod +x "$DEST/bin/pkg-config"
cp "$BUILD/tests/assets/tokenizer/tokenizer.json" "$BUILD/tests/assets/tokenizer/tokenizer_config.json" \
   "$DEST/tokenizer/"

# It must answer as the build will ask.
PKG_CONFIG_PATH="$DEST/lib/pkgconfig" "$DEST/bin/pkg-config" --cflags --libs libzstd sentencepiece >/dev/null

carried=$(du -sb "$DEST" | cut -f1)
tree=$(cd "$ROOT" && git ls-files -z -co --exclude-standard | xargs -0 stat -c %s 2>/dev/null |
       awk '{s += $1} END {print s + 0}')
total=$((carried + tree))
awk -v d="$DEST" -v c="$carried" -v t="$tree" 'BEGIN {
  printf "[prepare_carry] %s: %.1f MiB; with the working tree (%.1f MiB): %.1f MiB of 64\n", d, c / 2^20, t / 2^20,
         (c + t) / 2^20 }'
if ((total >= LIMIT)); then
  echo "[prepare_carry] expected the tree and the folder under 64 MiB, got $total bytes."
  exit 1
fi
if ! (cd "$ROOT" && git check-ignore -q "$DEST" 2>/dev/null); then
  echo "[prepare_carry] note: $DEST is not ignored by git; a carried folder must be (add it to .git/info/exclude)."
fi
