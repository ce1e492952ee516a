"""Per-sample data transforms on NumPy images in HWC layout (MegEngine style).

Every transform has ``apply(sample)`` and ``apply_batch(samples)``; the DataLoader calls
``apply_batch`` on each batch of samples before collating. A sample is either an image array or a
tuple such as ``(image, label)``; ``order`` names the role of each tuple element: ``"image"`` is
transformed, ``"mask"`` gets the same geometric change (nearest-neighbour, no normalisation), and
any other name (``"image_category"``, ``"label"``...) passes through. The default order is
``("image",)``: the first element is the image, the rest pass through. A random transform draws
its parameters once per sample, so an image and its mask stay aligned. Randomness uses NumPy's
global RNG, which the DataLoader reseeds differently in each worker process.

Example::

    t = Compose([RandomCrop(28, padding_size=2), Normalize(mean=33.3, std=78.6), ToMode("CHW")])
    image, label = t.apply((image_hwc_uint8, label))   # image: float32 (1, 28, 28)
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = [
    "Transform",
    "VisionTransform",
    "Compose",
    "Normalize",
    "ToMode",
    "Pad",
    "RandomCrop",
    "CenterCrop",
    "RandomHorizontalFlip",
    "Resize",
    "PseudoTransform",
    "RandomVerticalFlip",
    "RandomResizedCrop",
    "BrightnessTransform",
    "ContrastTransform",
    "SaturationTransform",
    "HueTransform",
    "ColorJitter",
    "ShortestEdgeResize",
    "RandomResize",
    "GaussianNoise",
    "Lighting",
    "TorchTransformCompose",
]


class Transform:
    """Base class: ``apply`` transforms one sample, ``apply_batch`` a list of samples."""

    def apply(self, input: Any) -> Any:
        """The transformed sample (what subclasses define)."""
        raise NotImplementedError

    def apply_batch(self, inputs: Sequence[Any]) -> list[Any]:
        """Every sample of ``inputs`` transformed (the DataLoader calls this once per batch)."""
        return [self.apply(x) for x in inputs]

    def __call__(self, input: Any) -> Any:
        return self.apply(input)

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in vars(self).items() if not k.startswith("_"))
        return f"{type(self).__name__}({args})"


class Compose(Transform):
    """Apply ``transforms`` one after the other.

    Example::

        Compose([RandomCrop(28, padding_size=2), Normalize(33.3, 78.6), ToMode("CHW")])
    """

    def __init__(self, transforms: Sequence[Transform] = ()) -> None:
        for t in transforms:
            if not hasattr(t, "apply") or not hasattr(t, "apply_batch"):
                raise TypeError(f"Compose: {t!r} is not a Transform (needs apply/apply_batch)")
        self.transforms = list(transforms)

    def apply(self, input: Any) -> Any:
        for t in self.transforms:
            input = t.apply(input)
        return input

    def apply_batch(self, inputs: Sequence[Any]) -> list[Any]:
        inputs = list(inputs)
        for t in self.transforms:
            inputs = t.apply_batch(inputs)
        return inputs


class VisionTransform(Transform):
    """Dispatches a sample's elements by role (see module docstring); subclasses implement
    ``_apply_image`` (and ``_apply_mask`` for geometric transforms) and, if random, ``_params``."""

    ROLES_TRANSFORMED = ("image", "mask")

    def __init__(self, order: Sequence[str] | None = None) -> None:
        self.order = ("image",) if order is None else tuple(order)
        if "image" not in self.order:
            raise ValueError(f"{type(self).__name__}: order must contain 'image', got {self.order}")

    def apply(self, input: Any) -> Any:
        """Transform an image array, or the image (and masks) of a tuple sample by ``order``."""
        if isinstance(input, np.ndarray):
            image = self._check(input)
            return self._apply_image(image, self._params(image))
        if not isinstance(input, (tuple, list)):
            raise TypeError(
                f"{type(self).__name__}: expected an image array or a tuple sample, "
                f"got {type(input).__name__}"
            )
        if self.order == ("image",) and input and type(input) is tuple:  # fast common path
            image = self._check(input[0])
            return (self._apply_image(image, self._params(image)),) + input[1:]
        if len(input) < len(self.order):
            raise ValueError(
                f"{type(self).__name__}: order {self.order} names {len(self.order)} elements, "
                f"sample has {len(input)}"
            )
        image = self._check(input[self.order.index("image")])
        params = self._params(image)
        out = list(input)
        for i, role in enumerate(self.order):
            if role == "image":
                out[i] = self._apply_image(self._check(input[i]), params)
            elif role == "mask":
                out[i] = self._apply_mask(self._check(input[i]), params)
        if isinstance(input, tuple):
            return type(input)(*out) if hasattr(input, "_fields") else tuple(out)
        return out

    def _check(self, image: Any) -> np.ndarray:
        if not isinstance(image, np.ndarray) or image.ndim not in (2, 3):
            got = getattr(image, "shape", type(image).__name__)
            raise ValueError(
                f"{type(self).__name__}: expected an HWC (or HW) image array, got {got}"
            )
        return image

    def _params(self, image: np.ndarray) -> Any:
        return None

    def _apply_image(self, image: np.ndarray, params: Any) -> np.ndarray:
        raise NotImplementedError

    def _apply_mask(self, mask: np.ndarray, params: Any) -> np.ndarray:
        return mask


def _pair(name: str, owner: str, value: int | Sequence[int]) -> tuple[int, int]:
    pair = (value, value) if np.isscalar(value) else tuple(value)
    if len(pair) != 2 or any(int(v) != v or v <= 0 for v in pair):
        raise ValueError(f"{owner}: {name} must be a positive int or (h, w), got {value!r}")
    return int(pair[0]), int(pair[1])


class Normalize(VisionTransform):
    """``(image - mean) / std`` in float32; ``mean``/``std`` are scalars or per-channel (the last
    axis). Besides HWC/HW images it accepts flat or tabular samples of any rank, such as a
    flattened MNIST digit ``(784,)``, as MegEngine does (a 1-D ``mean`` then has one value per
    feature)."""

    def __init__(self, mean: float | Sequence[float] = 0.0, std: float | Sequence[float] = 1.0,
                 order: Sequence[str] | None = None) -> None:
        super().__init__(order)
        self.mean = np.asarray(mean, dtype=np.float32)
        self.std = np.asarray(std, dtype=np.float32)
        if self.mean.ndim > 1 or self.std.ndim > 1:
            raise ValueError("Normalize: mean and std must be scalars or 1-D per-channel values")
        if np.any(self.std == 0):
            raise ValueError(f"Normalize: std must be non-zero, got {self.std.tolist()}")

    def _check(self, image: Any) -> np.ndarray:
        if not isinstance(image, np.ndarray) or image.ndim == 0:
            got = getattr(image, "shape", type(image).__name__)
            raise ValueError(f"Normalize: expected an image or a flat sample array, got {got}")
        return image

    def _apply_image(self, image: np.ndarray, params: Any) -> np.ndarray:
        channels = 1 if image.ndim == 2 else image.shape[-1]
        what = "the HWC image has" if image.ndim == 3 else "the sample has"
        unit = "channels" if image.ndim >= 2 else "features"
        for name, v in (("mean", self.mean), ("std", self.std)):
            if v.ndim == 1 and v.shape[0] not in (1, channels):
                raise ValueError(
                    f"Normalize: {name} has {v.shape[0]} values but {what} {channels} {unit} "
                    f"(shape {image.shape})"
                )
        return (image.astype(np.float32) - self.mean) / self.std


class ToMode(VisionTransform):
    """Change the layout from HWC to ``mode`` ("CHW", or "HWC" for a no-op); HW gets a C axis."""

    def __init__(self, mode: str = "CHW", order: Sequence[str] | None = None) -> None:
        super().__init__(order)
        if mode not in ("CHW", "HWC"):
            raise ValueError(f"ToMode: mode must be 'CHW' or 'HWC', got {mode!r}")
        self.mode = mode

    def _apply_image(self, image: np.ndarray, params: Any) -> np.ndarray:
        if image.ndim == 2:
            image = image[:, :, None]
        return np.ascontiguousarray(image.transpose(2, 0, 1)) if self.mode == "CHW" else image

    _apply_mask = _apply_image


def _pad(image: np.ndarray, top: int, bottom: int, left: int, right: int, value: Any) -> np.ndarray:
    """Constant padding of the H and W axes; ``value`` may be per-channel."""
    h, w = image.shape[:2]
    out = np.empty((h + top + bottom, w + left + right) + image.shape[2:], dtype=image.dtype)
    out[...] = np.asarray(value, dtype=image.dtype)
    out[top:top + h, left:left + w] = image
    return out


class Pad(VisionTransform):
    """Constant padding; ``size``: an int, (vertical, horizontal) or (top, bottom, left, right)."""

    def __init__(self, size: int | Sequence[int] = 0, value: float | Sequence[float] = 0,
                 mask_value: int = 0, order: Sequence[str] | None = None) -> None:
        super().__init__(order)
        s = (size,) if np.isscalar(size) else tuple(size)
        if len(s) not in (1, 2, 4) or any(int(v) != v or v < 0 for v in s):
            raise ValueError(
                f"Pad: size must be a non-negative int, (v, h) or (top, bottom, left, right), "
                f"got {size!r}"
            )
        s = tuple(int(v) for v in s)
        self.size = s * 4 if len(s) == 1 else (s[0], s[0], s[1], s[1]) if len(s) == 2 else s
        self.value, self.mask_value = value, mask_value

    def _apply_image(self, image: np.ndarray, params: Any) -> np.ndarray:
        return _pad(image, *self.size, self.value)

    def _apply_mask(self, mask: np.ndarray, params: Any) -> np.ndarray:
        return _pad(mask, *self.size, self.mask_value)


class RandomCrop(VisionTransform):
    """Pad by ``padding_size`` on every side, then crop ``output_size`` at a random position.
    An image still smaller than ``output_size`` after that padding is padded further (with
    ``padding_value``, masks with ``padding_maskvalue``) so that it sits at a random position in
    the crop, as MegEngine does (``RandomCrop((150, 120), padding_size=10)`` of a 100 x 100
    image gives 150 x 120)."""

    def __init__(self, output_size: int | Sequence[int], padding_size: int = 0,
                 padding_value: float | Sequence[float] = 0, padding_maskvalue: int = 0,
                 order: Sequence[str] | None = None) -> None:
        super().__init__(order)
        self.output_size = _pair("output_size", "RandomCrop", output_size)
        if int(padding_size) != padding_size or padding_size < 0:
            raise ValueError(f"RandomCrop: padding_size must be an int >= 0, got {padding_size!r}")
        self.padding_size = int(padding_size)
        self.padding_value, self.padding_maskvalue = padding_value, padding_maskvalue

    def _params(self, image: np.ndarray) -> tuple[int, int, int, int]:
        """(y, x) of the crop in the padded image, and the extra (top, left) padding of an image
        smaller than the crop (the bottom and right take the rest)."""
        h, w = (n + 2 * self.padding_size for n in image.shape[:2])
        oh, ow = self.output_size
        top = np.random.randint(oh - h + 1) if oh > h else 0
        left = np.random.randint(ow - w + 1) if ow > w else 0
        y = np.random.randint(h - oh + 1) if h >= oh else 0
        x = np.random.randint(w - ow + 1) if w >= ow else 0
        return y, x, top, left

    def _crop(self, image: np.ndarray, params, value: Any) -> np.ndarray:
        p = self.padding_size
        y, x, top, left = params
        h, w = image.shape[0] + 2 * p, image.shape[1] + 2 * p
        oh, ow = self.output_size
        bottom, right = max(0, oh - h - top), max(0, ow - w - left)
        if p or top or left or bottom or right:
            image = _pad(image, p + top, p + bottom, p + left, p + right, value)
        return image[y:y + oh, x:x + ow].copy()

    def _apply_image(self, image: np.ndarray, params) -> np.ndarray:
        return self._crop(image, params, self.padding_value)

    def _apply_mask(self, mask: np.ndarray, params) -> np.ndarray:
        return self._crop(mask, params, self.padding_maskvalue)


class CenterCrop(VisionTransform):
    """Crop ``output_size`` from the centre (the deterministic counterpart of RandomCrop)."""

    def __init__(self, output_size: int | Sequence[int],
                 order: Sequence[str] | None = None) -> None:
        super().__init__(order)
        self.output_size = _pair("output_size", "CenterCrop", output_size)

    def _apply_image(self, image: np.ndarray, params: Any) -> np.ndarray:
        (h, w), (oh, ow) = image.shape[:2], self.output_size
        if oh > h or ow > w:
            raise ValueError(f"CenterCrop: output_size {self.output_size} > image ({h}, {w})")
        y, x = (h - oh) // 2, (w - ow) // 2
        return image[y:y + oh, x:x + ow].copy()

    _apply_mask = _apply_image


class RandomHorizontalFlip(VisionTransform):
    """Mirror the W axis with probability ``prob``."""

    def __init__(self, prob: float = 0.5, order: Sequence[str] | None = None) -> None:
        super().__init__(order)
        if not 0.0 <= prob <= 1.0:
            raise ValueError(f"{type(self).__name__}: prob must be in [0, 1], got {prob}")
        self.prob = float(prob)

    def _params(self, image: np.ndarray) -> bool:
        return bool(np.random.random_sample() < self.prob)

    def _apply_image(self, image: np.ndarray, flip: bool) -> np.ndarray:
        return image[:, ::-1].copy() if flip else image

    _apply_mask = _apply_image


def _src_coords(n_out: int, n_in: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Half-pixel-centre source coordinates (OpenCV INTER_LINEAR convention): i0, i1, weight."""
    src = np.clip((np.arange(n_out) + 0.5) * (n_in / n_out) - 0.5, 0, n_in - 1)
    i0 = np.floor(src).astype(np.int64)
    return i0, np.minimum(i0 + 1, n_in - 1), src - i0


