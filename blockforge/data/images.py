"""Image sets for the vision Transformer: scikit-learn's digits, Fashion-MNIST IDX files, image folders.

A batch is (images FloatTensor (B, C, H, W), normalized; labels LongTensor (B,)).

- digits: scikit-learn's bundled 8x8 digits (1,797 images, values 0..16). They have no test split, so a
  fixed stratified 20% (split seed 0, whatever the training seed) is held out for validation.
- fashion-mnist: the four IDX files (gzipped or not) in the folder `data.path`, parsed here; the t10k
  files are the validation set. Images are 28x28; for another `model.image_size` they are resized
  (bilinear, antialiased) as batches are made.
- image-folder: the ImageNet layout `path/train/<class>/*`, `path/val/<class>/*`, read by torchvision
  with random resized crops and flips for training, resize and center crop for validation, ImageNet
  mean and std. Each training image's augmentation is seeded by (seed, its position in the stream),
  so batches are the same with any number of loader workers and after a resume.

digits and Fashion-MNIST are held as uint8 tensors and normalized per batch with the mean and std of
their training pixels.
"""

from __future__ import annotations

import gzip
import itertools
import struct
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch
import torch.nn.functional as F

from blockforge.data.batching import derived_seed, shuffled_batches
from blockforge.spec.data import DataConfig
from blockforge.errors import DataError

DIGITS_SPLIT_SEED = 0
DIGITS_VAL_FRACTION = 0.2
FASHION_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "val": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
IDX_TYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}  # the magic number's third byte
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
VAL_CROP_FRACTION = 0.875  # validation: resize to image_size / 0.875, then center-crop image_size
AUGMENTATION_STREAM = 1  # keeps augmentation seeds apart from epoch-order seeds


Batch = tuple[torch.Tensor, torch.Tensor]  # normalized float images (B, C, H, W), labels (B,)
Images = tuple[torch.Tensor, torch.Tensor]  # uint8 images (N, C, H, W), labels (N,)


def build_image_dataset(
    cfg: DataConfig, *, image_size: int, channels: int, classes: int, seed: int
) -> TensorImageDataset | ImageFolderDataset:
    if cfg.source == "digits":
        return digits_dataset(image_size=image_size, channels=channels, classes=classes, seed=seed)
    if not isinstance(cfg.path, str):
        raise DataError(f"data.path: {cfg.source} reads one folder, not {cfg.path!r}; give the folder's path")
    folder = Path(cfg.path).expanduser()
    if cfg.source == "fashion-mnist":
        return fashion_mnist_dataset(folder, image_size=image_size, channels=channels, classes=classes, seed=seed)
    return ImageFolderDataset(
        folder, image_size=image_size, channels=channels, classes=classes, seed=seed, num_workers=cfg.num_workers
    )


def check_fits(key: str, *, expected: int, found: int, fact: str) -> None:
    """The model setting `key` (value `expected`) must equal what the data has (`found`, stated by `fact`)."""
    if found != expected:
        raise DataError(f"{key}: is {expected}, but {fact}; set {key}: {found}")


class TensorImageDataset:
    """Images held in memory as uint8 (N, C, H, W) with their labels."""

    kind = "image"

    def __init__(self, train: Images, val: Images, *, max_value: int, image_size: int, seed: int, info: dict[str, Any]):
        self.train_images, self.train_labels = train
        self.val_images, self.val_labels = val
        self.max_value = max_value
        self.image_size = image_size
        self.seed = seed
        self.mean, self.std = pixel_mean_std(self.train_images, max_value)
        channels = self.train_images.shape[1]
        self.info = {**info, "images": {"train": len(self.train_labels), "val": len(self.val_labels)}, "image_size": image_size,
                     "preprocess": preprocess([self.mean] * channels, [self.std] * channels, crop_pct=1.0)}

    def _batch(self, images: torch.Tensor, labels: torch.Tensor) -> Batch:
        x = images.float() / self.max_value
        if x.shape[-1] != self.image_size:
            x = F.interpolate(x, size=(self.image_size, self.image_size), mode="bilinear", antialias=True, align_corners=False)
        return (x - self.mean) / self.std, labels.long()

    def train_batches(self, batch_size: int, start: int = 0, part: tuple[int, int] | None = None) -> Iterator[Batch]:
        for _, indices in shuffled_batches(len(self.train_labels), batch_size, self.seed, start, part=part):
            indices = torch.from_numpy(indices)
            yield self._batch(self.train_images[indices], self.train_labels[indices])

    def val_batches(self, batch_size: int, limit: int | None = None) -> list[Batch]:
        starts = range(0, len(self.val_labels), batch_size)[:limit]
        return [self._batch(self.val_images[i : i + batch_size], self.val_labels[i : i + batch_size]) for i in starts]

    def describe(self) -> dict[str, Any]:
        return dict(self.info)


