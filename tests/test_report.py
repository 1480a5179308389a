"""``memcores report``: markdown tables (mean ± std over seeds) and plots from a sweep folder."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from memcores.agents.files import write_text_atomic
from memcores.agents.logger import RunLogger
from memcores.experiments.cli import main
from memcores.experiments.report import build_report, mean_std


def write_json_atomic(path: Path, data: dict) -> None:
    write_text_atomic(path, json.dumps(data))


ACCURACY = {
    ("lstm", 0): [0.2, 0.5, 0.4],
    ("lstm", 1): [0.3, 0.6, 0.6],
    ("ur_lstm", 0): [0.5, 1.0, 1.0],
}


def write_trial(root: Path, core: str, seed: int, status: str = "ok") -> Path:
    """A trial folder as `memcores sweep` + `memcores supervised` leave it."""
    run = root / f"name={core},seed={seed}"
    run.mkdir(parents=True)
    config = {
        "task": {"name": "copy", "options": {"length": 20}},
        "core": {"name": core, "options": {}},
        "train": {"seed": seed},
    }
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    if status == "ok":
        logger = RunLogger(run)
        for i, acc in enumerate(ACCURACY[(core, seed)]):
            logger.record("eval/accuracy", acc)
            logger.record("eval/loss", 1.0 - acc)
            logger.dump(10 * i)
        logger.close()
        # a result table the trial wrote itself, like `memcores transfer`'s
        (run / "transfer.csv").write_text(
            "train_env,test_env,train_reward,test_reward\n"
            f"A-5x5,A-8x8,{0.9 + seed / 10},{0.5 + seed / 10}\n"
            f"B-5x5,B-8x8,{0.8},{0.1 * seed}\n"
        )
    message = "" if status == "ok" else "exit code 3\nboom"
    write_json_atomic(
        run / "trial.json", {"status": status, "seconds": 6.0, "message": message, "argv": []}
    )
    return run


@pytest.fixture
def sweep(tmp_path: Path) -> Path:
    root = tmp_path / "sweep"
    for core, seed in ACCURACY:
        write_trial(root, core, seed)
    write_trial(root, "ur_lstm", 1, status="failed")
    write_json_atomic(
        root / "sweep.json",
        {
            "command": "supervised",
            "config": "experiments/configs/demo_copy.yaml",
            "grid": {"core.name": ["lstm", "ur_lstm"], "train.seed": ["0", "1"]},
            "overrides": ["train.steps=30"],
            "backend": "local",
        },
    )
    return root


def table_rows(text: str, heading: str) -> list[list[str]]:
    """Cells of the markdown table under ``## heading``."""
    section = text.split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("|")][2:]
    return [[c.strip() for c in row.strip("|").split("|")] for row in rows]


def test_mean_std_formats_over_seeds():
    assert mean_std([0.5]) == "0.5"
    assert mean_std([0.4, 0.6]) == "0.5 ± 0.14"
    assert mean_std([]) == "-"


def test_report_tables_average_seeds_and_list_failures(sweep, tmp_path):
    out = tmp_path / "rep" / "report.md"
    text = build_report(sweep, out)
    assert out.read_text() == text
    assert "- trials: 4 (3 ok, 1 not ok), 0.4 trial-minutes in total" in text
    assert "`core.name` = lstm, ur_lstm" in text

    acc = {row[1]: row for row in table_rows(text, "eval/accuracy")}
    assert acc["lstm"][0] == "copy" and acc["lstm"][2] == "2"  # task, core, seeds
    assert acc["lstm"][3] == mean_std([0.4, 0.6])  # final
    assert acc["lstm"][4] == mean_std([0.5, 0.6])  # best = max
    assert acc["ur_lstm"][2:5] == ["1", "1", "1"]
    loss = {row[1]: row for row in table_rows(text, "eval/loss")}
    assert loss["lstm"][4] == mean_std([0.5, 0.4])  # loss: best = min

    transfer = table_rows(text, "Table `transfer.csv` (per trial, averaged over seeds)")
    lstm_a = next(r for r in transfer if r[1] == "lstm" and r[2] == "A-5x5")
    assert lstm_a[3:] == ["A-8x8", "2", mean_std([0.9, 1.0]), mean_std([0.5, 0.6])]

    failed = table_rows(text, "Trials that did not finish")
    assert failed == [["name=ur_lstm,seed=1", "failed", "exit code 3"]]
    # one PNG per metric, linked from the report
    for png in re.findall(r"!\[[^]]*\]\(([^)]+)\)", text):
        assert (out.parent / png).read_bytes()[:4] == b"\x89PNG"
    assert (out.parent / "report_eval_accuracy.png").is_file()