def _resize(image: np.ndarray, oh: int, ow: int, interpolation: str) -> np.ndarray:
    h, w = image.shape[:2]
    if (oh, ow) == (h, w):
        return image.copy()
    if interpolation == "nearest":
        ys = np.minimum(((np.arange(oh) + 0.5) * (h / oh)).astype(np.int64), h - 1)
        xs = np.minimum(((np.arange(ow) + 0.5) * (w / ow)).astype(np.int64), w - 1)
        return image[ys][:, xs]
    (y0, y1, fy), (x0, x1, fx) = _src_coords(oh, h), _src_coords(ow, w)
    extra = (1,) * (image.ndim - 2)
    fy, fx = fy.reshape((oh, 1) + extra), fx.reshape((1, ow) + extra)
    # float32 images stay float32; integers go through float64 so rounding matches exact maths.
    ftype = np.float32 if image.dtype in (np.float32, np.float16) else np.float64
    img = image.astype(ftype)
    rows0, rows1 = img[y0], img[y1]
    top = rows0[:, x0] * (1 - fx) + rows0[:, x1] * fx
    bottom = rows1[:, x0] * (1 - fx) + rows1[:, x1] * fx
    out = top * (1 - fy) + bottom * fy
    if np.issubdtype(image.dtype, np.integer):
        info = np.iinfo(image.dtype)
        return np.clip(np.rint(out), info.min, info.max).astype(image.dtype)
    return out.astype(image.dtype, copy=False)


