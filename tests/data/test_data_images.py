"""Image datasets: digits, Fashion-MNIST IDX files and image folders."""

import gzip
import struct
from collections import Counter
from itertools import islice

import numpy as np
import pytest
import torch

from blockforge.data import DataConfig
from blockforge.data.images import read_idx
from blockforge.errors import DataError

# --- digits -------------------------------------------------------------------------------------


def test_digits_split_is_fixed_stratified_and_complete(build_images):
    from sklearn.datasets import load_digits

    ds = build_images(DataConfig(source="digits"), image_size=8, channels=1, classes=10)
    assert ds.kind == "image" and ds.describe()["images"] == {"train": 1437, "val": 360}
    digits = load_digits()
    class_sizes = Counter(digits.target.tolist())
    val_sizes = Counter(ds.val_labels.tolist())
    assert all(abs(val_sizes[c] - 0.2 * n) <= 1 for c, n in class_sizes.items())  # stratified
    # train and val together are the whole set, each image once
    key = lambda images, labels: Counter(zip(map(bytes, images.numpy().reshape(len(labels), -1)), labels.tolist()))
    everything = key(torch.from_numpy(digits.images.astype(np.uint8)), torch.from_numpy(digits.target))
    assert key(ds.train_images, ds.train_labels) + key(ds.val_images, ds.val_labels) == everything
    other_seed = build_images(DataConfig(source="digits"), image_size=8, channels=1, classes=10, seed=7)
    assert torch.equal(other_seed.val_images, ds.val_images)  # the hold-out does not depend on the training seed


def test_digits_batches_are_normalized_and_resume_exactly(build_images, same_batches):
    ds = build_images(DataConfig(source="digits"), image_size=8, channels=1, classes=10)
    full = list(islice(ds.train_batches(100), 30))  # two epochs and a bit
    assert same_batches(list(islice(ds.train_batches(100, start=13), 17)), full[13:])
    images, labels = full[0]
    assert images.shape == (100, 1, 8, 8) and images.dtype == torch.float32 and labels.dtype == torch.long
    pixels = torch.cat([b[0] for b in full[:14]])
    assert abs(pixels.mean()) < 0.05 and abs(pixels.std() - 1) < 0.05
    val = ds.val_batches(64)
    assert len(val) == 6 and same_batches(val, ds.val_batches(64)) and len(ds.val_batches(64, limit=2)) == 2


@pytest.mark.parametrize(
    "sizes, message",
    [
        ({"image_size": 16, "channels": 1, "classes": 10}, "model.image_size: is 16, but digits images are 8x8; set .* 8"),
        ({"image_size": 8, "channels": 3, "classes": 10}, "model.channels: is 3, but digits images have 1 channel"),
        ({"image_size": 8, "channels": 1, "classes": 5}, "model.classes: is 5, but digits has 10 classes"),
    ],
)
def test_digits_must_fit_the_model(build_images, sizes, message):
    with pytest.raises(DataError, match=message):
        build_images(DataConfig(source="digits"), **sizes)


def test_image_family_rejects_text_sources_and_lists_of_folders(build_images):
    from blockforge.errors import SpecError
    from blockforge.spec import recipe_from_data

    model = {"family": "vit", "width": 16, "depth": 1, "heads": 2, "ffn": 32, "image_size": 8, "patch_size": 4, "channels": 1, "classes": 10}
    with pytest.raises(SpecError, match="data.source: 'builtin' does not fit model.family vit; choose one of: digits"):
        recipe_from_data({"model": model, "data": {"source": "builtin"}})
    with pytest.raises(DataError, match="data.path: fashion-mnist reads one folder"):
        build_images(DataConfig(source="fashion-mnist", path=["a", "b"]), image_size=28, channels=1, classes=10)


# --- Fashion-MNIST IDX files --------------------------------------------------------------------


