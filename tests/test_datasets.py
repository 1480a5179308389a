"""Dataset readers on tiny files written by the tests (nothing is downloaded)."""

from __future__ import annotations

import gzip
import pickle
from pathlib import Path

import numpy as np
import pytest

from memcores.envs import datasets
from memcores.envs.sequences import make_task


def _write_idx(path: Path, array: np.ndarray, gz: bool) -> None:
    header = bytes([0, 0, 0x08, array.ndim]) + b"".join(
        int(d).to_bytes(4, "big") for d in array.shape
    )
    data = header + array.astype(np.uint8).tobytes()
    if gz:
        with gzip.open(f"{path}.gz", "wb") as handle:
            handle.write(data)
    else:
        path.write_bytes(data)


def _tiny_mnist(root: Path, gz: bool) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(12, 28, 28))
    labels = np.arange(12) % 10
    root.mkdir(parents=True, exist_ok=True)
    _write_idx(root / "train-images-idx3-ubyte", images, gz)
    _write_idx(root / "train-labels-idx1-ubyte", labels, gz)
    _write_idx(root / "t10k-images-idx3-ubyte", images[:5], gz)
    _write_idx(root / "t10k-labels-idx1-ubyte", labels[:5], gz)
    return images, labels


@pytest.mark.parametrize("gz", [False, True])
def test_read_mnist(tmp_path: Path, gz: bool) -> None:
    images, labels = _tiny_mnist(tmp_path / "mnist", gz)
    data = datasets.read_mnist(tmp_path)  # finds the mnist/ sub-folder
    assert data.x_train.shape == (12, 784, 1) and data.x_test.shape == (5, 784, 1)
    np.testing.assert_allclose(data.x_train[3, :, 0], images[3].reshape(-1) / 255.0, rtol=1e-6)
    np.testing.assert_array_equal(data.y_train, labels)


def test_smnist_and_psmnist_tasks(tmp_path: Path) -> None:
    images, _ = _tiny_mnist(tmp_path, gz=False)
    s = make_task("smnist", data_dir=str(tmp_path), valid_fraction=0.0)
    p = make_task("psmnist", data_dir=str(tmp_path), valid_fraction=0.0)
    assert s.length == 784 and s.input_size == 1
    xs = s.batch("test", np.arange(2)).x[:, :, 0]  # [784, 2]
    xp = p.batch("test", np.arange(2)).x[:, :, 0]
    perm = datasets.bitreversal_permutation(784)
    np.testing.assert_allclose(xp, xs[perm])
    np.testing.assert_allclose(xs[:, 0], images[0].reshape(-1) / 255.0, rtol=1e-6)


def test_missing_mnist_names_files(tmp_path: Path) -> None:
    with pytest.raises(datasets.DatasetMissingError, match="train-images-idx3-ubyte.*t10k-labels"):
        make_task("smnist", data_dir=str(tmp_path))


def test_read_idx_rejects_garbage(tmp_path: Path) -> None:
    bad = tmp_path / "x"
    bad.write_bytes(b"\x01\x02\x03\x04junk")
    with pytest.raises(ValueError, match="not an IDX"):
        datasets.read_idx(bad)


def test_read_cifar10(tmp_path: Path) -> None:
    root = tmp_path / datasets.CIFAR_FOLDER
    root.mkdir()
    rng = np.random.default_rng(0)
    for name in (*datasets.CIFAR_TRAIN_FILES, datasets.CIFAR_TEST_FILE):
        data = rng.integers(0, 256, size=(3, 3072), dtype=np.uint8)
        with (root / name).open("wb") as handle:
            pickle.dump({b"data": data, b"labels": [1, 2, 3]}, handle)
    first = pickle.loads((root / "data_batch_1").read_bytes())[b"data"]
    out = datasets.read_cifar10(tmp_path)
    assert out.x_train.shape == (15, 1024, 3) and out.x_test.shape == (3, 1024, 3)
    # step k of image 0 is pixel k's (R, G, B)
    np.testing.assert_allclose(out.x_train[0, 5], first[0, [5, 1024 + 5, 2048 + 5]] / 255.0)
    task = make_task("scifar", data_dir=str(tmp_path), valid_fraction=0.0)
    assert task.length == 1024 and task.input_size == 3


def test_missing_cifar_names_files(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="data_batch_1.*test_batch"):
        make_task("scifar", data_dir=str(tmp_path))


def _tiny_har(root: Path, n: int = 6) -> np.ndarray:
    rng = np.random.default_rng(0)
    for split in ("train", "test"):
        signals = root / split / "Inertial Signals"
        signals.mkdir(parents=True)
        for k, sig in enumerate(datasets.HAR_SIGNALS):
            values = rng.normal(size=(n, 128)) + k
            np.savetxt(signals / f"{sig}_{split}.txt", values)
        np.savetxt(root / split / f"y_{split}.txt", np.arange(n) % 6 + 1, fmt="%d")
    return np.arange(n) % 6


def test_read_har(tmp_path: Path) -> None:
    labels = _tiny_har(tmp_path / datasets.HAR_FOLDER)
    out = datasets.read_har(tmp_path)
    assert out.x_train.shape == (6, 128, 9) and out.n_classes == 6
    np.testing.assert_array_equal(out.y_train, labels)
    # normalised per channel with the training statistics
    np.testing.assert_allclose(out.x_train.mean(axis=(0, 1)), 0.0, atol=1e-5)
    np.testing.assert_allclose(out.x_train.std(axis=(0, 1)), 1.0, atol=1e-3)
    binary = datasets.read_har(tmp_path, binary=True)
    np.testing.assert_array_equal(binary.y_train, [1, 0, 1, 0, 1, 0])
    task = make_task("har", data_dir=str(tmp_path), valid_fraction=0.0)
    assert task.length == 128 and task.input_size == 9


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        ("y_train.txt", r"y_train.txt is malformed"),
        ("body_acc_x_train.txt", r"body_acc_x_train.txt is malformed"),
    ],
)
def test_malformed_har_file_is_named(tmp_path: Path, damage: str, message: str) -> None:
    _tiny_har(tmp_path)
    path = next(tmp_path.rglob(damage))
    path.write_text(path.read_text().replace("1", "x", 1))
    with pytest.raises(ValueError, match=message):
        datasets.read_har(tmp_path)


def test_missing_har_names_files(tmp_path: Path) -> None:
    with pytest.raises(datasets.DatasetMissingError, match="body_acc_x_train.txt.*y_"):
        make_task("har", data_dir=str(tmp_path))