class Resize(VisionTransform):
    """Resize to ``output_size`` = (h, w), or an int for the shorter side (aspect kept).

    ``interpolation`` is ``"bilinear"`` (half-pixel centres, like OpenCV's INTER_LINEAR) or
    ``"nearest"``; masks always use nearest so labels are never blended.
    """

    def __init__(self, output_size: int | Sequence[int], interpolation: str = "bilinear",
                 order: Sequence[str] | None = None) -> None:
        super().__init__(order)
        if interpolation not in ("bilinear", "nearest"):
            raise ValueError(
                f"Resize: interpolation must be 'bilinear' or 'nearest', got {interpolation!r}"
            )
        if np.isscalar(output_size):
            _pair("output_size", "Resize", output_size)
            self.output_size: int | tuple[int, int] = int(output_size)
        else:
            self.output_size = _pair("output_size", "Resize", output_size)
        self.interpolation = interpolation

    def _shape(self, h: int, w: int) -> tuple[int, int]:
        if not isinstance(self.output_size, int):
            return self.output_size
        s = self.output_size
        return (s, max(1, round(s * w / h))) if h <= w else (max(1, round(s * h / w)), s)

    def _apply_image(self, image: np.ndarray, params: Any) -> np.ndarray:
        return _resize(image, *self._shape(*image.shape[:2]), self.interpolation)

    def _apply_mask(self, mask: np.ndarray, params: Any) -> np.ndarray:
        return _resize(mask, *self._shape(*mask.shape[:2]), "nearest")


