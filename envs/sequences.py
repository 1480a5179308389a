"""Supervised sequence tasks: synthetic memory tasks and sequence classification datasets.

Every task produces :class:`SequenceBatch` objects of NumPy arrays (no torch here):

* ``x [T, B, D]`` float32 inputs, time-major like the cores;
* ``y [W, B]`` int64 class targets (``loss="ce"``) or ``[W, B, K]`` float32 targets
  (``"mse"``, ``"bce"``) for the **last W steps** of the sequence only (the readout is only
  evaluated where something can be scored, which keeps long classification sequences cheap);
* ``loss_mask [W, B]`` and ``metric_mask [W, B]`` float32: which of those steps enter the loss
  and which the accuracy/MSE metric.

Synthetic tasks draw fresh examples from a ``numpy.random.Generator``; dataset tasks hold a
train/validation/test split and index it. Build a task by name with :func:`make_task`; the
options are the keyword arguments of its factory (validated like :func:`cores.make_core`).

Symbol conventions of the copy-like tasks (copy, denoise, transfer_copy): token 0 is the blank,
tokens ``1..alphabet`` are data symbols, token ``alphabet + 1`` is the marker (delimiter); the
input is the one-hot code of the token (``D = alphabet + 2``) and the readout predicts one of
``alphabet + 1`` classes (blank or a data symbol).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from memcores.envs import datasets

LossKind = Literal["ce", "mse", "bce"]


@dataclass
class SequenceBatch:
    """One batch of a task (see the module docstring for the shapes)."""

    x: np.ndarray
    y: np.ndarray
    loss_mask: np.ndarray
    metric_mask: np.ndarray

    @property
    def batch_size(self) -> int:
        return int(self.x.shape[1])


class SequenceTask:
    """Base class of every task.

    :ivar input_size: ``D``, the size of each input vector.
    :ivar output_size: number of classes (``ce``) or target dimension (``mse``/``bce``).
    :ivar loss: ``"ce"`` (cross-entropy over classes), ``"mse"`` or ``"bce"`` (independent bits).
    :ivar length: total sequence length ``T`` fed to the core.
    :ivar window: ``W``, the number of final steps that carry targets.
    :ivar baseline: loss of the best input-independent predictor (the "chance" level), or None.
    :ivar synthetic: True when examples are generated (infinite data), False for datasets.
    """

    input_size: int
    output_size: int
    loss: LossKind
    length: int
    window: int
    baseline: float | None = None
    synthetic: bool = True

    def sample(self, rng: np.random.Generator, batch_size: int) -> SequenceBatch:
        """A fresh batch of ``batch_size`` generated examples (synthetic tasks)."""
        raise NotImplementedError

    def describe(self) -> str:
        return f"{type(self).__name__}(T={self.length}, D={self.input_size})"


# =========================================================================== synthetic tasks
def _one_hot(tokens: np.ndarray, depth: int) -> np.ndarray:
    """``tokens [T, B]`` int -> ``[T, B, depth]`` float32."""
    return np.eye(depth, dtype=np.float32)[tokens]


class RecallTask(SequenceTask):
    """A token task whose last ``n_tokens`` steps recall earlier symbols (copy, denoise).

    Subclasses set ``window``, ``n_tokens`` and ``input_size`` and implement :meth:`tokens`;
    the loss covers the last ``window`` steps and accuracy the last ``n_tokens``.
    """

    window: int
    n_tokens: int
    input_size: int

    @staticmethod
    def _check_loss(task: str, loss: str) -> None:
        if loss not in ("all", "last10"):
            raise ValueError(f"{task} loss must be 'all' or 'last10', got {loss!r}")

    def _set_recall(self, loss: str, n_tokens: int, alphabet: int, total_length: int) -> None:
        """Token layout shared by recall tasks: blank 0, symbols ``1..alphabet``, the marker
        ``alphabet + 1``; CE over the last ``window`` steps."""
        self.loss_mode = loss
        self.n_tokens, self.alphabet = int(n_tokens), int(alphabet)
        self.marker = self.alphabet + 1
        self.input_size, self.output_size = self.alphabet + 2, self.alphabet + 1
        self.loss = "ce"
        self.length = int(total_length)
        self.window = self.length if loss == "all" else self.n_tokens
        # Chance: the blanks are predictable, the symbols are not.
        recall = math.log(self.alphabet)
        self.baseline = recall if loss == "last10" else recall * self.n_tokens / self.length

    def tokens(self, rng: np.random.Generator, batch_size: int) -> tuple[np.ndarray, np.ndarray]:
        """Input and target token ids, both ``[length, batch_size]`` int64."""
        raise NotImplementedError

    def sample(self, rng: np.random.Generator, batch_size: int) -> SequenceBatch:
        inputs, targets = self.tokens(rng, batch_size)
        y = targets[-self.window :]
        loss_mask = np.ones(y.shape, dtype=np.float32)
        metric_mask = np.zeros(y.shape, dtype=np.float32)
        metric_mask[-self.n_tokens :] = 1.0
        return SequenceBatch(_one_hot(inputs, self.input_size), y, loss_mask, metric_mask)


class CopyTask(RecallTask):
    """Copy memory task, h-detach/Arjovsky layout (T + 20 steps).

    Input tokens, for delay ``T``:

    * steps ``0..n_tokens-1``: ``n_tokens`` i.i.d. uniform data symbols from ``1..alphabet``;
    * steps ``n_tokens..n_tokens+T-2``: blanks (``T - 1`` of them);
    * step ``n_tokens + T - 1``: the marker;
    * last ``n_tokens`` steps: blanks, during which the model must output the data symbols
      in order.

    Targets are the blank for the first ``T + n_tokens`` steps and the data symbols for the last
    ``n_tokens``. ``loss="all"`` scores every step (h-detach); ``"last10"`` only the last
    ``n_tokens`` (UR-gates/fast-gate papers; chance loss ``log(alphabet)``). Accuracy is always
    per token over the last ``n_tokens`` steps.
    """

    def __init__(
        self,
        length: int = 100,
        loss: Literal["all", "last10"] = "last10",
        n_tokens: int = 10,
        alphabet: int = 8,
    ) -> None:
        if length < 1:
            raise ValueError(f"copy length (the delay T) must be >= 1, got {length}")
        self._check_loss("copy", loss)
        if n_tokens < 1 or alphabet < 2:
            raise ValueError(f"need n_tokens >= 1 and alphabet >= 2, got {n_tokens}, {alphabet}")
        self.delay = int(length)
        self._set_recall(loss, n_tokens, alphabet, total_length=self.delay + 2 * int(n_tokens))

    def tokens(self, rng: np.random.Generator, batch_size: int) -> tuple[np.ndarray, np.ndarray]:
        """``(inputs [T, B], targets [T, B])`` as token ids."""
        n, delay = self.n_tokens, self.delay
        data = rng.integers(1, self.alphabet + 1, size=(n, batch_size))
        inputs = np.zeros((self.length, batch_size), dtype=np.int64)
        inputs[:n] = data
        inputs[n + delay - 1] = self.marker
        targets = np.zeros_like(inputs)
        targets[-n:] = data
        return inputs, targets

    def describe(self) -> str:
        return f"copy(T={self.delay}, total {self.length} steps, loss={self.loss_mode})"


class TransferCopyTask(CopyTask):
    """Copy trained at delay ``length`` and also evaluated at each delay in ``eval_lengths``.

    Training is exactly :class:`CopyTask`; the trainer's final evaluation (and ``memcores
    supervised RUN --eval-only --eval-lengths ...``) reports accuracy at every delay in
    ``eval_lengths`` (h-detach Table 1).
    """

    def __init__(
        self,
        length: int = 100,
        loss: Literal["all", "last10"] = "all",
        n_tokens: int = 10,
        alphabet: int = 8,
        eval_lengths: list[int] | None = None,
    ) -> None:
        super().__init__(length, loss, n_tokens, alphabet)
        if isinstance(eval_lengths, str):  # "200,400" from a command-line override
            eval_lengths = [int(v) for v in eval_lengths.split(",") if v.strip()]
        self.eval_lengths = [int(v) for v in (eval_lengths or [200, 400, 1000, 2000])]
        if any(v < 1 for v in self.eval_lengths):
            raise ValueError(f"eval_lengths must be positive, got {self.eval_lengths}")

    def variants(self) -> dict[str, CopyTask]:
        """The tasks to evaluate on, keyed ``T=<delay>``."""
        return {
            f"T={t}": CopyTask(t, self.loss_mode, self.n_tokens, self.alphabet)
            for t in self.eval_lengths
        }


class PatternCopyTask(SequenceTask):
    """Copy of binary patterns (the online-LRU paper's copy task, Zucchet et al. §4.1).

    ``n_patterns`` i.i.d. Bernoulli(0.5) patterns of ``bits`` bits are shown at steps
    ``0..n_patterns-1`` (channel ``bits`` = 0), followed by ``length`` all-zero padding steps,
    one marker step (channel ``bits`` = 1, all pattern bits 0), then ``n_patterns`` all-zero
    steps during which the model outputs the patterns in order. Input ``D = bits + 1``; total
    ``T = 2 n_patterns + length + 1`` (48 for the defaults). Loss: binary cross-entropy per bit
    averaged over the recall steps; accuracy per bit (0.5 at chance; chance loss log 2).
    """

    def __init__(self, length: int = 7, n_patterns: int = 20, bits: int = 7) -> None:
        if length < 0 or n_patterns < 1 or bits < 1:
            raise ValueError(
                f"pattern_copy needs length (padding) >= 0, n_patterns >= 1, bits >= 1; "
                f"got {length}, {n_patterns}, {bits}"
            )
        self.padding, self.n_patterns, self.bits = int(length), int(n_patterns), int(bits)
        self.input_size = self.bits + 1
        self.output_size = self.bits
        self.loss = "bce"
        self.length = 2 * self.n_patterns + self.padding + 1
        self.window = self.n_patterns
        self.baseline = math.log(2.0)

    def sample(self, rng: np.random.Generator, batch_size: int) -> SequenceBatch:
        n, bits = self.n_patterns, self.bits
        patterns = rng.integers(0, 2, size=(n, batch_size, bits)).astype(np.float32)
        x = np.zeros((self.length, batch_size, self.input_size), dtype=np.float32)
        x[:n, :, :bits] = patterns
        x[n + self.padding, :, bits] = 1.0  # the output token
        ones = np.ones((n, batch_size), dtype=np.float32)
        return SequenceBatch(x, patterns, ones, ones.copy())

    def describe(self) -> str:
        return f"pattern_copy({self.n_patterns} x {self.bits} bits, padding {self.padding})"


class AddingTask(SequenceTask):
    """Adding problem (Hochreiter & Schmidhuber; UR-gates §3.2, fast-gate §3.1).

    Two input channels over ``T = length`` steps: values ``a_t ~ U[0, 1]`` and an indicator
    that is 1 at one index ``i0`` uniform in ``[0, T/2)`` and one ``i1`` uniform in
    ``[T/2, T)``. The target ``a_i0 + a_i1`` is predicted at the last step; loss MSE, whose
    input-independent baseline (always predicting 1) is the variance 1/6.
    """

    def __init__(self, length: int = 200) -> None:
        if length < 2:
            raise ValueError(f"adding length must be >= 2, got {length}")
        self.length = int(length)
        self.input_size, self.output_size = 2, 1
        self.loss, self.window, self.baseline = "mse", 1, 1.0 / 6.0

    def sample(self, rng: np.random.Generator, batch_size: int) -> SequenceBatch:
        t, half = self.length, self.length // 2
        values = rng.random((t, batch_size), dtype=np.float32)
        i0 = rng.integers(0, half, size=batch_size)
        i1 = rng.integers(half, t, size=batch_size)
        cols = np.arange(batch_size)
        marks = np.zeros((t, batch_size), dtype=np.float32)
        marks[i0, cols] = 1.0
        marks[i1, cols] = 1.0
        x = np.stack([values, marks], axis=-1)
        y = (values[i0, cols] + values[i1, cols]).astype(np.float32)[None, :, None]  # [1, B, 1]
        ones = np.ones((1, batch_size), dtype=np.float32)
        return SequenceBatch(x, y, ones, ones.copy())

    def describe(self) -> str:
        return f"adding(T={self.length})"


class DenoiseTask(RecallTask):
    """Denoise task (GORU paper / Kanuparthi thesis §5.1): copy symbols scattered in noise.

    Exact definition used here, for ``T = length``:

    * steps ``0..T-1``: ``n_tokens`` i.i.d. uniform data symbols from ``1..alphabet`` at
      ``n_tokens`` distinct positions drawn uniformly among the ``T`` steps (kept in time
      order); every other step is the blank;
    * step ``T``: the marker;
    * steps ``T+1..T+n_tokens``: blanks, during which the model outputs the data symbols in the
      order they appeared.

    Total length ``T + n_tokens + 1``. Targets are the blank before the recall steps.
    ``loss="all"|"last10"`` as for copy; accuracy per token over the recall steps.
    """

    def __init__(
        self,
        length: int = 100,
        loss: Literal["all", "last10"] = "last10",
        n_tokens: int = 10,
        alphabet: int = 8,
    ) -> None:
        if length < n_tokens:
            raise ValueError(f"denoise length must be >= n_tokens={n_tokens}, got {length}")
        self._check_loss("denoise", loss)
        self.span = int(length)
        self._set_recall(loss, n_tokens, alphabet, total_length=self.span + int(n_tokens) + 1)

    def tokens(self, rng: np.random.Generator, batch_size: int) -> tuple[np.ndarray, np.ndarray]:
        """``(inputs [T, B], targets [T, B])`` as token ids."""
        n = self.n_tokens
        # n distinct sorted positions per row: argsort of uniform keys, first n, sorted.
        keys = rng.random((batch_size, self.span))
        positions = np.sort(np.argsort(keys, axis=1)[:, :n], axis=1)  # [B, n]
        data = rng.integers(1, self.alphabet + 1, size=(batch_size, n))
        inputs = np.zeros((self.length, batch_size), dtype=np.int64)
        cols = np.repeat(np.arange(batch_size)[:, None], n, axis=1)
        inputs[positions, cols] = data
        inputs[self.span] = self.marker
        targets = np.zeros_like(inputs)
        targets[-n:] = data.T
        return inputs, targets

    def describe(self) -> str:
        return f"denoise(T={self.span}, total {self.length} steps, loss={self.loss_mode})"


# =========================================================================== datasets
class ClassificationTask(SequenceTask):
    """Sequence classification over a fixed dataset; the label is predicted at the last step.

    :param data: the arrays (``x [N, T, D]``, labels ``[N]``).
    :param valid_fraction: share of the training split held out (fixed seed) for evaluation
        during training; the test split is used for the final report.
    :param permutation: optional fixed permutation of the time steps, applied to every split.
    """

    synthetic = False

    def __init__(
        self,
        name: str,
        data: datasets.ArrayDataset,
        valid_fraction: float = 0.1,
        permutation: np.ndarray | None = None,
    ) -> None:
        if not 0.0 <= valid_fraction < 1.0:
            raise ValueError(f"valid_fraction must be in [0, 1), got {valid_fraction}")
        self.name = name
        x_train, x_test = data.x_train, data.x_test
        if permutation is not None:
            x_train, x_test = x_train[:, permutation], x_test[:, permutation]
        order = np.random.default_rng(12345).permutation(len(x_train))
        n_valid = int(round(valid_fraction * len(order)))
        valid, train = order[:n_valid], order[n_valid:]
        self.splits: dict[str, tuple[np.ndarray, np.ndarray]] = {
            "train": (x_train[train], data.y_train[train]),
            "valid": (x_train[valid], data.y_train[valid]),
            "test": (x_test, data.y_test),
        }
        self.input_size = int(x_train.shape[2])
        self.output_size = int(data.n_classes)
        self.loss, self.length, self.window = "ce", int(x_train.shape[1]), 1
        counts = np.bincount(data.y_train, minlength=data.n_classes) / len(data.y_train)
        self.baseline = float(-(counts[counts > 0] * np.log(counts[counts > 0])).sum())

    def size(self, split: str) -> int:
        return len(self.splits[split][1])

    def batch(self, split: str, indices: np.ndarray) -> SequenceBatch:
        """Examples ``indices`` of ``split`` ("train"|"valid"|"test") as a time-major batch."""
        x, y = self.splits[split]
        xb = np.ascontiguousarray(x[indices].transpose(1, 0, 2))  # [N, T, D] -> [T, B, D]
        yb = y[indices][None, :]  # [1, B]
        ones = np.ones(yb.shape, dtype=np.float32)
        return SequenceBatch(xb, yb, ones, ones.copy())

    def describe(self) -> str:
        sizes = ", ".join(f"{k} {self.size(k)}" for k in self.splits)
        return f"{self.name}(T={self.length}, D={self.input_size}, {sizes})"


def _digits(valid_fraction: float = 0.1) -> ClassificationTask:
    return ClassificationTask("digits", datasets.load_digits(), valid_fraction)


def _pdigits(valid_fraction: float = 0.1, seed: int = 0) -> ClassificationTask:
    perm = np.random.default_rng(seed).permutation(64)
    return ClassificationTask("pdigits", datasets.load_digits(), valid_fraction, perm)


def _smnist(data_dir: str = "data", valid_fraction: float = 1 / 6) -> ClassificationTask:
    return ClassificationTask("smnist", datasets.read_mnist(data_dir), valid_fraction)


def _psmnist(data_dir: str = "data", valid_fraction: float = 1 / 6) -> ClassificationTask:
    perm = datasets.bitreversal_permutation(784)
    return ClassificationTask("psmnist", datasets.read_mnist(data_dir), valid_fraction, perm)


def _scifar(data_dir: str = "data", valid_fraction: float = 0.1) -> ClassificationTask:
    return ClassificationTask("scifar", datasets.read_cifar10(data_dir), valid_fraction)


def _har(
    data_dir: str = "data", valid_fraction: float = 0.2, binary: bool = False
) -> ClassificationTask:
    name = "har2" if binary else "har"
    return ClassificationTask(name, datasets.read_har(data_dir, binary=binary), valid_fraction)


# =========================================================================== registry
@dataclass(frozen=True)
class TaskSpec:
    """A registry entry: a factory (its keyword arguments are the task's options) and a line."""

    factory: Callable[..., SequenceTask]
    description: str
    needs_data: bool = field(default=False)
    check_data: Callable[[str], object] | None = None
    """Checks that the files in ``data_dir`` are there without reading them (raises
    :class:`datasets.DatasetMissingError`), so a config is refused before a run starts."""


TASKS: dict[str, TaskSpec] = {
    "copy": TaskSpec(
        CopyTask, "copy 10 symbols after a delay T (T+20 steps); options length, loss=all|last10"
    ),
    "transfer_copy": TaskSpec(
        TransferCopyTask,
        "copy trained at delay `length`, evaluated at each of `eval_lengths` (h-detach Tab. 1)",
    ),
    "pattern_copy": TaskSpec(
        PatternCopyTask,
        "recall 20 random 7-bit patterns after `length` (7) padding steps and a marker (LRU)",
    ),
    "adding": TaskSpec(AddingTask, "sum of the two marked values among T (MSE, baseline 1/6)"),
    "denoise": TaskSpec(
        DenoiseTask, "recall 10 symbols scattered among T noise steps, in order, after a marker"
    ),
    "digits": TaskSpec(_digits, "scikit-learn 8x8 digits as 64-step pixel sequences (bundled)"),
    "pdigits": TaskSpec(_pdigits, "digits with a fixed random permutation of the 64 pixels"),
    "smnist": TaskSpec(
        _smnist,
        "sequential MNIST, 784 steps (idx files in data_dir)",
        True,
        datasets.mnist_paths,
    ),
    "psmnist": TaskSpec(
        _psmnist,
        "MNIST with the bit-reversal pixel permutation (idx files in data_dir)",
        True,
        datasets.mnist_paths,
    ),
    "scifar": TaskSpec(
        _scifar,
        "sequential CIFAR-10, 1024 RGB steps (python batches in data_dir)",
        True,
        datasets.cifar10_root,
    ),
    "har": TaskSpec(
        _har,
        "UCI HAR inertial signals, 9 x 128, 6 classes (binary=true: HAR-2)",
        True,
        datasets.har_root,
    ),
}


def task_options(name: str) -> dict[str, Any]:
    """The options of task ``name`` mapped to their defaults."""
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; valid tasks: {', '.join(sorted(TASKS))}")
    params = inspect.signature(TASKS[name].factory).parameters
    return {
        k: (p.default if p.default is not inspect.Parameter.empty else None)
        for k, p in params.items()
        if k != "self"
    }


def check_task_options(name: str, options: dict[str, Any]) -> None:
    """Raise ``ValueError`` naming the valid options when ``options`` has an unknown key."""
    allowed = task_options(name)
    for key in options:
        if key not in allowed:
            raise ValueError(
                f"unknown option {key!r} for task {name!r}; valid options: "
                f"{', '.join(sorted(allowed)) or '(none)'}"
            )


def check_task_data(name: str, options: dict[str, Any]) -> None:
    """For a task that reads files: check they are in its ``data_dir`` (not read here).

    :raises datasets.DatasetMissingError: a file is missing; the message names it.
    """
    check = TASKS[name].check_data if name in TASKS else None
    if check is not None:
        check(str(options.get("data_dir", task_options(name).get("data_dir"))))


def make_task(name: str, **options: Any) -> SequenceTask:
    """Build task ``name`` with ``options`` (see :func:`task_options`).

    :raises ValueError: unknown task, unknown option or bad value.
    :raises datasets.DatasetMissingError: a dataset file is not in ``data_dir``.
    """
    check_task_options(name, options)
    return TASKS[name].factory(**options)
