"""Transforms against straightforward float64 / per-pixel references."""

import numpy as np
import pytest

from minigrad.data.transform import (
    CenterCrop,
    Compose,
    Normalize,
    Pad,
    RandomCrop,
    RandomHorizontalFlip,
    Resize,
    ToMode,
)

RNG = np.random.default_rng(0)
IMG = RNG.integers(0, 256, size=(6, 5, 3), dtype=np.uint8)


def test_normalize_matches_float64():
    mean, std = [10.0, 20.0, 30.0], [2.0, 4.0, 8.0]
    out = Normalize(mean, std).apply(IMG)
    ref = (IMG.astype(np.float64) - np.array(mean)) / np.array(std)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, ref, rtol=1e-6)
    np.testing.assert_allclose(Normalize(5.0, 3.0).apply(IMG), (IMG - 5.0) / 3.0, rtol=1e-6)
    with pytest.raises(ValueError, match="std must be non-zero"):
        Normalize(0, [1, 0, 1])
    with pytest.raises(ValueError, match=r"mean has 2 values but the HWC image has 3 channels"):
        Normalize([1, 2]).apply(IMG)


def test_to_mode_chw():
    out = ToMode("CHW").apply(IMG)
    assert out.shape == (3, 6, 5) and out.flags.c_contiguous
    for c in range(3):
        for h in range(6):
            for w in range(5):
                assert out[c, h, w] == IMG[h, w, c]
    assert ToMode().apply(IMG[:, :, 0]).shape == (1, 6, 5)
    assert ToMode("HWC").apply(IMG) is IMG
    with pytest.raises(ValueError, match="mode must be"):
        ToMode("NCHW")


def test_pad_forms_and_per_channel_value():
    np.testing.assert_array_equal(
        Pad(2, value=7).apply(IMG), np.pad(IMG, ((2, 2), (2, 2), (0, 0)), constant_values=7)
    )
    np.testing.assert_array_equal(
        Pad((1, 3)).apply(IMG), np.pad(IMG, ((1, 1), (3, 3), (0, 0)))
    )
    out = Pad((1, 0, 2, 3), value=[1, 2, 3]).apply(IMG)
    assert out.shape == (7, 10, 3)
    np.testing.assert_array_equal(out[1:, 2:7], IMG)
    np.testing.assert_array_equal(out[0, 0], [1, 2, 3])
    np.testing.assert_array_equal(out[3, 9], [1, 2, 3])
    with pytest.raises(ValueError, match="Pad: size"):
        Pad((1, 2, 3))


def test_random_crop_is_a_window_of_the_padded_image_and_varies():
    np.random.seed(0)
    padded = np.pad(IMG, ((1, 1), (1, 1), (0, 0)))
    t = RandomCrop((4, 4), padding_size=1)
    seen = set()
    for _ in range(60):
        out = t.apply(IMG)
        hits = [(y, x) for y in range(5) for x in range(4)
                if np.array_equal(padded[y:y + 4, x:x + 4], out)]
        assert hits, "crop is not a window of the padded image"
        seen.add(hits[0])
    assert len(seen) > 10  # covers many of the 20 positions
    # larger than the padded image: padded further, the image at a random place inside
    np.random.seed(2)
    corners = set()
    for _ in range(30):
        big = RandomCrop((9, 7), padding_value=200).apply(IMG)  # IMG is 6 x 5
        assert big.shape == (9, 7, 3)
        hits = [(y, x) for y in range(4) for x in range(3)
                if np.array_equal(big[y:y + 6, x:x + 5], IMG)]
        assert hits and (big == 200).all(axis=-1).sum() == 9 * 7 - 6 * 5
        corners.add(hits[0])
    assert len(corners) > 4


def test_random_crop_and_flip_keep_image_and_mask_aligned():
    np.random.seed(1)
    mask = np.arange(30).reshape(6, 5)  # encodes positions
    image = np.repeat(mask[:, :, None], 3, axis=2).astype(np.int64)
    t = Compose([RandomCrop(3, padding_size=2, padding_value=-1, padding_maskvalue=-1,
                            order=("image", "mask", "label")),
                 RandomHorizontalFlip(0.5, order=("image", "mask", "label"))])
    for _ in range(20):
        img, m, label = t.apply((image, mask, "seven"))
        assert label == "seven"
        np.testing.assert_array_equal(img[:, :, 1], m)


def test_horizontal_flip_probability():
    np.testing.assert_array_equal(RandomHorizontalFlip(1.0).apply(IMG), IMG[:, ::-1])
    assert RandomHorizontalFlip(0.0).apply(IMG) is IMG
    np.random.seed(2)
    flips = sum(RandomHorizontalFlip(0.5).apply(IMG)[0, 0, 0] == IMG[0, -1, 0] for _ in range(400))
    assert 150 < flips < 250