# -- MegEngine's other transforms: identity, vertical flip, random resized crop, colour jitter ----


class PseudoTransform(Transform):
    """The identity: every sample passes unchanged (where an API requires some transform)."""

    def apply(self, input: Any) -> Any:
        return input


class RandomVerticalFlip(RandomHorizontalFlip):
    """Mirror the H axis with probability ``prob``."""

    def _apply_image(self, image: np.ndarray, flip: bool) -> np.ndarray:
        return image[::-1].copy() if flip else image

    _apply_mask = _apply_image


_CV2_INTERPOLATION = {0: "nearest", 1: "bilinear"}  # cv2.INTER_NEAREST, cv2.INTER_LINEAR


class RandomResizedCrop(VisionTransform):
    """Crop a random area (a ``scale_range`` fraction of the image, aspect ratio drawn
    log-uniformly from ``ratio_range``) and resize it to ``output_size`` (the Inception-style
    augmentation). After 10 draws that do not fit, the central crop closest to ``ratio_range`` is
    used. ``interpolation``: ``"bilinear"`` or ``"nearest"`` (or OpenCV's codes 1 and 0); masks use
    nearest."""

    def __init__(self, output_size: int | Sequence[int], scale_range=(0.08, 1.0),
                 ratio_range=(3.0 / 4, 4.0 / 3), interpolation: str | int = "bilinear",
                 order: Sequence[str] | None = None) -> None:
        super().__init__(order)
        self.output_size = _pair("output_size", "RandomResizedCrop", output_size)
        for name, (lo, hi) in (("scale_range", scale_range), ("ratio_range", ratio_range)):
            if not 0 < lo <= hi:
                raise ValueError(f"RandomResizedCrop: {name} must be (min, max) with "
                                 f"0 < min <= max, got {(lo, hi)}")
        self.scale_range, self.ratio_range = tuple(scale_range), tuple(ratio_range)
        interp = _CV2_INTERPOLATION.get(interpolation, interpolation)
        if interp not in ("bilinear", "nearest"):
            raise ValueError(f"RandomResizedCrop: interpolation must be 'bilinear' or 'nearest', "
                             f"got {interpolation!r}")
        self.interpolation = interp

    def _params(self, image: np.ndarray) -> tuple[int, int, int, int]:
        h, w = image.shape[:2]
        log_ratio = (np.log(self.ratio_range[0]), np.log(self.ratio_range[1]))
        for _ in range(10):
            area = np.random.uniform(*self.scale_range) * h * w
            ratio = np.exp(np.random.uniform(*log_ratio))
            cw, ch = int(round(np.sqrt(area * ratio))), int(round(np.sqrt(area / ratio)))
            if 0 < cw <= w and 0 < ch <= h:
                return np.random.randint(0, w - cw + 1), np.random.randint(0, h - ch + 1), cw, ch
        ratio = w / h  # fallback: the whole image, trimmed to the nearest allowed aspect ratio
        cw, ch = w, h
        if ratio < self.ratio_range[0]:
            ch = int(round(w / self.ratio_range[0]))
        elif ratio > self.ratio_range[1]:
            cw = int(round(h * self.ratio_range[1]))
        return (w - cw) // 2, (h - ch) // 2, cw, ch

    def _crop_resize(self, image: np.ndarray, box, interpolation: str) -> np.ndarray:
        x, y, cw, ch = box
        return _resize(image[y:y + ch, x:x + cw], *self.output_size, interpolation)

    def _apply_image(self, image: np.ndarray, box) -> np.ndarray:
        return self._crop_resize(image, box, self.interpolation)

    def _apply_mask(self, mask: np.ndarray, box) -> np.ndarray:
        return self._crop_resize(mask, box, "nearest")


