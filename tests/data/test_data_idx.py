"""IDX parser against hand-built files (struct-packed headers, independent of encode_idx)."""

import gzip
import struct

import numpy as np
import pytest

from minigrad.data.dataset.vision.idx import IDXFormatError, encode_idx, parse_idx, read_idx


def idx_bytes(code: int, shape: tuple, payload: bytes) -> bytes:
    header = struct.pack(">BBBB", 0, 0, code, len(shape)) + struct.pack(f">{len(shape)}I", *shape)
    return header + payload


def test_parse_uint8_images_against_manual_layout():
    rng = np.random.default_rng(0)
    ref = rng.integers(0, 256, size=(5, 28, 28), dtype=np.uint8)
    data = idx_bytes(0x08, (5, 28, 28), ref.tobytes())
    out = parse_idx(data, "imgs", expected_magic=2051, expected_shape=(None, 28, 28))
    assert out.dtype == np.uint8 and out.shape == (5, 28, 28)
    np.testing.assert_array_equal(out, ref)


@pytest.mark.parametrize("code,fmt,dtype", [(0x0B, ">h", np.int16), (0x0C, ">i", np.int32),
                                            (0x0D, ">f", np.float32), (0x0E, ">d", np.float64),
                                            (0x09, ">b", np.int8)])
def test_parse_big_endian_types(code, fmt, dtype):
    values = [-3, 0, 7, 100, -100, 42]
    payload = b"".join(struct.pack(fmt, v) for v in values)
    out = parse_idx(idx_bytes(code, (2, 3), payload))
    assert out.dtype == np.dtype(dtype) and out.dtype.isnative
    np.testing.assert_array_equal(out, np.array(values, dtype=np.float64).reshape(2, 3))


def test_encode_roundtrip_matches_manual_bytes():
    a = np.arange(6, dtype=np.int32).reshape(3, 2)
    assert encode_idx(a) == idx_bytes(0x0C, (3, 2), a.astype(">i4").tobytes())


def test_wrong_magic_names_file_and_values():
    data = idx_bytes(0x08, (3,), b"\x01\x02\x03")  # labels magic 2049
    with pytest.raises(IDXFormatError, match=r"imgs\.idx.*expected 2051.*got 2049"):
        parse_idx(data, "imgs.idx", expected_magic=2051)


def test_not_idx_at_all():
    with pytest.raises(IDXFormatError, match="not an IDX file"):
        parse_idx(b"GIF89a" + b"\0" * 20, "x.gz")
    with pytest.raises(IDXFormatError, match="too short"):
        parse_idx(b"\0\0", "tiny")


def test_truncated_header_and_payload():
    full = idx_bytes(0x08, (4, 28, 28), bytes(4 * 28 * 28))
    with pytest.raises(IDXFormatError, match="truncated header"):
        parse_idx(full[:9], "f")
    with pytest.raises(IDXFormatError, match=r"f: truncated payload.*needs 3136 bytes, .* 3135"):
        parse_idx(full[:-1], "f")
    with pytest.raises(IDXFormatError, match="trailing bytes"):
        parse_idx(full + b"\0", "f")


def test_wrong_count_and_shape():
    data = idx_bytes(0x08, (4, 28, 28), bytes(4 * 28 * 28))
    want = r"wrong shape: expected \(10000, 28, 28\).*\(4, 28, 28\)"
    with pytest.raises(IDXFormatError, match=want):
        parse_idx(data, "f", expected_shape=(10000, 28, 28))
    with pytest.raises(IDXFormatError, match="wrong shape"):
        parse_idx(data, "f", expected_shape=(None, 28))
    assert parse_idx(data, "f", expected_shape=(4, None, 28)).shape == (4, 28, 28)


def test_read_idx_gzip_and_plain(tmp_path):
    ref = np.arange(12, dtype=np.uint8).reshape(3, 4)
    raw = idx_bytes(0x08, (3, 4), ref.tobytes())
    (tmp_path / "a.idx").write_bytes(raw)
    (tmp_path / "a.idx.gz").write_bytes(gzip.compress(raw))
    np.testing.assert_array_equal(read_idx(tmp_path / "a.idx"), ref)
    np.testing.assert_array_equal(read_idx(tmp_path / "a.idx.gz"), ref)


def test_read_idx_truncated_gzip_names_file(tmp_path):
    raw = idx_bytes(0x08, (100, 28, 28), np.random.default_rng(1).bytes(100 * 28 * 28))
    gz = gzip.compress(raw)
    path = tmp_path / "cut.gz"
    path.write_bytes(gz[: len(gz) // 2])
    with pytest.raises(IDXFormatError, match=r"cut\.gz.*gzip"):
        read_idx(path)
