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
    GaussianNoise,
    HueTransform,
    Lighting,
    PseudoTransform,
    RandomResize,
    RandomResizedCrop,
    RandomVerticalFlip,
    Resize,
    SaturationTransform,
    ShortestEdgeResize,
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


# -- ShortestEdgeResize, RandomResize, GaussianNoise, Lighting -------------------------------------


def test_shortest_edge_resize_draws_the_short_side_and_caps_the_long_one():
    img = RNG.integers(0, 256, size=(30, 60, 3), dtype=np.uint8)
    mask = RNG.integers(0, 4, size=(30, 60), dtype=np.uint8)
    np.random.seed(4)
    size = np.random.randint(10, 21)  # the draw the transform makes
    np.random.seed(4)
    out, out_mask = ShortestEdgeResize((10, 20), max_size=1000,
                                       order=("image", "mask")).apply((img, mask))
    assert out.shape == (size, 2 * size, 3) and out_mask.shape == (size, 2 * size)
    np.testing.assert_array_equal(out, Resize((size, 2 * size)).apply(img))
    assert set(np.unique(out_mask)) <= set(np.unique(mask))  # nearest: no blended labels
    # long side capped: short side 40 would make the long one 80 > 50
    assert ShortestEdgeResize(40, max_size=50).apply(img).shape == (25, 50, 3)
    seen = {ShortestEdgeResize([16, 24], 1000, sample_style="choice").apply(img).shape[0]
            for _ in range(40)}
    assert seen == {16, 24}
    with pytest.raises(ValueError, match="sample_style must be 'range' or 'choice'"):
        ShortestEdgeResize(8, 16, sample_style="log")


def test_random_resize_scales_both_sides_by_one_factor():
    img = RNG.integers(0, 256, size=(10, 20, 3), dtype=np.uint8)
    np.random.seed(1)
    scale = np.random.uniform(0.5, 2.0)
    np.random.seed(1)
    out = RandomResize((0.5, 2.0)).apply(img)
    shape = (int(10 * scale + 0.5), int(20 * scale + 0.5))
    assert out.shape[:2] == shape
    np.testing.assert_array_equal(out, Resize(shape).apply(img))
    with pytest.raises(ValueError, match="scale_range must be"):
        RandomResize((2.0, 1.0))


def test_gaussian_noise_adds_scaled_normal_noise_and_clips():
    img = np.full((4, 5, 3), 128, np.uint8)
    np.random.seed(2)
    unit = np.random.normal(size=img.shape)
    np.random.seed(2)
    out = GaussianNoise(mean=[0.0, 0.1, 0.0], std=0.05).apply(img)
    ref = np.clip(np.rint(128 + (unit * 0.05 + np.array([0.0, 0.1, 0.0])) * 255), 0, 255)
    assert out.dtype == np.uint8
    np.testing.assert_allclose(out, ref, atol=1)  # float32 noise vs float64 reference
    bright = GaussianNoise(mean=2.0, std=0.0).apply(img)
    assert (bright == 255).all()  # clipped, not wrapped


def test_lighting_adds_one_pca_colour_shift_per_sample():
    img = RNG.uniform(50, 200, size=(3, 4, 3)).astype(np.float32)
    np.random.seed(5)
    alpha = np.random.normal(scale=0.1, size=3)
    np.random.seed(5)
    out = Lighting(0.1).apply(img)
    # ImageNet's PCA in RGB order (AlexNet), applied to a BGR image
    eigvec_rgb = np.array([[-0.5675, 0.7192, 0.4009],
                           [-0.5808, -0.0045, -0.8140],
                           [-0.5836, -0.6948, 0.4203]])
    shift_rgb = eigvec_rgb @ (alpha * np.array([0.2175, 0.0188, 0.0045])) * 255
    np.testing.assert_allclose(out - img, np.broadcast_to(shift_rgb[::-1], img.shape), atol=1e-3)
    assert Lighting(0).apply(img) is img


def test_torch_transform_compose_hands_rgb_to_pil_and_returns_bgr(monkeypatch):
    """MegEngine's TorchTransformCompose: BGR -> PIL (RGB) -> torchvision transforms -> BGR.
    Pillow is not installed here, so a minimal stand-in records what it is given."""
    import sys
    import types

    seen = []

    class FakeImage:
        def __init__(self, array):
            self.array = array

        def __array__(self, dtype=None, copy=None):
            return self.array.astype(dtype or self.array.dtype)

    module = types.ModuleType("PIL.Image")
    module.Image = FakeImage
    module.fromarray = lambda a: seen.append(a.copy()) or FakeImage(a)
    package = types.ModuleType("PIL")
    package.Image = module
    monkeypatch.setitem(sys.modules, "PIL", package)
    monkeypatch.setitem(sys.modules, "PIL.Image", module)
    from minigrad.data.transform import TorchTransformCompose

    flip = TorchTransformCompose(lambda im: FakeImage(im.array[:, ::-1]))  # a PIL-level op
    out, label = flip.apply((IMG, 7))
    np.testing.assert_array_equal(seen[0], IMG[..., ::-1])  # PIL got RGB
    np.testing.assert_array_equal(out, IMG[:, ::-1])        # back in BGR, flipped
    assert label == 7
    to_chw = TorchTransformCompose(lambda im: np.asarray(im).transpose(2, 0, 1) / 255.0)
    chw = to_chw.apply(IMG)
    np.testing.assert_allclose(chw, IMG.transpose(2, 0, 1) / 255.0)  # CHW, BGR order again
    with pytest.raises(TypeError, match="transforms must be callable"):
        TorchTransformCompose([1, 2])