def _gray(image: np.ndarray) -> np.ndarray:
    """Luma of an HWC image in OpenCV's BGR channel order (one channel: itself), float32, HW1."""
    img = image.astype(np.float32)
    if img.ndim == 2 or img.shape[-1] == 1:
        return img.reshape(img.shape[:2] + (1,))
    return (img[..., :3] @ np.array([0.114, 0.587, 0.299], np.float32))[..., None]


def _to_dtype(image: np.ndarray, dtype) -> np.ndarray:
    """Clip to [0, 255] (MegEngine's colour transforms assume 8-bit ranges) and cast back,
    rounding for integer types."""
    image = np.clip(image, 0, 255)
    return (np.rint(image) if np.issubdtype(dtype, np.integer) else image).astype(dtype)


class _Jitter(VisionTransform):
    """A colour transform that draws one factor per sample from ``[max(0, 1 - v), 1 + v]``."""

    def __init__(self, value: float, order: Sequence[str] | None = None) -> None:
        super().__init__(order)
        if value < 0:
            raise ValueError(f"{type(self).__name__}: value must be >= 0, got {value}")
        self.value = float(value)

    def _params(self, image: np.ndarray) -> float:
        return float(np.random.uniform(max(0.0, 1 - self.value), 1 + self.value))

    def _apply_image(self, image: np.ndarray, alpha: float) -> np.ndarray:
        if self.value == 0:
            return image
        return _to_dtype(self._blend(image.astype(np.float32), alpha), image.dtype)