def preprocess(mean: Sequence[float], std: Sequence[float], *, crop_pct: float) -> dict[str, Any]:
    """How a model's input images were made, in timm's terms: pixels scaled to [0, 1], then (x - mean) / std per
    channel; evaluation resized (bilinear) to image_size / crop_pct and center-cropped to image_size."""
    return {"mean": [float(m) for m in mean], "std": [float(s) for s in std], "interpolation": "bilinear", "crop_pct": crop_pct}


def pixel_mean_std(images: torch.Tensor, max_value: int) -> tuple[float, float]:
    """Mean and std of uint8 pixels scaled to [0, 1], from their histogram (no float copy of the set)."""
    counts = np.bincount(images.numpy().ravel(), minlength=256).astype(np.float64)
    values = np.arange(len(counts)) / max_value
    mean = (counts * values).sum() / counts.sum()
    std = np.sqrt((counts * (values - mean) ** 2).sum() / counts.sum())
    return float(mean), float(std)


# --- digits -------------------------------------------------------------------------------------


def digits_dataset(*, image_size: int, channels: int, classes: int, seed: int) -> TensorImageDataset:
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    check_fits("model.image_size", expected=image_size, found=8, fact="digits images are 8x8")
    check_fits("model.channels", expected=channels, found=1, fact="digits images have 1 channel")
    check_fits("model.classes", expected=classes, found=10, fact="digits has 10 classes")
    digits = load_digits()
    images = torch.from_numpy(digits.images.astype(np.uint8)).unsqueeze(1)  # values 0..16
    labels = torch.from_numpy(digits.target.astype(np.int64))
    train, val = train_test_split(
        np.arange(len(labels)), test_size=DIGITS_VAL_FRACTION, stratify=digits.target, random_state=DIGITS_SPLIT_SEED
    )
    train, val = torch.from_numpy(np.sort(train)), torch.from_numpy(np.sort(val))
    info = {"source": "digits", "classes": 10, "val": f"stratified {DIGITS_VAL_FRACTION:.0%} hold-out (seed {DIGITS_SPLIT_SEED})"}
    return TensorImageDataset(
        (images[train], labels[train]), (images[val], labels[val]), max_value=16, image_size=image_size, seed=seed, info=info
    )


# --- Fashion-MNIST (IDX files) ------------------------------------------------------------------


def read_idx(path: Path) -> np.ndarray:
    """An IDX file (gzipped when its name ends in .gz): magic 0 0 <type> <ndim>, big-endian uint32 dims, data."""
    try:
        with (gzip.open(path) if path.suffix == ".gz" else open(path, "rb")) as f:
            data = f.read()
    except (OSError, EOFError, zlib.error) as err:
        raise DataError(f"data.path: cannot read {path} ({type(err).__name__}: {err}); replace the file") from None
    if len(data) < 4 or data[:2] != b"\0\0" or data[2] not in IDX_TYPES:
        raise DataError(f"data.path: {path} is not an IDX file (its magic number is wrong); replace it with the original file")
    ndim = data[3]
    header = 4 + 4 * ndim
    if len(data) < header:
        raise DataError(f"data.path: {path} is truncated inside its IDX header; replace the file")
    dims = struct.unpack(f">{ndim}I", data[4:header])
    dtype = np.dtype(IDX_TYPES[data[2]])
    expected = int(np.prod(dims)) * dtype.itemsize
    if len(data) - header != expected:
        raise DataError(
            f"data.path: {path} holds {len(data) - header} bytes of data but its header announces {expected} "
            f"(dims {list(dims)}); the file is truncated or corrupt, replace it"
        )
    return np.frombuffer(data, dtype=dtype, offset=header).reshape(dims)


def find_idx(folder: Path, name: str) -> Path:
    for candidate in (folder / name, folder / f"{name}.gz"):
        if candidate.is_file():
            return candidate
    raise DataError(
        f"data.path: {folder} has no {name} (or {name}.gz); point data.path at the Fashion-MNIST folder "
        "(Debian's dataset-fashion-mnist installs it in /usr/share/datasets/fashion-mnist)"
    )


def read_fashion_split(folder: Path, split: str) -> Images:
    images_path, labels_path = (find_idx(folder, name) for name in FASHION_FILES[split])
    images, labels = read_idx(images_path), read_idx(labels_path)
    if images.ndim != 3 or images.dtype != np.uint8:
        raise DataError(
            f"data.path: {images_path} should hold uint8 images (N, rows, cols), "
            f"not {images.dtype} {list(images.shape)}; replace it"
        )
    if labels.ndim != 1 or len(labels) != len(images):
        raise DataError(
            f"data.path: {labels_path} should hold one label per image ({len(images)}), "
            f"not shape {list(labels.shape)}; replace it"
        )
    return torch.from_numpy(images.copy()).unsqueeze(1), torch.from_numpy(labels.astype(np.int64))


