"""MegEngine's transforms added for compatibility: PseudoTransform, RandomVerticalFlip,
RandomResizedCrop and the colour jitters (Brightness/Contrast/Saturation/Hue, ColorJitter), each
checked against the behaviour MegEngine documents, with per-pixel references."""

import colorsys

import numpy as np
import pytest

from minigrad.data.transform import (
    BrightnessTransform,
    ColorJitter,
    ContrastTransform,
    HueTransform,
    PseudoTransform,
    RandomResizedCrop,
    RandomVerticalFlip,
    Resize,
    SaturationTransform,
)

RNG = np.random.default_rng(3)
IMG = RNG.integers(0, 256, size=(6, 8, 3), dtype=np.uint8)
MASK = RNG.integers(0, 4, size=(6, 8), dtype=np.uint8)


def test_pseudo_transform_is_the_identity():
    sample = (IMG, 3)
    assert PseudoTransform().apply(sample) is sample
    assert PseudoTransform().apply_batch([sample, sample]) == [sample, sample]


def test_random_vertical_flip_flips_image_and_mask_together():
    """With probability prob the H axis is mirrored; image and mask get the same draw."""
    img, mask = RandomVerticalFlip(1.0, order=("image", "mask")).apply((IMG, MASK))
    np.testing.assert_array_equal(img, IMG[::-1])
    np.testing.assert_array_equal(mask, MASK[::-1])
    assert RandomVerticalFlip(0.0).apply(IMG) is IMG
    np.random.seed(0)
    flips = [RandomVerticalFlip(0.3).apply(IMG)[0, 0, 0] == IMG[-1, 0, 0] for _ in range(400)]
    assert 0.2 < np.mean(flips) < 0.4
    with pytest.raises(ValueError, match=r"RandomVerticalFlip: prob must be in \[0, 1\]"):
        RandomVerticalFlip(1.5)


def test_random_resized_crop():
    """A crop of a scale_range fraction of the area with aspect ratio in ratio_range, resized to
    output_size; with scale and ratio pinned to the whole image it is Resize; when no draw fits,
    the central crop clamped to ratio_range is used; the mask follows with nearest sampling."""
    whole = RandomResizedCrop((3, 4), scale_range=(1.0, 1.0), ratio_range=(8 / 6, 8 / 6))
    np.testing.assert_array_equal(whole.apply(IMG), Resize((3, 4)).apply(IMG))
    wide = np.arange(10 * 20 * 3, dtype=np.float32).reshape(10, 20, 3)
    fallback = RandomResizedCrop((5, 5), scale_range=(2.0, 3.0))  # never fits: centre crop
    centre = wide[:, 3:16]  # ratio 2 > 4/3: width round(10 * 4/3) = 13, centred
    np.testing.assert_array_equal(fallback.apply(wide), Resize((5, 5)).apply(centre))
    np.random.seed(5)
    t = RandomResizedCrop(4, interpolation=0, order=("image", "mask"))  # cv2.INTER_NEAREST
    labels = np.repeat(MASK[..., None], 3, axis=-1)
    img, mask = t.apply((labels, MASK))
    assert img.shape == (4, 4, 3) and mask.shape == (4, 4)
    np.testing.assert_array_equal(img[..., 0], mask)  # same box for image and mask
    with pytest.raises(ValueError, match="RandomResizedCrop: interpolation must be"):
        RandomResizedCrop(4, interpolation="area")


def _alpha(value, seed):
    np.random.seed(seed)
    return np.random.uniform(max(0, 1 - value), 1 + value)


def _gray(img):
    return img.astype(np.float32) @ np.array([0.114, 0.587, 0.299], np.float32)


@pytest.mark.parametrize("cls,blend", [
    (BrightnessTransform, lambda x, a: x * a),
    (ContrastTransform, lambda x, a: x * a + _gray(x).mean() * (1 - a)),
    (SaturationTransform, lambda x, a: x * a + _gray(x)[..., None] * (1 - a)),
])
def test_brightness_contrast_saturation(cls, blend):
    """MegEngine: the factor is drawn uniformly from [max(0, 1 - value), 1 + value]; brightness
    scales, contrast blends with the mean grey level, saturation with the grey image (OpenCV's BGR
    luma weights); results are clipped to [0, 255] in the input dtype; value 0 is the identity."""
    a = _alpha(0.5, seed=11)
    np.random.seed(11)
    got = cls(0.5).apply((IMG, 1))
    want = np.clip(np.rint(blend(IMG.astype(np.float32), a)), 0, 255).astype(np.uint8)
    assert got[1] == 1 and got[0].dtype == np.uint8
    np.testing.assert_allclose(got[0].astype(int), want.astype(int), atol=1)
    assert cls(0).apply(IMG) is IMG
    with pytest.raises(ValueError, match=f"{cls.__name__}: value must be >= 0"):
        cls(-0.1)


def test_hue_rotates_colours():
    """HueTransform turns the hue (HSV, BGR images) by a fraction of the circle drawn from
    [-value, value], keeping saturation and value: colorsys is the per-pixel reference; grey
    images pass through."""
    np.random.seed(4)
    turn = np.random.uniform(-0.4, 0.4)
    np.random.seed(4)
    out = HueTransform(0.4).apply(IMG).astype(int)
    want = np.zeros_like(out)
    for i, j in np.ndindex(IMG.shape[:2]):
        b, g, r = IMG[i, j] / 255.0
        h, sat, v = colorsys.rgb_to_hsv(r, g, b)
        r, g, b = colorsys.hsv_to_rgb((h + turn) % 1.0, sat, v)
        want[i, j] = np.rint(np.array([b, g, r]) * 255)
    assert np.abs(out - want).max() <= 1
    assert abs(turn) > 0.05 and np.abs(out - IMG).max() > 20  # it did change the colours
    gray_img = IMG[..., :1]
    assert HueTransform(0.3).apply(gray_img) is gray_img
    with pytest.raises(ValueError, match=r"HueTransform: value must be in \[0, 0.5\]"):
        HueTransform(0.6)


def test_color_jitter():
    """ColorJitter applies the non-zero jitters in a random order each sample; one component alone
    equals that transform; all zero is the identity; labels pass through."""
    np.random.seed(8)
    only = ColorJitter(brightness=0.3).apply(IMG)
    np.random.seed(8)
    np.random.permutation(1)  # ColorJitter first draws the order
    np.testing.assert_array_equal(only, BrightnessTransform(0.3).apply(IMG))
    np.testing.assert_array_equal(ColorJitter().apply(IMG), IMG)
    np.random.seed(9)
    outs = [ColorJitter(0.4, 0.4, 0.4, 0.1).apply((IMG, 7)) for _ in range(3)]
    for img, label in outs:
        assert img.dtype == np.uint8 and img.shape == IMG.shape and label == 7
    assert not np.array_equal(outs[0][0], outs[1][0])
