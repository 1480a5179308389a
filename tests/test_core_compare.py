"""`memcores report --compare BASE,OTHER`: two cores' transfer runs side by side per pair."""

from __future__ import annotations

import math
import warnings

import pytest
import yaml

from memcores.agents.logger import RunLogger
from memcores.experiments.cli import main
from memcores.experiments.core_compare import comparison_rows, parse_compare, separation, welch_p
from memcores.experiments.transfer_plot import TransferPoint


def test_separation_and_welch_p():
    assert separation([0.0, 0.1], [0.2, 0.3]) == "above"
    assert separation([0.2, 0.3], [0.0, 0.1]) == "below"
    assert separation([0.0, 0.3], [0.2, 0.4]) == "overlap"
    # Welch's t for [0, 0, 0] against [1, 2, 3]: t = 2 / sqrt(1/3), df = 2 -> p = 0.0742
    assert welch_p([0.0, 0.0, 0.0], [1.0, 2.0, 3.0]) == pytest.approx(0.0742, abs=1e-4)
    assert welch_p([1.0, 2.0, 3.0], [1.0, 2.0, 3.0]) == pytest.approx(1.0)
    assert math.isnan(welch_p([0.5, 0.5], [0.5, 0.5]))  # no spread: no test
    assert math.isnan(welch_p([0.5], [0.1, 0.2]))  # one run: no test


def test_p_values_keep_two_significant_figures():
    from memcores.experiments.core_compare import format_p

    assert format_p(0.0123) == "0.012"
    assert format_p(0.00531) == "0.0053"  # not 0.005: the retention wording rests on this digit
    assert format_p(0.4504) == "0.45"
    assert format_p(6.44e-05) == "6.4e-05"
    assert format_p(float("nan")) == "-"


def test_comparison_rows_give_each_train_env_once_and_small_p_in_figures():
    """A train env paired with two test envs is one train row, and a small p is not 0.00."""
    points = [
        TransferPoint("lstm", "PVM", "PVM-Large", train=[0.1, 0.2, 0.15], test=[0.0, 0.1, 0.0]),
        TransferPoint("lstm", "PVM", "PVM-Long", train=[0.1, 0.2, 0.15], test=[0.1, 0.0, 0.1]),
        TransferPoint("ur_lstm", "PVM", "PVM-Large", train=[0.9, 0.95, 0.92], test=[0, 0, 0]),
        TransferPoint("ur_lstm", "PVM", "PVM-Long", train=[0.9, 0.95, 0.92], test=[1, 1, 1]),
    ]
    _, train_rows = comparison_rows(points, "lstm", "ur_lstm", "train")
    assert [row[0] for row in train_rows] == ["PVM"]
    assert train_rows[0][-1] == "1.8e-04"
    _, test_rows = comparison_rows(points, "lstm", "ur_lstm", "test")
    assert [row[0] for row in test_rows] == ["PVM-Large", "PVM-Long"]


def test_comparison_rows_pair_the_cores_per_env_and_skip_unshared_pairs():
    points = [
        TransferPoint("lstm", "Fetch-5x5", "Fetch-8x8", train=[0.9, 0.95], test=[0.4, 0.5]),
        TransferPoint("rel_lstm", "Fetch-5x5", "Fetch-8x8", train=[0.9, 0.8], test=[0.6, 0.7]),
        TransferPoint("lstm", "DoorKey-5x5", "DoorKey-16x16", train=[1.0], test=[0.0]),
    ]
    header, rows = comparison_rows(points, "lstm", "rel_lstm", "test")
    assert header[1:3] == ["`lstm` runs", "`rel_lstm` runs"]
    assert rows == [["Fetch-8x8", "0.40 / 0.50", "0.60 / 0.70", "+0.200", "above", "0.11"]]
    _, train_rows = comparison_rows(points, "lstm", "rel_lstm", "train")
    assert train_rows[0][0] == "Fetch-5x5" and train_rows[0][3:5] == ["-0.075", "overlap"]
    with pytest.raises(ValueError, match="valid: train, test"):
        comparison_rows(points, "lstm", "rel_lstm", "eval")


@pytest.mark.parametrize("text", ["lstm", "lstm,", "lstm,lstm", "a,b,a"])
def test_parse_compare_refuses_fewer_than_two_or_repeated_cores(text):
    with pytest.raises(ValueError, match="BASE,OTHER"):
        parse_compare(text)
    assert parse_compare("lstm, ur_lstm,fast_lstm") == ("lstm", "ur_lstm", "fast_lstm")


