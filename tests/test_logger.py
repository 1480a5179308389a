"""RunLogger writes TensorBoard scalars and a CSV whose columns never shift."""

from __future__ import annotations

import csv

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from memcores.agents.logger import RunLogger


def test_scalars_reach_tensorboard_and_csv(tmp_path):
    logger = RunLogger(tmp_path)
    logger.record("rollout/ep_rew_mean", 0.5)
    logger.dump(step=10)
    logger.record("rollout/ep_rew_mean", 0.7)
    logger.record("train/value_loss", 0.1)  # a new column appears later
    logger.dump(step=20)
    logger.histogram("core/timescales", [1.0, 2.0, 3.0], step=20)
    logger.close()

    events = EventAccumulator(str(tmp_path))
    events.Reload()
    rewards = [(e.step, round(e.value, 3)) for e in events.Scalars("rollout/ep_rew_mean")]
    assert rewards == [(10, 0.5), (20, 0.7)]
    assert "core/timescales" in events.Tags()["histograms"]

    with (tmp_path / "progress.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert [r["step"] for r in rows] == ["10", "20"]
    assert rows[0]["train/value_loss"] == "" and float(rows[1]["train/value_loss"]) == 0.1


def test_resume_keeps_rows_and_truncates_future(tmp_path):
    logger = RunLogger(tmp_path, tensorboard=False)
    for step in (1, 2, 3):
        logger.record("loss", step)
        logger.dump(step)
    logger.close()
    resumed = RunLogger(tmp_path, tensorboard=False)
    resumed.truncate_after(2)
    resumed.record("loss", 9)
    resumed.dump(3)
    with (tmp_path / "progress.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert [(r["step"], r["loss"]) for r in rows] == [("1", "1.0"), ("2", "2.0"), ("3", "9.0")]