def idx_bytes(array: np.ndarray) -> bytes:
    return bytes([0, 0, 0x08, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape) + array.astype(np.uint8).tobytes()


def write_fashion(folder, *, gzipped: bool, train: int = 40, test: int = 20):
    rng = np.random.default_rng(0)
    folder.mkdir(exist_ok=True)
    for prefix, n in (("train", train), ("t10k", test)):
        files = {
            f"{prefix}-images-idx3-ubyte": rng.integers(0, 256, size=(n, 28, 28)),
            f"{prefix}-labels-idx1-ubyte": np.arange(n) % 10,
        }
        for name, array in files.items():
            data = idx_bytes(array)
            (folder / (name + ".gz" if gzipped else name)).write_bytes(gzip.compress(data) if gzipped else data)
    return folder


@pytest.mark.parametrize("gzipped", [True, False])
def test_fashion_mnist_reads_idx_files_and_resumes(tmp_path, build_images, same_batches, gzipped):
    folder = write_fashion(tmp_path / "fashion", gzipped=gzipped)
    ds = build_images(DataConfig(source="fashion-mnist", path=str(folder)), image_size=28, channels=1, classes=10)
    assert ds.describe()["images"] == {"train": 40, "val": 20}
    assert ds.val_labels.tolist() == [i % 10 for i in range(20)]  # the t10k files, in file order
    full = list(islice(ds.train_batches(16), 8))
    assert same_batches(list(islice(ds.train_batches(16, start=3), 5)), full[3:])
    assert full[0][0].shape == (16, 1, 28, 28)


def test_fashion_mnist_is_resized_to_the_model(tmp_path, build_images):
    folder = write_fashion(tmp_path / "fashion", gzipped=False)
    ds = build_images(DataConfig(source="fashion-mnist", path=str(folder)), image_size=16, channels=1, classes=10)
    images, labels = next(ds.train_batches(8))
    assert images.shape == (8, 1, 16, 16) and labels.shape == (8,)


def test_idx_reader_checks_magic_and_length(tmp_path):
    array = np.arange(24).reshape(2, 3, 4)
    good = tmp_path / "good-idx3-ubyte"
    good.write_bytes(idx_bytes(array))
    assert np.array_equal(read_idx(good), array)
    bad_magic = tmp_path / "bad-magic"
    bad_magic.write_bytes(b"\x12\x34" + idx_bytes(array)[2:])
    with pytest.raises(DataError, match="is not an IDX file"):
        read_idx(bad_magic)
    truncated = tmp_path / "truncated"
    truncated.write_bytes(idx_bytes(array)[:-5])
    with pytest.raises(DataError, match="holds 19 bytes of data but its header announces 24"):
        read_idx(truncated)
    broken_gzip = tmp_path / "broken.gz"
    broken_gzip.write_bytes(gzip.compress(idx_bytes(array))[:-10])
    with pytest.raises(DataError, match="data.path: cannot read .*broken.gz"):
        read_idx(broken_gzip)


def test_fashion_mnist_errors_name_the_key(tmp_path, build_images):
    folder = write_fashion(tmp_path / "fashion", gzipped=False)
    sizes = {"image_size": 28, "channels": 1, "classes": 10}
    with pytest.raises(DataError, match="model.classes: is 12, but the labels in .* name 10 classes"):
        build_images(DataConfig(source="fashion-mnist", path=str(folder)), **{**sizes, "classes": 12})
    (folder / "t10k-labels-idx1-ubyte").write_bytes(idx_bytes(np.arange(7)))  # 7 labels for 20 images
    with pytest.raises(DataError, match="should hold one label per image"):
        build_images(DataConfig(source="fashion-mnist", path=str(folder)), **sizes)
    (folder / "t10k-labels-idx1-ubyte").unlink()
    with pytest.raises(DataError, match="data.path: .* has no t10k-labels-idx1-ubyte"):
        build_images(DataConfig(source="fashion-mnist", path=str(folder)), **sizes)
    with pytest.raises(DataError, match="data.path: .* is not a folder"):
        build_images(DataConfig(source="fashion-mnist", path=str(tmp_path / "nowhere")), **sizes)


# --- image folders ------------------------------------------------------------------------------


@pytest.fixture
def image_folder(tmp_path):
    """ImageNet layout, 3 classes: 5 training and 2 validation PNGs each, 12x12 RGB."""
    from PIL import Image

    rng = np.random.default_rng(0)
    root = tmp_path / "images"
    for split, count in (("train", 5), ("val", 2)):
        for label in ("cat", "dog", "fox"):
            (root / split / label).mkdir(parents=True)
            for i in range(count):
                Image.fromarray(rng.integers(0, 256, size=(12, 12, 3), dtype=np.uint8)).save(root / split / label / f"{i}.png")
    return root


def test_image_folder_batches_resume_exactly(image_folder, build_images, same_batches):
    ds = build_images(DataConfig(source="image-folder", path=str(image_folder)), image_size=8, channels=3, classes=3)
    full = list(islice(ds.train_batches(4), 10))  # 15 images: several epochs, fresh augmentations
    assert same_batches(list(islice(ds.train_batches(4, start=6), 4)), full[6:])
    images, labels = full[0]
    assert images.shape == (4, 3, 8, 8) and labels.dtype == torch.long
    assert not same_batches(full[0], full[4])  # a later epoch: other order and crops
    val = ds.val_batches(4)
    assert len(val) == 2 and same_batches(list(val), [val[0], val[-1]]) and same_batches(list(val), val[:])
    assert same_batches(list(val), list(ds.val_batches(4)))
    assert [b[1].tolist() for b in val] == [[0, 0, 1, 1], [2, 2]]
    assert ds.describe()["images"] == {"train": 15, "val": 6}


def test_image_folder_augmentation_does_not_depend_on_workers(image_folder, build_images, same_batches):
    sizes = {"image_size": 8, "channels": 3, "classes": 3}
    one_process = build_images(DataConfig(source="image-folder", path=str(image_folder)), **sizes)
    workers = build_images(DataConfig(source="image-folder", path=str(image_folder), num_workers=2), **sizes)
    assert same_batches(list(islice(workers.train_batches(4), 4)), list(islice(one_process.train_batches(4), 4)))


def test_image_folder_errors_name_the_key(image_folder, build_images):
    cfg = DataConfig(source="image-folder", path=str(image_folder))
    with pytest.raises(DataError, match="model.classes: is 4, but .* has 3 class folders; set model.classes: 3"):
        build_images(cfg, image_size=8, channels=3, classes=4)
    with pytest.raises(DataError, match="model.channels: is 1, but image folders are read as RGB"):
        build_images(cfg, image_size=8, channels=1, classes=3)
    (image_folder / "val" / "fox" / "0.png").rename(image_folder / "val" / "0.png")
    for png in (image_folder / "val" / "fox").iterdir():
        png.unlink()
    (image_folder / "val" / "fox").rmdir()
    with pytest.raises(DataError, match="data.path: .*val has other classes than"):
        build_images(cfg, image_size=8, channels=3, classes=3)
    with pytest.raises(DataError, match="data.path: .*train is missing"):
        build_images(DataConfig(source="image-folder", path=str(image_folder / "nowhere")), image_size=8, channels=3, classes=3)