def _transfer_records(results, tmp_path):
    """Records of `lstm` and `rel_lstm`, two seeds each, on MemoryS7 -> MemoryS13."""
    from memcores.experiments.records import write_record

    for core, seed, test in (
        ("lstm", 0, 0.30),
        ("lstm", 1, 0.40),
        ("rel_lstm", 0, 0.50),
        ("rel_lstm", 1, 0.70),
    ):
        run = tmp_path / "runs" / f"{core}{seed}"
        run.mkdir(parents=True)
        config = {"env": {"id": "MiniGrid-MemoryS7-v0"}, "core": {"name": core}}
        (run / "config.yaml").write_text(yaml.safe_dump(config | {"train": {"seed": seed}}))
        logger = RunLogger(run, tensorboard=False)
        logger.record("rollout/ep_rew_mean", 0.5)
        logger.dump(100)
        logger.close()
        evals = {
            "MiniGrid-MemoryS7-v0": {"return": 0.95, "success": 1.0, "episodes": 5},
            "MiniGrid-MemoryS13-v0": {"return": test, "success": test, "episodes": 5},
        }
        write_record(
            run,
            results / f"seed={seed},name={core}" / "MemoryS7",
            eval_results=evals,
            wall_seconds=60.0,
            extra={"test_env": "MiniGrid-MemoryS13-v0"},
        )


