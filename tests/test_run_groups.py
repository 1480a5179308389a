"""Which runs are seeds of one experiment (experiments/run_groups.py)."""

from __future__ import annotations

from memcores.experiments.run_groups import differing_keys, seed_count, variant_names


def _config(**train) -> dict:
    return {
        "env": {"id": "MiniGrid-MemoryS7-v0", "workers": 2},
        "core": {"name": "lstm"},
        "train": {"seed": 0, **train},
        "run": {"dir": "runs/x"},
    }


def test_seed_bookkeeping_and_missing_keys_do_not_split_a_group():
    a = _config(seed=0, init_from=None)
    b = _config(seed=1, progress=False)  # no init_from key: an older record
    b["run"]["dir"], b["env"]["workers"] = "runs/y", 8
    assert differing_keys([a, b]) == []
    # a key set to a non-default value does split it, and a path compares as set / unset
    c = _config(seed=2, total_steps=7, init_from="runs/pretrained_seed2")
    assert differing_keys([a, c]) == ["train.init_from", "train.total_steps"]
    d = _config(seed=3, total_steps=7, init_from="runs/pretrained_seed3")
    assert differing_keys([c, d]) == []


def test_variant_names_name_what_differs_from_the_most_common_setting():
    configs = [_config(seed=s) for s in (0, 1, 2)]
    configs.append({**_config(seed=0), "agent": {"n_epochs": 8, "seq_len": 128}})
    configs.append({**_config(seed=1), "agent": {"seq_len": 128}})
    other_env = {**_config(seed=0), "env": {"id": "MiniGrid-DoorKey-5x5-v0"}}
    names = variant_names([*configs, other_env], lambda c: c, lambda c: c["env"]["id"])
    assert names[:3] == ["-", "-", "-"]
    assert names[3] == "agent.n_epochs=8, agent.seq_len=128"
    assert names[4] == "agent.seq_len=128"
    assert names[5] == ""  # alone in its group: nothing to tell apart


def test_seed_count_counts_distinct_seeds():
    assert seed_count([0, 1, 2]) == "3"
    assert seed_count([0, 0, 1, 1, 1, 2]) == "3 (6 runs)"
