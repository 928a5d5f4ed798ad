#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
# Test helper: compress a file as the data tests need it.
#   compress.py gz|zst INPUT OUTPUT
# gz uses Python's gzip; zst uses the `zstandard` package when installed, else the zstd CLI.
import gzip
import shutil
import subprocess
import sys


def main() -> int:
    kind, src, dst = sys.argv[1:4]
    with open(src, "rb") as f:
        data = f.read()
    if kind == "gz":
        with gzip.open(dst, "wb") as f:
            f.write(data)
        return 0
    try:
        import zstandard

        with open(dst, "wb") as f:
            f.write(zstandard.ZstdCompressor().compress(data))
        return 0
    except ImportError:
        if shutil.which("zstd") is None:
            return 2  # the test skips zst
        return subprocess.run(["zstd", "-q", "-f", src, "-o", dst]).returncode


if __name__ == "__main__":
    sys.exit(main())