class BrightnessTransform(_Jitter):
    """Scale the image by a factor from ``[max(0, 1 - value), 1 + value]``."""

    def _blend(self, image: np.ndarray, alpha: float) -> np.ndarray:
        return image * alpha


class ContrastTransform(_Jitter):
    """Blend the image with its mean grey level, weight from ``[max(0, 1 - value), 1 + value]``."""

    def _blend(self, image: np.ndarray, alpha: float) -> np.ndarray:
        return image * alpha + _gray(image).mean() * (1 - alpha)


class SaturationTransform(_Jitter):
    """Blend the image with its grey version, weight from ``[max(0, 1 - value), 1 + value]``."""

    def _blend(self, image: np.ndarray, alpha: float) -> np.ndarray:
        return image * alpha + _gray(image) * (1 - alpha)


def _shift_hue(image: np.ndarray, turn: float) -> np.ndarray:
    """Rotate the hue of a BGR image by ``turn`` of a full circle, keeping saturation and value
    (HSV computed in float, per pixel)."""
    bgr = image[..., :3].astype(np.float64)
    b, g, r = bgr[..., 0], bgr[..., 1], bgr[..., 2]
    v = bgr.max(-1)
    c = v - bgr.min(-1)
    safe = np.where(c > 0, c, 1.0)
    h = np.where(v == r, (g - b) / safe, np.where(v == g, 2 + (b - r) / safe, 4 + (r - g) / safe))
    h = ((h / 6.0 + turn) % 1.0) * 6.0
    # back to RGB: each channel is v - c * clip(min(k, 4 - k), 0, 1) with k = (n + h) mod 6
    out = np.empty_like(bgr)
    for channel, n in ((2, 5.0), (1, 3.0), (0, 1.0)):  # r, g, b in BGR order
        k = (n + h) % 6
        out[..., channel] = v - c * np.clip(np.minimum(k, 4 - k), 0, 1)
    result = image.astype(np.float64).copy()
    result[..., :3] = out
    return result


class HueTransform(VisionTransform):
    """Rotate the hue (of a 3-channel BGR image) by a fraction of a full turn drawn from
    ``[-value, value]``, ``value`` in [0, 0.5]; grey images pass through."""

    def __init__(self, value: float, order: Sequence[str] | None = None) -> None:
        super().__init__(order)
        if not 0 <= value <= 0.5:
            raise ValueError(f"HueTransform: value must be in [0, 0.5], got {value}")
        self.value = float(value)

    def _params(self, image: np.ndarray) -> float:
        return float(np.random.uniform(-self.value, self.value))

    def _apply_image(self, image: np.ndarray, turn: float) -> np.ndarray:
        if self.value == 0 or image.ndim != 3 or image.shape[-1] < 3:
            return image
        return _to_dtype(_shift_hue(image, turn), image.dtype)


class ColorJitter(VisionTransform):
    """Randomly change brightness, contrast, saturation and hue, in a random order per sample;
    each argument is the ``value`` of the corresponding transform (0 leaves it out).

    Example::

        t = ColorJitter(brightness=0.4, contrast=0.4, saturation=0.4, hue=0.1)
    """

    def __init__(self, brightness: float = 0, contrast: float = 0, saturation: float = 0,
                 hue: float = 0, order: Sequence[str] | None = None) -> None:
        super().__init__(order)
        self.brightness, self.contrast, self.saturation, self.hue = (
            brightness, contrast, saturation, hue)
        parts = ((BrightnessTransform, brightness), (ContrastTransform, contrast),
                 (SaturationTransform, saturation), (HueTransform, hue))
        self._parts = [cls(value) for cls, value in parts if value != 0]

    def _params(self, image: np.ndarray) -> list:
        order = np.random.permutation(len(self._parts))
        return [(self._parts[i], self._parts[i]._params(image)) for i in order]

    def _apply_image(self, image: np.ndarray, steps: list) -> np.ndarray:
        for part, params in steps:
            image = part._apply_image(image, params)
        return image


