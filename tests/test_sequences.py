"""Inputs and targets of every supervised sequence task."""

from __future__ import annotations

import math

import numpy as np
import pytest

from memcores.envs import datasets
from memcores.envs.sequences import (
    TASKS,
    AddingTask,
    CopyTask,
    DenoiseTask,
    PatternCopyTask,
    TransferCopyTask,
    make_task,
    task_options,
)


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(0)


def _tokens(batch_x: np.ndarray) -> np.ndarray:
    """One-hot ``[T, B, D]`` -> token ids ``[T, B]``."""
    assert np.all(batch_x.sum(-1) == 1.0)
    return batch_x.argmax(-1)


@pytest.mark.parametrize("delay", [1, 7, 100])
def test_copy_layout_and_targets(rng: np.random.Generator, delay: int) -> None:
    task = CopyTask(length=delay, loss="all")
    batch = task.sample(rng, 16)
    tok = _tokens(batch.x)
    assert batch.x.shape == (delay + 20, 16, 10)
    assert task.length == delay + 20 and task.window == delay + 20
    first = tok[:10]
    assert first.min() >= 1 and first.max() <= 8  # data symbols 1..8
    # T - 1 blanks, the marker, then 10 blanks to output over
    assert np.all(tok[10 : 10 + delay - 1] == 0)
    assert np.all(tok[10 + delay - 1] == 9)
    assert np.all(tok[-10:] == 0)
    # targets: blank everywhere but the last 10 steps, which are exactly the first 10 tokens
    assert np.all(batch.y[:-10] == 0)
    np.testing.assert_array_equal(batch.y[-10:], first)
    assert np.all(batch.loss_mask == 1)
    assert batch.metric_mask.sum() == 10 * 16 and np.all(batch.metric_mask[-10:] == 1)


def test_copy_last10_scores_only_recall(rng: np.random.Generator) -> None:
    task = CopyTask(length=50, loss="last10")
    batch = task.sample(rng, 4)
    assert task.window == 10 and batch.y.shape == (10, 4)
    np.testing.assert_array_equal(batch.y, _tokens(batch.x)[:10])
    assert task.baseline == pytest.approx(math.log(8))


def test_copy_draws_differ_and_are_reproducible() -> None:
    task = CopyTask(length=5)
    a = task.sample(np.random.default_rng(1), 8).x
    b = task.sample(np.random.default_rng(1), 8).x
    c = task.sample(np.random.default_rng(2), 8).x
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)


def test_transfer_copy_variants() -> None:
    task = make_task("transfer_copy", length=100, eval_lengths="200,400")
    assert task.length == 120
    variants = task.variants()
    assert list(variants) == ["T=200", "T=400"]
    assert variants["T=400"].length == 420 and variants["T=400"].input_size == task.input_size
    assert isinstance(TransferCopyTask().variants()["T=2000"], CopyTask)


def test_pattern_copy_layout(rng: np.random.Generator) -> None:
    task = PatternCopyTask()  # 20 patterns x 7 bits, padding 7
    batch = task.sample(rng, 5)
    assert task.length == 48 and batch.x.shape == (48, 5, 8)
    patterns = batch.x[:20, :, :7]
    np.testing.assert_array_equal(batch.y, patterns)
    assert set(np.unique(patterns)) <= {0.0, 1.0} and 0.3 < patterns.mean() < 0.7
    assert np.all(batch.x[:20, :, 7] == 0)
    assert np.all(batch.x[20:27] == 0)  # padding
    assert np.all(batch.x[27, :, 7] == 1) and np.all(batch.x[27, :, :7] == 0)  # marker
    assert np.all(batch.x[28:] == 0)
    assert task.window == 20 and batch.y.shape == (20, 5, 7)


def test_adding_target_is_sum_of_marked_values(rng: np.random.Generator) -> None:
    task = AddingTask(length=50)
    batch = task.sample(rng, 64)
    values, marks = batch.x[..., 0], batch.x[..., 1]
    assert batch.x.shape == (50, 64, 2)
    assert np.all(marks.sum(0) == 2)
    assert np.all(marks[:25].sum(0) == 1) and np.all(marks[25:].sum(0) == 1)
    np.testing.assert_allclose(batch.y[0, :, 0], (values * marks).sum(0), rtol=1e-6)
    assert batch.y.shape == (1, 64, 1) and task.baseline == pytest.approx(1 / 6)
    # the baseline: always predicting 1 has MSE close to 1/6
    big = task.sample(rng, 4000)
    assert np.mean((big.y - 1.0) ** 2) == pytest.approx(1 / 6, abs=0.01)


def test_denoise_recalls_scattered_symbols_in_order(rng: np.random.Generator) -> None:
    task = DenoiseTask(length=30, loss="all")
    batch = task.sample(rng, 32)
    tok = _tokens(batch.x)
    assert task.length == 41 and tok.shape == (41, 32)
    assert np.all(tok[30] == 9) and np.all(tok[31:] == 0)
    for b in range(32):
        shown = tok[:30, b][tok[:30, b] > 0]
        assert len(shown) == 10
        np.testing.assert_array_equal(batch.y[-10:, b], shown)
    assert np.all(batch.y[:-10] == 0)
    # positions are random, not the copy layout
    assert not np.all(tok[:10] > 0)


def test_digits_and_pdigits() -> None:
    digits, pdigits = make_task("digits"), make_task("pdigits")
    assert digits.length == 64 and digits.input_size == 1 and digits.output_size == 10
    idx = np.arange(8)
    a, b = digits.batch("train", idx), pdigits.batch("train", idx)
    assert a.x.shape == (64, 8, 1) and a.y.shape == (1, 8)
    np.testing.assert_array_equal(a.y, b.y)
    # the same images, pixels in a different (fixed) order
    np.testing.assert_allclose(np.sort(a.x[:, :, 0], 0), np.sort(b.x[:, :, 0], 0))
    assert not np.allclose(a.x, b.x)
    assert 0.0 <= a.x.min() and a.x.max() <= 1.0
    total = sum(digits.size(s) for s in ("train", "valid", "test"))
    assert total == 1797


def test_bitreversal_permutation() -> None:
    np.testing.assert_array_equal(datasets.bitreversal_permutation(8), [0, 4, 2, 6, 1, 5, 3, 7])
    perm = datasets.bitreversal_permutation(784)
    assert perm[:8].tolist() == [0, 512, 256, 768, 128, 640, 384, 64]
    assert sorted(perm.tolist()) == list(range(784))


def test_registry_and_options() -> None:
    for name, spec in TASKS.items():
        assert spec.description, name
        options = task_options(name)
        # an unknown option's message lists exactly the options task_options reports
        with pytest.raises(ValueError, match="valid options") as info:
            make_task(name, no_such_option=1)
        for option in options:
            assert option in str(info.value), (name, option)
    assert task_options("copy") == {"length": 100, "loss": "last10", "n_tokens": 10, "alphabet": 8}
    assert make_task("copy", length=30).sample(np.random.default_rng(0), 2).x.shape[0] == 50
    with pytest.raises(ValueError, match="valid tasks: .*adding"):
        make_task("nope")
    with pytest.raises(ValueError, match="unknown option 'lenght'.*valid options: .*length"):
        make_task("copy", lenght=5)
    with pytest.raises(ValueError, match="loss"):
        make_task("copy", loss="first10")
