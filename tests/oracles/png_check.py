# SPDX-License-Identifier: BSD-3-Clause
"""Oracle: decodes a PNG with zlib and struct only (CRC of every chunk checked, all five row filters) or
parses an SVG with xml.etree; writes what it found as JSON.

  png_check.py out.png result.json R,G,B ...   -> {"width", "height", "corner": [r, g, b], "counts": [n, ...],
                                                   "distinct": number of distinct colours}
  png_check.py out.svg result.json             -> {"root": tag, "polylines": n, "texts": [...]}
A file that is not a valid PNG or well-formed SVG exits 1 with the reason.
"""
import json
import struct
import sys
import zlib
import xml.etree.ElementTree as ET


def decode_png(data):
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        sys.exit("not a PNG signature")
    pos, chunks = 8, []
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + length]
        (crc,) = struct.unpack(">I", data[pos + 8 + length:pos + 12 + length])
        if zlib.crc32(kind + body) & 0xFFFFFFFF != crc:
            sys.exit(f"bad CRC in chunk {kind!r}")
        chunks.append((kind, body))
        pos += 12 + length
    if chunks[0][0] != b"IHDR" or chunks[-1][0] != b"IEND":
        sys.exit("IHDR must come first and IEND last")
    width, height, depth, color, _, _, interlace = struct.unpack(">IIBBBBB", chunks[0][1])
    if (depth, color, interlace) != (8, 2, 0):
        sys.exit(f"expected 8-bit RGB without interlace, got depth {depth} colour type {color}")
    raw = zlib.decompress(b"".join(body for kind, body in chunks if kind == b"IDAT"))
    stride, bpp = width * 3, 3
    if len(raw) != height * (stride + 1):
        sys.exit(f"expected {height * (stride + 1)} bytes of rows, got {len(raw)}")
    rows, prev = [], bytearray(stride)
    for y in range(height):
        kind, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for x in range(stride if kind != 0 else 0):
            a = line[x - bpp] if x >= bpp else 0
            b, c = prev[x], prev[x - bpp] if x >= bpp else 0
            if kind == 1:
                line[x] = (line[x] + a) & 0xFF
            elif kind == 2:
                line[x] = (line[x] + b) & 0xFF
            elif kind == 3:
                line[x] = (line[x] + (a + b) // 2) & 0xFF
            elif kind == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[x] = (line[x] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 0xFF
            elif kind != 0:
                sys.exit(f"unknown filter {kind} in row {y}")
        rows.append(bytes(line))
        prev = line
    return width, height, rows


def main():
    path, out = sys.argv[1], sys.argv[2]
    if path.endswith(".svg"):
        root = ET.parse(path).getroot()
        ns = "{http://www.w3.org/2000/svg}"
        result = {"root": root.tag, "polylines": len(root.findall(f"{ns}polyline")),
                  "texts": [t.text for t in root.findall(f"{ns}text")]}
    else:
        width, height, rows = decode_png(open(path, "rb").read())
        pixels = {}
        for row in rows:
            for x in range(0, len(row), 3):
                key = row[x:x + 3]
                pixels[key] = pixels.get(key, 0) + 1
        wanted = [bytes(int(v) for v in arg.split(",")) for arg in sys.argv[3:]]
        result = {"width": width, "height": height, "corner": list(rows[0][0:3]),
                  "counts": [pixels.get(w, 0) for w in wanted], "distinct": len(pixels)}
    with open(out, "w") as f:
        json.dump(result, f)


main()