# -- MegEngine's scale augmentations, noise and PCA lighting -----------------------------------


def _interpolation(owner: str, interpolation: str | int) -> str:
    interp = _CV2_INTERPOLATION.get(interpolation, interpolation)
    if interp not in ("bilinear", "nearest"):
        raise ValueError(f"{owner}: interpolation must be 'bilinear' or 'nearest' (or OpenCV's "
                         f"codes 1 and 0), got {interpolation!r}")
    return interp


class ShortestEdgeResize(VisionTransform):
    """Resize so that the shorter side becomes a size drawn from ``min_size`` while the longer
    side stays at most ``max_size`` (aspect ratio kept), the detection-style scale augmentation.

    ``min_size`` is an int or a sequence; with ``sample_style="range"`` the size is drawn
    uniformly from the integers in ``[min_size[0], min_size[-1]]``, with ``"choice"`` it is one of
    the values. ``interpolation``: ``"bilinear"`` or ``"nearest"`` (or OpenCV's 1 and 0); masks use
    nearest."""

    def __init__(self, min_size: int | Sequence[int], max_size: int,
                 sample_style: str = "range", interpolation: str | int = "bilinear",
                 order: Sequence[str] | None = None) -> None:
        super().__init__(order)
        sizes = (min_size,) if np.isscalar(min_size) else tuple(min_size)
        if not sizes or any(int(v) != v or v <= 0 for v in sizes):
            raise ValueError(f"ShortestEdgeResize: min_size must be positive ints, got "
                             f"{min_size!r}")
        if sample_style not in ("range", "choice"):
            raise ValueError(f"ShortestEdgeResize: sample_style must be 'range' or 'choice', got "
                             f"{sample_style!r}")
        if int(max_size) != max_size or max_size <= 0:
            raise ValueError(f"ShortestEdgeResize: max_size must be a positive int, got "
                             f"{max_size!r}")
        self.min_size, self.max_size = tuple(int(v) for v in sizes), int(max_size)
        self.sample_style = sample_style
        self.interpolation = _interpolation("ShortestEdgeResize", interpolation)

    def _params(self, image: np.ndarray) -> tuple[int, int]:
        if self.sample_style == "range":
            size = np.random.randint(self.min_size[0], self.min_size[-1] + 1)
        else:
            size = self.min_size[np.random.randint(len(self.min_size))]
        h, w = image.shape[:2]
        scale = size / min(h, w)
        th, tw = h * scale, w * scale
        if max(th, tw) > self.max_size:
            shrink = self.max_size / max(th, tw)
            th, tw = th * shrink, tw * shrink
        return max(1, int(round(th))), max(1, int(round(tw)))

    def _apply_image(self, image: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
        return _resize(image, *shape, self.interpolation)

    def _apply_mask(self, mask: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
        return _resize(mask, *shape, "nearest")


class RandomResize(VisionTransform):
    """Scale both sides by one factor drawn uniformly from ``scale_range`` (sizes rounded to the
    nearest pixel); masks use nearest."""

    def __init__(self, scale_range: Sequence[float], interpolation: str | int = "bilinear",
                 order: Sequence[str] | None = None) -> None:
        super().__init__(order)
        lo, hi = scale_range
        if not 0 < lo <= hi:
            raise ValueError(f"RandomResize: scale_range must be (min, max) with 0 < min <= max, "
                             f"got {tuple(scale_range)}")
        self.scale_range = (float(lo), float(hi))
        self.interpolation = _interpolation("RandomResize", interpolation)

    def _params(self, image: np.ndarray) -> tuple[int, int]:
        scale = np.random.uniform(*self.scale_range)
        h, w = image.shape[:2]
        return max(1, int(h * scale + 0.5)), max(1, int(w * scale + 0.5))

    def _apply_image(self, image: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
        return _resize(image, *shape, self.interpolation)

    def _apply_mask(self, mask: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
        return _resize(mask, *shape, "nearest")


class GaussianNoise(VisionTransform):
    """Add Gaussian noise ``N(mean, std) * 255`` to every pixel (``mean``/``std`` scalars or
    per-channel, in units of the full 8-bit range) and clip to [0, 255], keeping the dtype."""

    def __init__(self, mean: float | Sequence[float] = 0.0, std: float | Sequence[float] = 1.0,
                 order: Sequence[str] | None = None) -> None:
        super().__init__(order)
        self.mean = np.asarray(mean, dtype=np.float32)
        self.std = np.asarray(std, dtype=np.float32)
        if np.any(self.std < 0):
            raise ValueError(f"GaussianNoise: std must be >= 0, got {self.std.tolist()}")

    def _params(self, image: np.ndarray) -> np.ndarray:
        return np.random.normal(size=image.shape).astype(np.float32)

    def _apply_image(self, image: np.ndarray, unit: np.ndarray) -> np.ndarray:
        noise = (unit * self.std + self.mean) * 255
        return _to_dtype(image.astype(np.float32) + noise, image.dtype)


#: ImageNet's RGB colour covariance (AlexNet's PCA lighting), rows and columns in BGR order, for
#: pixel values in [0, 1]: eigenvalues and the matching eigenvectors (columns).
LIGHTING_EIGVAL = np.array([0.2175, 0.0188, 0.0045])
LIGHTING_EIGVEC = np.array([[-0.5836, -0.6948, 0.4203],
                            [-0.5808, -0.0045, -0.8140],
                            [-0.5675, 0.7192, 0.4009]])


class Lighting(VisionTransform):
    """AlexNet's PCA colour augmentation: add ``eigvec @ (alpha * eigval) * 255`` to every pixel
    of a BGR image, ``alpha`` three draws from ``N(0, scale)`` per sample, then clip to [0, 255]
    keeping the dtype. ``scale=0`` leaves images unchanged."""

    def __init__(self, scale: float, order: Sequence[str] | None = None) -> None:
        super().__init__(order)
        if scale < 0:
            raise ValueError(f"Lighting: scale must be >= 0, got {scale}")
        self.scale = float(scale)

    def _params(self, image: np.ndarray) -> np.ndarray:
        return np.random.normal(scale=self.scale, size=3) if self.scale else np.zeros(3)

    def _apply_image(self, image: np.ndarray, alpha: np.ndarray) -> np.ndarray:
        if self.scale == 0:
            return image
        if image.ndim != 3 or image.shape[-1] != 3:
            raise ValueError(f"Lighting: expected a 3-channel BGR image, got shape {image.shape}")
        shift = (LIGHTING_EIGVEC @ (alpha * LIGHTING_EIGVAL) * 255).astype(np.float32)
        return _to_dtype(image.astype(np.float32) + shift, image.dtype)


def _swap_colour_order(image: np.ndarray) -> np.ndarray:
    """BGR <-> RGB of a 3-channel HWC or CHW array (anything else is returned as it is)."""
    if image.ndim == 3 and image.shape[-1] == 3:
        return np.ascontiguousarray(image[..., ::-1])
    if image.ndim == 3 and image.shape[0] == 3:
        return np.ascontiguousarray(image[::-1])
    return image


class TorchTransformCompose(VisionTransform):
    """Run torchvision transforms (``transforms``: a callable on a PIL image, e.g.
    ``torchvision.transforms.Compose([...])``) on the BGR uint8 image of a sample, as MegEngine
    does: the image goes to PIL in RGB order and what comes back (a PIL image or an array,
    HWC or CHW) returns to BGR. Needs Pillow (and torchvision for its transforms)."""

    def __init__(self, transforms, order: Sequence[str] | None = None) -> None:
        super().__init__(order)
        if not callable(transforms):
            raise TypeError(f"TorchTransformCompose: transforms must be callable (a torchvision "
                            f"Compose), got {type(transforms).__name__}")
        self.transforms = transforms

    def _apply_image(self, image: np.ndarray, params: Any) -> np.ndarray:
        try:
            pil = importlib.import_module("PIL.Image")
        except ImportError:
            raise ImportError("TorchTransformCompose needs Pillow (pip install pillow) to hand "
                              "images to torchvision transforms") from None
        out = self.transforms(pil.fromarray(_swap_colour_order(image).astype(np.uint8)))
        if isinstance(out, pil.Image):
            out = np.array(out, dtype=np.uint8)
        elif hasattr(out, "numpy") and not isinstance(out, np.ndarray):
            out = out.numpy()  # a torch tensor (ToTensor): CHW
        return _swap_colour_order(np.asarray(out))