def test_report_compare_from_the_cli_and_its_errors(tmp_path, capsys):
    results = tmp_path / "results"
    _transfer_records(results, tmp_path)
    out = tmp_path / "report" / "r.md"
    args = ["report", str(results), "--no-plots", "--out", str(out)]
    assert main([*args, "--compare", "lstm,rel_lstm"]) == 0
    text = out.read_text()
    assert "## `rel_lstm` against `lstm`, test return per run" in text
    assert "| MemoryS13 | 0.30 / 0.40 | 0.50 / 0.70 | +0.250 | above | 0.20 |" in text
    capsys.readouterr()

    # an unknown core: one line naming the recorded cores, exit 2, nothing written
    out.unlink()
    assert main([*args, "--compare", "lstm,gru"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "recorded cores: lstm, rel_lstm" in err
    assert not out.exists()
    assert main([*args, "--compare", "lstm"]) == 2
    assert "BASE,OTHER" in capsys.readouterr().err


def _welch_by_hand(a: list[float], b: list[float]) -> float:
    """Two-sided p of Welch's t from its formula (not scipy's ttest_ind)."""
    from scipy import stats

    va, vb = (sum((x - sum(v) / len(v)) ** 2 for x in v) / (len(v) - 1) for v in (a, b))
    se2 = va / len(a) + vb / len(b)
    t = (sum(b) / len(b) - sum(a) / len(a)) / math.sqrt(se2)
    df = se2**2 / ((va / len(a)) ** 2 / (len(a) - 1) + (vb / len(b)) ** 2 / (len(b) - 1))
    return float(2 * stats.t.sf(abs(t), df))


def test_retention_rows_pair_each_run_test_with_its_own_train():
    from memcores.experiments.core_compare import retention, retention_rows

    lstm = TransferPoint("lstm", "PVM", "PVM-Long", [0.8, 1.0], [0.2, 0.5], ["0", "1"])
    fast = TransferPoint("fast_lstm", "PVM", "PVM-Long", [0.5, 0.6], [0.4, 0.6], ["0", "1"])
    ur = TransferPoint("ur_lstm", "PVM", "PVM-Long", [0.0, 0.5], [0.1, 0.5], ["0", "1"])
    assert retention(lstm) == pytest.approx([0.25, 0.5])
    assert retention(fast) == pytest.approx([0.8, 1.0])
    assert math.isnan(retention(ur)[0])  # nothing learned on the train env: no ratio
    header, rows = retention_rows([lstm, fast, ur], "lstm", ["fast_lstm", "ur_lstm"])
    assert header[-2:] == ["Welch p test vs `lstm`", "Welch p retention vs `lstm`"]
    by_core = {r[1]: r for r in rows}
    assert list(by_core) == ["lstm", "fast_lstm", "ur_lstm"]
    assert by_core["lstm"][2:8] == [
        "2",
        "0.900 ± 0.141",
        "0.350 ± 0.212",
        "0.25 / 0.50",
        "0.375 ± 0.177",
        "-",
    ]
    assert by_core["fast_lstm"][5:7] == ["0.80 / 1.00", "0.900 ± 0.141"]
    p_test = _welch_by_hand([0.2, 0.5], [0.4, 0.6])
    p_ratio = _welch_by_hand([0.25, 0.5], [0.8, 1.0])
    assert by_core["fast_lstm"][7:] == [f"{p_test:#.2g}", f"{p_ratio:#.2g}"]
    assert by_core["fast_lstm"][8] == "0.087"  # t = 3.28, df = 1.91 (t = 3.28 at df 2: 0.082)
    assert by_core["ur_lstm"][5:9] == [
        "- / 1.00",
        "1.000",
        f"{_welch_by_hand([0.2, 0.5], [0.1, 0.5]):#.2g}",
        "-",
    ]


def _success_records(results, tmp_path):
    """lstm and fast_lstm, two seeds each, on PassiveVisualMatch -> its long-delay twin, with
    train successes that differ, so success and retention tell different stories."""
    for core, seed, train, test in (
        ("lstm", 0, 0.8, 0.2),
        ("lstm", 1, 1.0, 0.5),
        ("fast_lstm", 0, 0.5, 0.4),
        ("fast_lstm", 1, 0.6, 0.6),
    ):
        _success_record(results, tmp_path, core, seed, train, test)


def _success_record(results, tmp_path, core, seed, train, test, options=None, command=""):
    """One run of ``core`` (with core ``options``) on PassiveVisualMatch -> LongDelay, its
    record under ``results/name=CORE[,OPTION=VALUE...],seed=SEED/pair``."""
    from memcores.experiments.records import write_record

    options = options or {}
    name = f"name={core}" + "".join(f",{k}={v}" for k, v in options.items()) + f",seed={seed}"
    run = tmp_path / "runs" / name
    run.mkdir(parents=True)
    config = {"env": {"id": "memcores/PassiveVisualMatch-v0"}, "core": {"name": core, **options}}
    config |= {"train": {"seed": seed}, "run": {"dir": str(run)}}
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    logger = RunLogger(run, tensorboard=False)
    logger.record("rollout/ep_rew_mean", 0.5)
    logger.dump(100)
    logger.close()
    test_id = "memcores/PassiveVisualMatch-LongDelay-v0"
    evals = {
        "memcores/PassiveVisualMatch-v0": {"return": 1.0, "success": train, "episodes": 5},
        test_id: {"return": 1.0, "success": test, "episodes": 5},
    }
    write_record(
        run,
        results / name / "pair",
        command=command,
        eval_results=evals,
        extra={"test_env": test_id},
    )


def test_report_compare_on_success_and_the_retention_view(tmp_path, capsys, monkeypatch):
    results = tmp_path / "results"
    _success_records(results, tmp_path)
    out = tmp_path / "rep" / "r.md"
    args = ["report", str(results), "--out", str(out), "--compare", "lstm,fast_lstm"]
    assert main([*args, "--quantity", "success", "--no-plots"]) == 0
    text = out.read_text()
    # return would be 1.0 everywhere: these are the success values
    row = "| PassiveVisualMatch-LongDelay | 0.20 / 0.50 | 0.40 / 0.60 | +0.150 | overlap |"
    assert "## `fast_lstm` against `lstm`, test success per run" in text and row in text
    # the paired view alone, as one table and one figure
    retention_args = [*args, "--quantity", "success", "--retention", "--sections", "comparison"]
    monkeypatch.setattr("sys.argv", ["memcores", *retention_args])  # as typed in a shell
    assert main(retention_args) == 0
    text = out.read_text()
    assert f"- made by: `memcores report {results} --out {out} --compare lstm,fast_lstm" in text
    assert "## rollout/ep_rew_mean" not in text and "## Train/test" not in text
    rows = [line for line in text.splitlines() if line.startswith("| PassiveVisualMatch ->")]
    assert [r.split("|")[2].strip() for r in rows] == ["lstm", "fast_lstm"]
    assert "| 0.80 / 1.00 | 0.900 ± 0.141 |" in rows[1]
    png = out.parent / "r.png"
    assert png.read_bytes()[:4] == b"\x89PNG" and f"]({png.name})" in text
    capsys.readouterr()
    with pytest.raises(SystemExit):  # argparse names the choices
        main([*args, "--quantity", "speed"])
    assert main([*args[:4], "--retention"]) == 2
    assert "--retention needs --compare" in capsys.readouterr().err
    assert main([*args, "--sections", "metrics,plots"]) == 2
    assert "unknown section 'plots'; valid: metrics, transfer" in capsys.readouterr().err


def test_check_cores_names_the_missing_and_the_recorded_cores_in_one_line():
    """The refusal's whole line: the missing cores in the order asked, the recorded ones
    sorted, ``none`` where nothing was recorded; no error where every core has a run."""
    from memcores.experiments.core_compare import check_cores

    points = [
        TransferPoint("rel_lstm", "PVM", "PVM-Long", [0.5], [0.5]),
        TransferPoint("lstm", "PVM", "PVM-Long", [0.5], [0.5]),
    ]
    check_cores(points, ["lstm", "rel_lstm"])
    missing = "^--compare: no transfer records of gru, fast_lstm; recorded cores: lstm, rel_lstm$"
    with pytest.raises(ValueError, match=missing):
        check_cores(points, ["lstm", "gru", "fast_lstm"])
    with pytest.raises(
        ValueError, match="^--compare: no transfer records of lstm; recorded cores: none$"
    ):
        check_cores([], ["lstm"])


def test_parse_compare_refusal_is_one_exact_line():
    """The message of a bad ``--compare``, word for word."""
    want = (
        r"^--compare takes two or more different core names, BASE,OTHER\[,OTHER\.\.\.\] "
        r"\(e\.g\. lstm,rel_lstm\); got 'lstm,lstm'$"
    )
    with pytest.raises(ValueError, match=want):
        parse_compare("lstm,lstm")


def test_separation_counts_a_tie_as_overlap():
    """A run of ``other`` equal to the best (worst) run of ``base`` is not above (below)."""
    assert separation([0.1, 0.2], [0.2, 0.3]) == "overlap"
    assert separation([0.2, 0.3], [0.1, 0.2]) == "overlap"
    assert separation([0.1, 0.2], [0.21, 0.3]) == "above"


def test_welch_p_with_one_side_without_spread():
    """One side without spread and the other with some is a test: [0.5, 0.5] against [0, 2]
    gives t = (1 - 0.5) / sqrt(0 / 2 + 2 / 2) = 0.5 at df = 1 (Welch-Satterthwaite), so
    p = 1 - (2 / pi) atan(0.5) = 0.70483 (Cauchy); the same either way round."""
    want = 1 - 2 / math.pi * math.atan(0.5)
    assert want == pytest.approx(0.70483, abs=1e-5)
    assert welch_p([0.5, 0.5], [0.0, 2.0]) == pytest.approx(want, abs=1e-9)
    assert welch_p([0.0, 2.0], [0.5, 0.5]) == pytest.approx(want, abs=1e-9)


def test_welch_p_without_spread_in_floats_is_quiet():
    """[0.99, 0.99] has no spread although 0.99 is no exact float (scipy's t-test warned of
    precision loss there): against [0.56, 0.39, 0.43] (mean 0.46, sample variance 0.0079) it
    is t = -0.53 / sqrt(0.0079 / 3) = -10.328 at df = 2, and at df = 2 the t distribution's
    two-sided tail is 1 - |t| / sqrt(2 + t^2) = 0.009245."""
    t = -0.53 / math.sqrt(0.0079 / 3)
    want = 1 - abs(t) / math.sqrt(2 + t * t)
    assert want == pytest.approx(0.009245, abs=1e-6)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert welch_p([0.99, 0.99], [0.56, 0.39, 0.43]) == pytest.approx(want, rel=1e-9)


def test_mean_std_and_p_at_their_edges():
    """``-`` for no values, one value alone to three decimals, mean ± sample std; a p of
    exactly 0.001 keeps two significant figures."""
    from memcores.experiments.core_compare import format_p, mean_std

    assert mean_std([]) == "-"
    assert mean_std([0.25]) == "0.250"
    assert mean_std([0.1, 0.3]) == "0.200 ± 0.141"
    assert format_p(0.001) == "0.0010"
    assert format_p(0.000999) == "1.0e-03"


def test_comparison_rows_default_to_the_test_block_and_read_past_other_cores():
    """Without ``block`` the rows are the test scores; points of other cores and unshared
    pairs before the base's shared pair are skipped, not the end of the table; the header
    in full."""
    points = [
        TransferPoint("rel_lstm", "Fetch-5x5", "Fetch-8x8", train=[0.9, 0.8], test=[0.6, 0.7]),
        TransferPoint("lstm", "DoorKey-5x5", "DoorKey-16x16", train=[1.0], test=[0.0]),
        TransferPoint("lstm", "Fetch-5x5", "Fetch-8x8", train=[0.9, 0.95], test=[0.4, 0.5]),
    ]
    header, rows = comparison_rows(points, "lstm", "rel_lstm")
    assert header == [
        "test env",
        "`lstm` runs",
        "`rel_lstm` runs",
        "difference",
        "separation",
        "Welch p",
    ]
    assert rows == [["Fetch-8x8", "0.40 / 0.50", "0.60 / 0.70", "+0.200", "above", "0.11"]]


def test_retention_refuses_runs_that_do_not_pair():
    """A train score per run and a test score per run: lists of different lengths are an
    error, not a ratio of the first runs."""
    from memcores.experiments.core_compare import retention

    with pytest.raises(ValueError):
        retention(TransferPoint("lstm", "PVM", "PVM-Long", [0.5, 0.5], [0.2, 0.4, 0.6]))


def test_retention_rows_in_full_past_a_core_without_the_pair():
    """A core that did not run the pair is skipped and the cores after it still get their
    rows; the base's row has ``-`` for both p-values; seeds count distinct seeds (two runs
    of seed 0 are one) or, where no seeds are recorded, the runs; the header in full."""
    from memcores.experiments.core_compare import retention_rows

    lstm = TransferPoint("lstm", "PVM", "PVM-Long", [0.8, 1.0], [0.2, 0.5], ["0", "0"])
    gru = TransferPoint("gru", "PVM", "PVM-Large", [0.8, 1.0], [0.2, 0.5], ["0", "1"])
    fast = TransferPoint("fast_lstm", "PVM", "PVM-Long", [0.5, 0.6, 0.4], [0.4, 0.6, 0.2])
    header, rows = retention_rows([lstm, gru, fast], "lstm", ["gru", "fast_lstm"])
    assert header == [
        "env pair",
        "core",
        "seeds",
        "train",
        "test",
        "retention per run",
        "retention",
        "Welch p test vs `lstm`",
        "Welch p retention vs `lstm`",
    ]
    assert [r[1] for r in rows] == ["lstm", "fast_lstm"]
    assert rows[0] == [
        "PVM -> PVM-Long",
        "lstm",
        "1",
        "0.900 ± 0.141",
        "0.350 ± 0.212",
        "0.25 / 0.50",
        "0.375 ± 0.177",
        "-",
        "-",
    ]
    assert rows[1][:7] == [
        "PVM -> PVM-Long",
        "fast_lstm",
        "3",
        "0.500 ± 0.100",
        "0.400 ± 0.200",
        "0.80 / 1.00 / 0.50",
        "0.767 ± 0.252",
    ]


def test_train_rows_go_on_past_a_train_env_already_given():
    """A train env's second pair is skipped, and the train envs after it still get rows, in
    the order of the records."""
    points = [
        TransferPoint(core, train, test, train=[0.1, 0.2], test=[0.0, 0.1])
        for core in ("lstm", "ur_lstm")
        for train, test in (("PVM", "PVM-Large"), ("PVM", "PVM-Long"), ("Fetch-5x5", "Fetch-8x8"))
    ]
    _, rows = comparison_rows(points, "lstm", "ur_lstm", "train")
    assert [row[0] for row in rows] == ["PVM", "Fetch-5x5"]


def test_runs_of_one_core_with_different_swept_options_are_never_pooled(tmp_path, capsys):
    """A swept core option (``--grid core.memory_len=16,128``) names the core as ``memcores
    bench cores`` does, ``gtrxl:memory_len=16``, so each option set is its own row; a core
    without the option (``lstm``) keeps its plain name."""
    results = tmp_path / "results"
    for core, options, seed, test in (
        ("lstm", {}, 0, 0.2),
        ("lstm", {}, 1, 0.4),
        ("gtrxl", {"memory_len": 16}, 0, 0.3),
        ("gtrxl", {"memory_len": 128}, 0, 0.9),
    ):
        grid = "--grid core.name=gtrxl --grid core.memory_len=16,128" if options else ""
        command = f"memcores sweep c.yaml {grid} --grid train.seed=0,1"
        _success_record(results, tmp_path, core, seed, 1.0, test, options, command)
    out = tmp_path / "r.md"
    compare = "lstm,gtrxl:memory_len=16,gtrxl:memory_len=128"
    args = ["report", str(results), "--no-plots", "--out", str(out), "--compare", compare]
    assert main([*args, "--quantity", "success", "--retention", "--sections", "comparison"]) == 0
    rows = [line for line in out.read_text().splitlines() if line.startswith("| PassiveVisual")]
    cells = [[c.strip() for c in row.split("|")[2:6]] for row in rows]
    assert cells == [
        ["lstm", "2", "1.000 ± 0.000", "0.300 ± 0.141"],
        ["gtrxl:memory_len=16", "1", "1.000", "0.300"],
        ["gtrxl:memory_len=128", "1", "1.000", "0.900"],
    ]
    assert main([*args[:-1], "lstm,gtrxl"]) == 2  # the pooled name no longer exists
    assert "recorded cores: gtrxl:memory_len=128, gtrxl:memory_len=16, lstm" in (
        capsys.readouterr().err
    )
