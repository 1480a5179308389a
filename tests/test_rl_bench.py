"""`memcores bench rl --quick` runs both sides and prints the ratio (no assertion on speed),
leaving no sb3 log folder in the temp dir."""

from __future__ import annotations

import re
import tempfile

from memcores.experiments.bench.record import read_record
from memcores.experiments.cli import main


def test_bench_rl_quick(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    assert main(["bench", "rl", "--quick", "--out", str(tmp_path / "record")]) == 0
    # sb3's default logger would leave an empty SB3-<time> folder in the temp dir per learn()
    assert list(tmp_path.glob("SB3-*")) == []
    out = capsys.readouterr().out
    assert "memcores PPO (lstm):" in out
    assert "sb3-contrib RecurrentPPO:" in out
    assert "ratio memcores / sb3-contrib:" in out
    # the printed ratio is the quotient of the two printed best rates, both of real work
    ours = re.search(r"memcores PPO \(lstm\):\s+(\d+) frames/s wall", out)
    sb3 = re.search(r"sb3-contrib RecurrentPPO:\s+(\d+) frames/s wall", out)
    ratio = re.search(r"ratio memcores / sb3-contrib: ([\d.]+)x \(wall\)", out)
    assert ours and sb3 and ratio
    fps_ours, fps_sb3 = float(ours.group(1)), float(sb3.group(1))
    assert fps_ours > 0 and fps_sb3 > 0
    # the rates are printed rounded to whole frames/s and the ratio to 0.01
    rounding = fps_ours / fps_sb3 * (0.5 / fps_ours + 0.5 / fps_sb3) * 1.01 + 0.005
    assert abs(float(ratio.group(1)) - fps_ours / fps_sb3) <= rounding

    # the record: the trainers' table, then the ceiling and scaling table, a line per layout
    trainers, scaling = read_record(tmp_path / "record")["tables"]
    assert trainers["rows"][0][1] == ours.group(1)
    assert [row[0] for row in scaling["rows"]] == [
        "sync (in-process)", "async, 1 worker", "async, 2 workers",
    ]  # fmt: skip
    assert scaling["columns"][1:] == ["2 envs: env alone / trainer"]
    alone, trainer = scaling["rows"][0][1].split(" / ")
    assert float(alone.replace(",", "")) > 0 and float(trainer.replace(",", "")) > 0