def bilinear_reference(img, oh, ow):
    """Per-pixel half-pixel-centre bilinear resize in float64."""
    h, w = img.shape[:2]
    out = np.zeros((oh, ow) + img.shape[2:])
    for i in range(oh):
        sy = min(max((i + 0.5) * h / oh - 0.5, 0.0), h - 1)
        y0 = int(np.floor(sy))
        y1, wy = min(y0 + 1, h - 1), sy - np.floor(sy)
        for j in range(ow):
            sx = min(max((j + 0.5) * w / ow - 0.5, 0.0), w - 1)
            x0 = int(np.floor(sx))
            x1, wx = min(x0 + 1, w - 1), sx - np.floor(sx)
            out[i, j] = ((1 - wy) * ((1 - wx) * img[y0, x0] + wx * img[y0, x1])
                         + wy * ((1 - wx) * img[y1, x0] + wx * img[y1, x1]))
    return out


@pytest.mark.parametrize("shape", [(9, 7), (3, 4), (6, 5), (12, 2)])
def test_resize_bilinear_matches_reference(shape):
    img = IMG.astype(np.float64)
    out = Resize(shape).apply(img)
    assert out.shape == shape + (3,) and out.dtype == np.float64
    np.testing.assert_allclose(out, bilinear_reference(img, *shape), atol=1e-12)
    out8 = Resize(shape).apply(IMG)
    assert out8.dtype == np.uint8
    ref = bilinear_reference(img, *shape)
    tie = np.abs(ref - np.floor(ref) - 0.5) < 1e-9  # x.5 may round either way after float error
    diff = np.abs(out8.astype(np.int64) - np.rint(ref))
    assert np.all(diff[~tie] == 0) and np.all(diff[tie] <= 1)


def test_resize_properties():
    img = RNG.standard_normal((8, 6, 2))
    box = img.reshape(4, 2, 3, 2, 2).mean(axis=(1, 3))  # half-pixel 2x downscale == 2x2 mean
    np.testing.assert_allclose(Resize((4, 3)).apply(img), box, atol=1e-12)
    const = np.full((5, 7, 1), 3.5, np.float32)
    np.testing.assert_allclose(Resize((11, 3)).apply(const), 3.5)
    assert Resize(4).apply(np.zeros((8, 16, 3))).shape == (4, 8, 3)  # int: shorter side
    assert Resize(4).apply(np.zeros((16, 8))).shape == (8, 4)


def test_resize_nearest_and_mask():
    img = np.arange(12).reshape(3, 4)
    out = Resize((6, 2), interpolation="nearest").apply(img)
    ref = np.array([[img[int((i + 0.5) * 3 / 6), int((j + 0.5) * 4 / 2)] for j in range(2)]
                    for i in range(6)])
    np.testing.assert_array_equal(out, ref)
    _, mask = Resize((6, 2), order=("image", "mask")).apply((img.astype(np.float32), img))
    np.testing.assert_array_equal(mask, ref)  # masks are never blended
    with pytest.raises(ValueError, match="interpolation"):
        Resize(3, interpolation="cubic")


def test_center_crop_compose_and_apply_batch():
    np.testing.assert_array_equal(CenterCrop((2, 3)).apply(IMG), IMG[2:4, 1:4])
    t = Compose([Normalize(33.0, 78.0), ToMode("CHW")])
    samples = [(IMG, 3), (IMG[::-1], 4)]
    batch = t.apply_batch(samples)
    for (img, label), (ref_img, ref_label) in zip(batch, samples, strict=True):
        assert label == ref_label
        np.testing.assert_allclose(img, ((ref_img - 33.0) / 78.0).transpose(2, 0, 1), rtol=1e-6)
    with pytest.raises(TypeError, match="not a Transform"):
        Compose([lambda x: x])
    with pytest.raises(ValueError, match=r"expected an HWC \(or HW\) image"):
        CenterCrop(1).apply((np.zeros(3), 1))  # geometric transforms need an image
    with pytest.raises(ValueError, match=r"expected an image or a flat sample"):
        Normalize().apply((np.float32(3), 1))


def test_normalize_accepts_flat_and_tabular_samples():
    """MegEngine's beginner tutorials normalise flattened digits ``(784,)`` and feature rows."""
    flat = RNG.integers(0, 256, size=(784,), dtype=np.uint8)
    out, label = Normalize(33.3, 78.6).apply((flat, 7))
    assert out.shape == (784,) and out.dtype == np.float32 and label == 7
    np.testing.assert_allclose(out, (flat.astype(np.float64) - 33.3) / 78.6, atol=1e-6)
    rows = RNG.normal(size=(4,)).astype(np.float32)
    mean, std = [1.0, 2.0, 3.0, 4.0], [1.0, 2.0, 4.0, 8.0]
    np.testing.assert_allclose(Normalize(mean, std).apply(rows),
                               (rows - np.array(mean)) / np.array(std), rtol=1e-6)
    with pytest.raises(ValueError, match="mean has 3 values but the sample has 4 features"):
        Normalize([1.0, 2.0, 3.0]).apply(rows)