def test_report_cli(sweep, tmp_path, capsys):
    out = tmp_path / "r.md"
    code = main(["report", str(sweep), "--out", str(out), "--metric", "eval/loss", "--no-plots"])
    assert code == 0
    text = out.read_text()
    assert "## eval/loss" in text and "## eval/accuracy" not in text and "![" not in text
    assert main(["report", str(sweep), "--out", str(out), "--metric", "nope/x"]) == 2
    assert "eval/accuracy" in capsys.readouterr().err  # names what was logged
    assert main(["report", str(tmp_path / "missing"), "--out", str(out)]) == 2


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("train: {MemoryS7: {lstm: [1, 2]}}", "train.MemoryS7.lstm must be a number or null"),
        ("train: {MemoryS7: {lstm: high}}", "train.MemoryS7.lstm must be a number or null"),
        ("title: [a]\ntrain: {}", "title must be text, got ['a']"),
        ("train: [1]", "train must map env -> {core: value}"),
        ("train: {}\ntrain: {}", "duplicate key 'train' (first given on line 1)"),
        ("a: &a [1,1,1,1,1,1,1,1,1,1]\nb: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a,*a]\n"
         "c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b,*b]\ntrain: [*c,*c,*c,*c,*c,*c,*c,*c,*c,*c]",
         "aliases expand to more than"),
    ],
)  # fmt: skip
def test_a_wrong_reference_file_is_one_line_and_writes_nothing(
    sweep, tmp_path, capsys, text, message
):
    reference, out = tmp_path / "ref.yaml", tmp_path / "report" / "r.md"
    reference.write_text(text + "\n")
    assert main(["report", str(sweep), "--reference", str(reference), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(reference) in err[0] and message in err[0]
    assert not out.parent.exists()


def test_a_threshold_must_be_a_finite_number(sweep, tmp_path, capsys):
    out = tmp_path / "report" / "r.md"
    for bad in ("nan", "inf"):
        with pytest.raises(SystemExit) as caught:
            main(["report", str(sweep), "--threshold", bad, "--out", str(out)])
        assert caught.value.code == 2
        assert f"--threshold: must be a finite number, got {bad}" in capsys.readouterr().err
    assert not out.parent.exists()


def test_transfer_trials_report_per_env_runs_and_their_table(tmp_path):
    """A transfer trial has no config.yaml of its own: one run per env pair in sub-folders and
    a table.csv; rows take the core from the trial's overrides and the env from each run."""
    root = tmp_path / "sweep"
    for core in ("lstm", "ur_lstm"):
        for seed in (0, 1):
            trial = root / f"name={core},seed={seed}"
            for env, reward in (("MemoryS7", 0.5), ("DoorKey-5x5", 0.9)):
                run = trial / env
                run.mkdir(parents=True)
                config = {"env": {"id": f"MiniGrid-{env}-v0"}, "core": {"name": core}}
                (run / "config.yaml").write_text(yaml.safe_dump(config))
                logger = RunLogger(run)
                for step in (100, 200):
                    logger.record("rollout/ep_rew_mean", reward * step / 200 + seed / 100)
                    logger.dump(step)
                logger.close()
            (trial / "table.csv").write_text(
                "train_env,test_env,core,frames,train_return,test_return,run_dir\n"
                f"MiniGrid-MemoryS7-v0,MiniGrid-MemoryS13-v0,{core},200,{0.5 + seed / 10},0.25,"
                f"{trial}/MemoryS7\n"
            )
            overrides = [f"core.name={core}", f"train.seed={seed}"]
            write_json_atomic(
                trial / "trial.json", {"status": "ok", "seconds": 1.0, "overrides": overrides}
            )
    grid = {"core.name": ["lstm", "ur_lstm"], "train.seed": ["0", "1"]}
    write_json_atomic(root / "sweep.json", {"command": "transfer", "grid": grid})
    reference = tmp_path / "ref.yaml"
    reference.write_text(
        "title: Paper T7\nlabel: paper\n"
        "train: {MemoryS7: {lstm: 0.96, rel_lstm: 0.94}}\ntest: {MemoryS13: {lstm: 0.25}}\n"
    )
    out = tmp_path / "report.md"
    text = build_report(root, out, reference=reference)
    # Table 7 layout: Train/Test blocks, one column per core, the paper's beside ours
    heading = "Train/test return per env pair (mean ± std over seeds); paper: Paper T7"
    section = text.split(f"## {heading}\n", 1)[1]
    assert "| Environment | lstm | lstm (paper) | ur_lstm | rel_lstm (paper) |" in section
    t7 = table_rows(text, heading)
    assert t7[1] == ["MemoryS7", mean_std([0.5, 0.6]), "0.96", mean_std([0.5, 0.6]), "0.94"]
    assert t7[3] == ["MemoryS13", "0.25 ± 0", "0.25", "0.25 ± 0", "-"]
    rows = {(r[0], r[1]): r for r in table_rows(text, "rollout/ep_rew_mean")}
    assert rows[("MiniGrid-MemoryS7-v0", "ur_lstm")][2:4] == ["2", mean_std([0.5, 0.51])]
    assert rows[("MiniGrid-DoorKey-5x5-v0", "lstm")][3] == mean_std([0.9, 0.91])
    table = table_rows(text, "Table `table.csv` (per trial, averaged over seeds)")
    assert table[0][:3] == ["lstm", "MiniGrid-MemoryS7-v0", "MiniGrid-MemoryS13-v0"]
    assert table[0][-2:] == [mean_std([0.5, 0.6]), "0.25 ± 0"]
    assert (tmp_path / "report_rollout_ep_rew_mean.png").is_file()
    bad = tmp_path / "bad.yaml"
    bad.write_text("rows: []\n")
    with pytest.raises(ValueError, match="train"):
        build_report(root, out, reference=bad)


def test_report_from_committed_records_alone(tmp_path):
    """A fresh clone has no run folders: the report is built from results/ records, the
    transfer table from each record's evaluation on its train and test env."""
    from memcores.experiments.records import write_record

    results = tmp_path / "results" / "t7"
    for core, seed in (("lstm", 0), ("lstm", 1), ("ur_lstm", 0)):
        run = tmp_path / "runs" / f"{core}{seed}"
        run.mkdir(parents=True)
        config = {"env": {"id": "MiniGrid-MemoryS7-v0"}, "core": {"name": core}}
        config["train"] = {"seed": seed}
        config["run"] = {"dir": str(run)}  # as the trainer writes it
        (run / "config.yaml").write_text(yaml.safe_dump(config))
        logger = RunLogger(run, tensorboard=False)
        for step in (100, 200):
            logger.record("rollout/ep_rew_mean", step / 400 + seed / 10)
            logger.dump(step)
        logger.close()
        # one run tested on two envs: two pair records that name the same run folder
        train = {"return": 0.5 + seed / 10, "success": 0.9, "episodes": 5}
        for test_env, success in (("MemoryS13", 0.2 + seed / 10), ("MemoryS9", 0.7)):
            test_id = f"MiniGrid-{test_env}-v0"
            evals = {
                "MiniGrid-MemoryS7-v0": train,
                test_id: {"return": 0.25, "success": success, "episodes": 5},
            }
            write_record(
                run,
                results / f"name={core},seed={seed}" / f"MemoryS7-to-{test_env}",
                eval_results=evals,
                wall_seconds=60.0,
                extra={"test_env": test_id},
            )
    out = tmp_path / "report.md"
    text = build_report(results, out, plots=False)
    # each run and its minute count once, not once per pair record
    assert "- training runs: 3 (3 ok, 0 not ok), 6 records, 3.0 trial-minutes in total" in text
    assert "curve.csv" not in text  # a record's learning curve is not a result table
    rows = {r[1]: r for r in table_rows(text, "rollout/ep_rew_mean")}
    assert rows["lstm"][2:4] == ["2", mean_std([0.5, 0.6])]  # two runs, not four records
    t7 = table_rows(text, "Train/test return per env pair (mean ± std over seeds)")
    assert t7[1] == ["MemoryS7", mean_std([0.5, 0.6]), "0.5"]
    assert t7[3] == ["MemoryS13", "0.25 ± 0", "0.25"]
    success = table_rows(text, "Train/test success per env pair (mean ± std over seeds)")
    assert success[1] == ["MemoryS7", "0.9 ± 0", "0.9"]
    assert success[3] == ["MemoryS13", mean_std([0.2, 0.3]), "0.2"]
    assert success[4] == ["MemoryS9", "0.7 ± 0", "0.7"]

    # rows follow a given order (a published table's), then the order found
    from memcores.experiments.report import load_trials, transfer_points, transfer_table

    ordered = transfer_table(load_trials(results), None, (), "success", {"test": ["MemoryS9"]})
    assert [line.split("|")[1].strip() for line in ordered.splitlines()[5:7]] == [
        "MemoryS9",
        "MemoryS13",
    ]

    # the transfer figure's points: one train/test value per run and pair, seeds apart

    points = {(p.core, p.test_env): p for p in transfer_points(load_trials(results), "success")}
    assert set(points) == {(c, t) for c in ("lstm", "ur_lstm") for t in ("MemoryS13", "MemoryS9")}
    assert points["lstm", "MemoryS13"].train == [0.9, 0.9]
    assert sorted(points["lstm", "MemoryS13"].test) == pytest.approx([0.2, 0.3])
    text = build_report(results, out, plots=True)
    for quantity in ("return", "success"):
        png = tmp_path / f"report_train_vs_test_{quantity}.png"
        assert png.stat().st_size > 0
        assert f"![train vs test {quantity}]({png.name})" in text


def test_records_of_a_sweep_over_a_delay_give_a_core_by_delay_table_and_figure(tmp_path):
    """A results folder keeps no sweep.json: the grid comes from the sweep command its
    records keep, and a numeric swept key (the delay) becomes the columns of a pivot table
    and the x axis of a final-value plot."""
    from memcores.experiments.records import write_record

    command = (
        "memcores sweep c.yaml --grid train.seed=0,1 --grid core.name=lstm,lru "
        "--grid env.kwargs.distractor_steps=5,40 --results results/h"
    )
    results = tmp_path / "results" / "h"
    success = {("lstm", 5): 0.9, ("lstm", 40): 0.3, ("lru", 5): 0.8, ("lru", 40): 0.6}
    for (core, delay), value in success.items():
        for seed in (0, 1):
            run = tmp_path / "runs" / f"{core}{delay}{seed}"
            run.mkdir(parents=True)
            config = {
                "env": {
                    "id": "memcores/PassiveVisualMatch-v0",
                    "kwargs": {"distractor_steps": delay},
                },
                "core": {"name": core},
                "train": {"seed": seed},
            }
            (run / "config.yaml").write_text(yaml.safe_dump(config))
            logger = RunLogger(run, tensorboard=False)
            for step in (100, 200):
                logger.record("rollout/success_rate", value * step / 200 + seed / 10)
                logger.dump(step)
            logger.close()
            name = f"seed={seed},name={core},distractor_steps={delay}"
            write_record(run, results / name, command=command)
    out = tmp_path / "report.md"
    text = build_report(results, out, metrics=["rollout/success_rate"])
    assert "`env.kwargs.distractor_steps` = 5, 40" in text
    section = text.split("mean ± std (seeds):\n", 1)[1]
    header, _, *rows = [line for line in section.splitlines() if line.startswith("|")][:4]
    assert header == "| core.name | distractor_steps=5 | distractor_steps=40 |"
    cells = [[c.strip() for c in r.strip("|").split("|")] for r in rows]
    assert cells[0] == ["lstm", f"{mean_std([0.9, 1.0])} (2)", f"{mean_std([0.3, 0.4])} (2)"]
    assert cells[1][0] == "lru"  # grid order, not alphabetical
    assert (tmp_path / "report_rollout_success_rate_vs_env_kwargs_distractor_steps.png").is_file()


def test_plot_against_a_config_key_and_its_error(tmp_path, capsys):
    """`memcores plot --against KEY`: one point per key value, mean over seeds; a key that
    is not numeric is a one-line error with exit code 2."""
    from memcores.experiments.plotting import final_bands
    from memcores.experiments.records import find_runs

    for core, delay, seed, value in (
        ("lstm", 5, 0, 0.8),
        ("lstm", 5, 1, 1.0),
        ("lstm", 40, 0, 0.3),
    ):
        run = tmp_path / "runs" / f"{core}{delay}{seed}"
        run.mkdir(parents=True)
        config = {"env": {"kwargs": {"distractor_steps": delay}}, "core": {"name": core}}
        (run / "config.yaml").write_text(yaml.safe_dump(config | {"train": {"seed": seed}}))
        logger = RunLogger(run, tensorboard=False)
        logger.record("rollout/success_rate", value)
        logger.dump(10)
        logger.close()
    (band,) = final_bands(
        find_runs([tmp_path / "runs"]), "rollout/success_rate", "env.kwargs.distractor_steps"
    )
    assert band.steps.tolist() == [5.0, 40.0] and band.mean.tolist() == pytest.approx([0.9, 0.3])
    assert band.low.tolist() == pytest.approx([0.8, 0.3]) and band.n == 2
    png = tmp_path / "h.png"
    args = ["plot", str(tmp_path / "runs"), "--metric", "rollout/success_rate"]
    assert main([*args, "--against", "env.kwargs.distractor_steps", "--out", str(png)]) == 0
    assert png.is_file() and "lstm (seeds=2): 5: 0.9, 40: 0.3" in capsys.readouterr().out
    assert main([*args, "--against", "core.name", "--out", str(tmp_path / "x.png")]) == 2
    assert "numeric 'core.name'" in capsys.readouterr().err


def test_transfer_figure_places_reference_points_and_refuses_an_empty_plot(tmp_path):
    from memcores.experiments.transfer_plot import TransferPoint, plot_transfer, reference_point

    ref = {"train": {"DoorKey-5x5": {"lstm": 0.94}}, "test": {"DoorKey-16x16": {"lstm": 0.09}}}
    assert reference_point(ref, "lstm", "DoorKey-5x5", "DoorKey-16x16") == (0.94, 0.09)
    assert reference_point(ref, "rel_lstm", "DoorKey-5x5", "DoorKey-16x16") is None
    assert reference_point(None, "lstm", "DoorKey-5x5", "DoorKey-16x16") is None
    point = TransferPoint("lstm", "DoorKey-5x5", "DoorKey-16x16", [0.9, 0.95], [0.1, 0.3])
    png = plot_transfer([point], tmp_path / "t.png", "return", ref)
    assert png.stat().st_size > 0
    with pytest.raises(ValueError, match="no train/test pairs"):
        plot_transfer([], tmp_path / "empty.png")


def _record(results: Path, tmp_path: Path, name: str, config: dict, values: list[float]) -> Path:
    """A committed record of a run whose ``rollout/ep_rew_mean`` took ``values`` (steps 100,
    200, ...)."""
    from memcores.experiments.records import write_record

    run = tmp_path / "runs" / name
    run.mkdir(parents=True)
    config = {**config, "run": {"dir": str(run)}}  # as the trainer writes it
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    logger = RunLogger(run, tensorboard=False)
    for i, value in enumerate(values):
        logger.record("rollout/ep_rew_mean", value)
        logger.dump(100 * (i + 1))
    logger.close()
    write_record(run, results / name)
    return results / name


def _s7(seed: int, epochs: int = 8, steps: int = 200) -> dict:
    return {
        "env": {"id": "MiniGrid-MemoryS7-v0", "workers": seed},  # workers: how, not what
        "core": {"name": "lstm"},
        "agent": {"n_epochs": epochs},
        "train": {"seed": seed, "total_steps": steps},
    }


def test_report_and_plot_pool_only_seeds_of_one_config(tmp_path, capsys):
    """Five lstm records: seeds 0, 1, 2 of one config, seed 0 again with 4 epochs, and seed 1
    of that 4-epoch config: two rows (3 seeds, 2 seeds), named by the epochs, not 'seeds 5'."""
    results = tmp_path / "results" / "s7"
    for name, seed, epochs, value in (
        ("a0", 0, 8, 0.9),
        ("a1", 1, 8, 0.8),
        ("a2", 2, 8, 0.7),
        ("b0", 0, 4, 0.2),
        ("b1", 1, 4, 0.4),
    ):
        _record(results, tmp_path, name, _s7(seed, epochs), [0.1, value])
    text = build_report(results, tmp_path / "r.md", plots=False)
    rows = {r[2]: r for r in table_rows(text, "rollout/ep_rew_mean")}
    assert set(rows) == {"-", "agent.n_epochs=4"}
    assert rows["-"][3:5] == ["3", mean_std([0.9, 0.8, 0.7])]
    assert rows["agent.n_epochs=4"][3:5] == ["2", mean_std([0.2, 0.4])]
    assert "differ from the most common setting" in text
    # the plot draws the same two groups
    args = ["plot", str(results), "--out", str(tmp_path / "p.png"), "--panel-by", "none"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "lstm (seeds=3, last mean 0.8)" in out
    assert "lstm [agent.n_epochs=4] (seeds=2, last mean 0.3)" in out


def test_seeds_count_distinct_seeds(tmp_path):
    """Two records of seed 0 with one config (a re-run) are one seed, two runs."""
    results = tmp_path / "results" / "s7"
    _record(results, tmp_path, "x", _s7(0), [0.5])
    _record(results, tmp_path, "y", _s7(0), [0.7])
    text = build_report(results, tmp_path / "r.md", plots=False)
    (row,) = table_rows(text, "rollout/ep_rew_mean")
    assert row[2] == "1 (2 runs)"


def test_broken_records_are_named_and_counted_as_failed(tmp_path):
    results = tmp_path / "results" / "s7"
    for seed in (0, 1, 2, 3, 4):
        _record(results, tmp_path, f"s{seed}", _s7(seed), [0.1, 0.5])
    (results / "s1" / "curve.csv").write_text("")  # empty curve
    (results / "s2" / "curve.csv").unlink()  # missing curve
    (results / "s3" / "record.json").unlink()  # half-written record
    (results / "s4" / "config.yaml").write_text("core: [unclosed\n")  # corrupt config
    text = build_report(results, tmp_path / "r.md", plots=False)
    assert "- trials: 5 (1 ok, 4 not ok)" in text
    (row,) = table_rows(text, "rollout/ep_rew_mean")
    assert row[2] == "1"
    broken = {r[0]: r for r in table_rows(text, "Trials that did not finish or are broken")}
    assert set(broken) == {"s1", "s2", "s3", "s4"}
    assert all(r[1] == "broken" for r in broken.values())
    assert "empty curve.csv" in broken["s1"][2]
    assert "no curve.csv" in broken["s2"][2]
    assert "no record.json" in broken["s3"][2]
    assert "corrupt config" in broken["s4"][2] and "config.yaml" in broken["s4"][2]


def test_corrupt_config_in_plot_is_one_line(tmp_path, capsys):
    results = tmp_path / "results" / "s7"
    _record(results, tmp_path, "s0", _s7(0), [0.1, 0.5])
    (results / "s0" / "config.yaml").write_text("core: [unclosed\n")
    assert main(["plot", str(results), "--out", str(tmp_path / "p.png")]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "corrupt config" in err
    assert str(results / "s0" / "config.yaml") in err and "Traceback" not in err
    assert main(["report", str(results), "--out", str(tmp_path / "r.md"), "--no-plots"]) == 0
    assert "| s0 | broken | corrupt config" in (tmp_path / "r.md").read_text()


def test_incomplete_records_are_shown_as_such(tmp_path):
    results = tmp_path / "results" / "s7"
    _record(results, tmp_path, "done", _s7(0, steps=200), [0.1, 0.5])
    _record(results, tmp_path, "cut", _s7(1, steps=8192), [0.1, 0.3])
    text = build_report(results, tmp_path / "r.md", plots=False)
    assert "- trials: 2 (2 ok, 0 not ok, 1 incomplete)" in text
    (row,) = table_rows(text, "Incomplete runs")
    assert row[0].endswith("cut") and row[1:] == ["200", "8192"]


def test_best_value_comes_from_the_record_full_curve(tmp_path):
    """A peak the thinned curve lost is still the run's best: the record keeps it."""
    from memcores.experiments.records import MAX_CURVE_ROWS, read_curves

    results = tmp_path / "results" / "s7"
    values = [0.1] * 1000
    values[402] = 0.93  # dropped by the 300-row thinning
    path = _record(results, tmp_path, "s0", _s7(0, steps=100_000), values)
    assert 0.93 not in read_curves(path)["rollout/ep_rew_mean"].values.tolist()
    assert len((path / "curve.csv").read_text().splitlines()) <= MAX_CURVE_ROWS + 1
    text = build_report(results, tmp_path / "r.md", plots=False)
    (row,) = table_rows(text, "rollout/ep_rew_mean")
    assert row[4] == "0.93"


def test_plot_defaults_for_supervised_runs_and_says_where_it_wrote(tmp_path, monkeypatch, capsys):
    sweep = tmp_path / "sweep"
    write_trial(sweep, "lstm", 0)
    monkeypatch.chdir(tmp_path)
    assert main(["plot", str(sweep)]) == 0
    out = capsys.readouterr().out
    assert f"wrote {tmp_path / 'curves.png'}" in out
    assert (tmp_path / "curves.png").is_file()


def test_threshold_crossings_come_from_the_record_or_are_marked(tmp_path):
    """`--threshold 0.9`: each run's first step at 0.9, from the record's full-curve number; a
    record without one falls back to its thinned curve, marked `*`."""
    import json

    results = tmp_path / "results" / "s7"
    values = [0.1] * 1000
    values[402] = 0.93  # dropped by the 300-row thinning: the full curve crosses at 40300
    values[700:] = [0.95] * 300
    _record(results, tmp_path, "s0", _s7(0, steps=100_000), values)
    _record(results, tmp_path, "s1", _s7(1, steps=100_000), [0.1] * 1000)
    old = results / "s2"
    _record(results, tmp_path, "s2", _s7(2, steps=100_000), values)
    record = json.loads((old / "record.json").read_text())
    del record["derived"]  # a record made before derived numbers existed
    (old / "record.json").write_text(json.dumps(record))
    args = ["report", str(results), "--out", str(tmp_path / "r.md"), "--no-plots"]
    assert main([*args, "--threshold", "0.9"]) == 0
    text = (tmp_path / "r.md").read_text()
    (row,) = table_rows(text, "rollout/ep_rew_mean")
    assert row[-1] == "40300 / never / 70300*"  # the thinned curve: later than 40300
    assert "`*`: from the record's thinned `curve.csv`" in text
