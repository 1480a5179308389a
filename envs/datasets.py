"""Readers for the sequence-classification datasets, from standard files the user already has.

Nothing here downloads anything. :func:`load_digits` uses scikit-learn's bundled 8x8 digits (no
file needed); MNIST, CIFAR-10 and UCI HAR are read from their standard distribution files in a
``data_dir``. A missing file raises :class:`DatasetMissingError` naming every expected file and
where to get it.

Every reader returns a :class:`ArrayDataset` of NumPy arrays (no torch here): ``x`` of shape
``[N, T, D]`` float32 and integer labels ``y`` of shape ``[N]``.
"""

from __future__ import annotations

import gzip
import pickle
from dataclasses import dataclass
from pathlib import Path

import numpy as np

MNIST_URL = "http://yann.lecun.com/exdb/mnist/ (or any mirror of the four idx files)"
CIFAR_URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz (extract it)"
HAR_URL = (
    "https://archive.ics.uci.edu/dataset/240/human+activity+recognition+using+smartphones "
    "(extract 'UCI HAR Dataset')"
)

MNIST_FILES = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}
CIFAR_FOLDER = "cifar-10-batches-py"
CIFAR_TRAIN_FILES = tuple(f"data_batch_{i}" for i in range(1, 6))
CIFAR_TEST_FILE = "test_batch"
HAR_FOLDER = "UCI HAR Dataset"
HAR_SIGNALS = tuple(
    f"{kind}_{axis}" for kind in ("body_acc", "body_gyro", "total_acc") for axis in "xyz"
)


class DatasetMissingError(FileNotFoundError):
    """A dataset file is not in ``data_dir``; the message names the files and their source."""


@dataclass(frozen=True)
class ArrayDataset:
    """Train and test splits as arrays.

    :param x_train: ``[N_train, T, D]`` float32 inputs.
    :param y_train: ``[N_train]`` int64 labels.
    :param x_test: ``[N_test, T, D]`` float32 inputs.
    :param y_test: ``[N_test]`` int64 labels.
    :param n_classes: number of label values.
    """

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    n_classes: int


# --------------------------------------------------------------------------- digits (bundled)
def load_digits(test_fraction: float = 0.2, seed: int = 0) -> ArrayDataset:
    """scikit-learn's bundled 8x8 digits (1797 images) as 64-step sequences of 1 pixel.

    Pixels are scaled from 0..16 to 0..1 and read row by row. The test split is a fixed
    random ``test_fraction`` of the images (``seed``), stratified by nothing: the classes are
    balanced already.
    """
    from sklearn.datasets import load_digits as sk_load_digits

    bunch = sk_load_digits()
    x = (bunch.data.astype(np.float32) / 16.0)[:, :, None]  # [N, 64, 1]
    y = bunch.target.astype(np.int64)
    order = np.random.default_rng(seed).permutation(len(y))
    n_test = int(round(test_fraction * len(y)))
    test, train = order[:n_test], order[n_test:]
    return ArrayDataset(x[train], y[train], x[test], y[test], n_classes=10)


# --------------------------------------------------------------------------- MNIST (idx files)
def read_mnist(data_dir: str | Path) -> ArrayDataset:
    """MNIST from the four idx files (optionally ``.gz``) in ``data_dir`` or ``data_dir/mnist``.

    Returns 784-step sequences of one pixel scaled to 0..1, in row-major order.
    """
    paths = mnist_paths(data_dir)
    x_train = read_idx(paths["train_images"]).reshape(-1, 784, 1).astype(np.float32) / 255.0
    x_test = read_idx(paths["test_images"]).reshape(-1, 784, 1).astype(np.float32) / 255.0
    y_train = read_idx(paths["train_labels"]).astype(np.int64)
    y_test = read_idx(paths["test_labels"]).astype(np.int64)
    _check_lengths("MNIST", x_train, y_train, x_test, y_test)
    return ArrayDataset(x_train, y_train, x_test, y_test, n_classes=10)


def mnist_paths(data_dir: str | Path) -> dict[str, Path]:
    """The four MNIST idx files under ``data_dir`` (checked, not read), keyed as
    :data:`MNIST_FILES`. :raises DatasetMissingError: one is missing."""
    root = _find_root(data_dir, ("", "mnist", "MNIST", "MNIST/raw"), MNIST_FILES["train_images"])
    paths = {}
    for key, name in MNIST_FILES.items():
        path = _idx_path(root, name) if root is not None else None
        if path is None:
            raise DatasetMissingError(
                f"MNIST file {name}[.gz] not found under {data_dir}; expected "
                f"{', '.join(f + '[.gz]' for f in MNIST_FILES.values())} in data_dir "
                f"(or data_dir/mnist); get them from {MNIST_URL}"
            )
        paths[key] = path
    return paths


