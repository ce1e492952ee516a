"""Reading an image file as MegEngine's datasets do (``cv2.imread(path, cv2.IMREAD_COLOR)``):
an ``(H, W, 3)`` uint8 array in BGR channel order, grey images repeated to three channels and any
alpha channel dropped.

PNG (8-bit, not interlaced), binary PGM/PPM (``P5``/``P6``) and ``.npy`` arrays are decoded here
with NumPy and zlib alone; every other format (JPEG...) is handed to OpenCV when it is installed,
and otherwise is an error naming the file.

Example::

    image = read_image("train/n01440764/img_0001.png")    # (H, W, 3) uint8, BGR
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import struct
import zlib
from pathlib import Path

import numpy as np

__all__ = ["IMAGE_EXTENSIONS", "decode_png", "is_image_file", "read_image"]

#: what ImageFolder takes for an image by default (MegEngine's list, plus .npy arrays)
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp",
                    ".npy")
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_PNG_CHANNELS = {0: 1, 2: 3, 4: 2, 6: 4}  # colour type -> samples per pixel


def is_image_file(path: str | os.PathLike) -> bool:
    """True when the file name ends with one of :data:`IMAGE_EXTENSIONS` (any letter case)."""
    return os.fspath(path).lower().endswith(IMAGE_EXTENSIONS)


def _paeth(a: int, b: int, c: int) -> int:
    p = a + b - c
    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
    return a if pa <= pb and pa <= pc else b if pb <= pc else c


def _unfilter(raw: bytes, height: int, stride: int, bpp: int, where: str) -> np.ndarray:
    """Undo PNG's per-row filters (none, sub, up, average, Paeth) on the decompressed rows."""
    if len(raw) != height * (stride + 1):
        raise ValueError(f"read_image: {where}: image data is {len(raw)} bytes, expected "
                         f"{height * (stride + 1)}")
    rows = np.frombuffer(raw, np.uint8).reshape(height, stride + 1)
    out = np.zeros((height, stride), np.uint8)
    previous = np.zeros(stride, np.uint8)
    for y in range(height):
        kind, line = rows[y, 0], rows[y, 1:]
        if kind == 0:
            row = line.copy()
        elif kind == 2:
            row = line + previous  # uint8 arithmetic wraps mod 256, as PNG's does
        elif kind in (1, 3, 4):
            row = line.astype(np.int64)
            up = previous.astype(np.int64)
            for x in range(stride):
                left = row[x - bpp] if x >= bpp else 0
                corner = up[x - bpp] if x >= bpp else 0
                if kind == 1:
                    guess = left
                elif kind == 3:
                    guess = (left + up[x]) // 2
                else:
                    guess = _paeth(left, up[x], corner)
                row[x] = (row[x] + guess) & 0xFF
            row = row.astype(np.uint8)
        else:
            raise ValueError(f"read_image: {where}: unknown PNG filter type {kind} in row {y}")
        out[y] = previous = row
    return out


def decode_png(data: bytes, where: str = "<bytes>") -> np.ndarray:
    """An 8-bit, non-interlaced PNG as an ``(H, W, C)`` uint8 array in the file's channel order
    (C = 1 grey, 2 grey+alpha, 3 RGB, 4 RGBA)."""
    if not data.startswith(PNG_SIGNATURE):
        raise ValueError(f"read_image: {where} is not a PNG file")
    pos, header, chunks = len(PNG_SIGNATURE), None, []
    while pos + 8 <= len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        pos += 12 + length
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            chunks.append(body)
        elif kind == b"IEND":
            break
    if header is None:
        raise ValueError(f"read_image: {where}: PNG without an IHDR chunk")
    width, height, depth, colour, _, _, interlace = header
    if depth != 8 or colour not in _PNG_CHANNELS or interlace:
        raise ValueError(f"read_image: {where}: only 8-bit non-interlaced grey/RGB(A) PNGs decode "
                         f"without OpenCV (bit depth {depth}, colour type {colour}, interlace "
                         f"{interlace})")
    channels = _PNG_CHANNELS[colour]
    rows = _unfilter(zlib.decompress(b"".join(chunks)), height, width * channels, channels, where)
    return rows.reshape(height, width, channels)


def _decode_pnm(data: bytes, where: str) -> np.ndarray:
    """Binary PGM (P5) / PPM (P6) with maxval <= 255 as an (H, W, 1 or 3) array (RGB)."""
    fields, pos = [], 0
    while len(fields) < 4:
        while pos < len(data) and data[pos:pos + 1].isspace():
            pos += 1
        if data[pos:pos + 1] == b"#":
            pos = data.index(b"\n", pos) + 1
            continue
        end = pos
        while end < len(data) and not data[end:end + 1].isspace():
            end += 1
        fields.append(data[pos:end])
        pos = end
    magic, width, height, maxval = fields[0], int(fields[1]), int(fields[2]), int(fields[3])
    channels = {b"P5": 1, b"P6": 3}.get(magic)
    if channels is None or maxval > 255:
        raise ValueError(f"read_image: {where}: only binary 8-bit PGM/PPM decode without OpenCV")
    pixels = np.frombuffer(data, np.uint8, width * height * channels, pos + 1)
    return pixels.reshape(height, width, channels)


def _as_bgr(image: np.ndarray, rgb_order: bool) -> np.ndarray:
    """Three channels, BGR: grey repeated, alpha dropped, RGB reversed."""
    if image.ndim == 2:
        image = image[:, :, None]
    if image.shape[-1] in (1, 2):
        return np.ascontiguousarray(np.repeat(image[..., :1], 3, axis=-1))
    image = image[..., :3]
    return np.ascontiguousarray(image[..., ::-1] if rgb_order else image)


def read_image(path: str | os.PathLike) -> np.ndarray:
    """The image at ``path`` as ``cv2.imread(path, cv2.IMREAD_COLOR)`` gives it: ``(H, W, 3)``
    uint8, BGR. A ``.npy`` file is returned as stored (it is assumed to be HWC already)."""
    path = Path(path)
    where = repr(str(path))
    if path.suffix.lower() == ".npy":
        return np.load(path, allow_pickle=False)
    data = path.read_bytes()
    if data.startswith(PNG_SIGNATURE):
        return _as_bgr(decode_png(data, where), rgb_order=True)
    if data[:2] in (b"P5", b"P6"):
        return _as_bgr(_decode_pnm(data, where), rgb_order=True)
    if importlib.util.find_spec("cv2") is None:
        raise ValueError(f"read_image: {where} is not a PNG, PGM/PPM or .npy file, and decoding "
                         "other formats (JPEG...) needs OpenCV (pip install opencv-python)")
    cv2 = importlib.import_module("cv2")
    image = cv2.imread(str(path), cv2.IMREAD_COLOR)
    if image is None:
        raise ValueError(f"read_image: OpenCV could not decode {where}")
    return image