def fashion_mnist_dataset(folder: Path, *, image_size: int, channels: int, classes: int, seed: int) -> TensorImageDataset:
    if not folder.is_dir():
        raise DataError(f"data.path: {folder} is not a folder; point it at the folder holding the Fashion-MNIST IDX files")
    train, val = read_fashion_split(folder, "train"), read_fashion_split(folder, "val")
    check_fits("model.channels", expected=channels, found=1, fact="Fashion-MNIST images have 1 channel")
    found_classes = int(max(train[1].max(), val[1].max())) + 1
    labels_fact = f"the labels in {folder} name {found_classes} classes"
    check_fits("model.classes", expected=classes, found=found_classes, fact=labels_fact)
    info = {
        "source": "fashion-mnist", "path": str(folder), "classes": found_classes,
        "native_size": train[0].shape[-1], "val": "t10k files",
    }
    return TensorImageDataset(train, val, max_value=255, image_size=image_size, seed=seed, info=info)


# --- image folders ------------------------------------------------------------------------------


def collate(items: list[tuple[torch.Tensor, int]]) -> Batch:
    images, labels = zip(*items)
    return torch.stack(images), torch.tensor(labels, dtype=torch.long)


class SeededAugmentation(torch.utils.data.Dataset):
    """Training images by (index, stream position); the position seeds the random transform."""

    def __init__(self, folder, transform, seed: int):
        self.folder, self.transform, self.seed = folder, transform, seed

    def __len__(self) -> int:
        return len(self.folder)

    def __getitem__(self, item: tuple[int, int]) -> tuple[torch.Tensor, int]:
        index, position = item
        image, label = self.folder[index]
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(derived_seed(self.seed, AUGMENTATION_STREAM, position))
            return self.transform(image), label


class FolderBatches(Sequence):
    """Validation batches decoded when read: an ImageNet validation set does not fit in memory."""

    def __init__(self, folder, batch_size: int, length: int, num_workers: int):
        self.folder, self.batch_size, self.length, self.num_workers = folder, batch_size, length, num_workers

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int | slice) -> Batch | list[Batch]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(self.length))]
        if i < 0:
            i += self.length
        if not 0 <= i < self.length:
            raise IndexError(i)
        start = i * self.batch_size
        return collate([self.folder[j] for j in range(start, min(start + self.batch_size, len(self.folder)))])

    def __iter__(self) -> Iterator[Batch]:
        loader = torch.utils.data.DataLoader(
            self.folder, batch_size=self.batch_size, num_workers=self.num_workers, collate_fn=collate
        )
        return itertools.islice(iter(loader), self.length)


class ImageFolderDataset:
    kind = "image"

    def __init__(self, root: Path, *, image_size: int, channels: int, classes: int, seed: int, num_workers: int):
        from torchvision.transforms import v2

        check_fits("model.channels", expected=channels, found=3, fact="image folders are read as RGB (3 channels)")
        normalize = [v2.ToImage(), v2.ToDtype(torch.float32, scale=True), v2.Normalize(IMAGENET_MEAN, IMAGENET_STD)]
        train_transform = v2.Compose([v2.RandomResizedCrop(image_size, antialias=True), v2.RandomHorizontalFlip(), *normalize])
        val_resize = v2.Resize(int(image_size / VAL_CROP_FRACTION), antialias=True)
        val_transform = v2.Compose([val_resize, v2.CenterCrop(image_size), *normalize])
        train = self._folder(root / "train", None)
        self.val = self._folder(root / "val", val_transform)
        if self.val.classes != train.classes:
            raise DataError(
                f"data.path: {root / 'val'} has other classes than {root / 'train'}; give both the same class folders"
            )
        classes_fact = f"{root / 'train'} has {len(train.classes)} class folders"
        check_fits("model.classes", expected=classes, found=len(train.classes), fact=classes_fact)
        self.train = SeededAugmentation(train, train_transform, seed)
        self.seed, self.num_workers = seed, num_workers
        self.info = {
            "source": "image-folder", "path": str(root), "classes": len(train.classes),
            "images": {"train": len(train), "val": len(self.val)}, "image_size": image_size, "val": "val folder",
            "preprocess": preprocess(IMAGENET_MEAN, IMAGENET_STD, crop_pct=VAL_CROP_FRACTION),
        }

    @staticmethod
    def _folder(path: Path, transform):
        from torchvision.datasets import ImageFolder

        if not path.is_dir():
            raise DataError(f"data.path: {path} is missing; an image folder needs train/<class>/* and val/<class>/*")
        try:
            return ImageFolder(str(path), transform=transform)
        except (FileNotFoundError, OSError) as err:
            raise DataError(f"data.path: {path} has no usable images ({err}); put images in one sub-folder per class") from None

    def train_batches(self, batch_size: int, start: int = 0, part: tuple[int, int] | None = None) -> Iterator[Batch]:
        batches = (
            list(zip(indices.tolist(), positions.tolist()))
            for positions, indices in shuffled_batches(len(self.train), batch_size, self.seed, start, part=part)
        )
        loader = torch.utils.data.DataLoader(self.train, batch_sampler=batches, num_workers=self.num_workers, collate_fn=collate)
        yield from loader

    def val_batches(self, batch_size: int, limit: int | None = None) -> FolderBatches:
        length = len(range(0, len(self.val), batch_size)[:limit])
        return FolderBatches(self.val, batch_size, length, self.num_workers)

    def describe(self) -> dict[str, Any]:
        return dict(self.info)