def _idx_path(root: Path, name: str) -> Path | None:
    for candidate in (root / name, root / f"{name}.gz"):
        if candidate.is_file():
            return candidate
    return None


def read_idx(path: str | Path) -> np.ndarray:
    """Read one IDX file (the MNIST format: magic, dims, big-endian data), gzipped or not."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as handle:
        data = handle.read()
    if len(data) < 4 or data[0] != 0 or data[1] != 0:
        raise ValueError(f"{path} is not an IDX file (bad magic number)")
    dtypes = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}
    if data[2] not in dtypes:
        raise ValueError(f"{path}: unknown IDX data type 0x{data[2]:02x}")
    ndim = data[3]
    shape = tuple(int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    body = np.frombuffer(data, dtype=dtypes[data[2]], offset=4 + 4 * ndim)
    if body.size != int(np.prod(shape)):
        raise ValueError(f"{path}: IDX header says {shape} but holds {body.size} values")
    return body.reshape(shape)


# --------------------------------------------------------------------------- CIFAR-10 (python)
def read_cifar10(data_dir: str | Path) -> ArrayDataset:
    """CIFAR-10 "python version" batches as 1024-step sequences of RGB pixels in 0..1.

    Looks for ``data_batch_1..5`` and ``test_batch`` in ``data_dir`` or
    ``data_dir/cifar-10-batches-py``. Pixels are read row by row, the 3 channels per step.
    """
    root = cifar10_root(data_dir)
    train = [_cifar_batch(root / n) for n in CIFAR_TRAIN_FILES]
    x_test, y_test = _cifar_batch(root / CIFAR_TEST_FILE)
    x_train = np.concatenate([x for x, _ in train])
    y_train = np.concatenate([y for _, y in train])
    _check_lengths("CIFAR-10", x_train, y_train, x_test, y_test)
    return ArrayDataset(x_train, y_train, x_test, y_test, n_classes=10)


def cifar10_root(data_dir: str | Path) -> Path:
    """The folder under ``data_dir`` that holds every CIFAR-10 batch file (checked, not read).
    :raises DatasetMissingError: a file is missing."""
    root = _find_root(data_dir, ("", CIFAR_FOLDER), CIFAR_TEST_FILE)
    names = (*CIFAR_TRAIN_FILES, CIFAR_TEST_FILE)
    missing = [n for n in names if root is None or not (root / n).is_file()]
    if missing or root is None:
        raise DatasetMissingError(
            f"CIFAR-10 file(s) {', '.join(missing)} not found under {data_dir}; expected "
            f"{', '.join(names)} in data_dir or data_dir/{CIFAR_FOLDER}; get {CIFAR_URL}"
        )
    return root


def _cifar_batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
    # The official files are pickles of {b"data": uint8 [N, 3072] (R plane, G, B), b"labels"}.
    # Only the user's own copy of the public dataset is ever unpickled here.
    with path.open("rb") as handle:
        batch = pickle.load(handle, encoding="bytes")
    data = np.asarray(batch[b"data"], dtype=np.uint8)
    labels = np.asarray(batch[b"labels"], dtype=np.int64)
    # [N, 3, 32, 32] -> [N, 32*32, 3]: one RGB pixel per step, row-major.
    x = data.reshape(-1, 3, 1024).transpose(0, 2, 1).astype(np.float32) / 255.0
    return x, labels


# --------------------------------------------------------------------------- UCI HAR
def _read_numbers(path: Path, ndmin: int) -> np.ndarray:
    """``np.loadtxt`` whose error on a malformed file names the file."""
    try:
        return np.loadtxt(path, ndmin=ndmin)
    except ValueError as err:
        raise ValueError(f"{path} is malformed: {str(err).splitlines()[0]}") from None


def read_har(data_dir: str | Path, binary: bool = False, normalize: bool = True) -> ArrayDataset:
    """UCI HAR inertial signals: 9 channels x 128 steps, 6 activity classes (or 2).

    Reads ``{train,test}/Inertial Signals/<signal>_{train,test}.txt`` for the 9 signals
    (body_acc, body_gyro, total_acc; x, y, z) and ``{train,test}/y_{train,test}.txt`` from
    ``data_dir`` or ``data_dir/UCI HAR Dataset``.

    :param binary: the FastGRNN "HAR-2" labels used by Ohno & Kumagai: {sitting, laying,
        walking upstairs} -> 0, {standing, walking, walking downstairs} -> 1.
    :param normalize: per-channel zero mean / unit variance with the training split's stats.
    """
    root = har_root(data_dir)
    splits = {}
    for split in ("train", "test"):
        paths = [root / split / "Inertial Signals" / f"{sig}_{split}.txt" for sig in HAR_SIGNALS]
        channels = [_read_numbers(path, ndmin=2) for path in paths]
        shapes = {channel.shape for channel in channels}
        if len(shapes) > 1:
            found = ", ".join(f"{p.name} {c.shape}" for p, c in zip(paths, channels, strict=True))
            raise ValueError(
                f"UCI HAR {split}: the signal files under {paths[0].parent} differ in shape "
                f"({found})"
            )
        x = np.stack(channels, axis=-1).astype(np.float32)  # [N, 128, 9]
        y = _read_numbers(root / split / f"y_{split}.txt", ndmin=1).astype(np.int64) - 1  # 0..5
        if len(x) != len(y):
            raise ValueError(f"UCI HAR {split}: {len(x)} signal rows but {len(y)} labels")
        splits[split] = (x, y)
    (x_train, y_train), (x_test, y_test) = splits["train"], splits["test"]
    if normalize:
        mean = x_train.mean(axis=(0, 1), keepdims=True)
        std = x_train.std(axis=(0, 1), keepdims=True) + 1e-8
        x_train, x_test = (x_train - mean) / std, (x_test - mean) / std
    n_classes = 6
    if binary:
        # 0-based activity ids: 0 walking, 1 upstairs, 2 downstairs, 3 sitting, 4 standing,
        # 5 laying.
        to_binary = np.array([1, 0, 1, 0, 1, 0], dtype=np.int64)
        y_train, y_test, n_classes = to_binary[y_train], to_binary[y_test], 2
    return ArrayDataset(
        x_train.astype(np.float32), y_train, x_test.astype(np.float32), y_test, n_classes
    )


def har_root(data_dir: str | Path) -> Path:
    """The folder under ``data_dir`` that holds every UCI HAR file (checked, not read).
    :raises DatasetMissingError: a file is missing."""
    root = _find_root(data_dir, ("", HAR_FOLDER), "train")
    expected = [
        f"{split}/Inertial Signals/{sig}_{split}.txt"
        for split in ("train", "test")
        for sig in HAR_SIGNALS
    ] + [f"{split}/y_{split}.txt" for split in ("train", "test")]
    missing = [e for e in expected if root is None or not (root / e).is_file()]
    if missing or root is None:
        raise DatasetMissingError(
            f"UCI HAR file(s) missing under {data_dir} (looked in data_dir and "
            f"data_dir/{HAR_FOLDER}): {', '.join(missing[:3])}"
            f"{' ...' if len(missing) > 3 else ''}; expected {{train,test}}/Inertial Signals/"
            f"{{{','.join(HAR_SIGNALS)}}}_{{train,test}}.txt and "
            f"{{train,test}}/y_{{train,test}}.txt; get them from {HAR_URL}"
        )
    return root


# --------------------------------------------------------------------------- helpers
def _find_root(data_dir: str | Path, subdirs: tuple[str, ...], marker: str) -> Path | None:
    """The first ``data_dir/sub`` that holds ``marker`` (a file or folder, or ``marker.gz``)."""
    base = Path(data_dir).expanduser()
    for sub in subdirs:
        root = base / sub if sub else base
        if (root / marker).exists() or (root / f"{marker}.gz").exists():
            return root
    return None


def _check_lengths(name: str, *arrays: np.ndarray) -> None:
    x_train, y_train, x_test, y_test = arrays
    if len(x_train) != len(y_train) or len(x_test) != len(y_test):
        raise ValueError(
            f"{name}: image and label counts differ (train {len(x_train)} vs {len(y_train)}, "
            f"test {len(x_test)} vs {len(y_test)})"
        )


def bitreversal_permutation(n: int) -> np.ndarray:
    """The deterministic bit-reversal permutation of ``range(n)`` (UR-gates paper, App. D.2).

    Built for ``N = 2**ceil(log2 n)`` and restricted to the entries ``< n``; e.g.
    ``[0, 4, 2, 6, 1, 5, 3, 7]`` for ``n = 8`` and ``[0, 512, 256, 768, ...]`` for 784.
    """
    if n <= 0:
        raise ValueError(f"n must be positive, got {n}")
    bits = max(int(np.ceil(np.log2(n))), 0)
    size = 1 << bits
    idx = np.arange(size)
    rev = np.zeros(size, dtype=np.int64)
    for b in range(bits):
        rev |= ((idx >> b) & 1) << (bits - 1 - b)
    return rev[rev < n]
