"""Image datasets laid out as one folder per class: ``ImageFolder`` and ``ImageNet`` (MegEngine's).

``root/<class name>/.../<image file>``: the classes are the sub-folders of ``root`` in sorted
order, numbered from 0; the samples are the image files under each (any depth, sorted). An item
is ``(image, label)``, ``image`` the ``(H, W, 3)`` uint8 BGR array of
:func:`~minigrad.data.dataset.vision.image_file.read_image` and ``label`` an ``np.int32``;
``class_name=True`` appends the class's folder name: ``(image, label, class_name)``.

``ImageNet(root, train)`` is an ``ImageFolder`` over ``root/train`` or ``root/val``, both laid out
by WordNet id (``n01440764/...``), the layout of the extracted ILSVRC2012 archives once the
validation images are sorted into class folders.

Example::

    train = ImageFolder("/data/flowers/train")
    image, label = train[0]
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import numpy as np

from minigrad.data.dataset.base import Dataset, _check_index
from minigrad.data.dataset.vision.image_file import is_image_file, read_image

__all__ = ["ImageFolder", "ImageNet"]


class ImageFolder(Dataset):
    """The image files under ``root``'s class folders (see the module docstring);
    ``check_valid_func(path)`` chooses which files are samples (default: image extensions)."""

    def __init__(self, root: str | os.PathLike, check_valid_func: Callable | None = None,
                 class_name: bool = False) -> None:
        self.root = Path(root).expanduser()
        if not self.root.is_dir():
            raise FileNotFoundError(f"{type(self).__name__}: {str(self.root)!r} is not a directory")
        self.check_valid = check_valid_func or is_image_file
        self.class_name = bool(class_name)
        self.classes = sorted(entry.name for entry in os.scandir(self.root) if entry.is_dir())
        if not self.classes:
            raise FileNotFoundError(f"{type(self).__name__}: {str(self.root)!r} has no class "
                                    "folders (expected root/<class>/<image files>)")
        self.class_dict = {name: np.int32(i) for i, name in enumerate(self.classes)}
        self.samples: list[tuple[str, np.int32]] = []
        for name in self.classes:
            for folder, dirs, files in os.walk(self.root / name, followlinks=True):
                dirs.sort()
                self.samples.extend((os.path.join(folder, f), self.class_dict[name])
                                    for f in sorted(files)
                                    if self.check_valid(os.path.join(folder, f)))

    def __getitem__(self, index: int) -> tuple:
        path, label = self.samples[_check_index(index, len(self), type(self).__name__)]
        image = read_image(path)
        return (image, label, self.classes[label]) if self.class_name else (image, label)

    def __len__(self) -> int:
        return len(self.samples)


class ImageNet(ImageFolder):
    """ILSVRC2012 in class folders: ``root/train/<wnid>/...`` or ``root/val/<wnid>/...``.

    ``root`` defaults to ``$MINIGRAD_DATA/imagenet``, else ``~/.cache/minigrad/imagenet``; the
    archives are not downloaded (they need an account), so a missing folder is an error that
    names the layout expected."""

    def __init__(self, root: str | os.PathLike | None = None, train: bool = True,
                 **kwargs) -> None:
        if root is None:
            env = os.environ.get("MINIGRAD_DATA")
            root = Path(env) / "imagenet" if env else Path.home() / ".cache/minigrad/imagenet"
        split = Path(root).expanduser() / ("train" if train else "val")
        if not split.is_dir():
            raise FileNotFoundError(
                f"ImageNet: {str(split)!r} does not exist; extract ILSVRC2012 so that "
                f"{split}/<wnid>/<image files> holds each class (validation images sorted into "
                "class folders too)")
        self.train = bool(train)
        super().__init__(split, **kwargs)
