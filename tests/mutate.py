"""``make mutate``: mutation testing of the modules whose maths the results rest on.

Each target below is one module (optionally only some of its functions) and the tests of its
area. For each, mutmut (3.x) runs in a scratch copy of the sources: it plants one small change
at a time (an operator flipped, a constant nudged, an argument dropped) and runs the tests that
cover the changed function; a mutant the tests do not notice *survives*. The record written to
``results/mutation/`` gives, per module, how many mutants were killed, which survived (with
their diffs) and which are marked equivalent (no test can tell them from the original, each with
a one-line reason in :data:`EQUIVALENT`). The score is killed / (mutants - equivalent); mutants
of a function no selected test calls count as survivors.

Usage (from the repository root; ``make mutate`` runs every target)::

    python tests/mutate.py [--targets cores/gates.py agents/ppo.py] [--jobs 2]

A run of some targets updates their rows of the record and keeps the others; ``--survivors``
runs only the recorded survivors again, against the tests as they are now (the sources must be
those of the record: a mutant's name is its function and its number in that function).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RECORD_DIR = REPO / "results" / "mutation"
SUMMARY = RECORD_DIR / "summary.json"
PACKAGE = "memcores"
SUBPACKAGES = ("cores", "agents", "envs", "experiments")
"""The repository's folders that are the package's subpackages (``memcores.cores``, ...)."""
RECORD_READ = "results/table7/seed=0,name=lstm,suite=memory/MemoryS7"
"""The committed run whose policy the evaluation's tests re-evaluate to its record."""
COPIED = ("tests", "pyproject.toml", "experiments/configs", RECORD_READ)
"""What the scratch copy holds beside the package: the tests, the pytest configuration and
the configs and the record the tests read by their path in the repository."""


@dataclass(frozen=True)
class Target:
    """One module under mutation.

    :param path: the module, relative to the repository root.
    :param tests: the test files of its area (each mutant runs those that call its function).
    :param functions: ``name`` or ``Class.method`` of the functions to mutate; empty: all.
    """

    path: str
    tests: tuple[str, ...]
    functions: tuple[str, ...] = ()

    @property
    def module(self) -> str:
        """The module's import name (``memcores.cores.lru``): mutmut names mutants by it."""
        return f"{PACKAGE}." + self.path.removesuffix(".py").replace("/", ".")

    def mangled(self, function: str) -> str:
        """mutmut's key of ``function``: ``pkg.mod.x_name`` or ``pkg.mod.xǁClassǁmethod``."""
        cls, _, name = function.rpartition(".")
        return f"{self.module}.x{'ǁ' + cls + 'ǁ' if cls else '_'}{name}"

    def globs(self) -> list[str]:
        """The mutant names to run (mutmut's ``run`` arguments)."""
        if not self.functions:
            return []
        return [self.mangled(f) + "*" for f in self.functions]

    def selects(self, mutant: str) -> bool:
        """Whether ``mutant`` (``key__mutmut_N``) belongs to one of :attr:`functions`."""
        key = mutant.partition("__mutmut_")[0]
        return not self.functions or key in {self.mangled(f) for f in self.functions}


_GATE_TESTS = (
    "tests/test_cell_transcriptions.py",
    "tests/test_gates.py",
    "tests/test_gradient_references.py",
    "tests/test_power_law.py",
)
_RL_TESTS = ("tests/test_losses.py",)
_R2D2 = "tests/test_r2d2.py::test_"
_VALUE_TESTS = tuple(
    f"{_R2D2}{name}"
    for name in (
        "nstep_target_by_hand_across_an_episode_end",
        "double_q_takes_the_target_value_of_the_online_argmax",
        "value_rescaling_by_hand_and_inverse",
        "priority_mix_by_hand",
        "sampling_probabilities_and_importance_weights_by_hand",
        "apex_epsilons_by_hand",
        "the_ring_keeps_complete_sequences_and_their_states",
        "burn_in_gets_no_gradient_and_ends_in_the_online_state",
        "nstep_target_by_hand_with_fewer_steps_than_the_sequence",
        "double_q_over_steps_and_sequences_by_hand",
        "burn_in_and_learnt_steps_reset_at_their_episode_starts",
        "slot_starts_and_complete_sequences_by_hand",
        "sampling_needs_one_complete_sequence_and_returns_its_starts",
        "a_rollout_that_does_not_fit_the_replay_is_refused",
        "new_priorities_are_stored_as_float32",
        "a_replay_round_trips_through_its_state_and_refuses_another_layout",
    )
)
_PQN_TESTS = (
    "tests/test_pqn.py::test_q_lambda_by_hand",
    "tests/test_pqn.py::test_the_rollout_returns_are_q_lambda",
    "tests/test_pqn.py::test_epsilon_schedule_is_linear_then_flat",
    "tests/test_pqn.py::test_epsilon_greedy_acts_greedily_at_zero_and_per_group",
    "tests/test_pqn.py::test_the_td_loss_is_half_the_mean_squared_error_of_the_taken_actions",
    "tests/test_pqn.py::test_epsilon_greedy_reads_the_groups_epsilons_in_turn",
    "tests/test_pqn.py::test_epsilon_greedy_explores_every_action_and_returns_the_networks_step",
    "tests/test_pqn.py::test_the_td_loss_adds_the_reconstruction_only_with_its_coefficient",
)
TARGETS: tuple[Target, ...] = (
    Target(
        "agents/ppo.py",
        _RL_TESTS,
        ("ppo_loss", "a2c_loss", "_kl_too_large", "explained_variance"),
    ),
    Target("envs/memory_match.py", ("tests/test_env_rewards.py",), ("VisualMatchEnv.step",)),
    Target(
        "cores/rel_lstm.py",
        ("tests/test_gradient_references.py", "tests/test_rel_lstm.py"),
        ("screening_update",),
    ),
    Target(
        "cores/_fused_rel_lstm.py",
        ("tests/test_gradient_references.py", "tests/test_rel_lstm.py"),
        ("buffer_mask", "relevant_mask"),
    ),
    Target(
        "cores/lru.py",
        (
            "tests/test_gradient_references.py",
            "tests/test_lru.py",
            "tests/test_online.py::test_streaming_equals_online_mode",
            "tests/test_online.py::test_starts_reset_state_and_traces",
        ),
        (
            "_coefficients",
            "_lambda",
            "_recurrent_grads",
            "_spatial_input_grad",
            "_OnlineLRUScan.forward",
            "_OnlineLRUScan.backward",
            "_OnlineLRUStep.forward",
            "_OnlineLRUStep.backward",
            "LRULayer.scan",
            "LRULayer.online_step",
        ),
    ),
    Target(
        "agents/rollout.py",
        (
            *_RL_TESTS,
            "tests/test_a2c.py::test_nstep_returns_by_hand",
            "tests/test_rl_bookkeeping.py::test_chunk_layout",
            "tests/test_rl_bookkeeping.py::"
            "test_returns_accept_the_envs_flags_from_the_cpu_on_any_buffer_device",
            "tests/test_rollout_device.py",
            "tests/test_rollout_graph.py",
        ),
        (
            "RolloutBuffer.compute_returns",
            "RolloutBuffer._chunked",
            "RolloutBuffer.chunks",
            "select_chunks",
            "collect_on_device",
        ),
    ),
    Target(
        "envs/vector.py",
        (
            "tests/test_env_rewards.py",
            "tests/test_vector_env.py::test_matches_single_envs_with_same_step_reset",
            "tests/test_vector_env.py::test_workers_reproduce_in_process_envs",
        ),
        ("_EnvRunner.reset", "_EnvRunner.step", "VectorEnv.reset", "VectorEnv.step_wait"),
    ),
    Target(
        "cores/gates.py",
        ("tests/test_gate_values.py", "tests/test_gates.py", "tests/test_on_lstm.py"),
    ),
    Target(
        "cores/gated.py",
        _GATE_TESTS,
        ("GatedLSTM.cell", "GatedLSTM.step", "GatedLSTM._gate_input", "GatedLSTM._draw_detach"),
    ),
    # forward's body is the dispatch to cuDNN and the Triton kernels (CUDA only) around the
    # step loop of cores/base.py: the maths is the cell
    Target("cores/gru.py", _GATE_TESTS, ("GatedGRU.cell", "GatedGRU.step")),
    # the reset and the step loop against rules written out in their tests: the cell tests
    # reach them only through whole cores, minutes of tests per mutant
    Target(
        "cores/base.py",
        (
            "tests/test_base_reference.py",
            "tests/test_cores.py::test_reset_where_resets_steps_and_sequences_to_zero_or_an_initial_state",
        ),
        ("_expand_mask", "reset_where", "keep_mask", "step_loop", "MemoryCore.reset_state"),
    ),
    # the sweep's ranking of points and PBT's bounds: what a sweep names best
    Target(
        "experiments/sweep.py",
        ("tests/test_sweep_order.py", "tests/test_sweep.py"),
        ("_write_point_outcomes",),
    ),
    Target("experiments/tune_engine.py", ("tests/test_sweep_order.py",), ("KeepInRange.__call__",)),
    # the batched envs' own draws and steps (the parity tests load gymnasium's state instead)
    Target(
        "envs/batched.py",
        (
            "tests/test_batched_draws.py",
            "tests/test_batched_memory_match.py",
            "tests/test_batched_popgym.py",
            "tests/test_fail_fast.py::test_a_batched_env_checks_what_it_is_stepped_with",
        ),
        (
            "_mul32",
            "hash32",
            "env_keys",
            "random_words",
            "uniform_int",
            "BatchedEnv._refill",
            "BatchedEnv._reset_done",
            "BatchedEnv.reset",
            "BatchedEnv.step",
            "BatchedEnv.checked_actions",
            "BatchedEnv.step_recordable",
            "BatchedEnv.tick",
            "_kept",
            "_masked",
        ),
    ),
    Target(
        "envs/batched_memory_match.py",
        (
            "tests/test_batched_memory_match.py",
            "tests/test_batched_memory_match_layouts.py",
            "tests/test_batched_draws.py",
        ),
    ),
    Target(
        "envs/batched_popgym.py", ("tests/test_batched_popgym.py", "tests/test_batched_draws.py")
    ),
    Target(
        "envs/batched_registry.py",
        (
            "tests/test_batched_memory_match.py",
            "tests/test_batched_popgym.py",
            "tests/test_fail_fast.py::test_the_env_builders_take_only_true_or_false_for_a_flag",
            "tests/test_fail_fast.py::test_max_steps_below_one_is_refused",
        ),
    ),
    Target(
        "agents/rollout_graph.py",
        ("tests/test_rollout_graph.py",),
        ("RolloutGraph.load", "RolloutGraph.prime", "RolloutGraph._step", "RolloutGraph.__call__"),
    ),
    Target(
        "agents/torchrl_module.py",
        (
            "tests/test_engine_torchrl.py",
            "tests/test_torchrl_module.py",
            "tests/test_fail_fast.py::test_the_torchrl_module_names_what_is_wrong_in_the_tensordict",
        ),
        ("CoreModule.forward", "CoreModule._input", "CoreModule._stored_state", "_at_last_step"),
    ),
    Target(
        "agents/rllib_module.py",
        (
            "tests/test_engine_rllib.py",
            "tests/test_rllib_module.py",
            "tests/test_fail_fast.py::test_the_rllib_module_names_what_is_wrong_in_the_batch",
        ),
        ("CoreRLModule._memory", "CoreRLModule._state_in", "CoreRLModule.compute_values"),
    ),
    Target("cores/min_rnn.py", ("tests/test_modern_cores.py", "tests/test_min_rnn.py")),
    Target("cores/xlstm.py", ("tests/test_modern_cores.py", "tests/test_xlstm.py")),
    # the backward and its helpers (the forward is checked against the loops by the same tests)
    Target(
        "cores/_fused_lstm.py",
        ("tests/test_gates.py", "tests/test_gradient_references.py"),
        ("_backward", "_gate_factors", "_forget_slope"),
    ),
    Target("cores/power_rnn.py", ("tests/test_power_rnn.py",)),
    Target("cores/janet.py", ("tests/test_janet.py",)),
    Target("cores/nru.py", ("tests/test_nru.py",)),
    Target("experiments/core_compare.py", ("tests/test_core_compare.py",)),
    Target(
        "agents/evaluation.py",
        (
            "tests/test_evaluation.py",
            "tests/test_memory_match_eval.py",
            "tests/test_popgym.py",
            # the rest of test_run.py reads every committed policy (not copied) or no evaluation
            "tests/test_run.py::test_a_policy_of_the_earlier_format_re_evaluates_to_its_record",
        ),
        ("EvalResult.summary", "play_episodes", "evaluate_policy", "check_observations"),
    ),
    # scan_values and scan_adjoint are under @torch.no_grad(): mutmut 3 plants no mutant in a
    # decorated function, so theirs are reached only through the functions they call
    Target(
        "cores/scan.py",
        ("tests/test_scan_reference.py", "tests/test_lru.py", "tests/test_gradient_references.py"),
        (
            "_chunk_size",
            "scan_values",
            "_sequential",
            "_parallel",
            "scan_adjoint",
            "previous_states",
            "_LinearScan.forward",
            "_LinearScan.backward",
            "linear_scan",
        ),
    ),
    Target(
        "agents/r2d2.py",
        _VALUE_TESTS,
        ("rescale", "unrescale", "nstep_targets", "double_q_bootstrap", "online_q"),
    ),
    Target(
        "agents/replay.py",
        _VALUE_TESTS,
        (
            "sequence_priority",
            "sampling_probabilities",
            "importance_weights",
            "SequenceReplay.add",
            "SequenceReplay.slot_starts",
            "SequenceReplay.valid",
            "SequenceReplay.sample",
            "SequenceReplay.update_priorities",
            "SequenceReplay.state_dict",
            "SequenceReplay.load_state_dict",
        ),
    ),
    Target("agents/pqn.py", _PQN_TESTS, ("q_lambda_returns", "td_loss")),
    Target(
        "agents/q_network.py",
        (*_PQN_TESTS, *_VALUE_TESTS),
        ("linear_epsilon", "apex_epsilons", "EpsilonGreedy.__call__"),
    ),
)
"""The modules, in the order ``make mutate`` runs them (the losses and rewards first)."""

_ON_THE_CPU = (
    "on the CPU, where these tests run, torch's default device is the env's: the same tensor "
    "(only a run on an accelerator tells the two apart)"
)
EQUIVALENT: dict[str, str] = {
    "agents.ppo.x_explained_variance__mutmut_10": 'float("NAN") is the same NaN as float("nan")',
    "envs.memory_match.xǁVisualMatchEnvǁstep__mutmut_26": "reward is 0.0 before the apple is "
    "paid, so = and += give the same value",
    "cores.rel_lstm.x_screening_update__mutmut_92": "a bool tensor added to a float tensor is "
    "promoted to the float's dtype: the same sum without the explicit cast",
    "cores.lru.xǁ_OnlineLRUStepǁbackward__mutmut_27": "einsum's subscripts in capitals name the "
    "same contraction",
    "cores.lru.xǁLRULayerǁonline_step__mutmut_11": "keep is [B]: unsqueeze(1) and unsqueeze(-1) "
    "of a 1-d tensor are the same [B, 1] view",
    "cores.lru.xǁLRULayerǁonline_step__mutmut_16": "keep is [B]: unsqueeze(1) and unsqueeze(-1) "
    "of a 1-d tensor are the same [B, 1] view",
    "cores.lru.xǁLRULayerǁonline_step__mutmut_36": "gamma is [N]: unsqueeze(1) and unsqueeze(-1) "
    "of a 1-d tensor are the same [N, 1] view",
    "cores.lru.xǁ_OnlineLRUScanǁbackward__mutmut_68": "gamma is [N]: unsqueeze(1) and "
    "unsqueeze(-1) of a 1-d tensor are the same [N, 1] view",
    "cores.lru.xǁ_OnlineLRUScanǁbackward__mutmut_28": "torch.cat's default dim is 0",
    "cores.lru.xǁLRULayerǁscan__mutmut_57": "torch.cat's default dim is 0",
    "cores.gated.xǁGatedLSTMǁcell__mutmut_3": "the sigmoid of the columns past the last sigmoid "
    "gate is never read (every gate is read by its block)",
    "cores.gated.xǁGatedLSTMǁcell__mutmut_9": "gate_fn('sigmoid') is torch.sigmoid of the same "
    "block: the branch only reuses the sigmoid already taken",
    "cores.gated.xǁGatedLSTMǁcell__mutmut_10": "gate_fn('sigmoid') is torch.sigmoid of the same "
    "block: the branch only reuses the sigmoid already taken",
    "cores.gated.xǁGatedLSTMǁ_draw_detach__mutmut_9": "torch.rand never returns p itself except "
    "with probability 2^-24 (its float32 grid), where < and <= differ",
    "envs.vector.xǁ_EnvRunnerǁreset__mutmut_2": "make_env(seed=seed + i) already seeds the "
    "first reset that is given no seed: the same episode",
    "envs.vector.xǁ_EnvRunnerǁreset__mutmut_14": "every step writes the flags and rewards of "
    "the rows it steps before anything reads them: the values set at reset are never read",
    "envs.vector.xǁ_EnvRunnerǁreset__mutmut_15": "every step writes the flags and rewards of "
    "the rows it steps before anything reads them: the values set at reset are never read",
    "envs.vector.xǁ_EnvRunnerǁreset__mutmut_16": "every step writes the flags and rewards of "
    "the rows it steps before anything reads them: the values set at reset are never read",
    "envs.vector.xǁ_EnvRunnerǁreset__mutmut_19": "every step writes the flags and rewards of "
    "the rows it steps before anything reads them: the values set at reset are never read",
    "envs.vector.xǁ_EnvRunnerǁstep__mutmut_30": "make_env's SuccessInfo puts success in every "
    "info: the default of info.get is never used",
    "envs.vector.xǁ_EnvRunnerǁstep__mutmut_32": "make_env's SuccessInfo puts success in every "
    "info: the default of info.get is never used",
    "envs.vector.xǁ_EnvRunnerǁstep__mutmut_35": "make_env's SuccessInfo puts success in every "
    "info: the default of info.get is never used",
    "envs.vector.xǁVectorEnvǁstep_wait__mutmut_3": "pop's default None is falsy like False: the "
    "same refusal",
    "cores.gru.xǁGatedGRUǁcell__mutmut_8": "the sum of the columns past the reset gate is never "
    "read (the candidate n adds its own blocks)",
    "cores.gates.x_constant_bias__mutmut_2": "the sigmoid's inverse of sigma(1) rounds back to "
    "exactly 1.0 in float64: the same ones [H] as the shortcut",
    "cores.gates.x_constant_bias__mutmut_3": "the sigmoid's inverse of sigma(1) rounds back to "
    "exactly 1.0 in float64: the same ones [H] as the shortcut",
    "cores.gates.x_gate_derivative__mutmut_20": "a bool mask multiplied into a float tensor is "
    "promoted to the float's dtype: the same product without the explicit cast",
    "cores.gates.x_gate_derivative__mutmut_38": "a bool mask multiplied into a float tensor is "
    "promoted to the float's dtype: the same product without the explicit cast",
    "cores.scan.x__parallel__mutmut_16": "torch.cat's default dim is 0",
    "cores.scan.x__parallel__mutmut_24": "torch.cat's default dim is 0",
    "cores.scan.x__parallel__mutmut_85": "torch.stack's default dim is 0",
    "cores.scan.x__parallel__mutmut_44": "size is a power of two: the extra round at shift == "
    "size writes the empty slice [:, size:]",
    "cores.scan.x__parallel__mutmut_63": "acc_a and acc_b have the same number of chunks: zip "
    "never meets unequal lengths",
    "cores.scan.x__parallel__mutmut_66": "acc_a and acc_b have the same number of chunks: zip "
    "never meets unequal lengths",
    "cores.scan.x__parallel__mutmut_75": "acc_a and acc_b have the same number of chunks: zip "
    "never meets unequal lengths",
    "cores.scan.xǁ_LinearScanǁbackward__mutmut_15": "previous_states writes h0 into a tensor "
    "of h's dtype: the assignment casts it the same way",
    "cores.scan.x_linear_scan__mutmut_7": "scan_values and scan_adjoint expand a themselves and "
    "autograd sums a broadcast gradient back to a's shape: the same values and gradients",
    "cores.base.x_step_loop__mutmut_23": "torch.stack's default dim is 0",
    "experiments.sweep.x__write_point_outcomes__mutmut_5": "the sign only orders the values: "
    "-2 x value orders them as -1 x value does",
    "experiments.sweep.x__write_point_outcomes__mutmut_9": "the sign only orders the values: "
    "2 x value orders them as 1 x value does",
    "experiments.sweep.x__write_point_outcomes__mutmut_24": "points without a value share one "
    "constant key after the scored ones' 0: (2, 0.0) sorts as (1, 0.0)",
    "experiments.sweep.x__write_point_outcomes__mutmut_25": "points without a value share one "
    "constant key: (1, 1.0) sorts as (1, 0.0)",
    "experiments.sweep.x__write_point_outcomes__mutmut_44": "json.dumps reads sort_keys=None "
    "as false, like False",
    "envs.batched.xǁBatchedEnvǁ_refill__mutmut_13": "an indexed assignment casts the value to the "
    "pool's dtype, as the explicit cast does",
    "envs.batched.xǁBatchedEnvǁ_refill__mutmut_27": "torch.where promotes both dtypes and copy_ "
    "casts the result back to the pool's dtype: the same values",
    "envs.batched.xǁBatchedEnvǁchecked_actions__mutmut_21": "step_recordable converts the actions "
    "to int64 again",
    "envs.batched.xǁBatchedEnvǁstep_recordable__mutmut_2": "every caller passes int64 actions "
    "already: step (through checked_actions) and the recorded rollout step (sampled actions)",
    "envs.batched.x__kept__mutmut_5": "the values reset writes are fresh contiguous tensors: a "
    "clone keeping their format is contiguous too",
    "envs.batched.x_random_words__mutmut_46": "an int64 tensor times a Python float is float32, "
    "torch's default dtype: the same values",
    "envs.batched.x_env_keys__mutmut_6": "torch.arange of integers is int64 by default",
    "envs.batched.x_env_keys__mutmut_9": "torch.arange of integers is int64 by default",
    "envs.batched.x_random_words__mutmut_14": "torch.arange of integers is int64 by default",
    "envs.batched.x_random_words__mutmut_18": "torch.arange of integers is int64 by default",
    "envs.batched.xǁBatchedEnvǁchecked_actions__mutmut_9": _ON_THE_CPU,
    "envs.batched.xǁBatchedEnvǁchecked_actions__mutmut_11": _ON_THE_CPU,
    "envs.batched.xǁBatchedEnvǁreset__mutmut_9": _ON_THE_CPU,
    "envs.batched.xǁBatchedEnvǁreset__mutmut_12": _ON_THE_CPU,
    "envs.batched.xǁBatchedEnvǁreset__mutmut_20": _ON_THE_CPU,
    "envs.batched.xǁBatchedEnvǁreset__mutmut_23": _ON_THE_CPU,
    "envs.batched.xǁBatchedEnvǁreset__mutmut_31": _ON_THE_CPU,
    "envs.batched.xǁBatchedEnvǁreset__mutmut_34": _ON_THE_CPU,
    "envs.batched.xǁBatchedEnvǁreset__mutmut_75": _ON_THE_CPU,
    "envs.batched.xǁBatchedEnvǁreset__mutmut_78": _ON_THE_CPU,
    "envs.batched.xǁBatchedEnvǁstep_recordable__mutmut_4": _ON_THE_CPU,
    "envs.batched.xǁBatchedEnvǁstep_recordable__mutmut_6": _ON_THE_CPU,
    "envs.batched.x_env_keys__mutmut_7": _ON_THE_CPU,
    "envs.batched.x_env_keys__mutmut_10": _ON_THE_CPU,
    "envs.batched.x_random_words__mutmut_15": _ON_THE_CPU,
    "envs.batched.x_random_words__mutmut_19": _ON_THE_CPU,
}
_Q_CALL = "agents.q_network.xǁEpsilonGreedyǁ__call____mutmut_"
_TWO_DIMS = "q is [R, A]: its dim 1 is its dim -1"
EQUIVALENT |= {f"{_Q_CALL}{n}": _ON_THE_CPU for n in (23, 26, 28, 34, 38, 61, 63)}
EQUIVALENT |= {
    f"{_Q_CALL}29": "torch.rand never returns epsilon itself except with probability 2^-24 "
    "(its float32 grid), where < and <= differ",
    f"{_Q_CALL}35": "torch.randint(high, size) is torch.randint(0, high, size): the same draws",
    f"{_Q_CALL}40": _TWO_DIMS,
    f"{_Q_CALL}50": _TWO_DIMS,
}
_REPLAY = "agents.replay.xǁSequenceReplayǁ"
EQUIVALENT |= {
    f"{_REPLAY}{name}__mutmut_{n}": _ON_THE_CPU
    for name, numbers in (("sample", (30, 32)), ("slot_starts", (5, 9)))
    for n in numbers
}
EQUIVALENT |= {
    f"{_REPLAY}update_priorities__mutmut_{n}": _ON_THE_CPU + "; the dtype is still float32"
    for n in (2, 4, 10)
}
EQUIVALENT |= {
    f"{_REPLAY}load_state_dict__mutmut_{n}": "the arity is checked before the loop: the zip "
    "never sees sequences of unequal length"
    for n in (36, 39, 42)
}
# cores (power_rnn, janet, nru, min_rnn, xlstm, _fused_lstm)
_CAPITALS = "einsum's subscripts in capitals name the same contraction"
_CORE_DEVICE = (
    "on the CPU, where these tests run, torch's default device is the inputs': the same "
    "tensor (only a run on an accelerator tells the two apart)"
)
_STARTS_BOOL = (
    "the starts (and their padding) are read only through .bool(): zeros of another dtype "
    "are the same all-false mask"
)
_XLSTM_CAPITALS = (
    "xǁMLSTMǁ_chunks__mutmut_223",
    "xǁMLSTMǁ_chunks__mutmut_291",
    "xǁMLSTMǁstep__mutmut_29",
    "xǁSLSTMǁ_cell__mutmut_12",
)
_XLSTM_DEVICE = ("_chunks__mutmut_76", "forward__mutmut_18", "forward__mutmut_22")
_BLOCKS = (
    "the blocks only split the work: each block's scan starts from the state the last one "
    "ended in, and the backward carries the adjoint the same way, so any block length gives "
    "the same values"
)
EQUIVALENT |= {
    "cores.janet.xǁJANETǁcell__mutmut_14": "a is [B, 2H]: its dim +1 is its dim -1",
    "cores.janet.xǁJANETǁreset_parameters__mutmut_17": "an indexed assignment casts the value "
    "to the bias's dtype, as the explicit cast does",
    "cores.nru.xǁNRUǁ_vectors__mutmut_7": "pq is [B, 2s]: its dim +1 is its dim -1",
    "cores.nru.xǁNRUǁcell__mutmut_25": "h and m are [B, H] and [B, M]: their dim +1 is their "
    "dim -1",
    "cores.nru.xǁNRUǁcell__mutmut_37": "heads is [B, 2k + 4s]: its dim +1 is its dim -1",
    "cores.min_rnn.xǁMinGRUCellǁdirect_step__mutmut_8": "the projection of x_t [B, D] is "
    "[B, 2H]: its dim +1 is its dim -1",
    "cores.min_rnn.xǁMinLSTMCellǁdirect_step__mutmut_8": "the projection of x_t [B, D] is "
    "[B, 3H]: its dim +1 is its dim -1",
    "cores.min_rnn.xǁ_MinRNNScanǁforward__mutmut_13": _BLOCKS,
    "cores.min_rnn.xǁ_MinRNNScanǁforward__mutmut_14": _BLOCKS,
    "cores.min_rnn.xǁ_MinRNNScanǁforward__mutmut_74": "saved is made from the first block's "
    "parts: zip never meets unequal lengths",
    "cores.min_rnn.xǁ_MinRNNǁforward__mutmut_14": "on the CPU the mask is then applied also "
    "for starts that are all false: a keep mask of ones changes nothing",
    "cores.min_rnn.xǁ_MinRNNǁforward__mutmut_30": "check_sequence has checked len(state) "
    "against state_arity, len(cells): zip never meets unequal lengths",
    "cores.xlstm.x__chunk_stabilisers__mutmut_14": 'float("-INF") is the same -inf as '
    'float("-inf")',
    "cores.xlstm.x__chunk_stabilisers__mutmut_28": "the extra round at shift == NC (NC a power "
    "of two) concatenates alpha[:NC] and beta[:NC] whole with empty slices: the same tensors",
    "cores.xlstm.xǁMLSTMǁ_chunks__mutmut_100": "first indexes [0, L): the pad after the last "
    "step is never gathered",
    "cores.xlstm.xǁMLSTMǁforward__mutmut_17": _STARTS_BOOL,
    "cores.xlstm.xǁMLSTMǁforward__mutmut_57": _STARTS_BOOL,
    "cores.xlstm.xǁMLSTMǁforward__mutmut_60": _STARTS_BOOL,
    "cores.xlstm.xǁMLSTMǁforward__mutmut_81": "h[:steps] is [T, B, heads, d]: flatten(+2) and "
    "flatten(-2) merge the same last two dims",
}
EQUIVALENT |= {f"cores.xlstm.{name}": _CAPITALS for name in _XLSTM_CAPITALS}
EQUIVALENT |= {f"cores.xlstm.xǁMLSTMǁ{name}": _CORE_DEVICE for name in _XLSTM_DEVICE}
# agents and experiments (core_compare, evaluation, torchrl, rllib, rollout_graph)
_WELCH = "experiments.core_compare.x_welch_p__mutmut_"
EQUIVALENT |= {
    f"{_WELCH}1": "one run on one side only: scipy's Welch test is NaN as well (one run has "
    "no sample variance), the NaN the early return gives",
    f"{_WELCH}16": "ttest_ind branches on `if equal_var:`: None runs Welch's test as False does",
}
_PLAY = "agents.evaluation.x_play_episodes__mutmut_"
EQUIVALENT |= {
    f"{_PLAY}{n}": "the ended episodes counted in float64: the same exact counts below 2^53, "
    "the same comparisons with the quota"
    for n in (17, 19)
}
EQUIVALENT |= {
    f"{_PLAY}{n}": "which CUDA generators fork_rng saves: on the CPU (or the meta device) there "
    "is none either way; only a run on a GPU tells the two apart"
    for n in (20, 22, 24, 25, 26, 27)
}
EQUIVALENT |= {
    f"{_PLAY}{n}": "RecurrentActorCritic.initial_state makes the state on the policy's device "
    "when given none: the device passed"
    for n in (40, 42)
}
_TORCHRL = "agents.torchrl_module.xǁCoreModuleǁ"
_GET = "tensordict's get without a default returns None for a missing key, as with None"
_STRICT = "the lists zipped are one per state tensor of the core (its initial state's "
_STRICT += "arity, which check_sequence holds its outputs to): always of the same length"
EQUIVALENT |= {
    f"{_TORCHRL}_input__mutmut_6": _GET,
    f"{_TORCHRL}_stored_state__mutmut_4": _GET,
    f"{_TORCHRL}forward__mutmut_48": _GET,
    **{f"{_TORCHRL}_stored_state__mutmut_{n}": _STRICT for n in (8, 12, 13)},
    **{f"{_TORCHRL}forward__mutmut_{n}": _STRICT for n in (100, 103, 105)},
    f"{_TORCHRL}forward__mutmut_9": "a [B, T] tensordict unsqueezed to [1, B, T] is flattened "
    "back to [B, T] on the next line: the same rows",
    f"{_TORCHRL}forward__mutmut_16": "flatten(0, -2) of a [B, T] tensordict is flatten(0, 0): "
    "the same [B, T]",
    f"{_TORCHRL}forward__mutmut_17": "tensordict's flatten reads start_dim None as 0",
    f"{_TORCHRL}forward__mutmut_24": "flatten(0, -2) of a [B, T] tensordict is flatten(0, 0): "
    "the same [B, T]",
    f"{_TORCHRL}forward__mutmut_31": "reshape(-1) is 1-d: unsqueeze(1) and unsqueeze(-1) are the "
    "same [N, 1]",
    f"{_TORCHRL}forward__mutmut_54": "the starts are cast with .bool() two lines on: zeros and a "
    "True of any dtype are the same flags",
    f"{_TORCHRL}forward__mutmut_57": "the starts are cast with .bool() two lines on: zeros and a "
    "True of any dtype are the same flags",
    f"{_TORCHRL}forward__mutmut_61": "with no state stored every row starts from the core's "
    "initial state already: a reset to it before the first step changes nothing",
}
_RLLIB = "agents.rllib_module.xǁCoreRLModuleǁ"
_TEMPLATE = "the template is read only for its arity and its shapes past the batch dim: "
EQUIVALENT |= {
    f"{_RLLIB}_memory__mutmut_19": "the vector encoder (Linear, then LayerNorm over the last "
    "dim) acts on each row alone: [B, T, n] unflattened gives the same [B, T, features]",
    f"{_RLLIB}_state_in__mutmut_14": _TEMPLATE + "on any device the same",
    f"{_RLLIB}_state_in__mutmut_16": _TEMPLATE + "on any device the same",
    f"{_RLLIB}_state_in__mutmut_17": _TEMPLATE + "the same for any batch size",
    **{
        f"{_RLLIB}_state_in__mutmut_{n}": "keys are made one per tensor of the template: the "
        "two lists always have the same length"
        for n in (37, 40, 41)
    },
}
# envs (batched_popgym, batched_memory_match)
_POPGYM = "envs.batched_popgym."
_ALREADY_FLOAT32 = (
    "torch.where of Python floats (times a bool mask) is already float32, torch's default "
    "dtype: .to(None) returns the same tensor"
)
EQUIVALENT |= {
    f"{_POPGYM}x__deal_order__mutmut_4": "u is [M, C]: argsort's default dim -1 is its dim 1",
    f"{_POPGYM}xǁBatchedMineSweeperǁ_fresh_game__mutmut_7": "the words are [M, H * W]: "
    "argsort's default dim -1 is its dim 1",
    f"{_POPGYM}x_make_batched_popgym__mutmut_19": "bool(None) is False: a missing prev_reward "
    "is off either way",
    f"{_POPGYM}x_make_batched_popgym__mutmut_21": "bool(None) is False: a missing prev_reward "
    "is off either way",
    f"{_POPGYM}xǁBatchedCountRecallǁ__init____mutmut_7": "error_clamp is taken as POPGym's "
    "CountRecall takes it, and read by neither (the reward is +-1 / (C - 1))",
    f"{_POPGYM}xǁBatchedCountRecallǁ_game_fresh__mutmut_2": "both decks are [M, C]: decks[1] "
    "has decks[0]'s row count",
    f"{_POPGYM}xǁBatchedCountRecallǁ_game_fresh__mutmut_4": "both decks are drawn on one "
    "device: decks[1]'s is decks[0]'s",
    f"{_POPGYM}xǁBatchedCountRecallǁ_game_fresh__mutmut_28": "scatter_add_ reads src only "
    "where the [M, 1] index has entries: the first column of [M, 2] ones is the same ones",
    f"{_POPGYM}xǁBatchedRepeatPreviousǁ_play_cards__mutmut_30": _ALREADY_FLOAT32,
    f"{_POPGYM}xǁBatchedAutoencodeǁ_play_cards__mutmut_47": _ALREADY_FLOAT32,
    f"{_POPGYM}xǁBatchedCountRecallǁ_play_cards__mutmut_70": _ALREADY_FLOAT32,
    f"{_POPGYM}xǁBatchedMineSweeperǁ_play__mutmut_19": _ALREADY_FLOAT32,
    f"{_POPGYM}xǁBatchedNoisyPositionOnlyCartPoleǁ_play__mutmut_92": "the float64 reward is "
    "copied into the float32 last_reward and output: 1 / L is rounded once, to the same float32",
    f"{_POPGYM}xǁBatchedNoisyPositionOnlyCartPoleǁ_play__mutmut_95": "the float64 reward is "
    "copied into the float32 last_reward and output: 1 / L is rounded once, to the same float32",
    f"{_POPGYM}xǁBatchedPopGymǁ_fresh__mutmut_30": "torch's default dtype is float32: the "
    "same zeros",
    f"{_POPGYM}xǁBatchedPopGymǁ_fresh__mutmut_33": "torch's default dtype is float32: the "
    "same zeros",
    f"{_POPGYM}xǁBatchedPopGymǁ__init____mutmut_23": "gymnasium's Box defaults to dtype "
    "np.float32: the same space",
    f"{_POPGYM}xǁBatchedMineSweeperǁ_fresh_game__mutmut_43": "the 3x3 sums read columns "
    "0..W+1 of the padded board: a second zero column after them is never read",
    f"{_POPGYM}xǁBatchedMineSweeperǁ_fresh_game__mutmut_45": "the 3x3 sums read rows 0..H+1 "
    "of the padded board: a second zero row after them is never read",
    f"{_POPGYM}xǁBatchedMineSweeperǁ_play__mutmut_48": "a clicked mine is then marked VIEWED, "
    "but a mine ends the episode in that step and the auto-reset replaces the board before "
    "anything reads it",
}
EQUIVALENT |= {
    f"{_POPGYM}xǁBatchedCardGameǁ_game_obs__mutmut_{n}": "every _card_obs returns one index "
    "per obs_sizes entry: zip never meets unequal lengths"
    for n in (11, 14, 15)
}
# envs/batched_memory_match.py
_MATCH = "envs.batched_memory_match.x"
_NEVER_PAST_BUDGET = (
    "k <= budget = numel - 2 on every step (an episode ends at max_steps at the latest): the "
    "upper clamp never binds and the table's last entry is never read"
)
_BOOL_TIMES_INT = (
    "a bool tensor times or plus an int64 tensor or Python int is int64: .to(None) keeps the "
    "bool and the result is the same"
)
EQUIVALENT |= {
    "envs.batched_registry.x_make_batched_env__mutmut_27": _ON_THE_CPU,
    **{
        f"agents.rollout.x_collect_on_device__mutmut_{n}": "the acting state has the state's "
        "arity: zip never meets unequal lengths"
        for n in (64, 67, 68)
    },
    "agents.rollout.x_collect_on_device__mutmut_84": "numpy's astype(None) is float64, the "
    "dtype asked for",
    f"{_MATCH}__view_offsets__mutmut_11": "j of shape [7] broadcasts against i [7, 1] as "
    "[1, 7] does: the same [7, 7] grids",
    **{
        f"{_MATCH}ǁBatchedVisualMatchǁ{name}": _ON_THE_CPU
        for name in (
            *(f"__init____mutmut_{n}" for n in (6, 38, 40, 46, 54, 57, 71, 76, 82, 90, 93, 98)),
            "__init____mutmut_100",
            *(f"_cue_pose__mutmut_{n}" for n in (159, 163, 188, 190)),
            *(f"_fresh__mutmut_{n}" for n in (45, 47, 187, 190)),
            "_room_template__mutmut_32",
        )
    },
    **{
        f"{_MATCH}ǁBatchedVisualMatchǁ__init____mutmut_{n}": "a list of Python floats makes a "
        "float32 tensor, torch's default dtype"
        for n in (53, 56)
    },
    f"{_MATCH}ǁBatchedVisualMatchǁ__init____mutmut_65": _NEVER_PAST_BUDGET,
    **{
        f"{_MATCH}ǁBatchedVisualMatchǁ_advance__mutmut_{n}": _NEVER_PAST_BUDGET
        for n in (110, 112, 116, 117)
    },
    f"{_MATCH}ǁBatchedVisualMatchǁ__init____mutmut_77": "with_balls=None is as falsy as False",
    **{
        f"{_MATCH}ǁBatchedVisualMatchǁ__init____mutmut_{n}": "a 0-dim int64 tensor does not "
        "raise torch.where's result dtype: int32 as the room, which scatter_ writes"
        for n in (89, 92)
    },
    f"{_MATCH}ǁBatchedVisualMatchǁ_advance__mutmut_115": "k = 0 only on the step that enters "
    "the reward room, where no choice and so no success is possible: its entry is multiplied "
    "by 0",
    **{
        f"{_MATCH}ǁBatchedVisualMatchǁ_cue_pose__mutmut_{n}": _BOOL_TIMES_INT for n in (37, 94, 169)
    },
    **{
        f"{_MATCH}ǁBatchedVisualMatchǁ_cue_pose__mutmut_{n}": "vec is one of the four unit "
        "headings: its sum is -1 or 1, never 0, so < 0, <= 0 and < 1 agree"
        for n in (40, 41)
    },
    **{
        f"{_MATCH}ǁBatchedVisualMatchǁ_cue_pose__mutmut_{n}": "vec is an axis heading, so one "
        "of the two products is 0, and only |right| is read: flipping either sign keeps it"
        for n in (138, 141)
    },
    f"{_MATCH}ǁBatchedVisualMatchǁ_cue_pose__mutmut_153": "|right| is an integer: <= 3.5 and "
    "<= 3 agree",
    f"{_MATCH}ǁBatchedVisualMatchǁ_cue_pose__mutmut_181": "the largest score is 1 only when "
    "the last try alone hides the ball: the fallback then picks that same last try",
    f"{_MATCH}ǁBatchedVisualMatchǁ_fresh__mutmut_88": "a word equals the density only if the "
    "density is a multiple of 2^-24, and then with probability 2^-24 (never at 0.3)",
    f"{_MATCH}ǁBatchedVisualMatchǁ_fresh__mutmut_132": "the int64 order added in place to "
    "the int32 room is cast back to int32: the same codes",
    f"{_MATCH}ǁBatchedVisualMatchǁ_fresh__mutmut_136": "u_order is [M, k]: argsort's default "
    "dim -1 is its dim 1",
    f"{_MATCH}ǁBatchedVisualMatchǁ_observe__mutmut_57": "without reveal_cue every colour has "
    "the same mission: row 1 of the table is row 0",
}
# the fused LSTM's backward
_FUSED = "cores._fused_lstm.x_"
_MATERIALIZED = (
    "autograd hands the backward zeros for an unused output (the function never turns "
    "set_materialize_grads off): the None branch is never taken"
)
_SLOPE_ZERO = (
    "beyond |s| = 30 the sigmoid's slope f (1 - f) is exactly 0 and nan_to_num_ turns "
    "inf * 0 into 0: the clamp's bounds change no value"
)
EQUIVALENT |= {f"{_FUSED}_backward__mutmut_{n}": _MATERIALIZED for n in (35, 37, 45, 47, 84)}
EQUIVALENT |= {f"{_FUSED}_forget_slope__mutmut_{n}": _SLOPE_ZERO for n in (37, 38, 40, 52, 53)}
EQUIVALENT |= {
    f"{_FUSED}_backward__mutmut_176": "dy_prev is None only at step 0, where h-detach leaves "
    "h0 no gradient: None is autograd's zero gradient",
    f"{_FUSED}_backward__mutmut_21": "the tensor of ones is read only by tied cells",
    f"{_FUSED}_backward__mutmut_8": "quarter is read only by the fast gates, for which it is "
    "a tensor",
    f"{_FUSED}_backward__mutmut_71": "dA has n H columns: slice(H, None) is slice(H, n H)",
    f"{_FUSED}_backward__mutmut_218": "torch.cat's default dim is 0",
    **{
        f"{_FUSED}_backward__mutmut_{n}": "a gradient computed for an input that needs none is "
        "dropped by autograd: only time is spent"
        for n in (249, 254, 264)
    },
    f"{_FUSED}_gate_factors__mutmut_134": "an out-of-place subtraction gives the same values "
    "(the in-place one only spares a copy)",
    **{
        f"{_FUSED}_gate_factors__mutmut_{n}": "for the sigmoid, _forget_slope returns f (1 - f), "
        "the factor s already holds: the same product by another route"
        for n in (199, 200)
    },
    **{
        f"{_FUSED}_forget_slope__mutmut_{n}": "nan_to_num_'s default replaces NaN with 0.0"
        for n in (33, 54)
    },
    **{
        f"{_FUSED}_gate_factors__mutmut_{n}": "the rows of C a chunk subtracts from in place are "
        "read by no later chunk (chunks run from the end and each reads the rows before its "
        "own) nor after the loop: in place or not, the same values"
        for n in (135, 137, 138, 139, 140)
    },
    f"{_FUSED}_gate_factors__mutmut_4": "the only chunk shorter than _CHUNK starts at step 0, "
    "where stop + start is stop - start; a full chunk's slice past the buffers' end stops at "
    "their length, _CHUNK",
}
EQUIVALENT = {f"{PACKAGE}.{name}": why for name, why in EQUIVALENT.items()}
"""Mutant name -> why no test can tell it from the original (it computes the same thing)."""

TEST_TIMEOUT_S = 30
"""Seconds one test may run under a mutant (the slowest selected test takes a few)."""

KILLED, SURVIVED, NO_TESTS, TIMEOUT, NOT_RUN = "killed", "survived", "no tests", "timeout", "-"
STATUS_BY_EXIT_CODE = {1: KILLED, 3: KILLED, 0: SURVIVED, 5: NO_TESTS, 33: NO_TESTS, 36: TIMEOUT}
STATUS_BY_EXIT_CODE |= {-24: TIMEOUT, 24: TIMEOUT, 152: TIMEOUT, 255: TIMEOUT, -9: KILLED}
STATUS_BY_EXIT_CODE |= {-11: KILLED}  # a crash is a detected change
"""mutmut's exit codes of a mutant's test run (mutmut.stats) -> this record's statuses."""


def mutmut_config(target: Target) -> str:
    """The ``[tool.mutmut]`` table for ``target`` (TOML; ``json.dumps`` writes its lists)."""
    options = {
        "source_paths": [PACKAGE],
        "only_mutate": [f"{PACKAGE}/{target.path}"],
        "also_copy": ["experiments/configs", RECORD_READ],  # mutmut tests in its own copy
        "pytest_add_cli_args_test_selection": list(target.tests),
        # a mutant can make a loop endless (``shift *= 2`` -> ``shift **= 2``): mutmut stops a
        # spinning one at 30x the tests' CPU time; pytest-timeout fails any test that runs (or
        # waits) past TEST_TIMEOUT_S of wall time, so no mutant stalls the run
        "pytest_add_cli_args": [
            *("-p", "no:randomly", "-p", "no:cacheprovider", "-q", f"--timeout={TEST_TIMEOUT_S}")
        ],
        # torch is not fork-safe once it has run: workers fork from a fresh server process
        "process_isolation": "forkserver",
        "use_git_change_detection": False,
    }
    return "\n[tool.mutmut]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in options.items())


def scratch_copy(target: Target, into: Path) -> None:
    """The package, tests and pyproject (with mutmut's table for ``target``) under ``into``.

    The subpackages go inside ``memcores/``, as a wheel installs them: a module's file path
    (``memcores/cores/lru.py``) then spells its import name, which mutmut requires (it names a
    mutant by the path and finds the tests that reach it by the name the tests import).
    """
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(REPO / PACKAGE, into / PACKAGE, ignore=ignore)
    for name in SUBPACKAGES:
        shutil.copytree(REPO / name, into / PACKAGE / name, ignore=ignore)
    for name in COPIED:
        src = REPO / name
        if src.is_dir():
            shutil.copytree(src, into / name, ignore=ignore, dirs_exist_ok=True)
        else:
            shutil.copy2(src, into / name)
    with open(into / "pyproject.toml", "a", encoding="utf-8") as f:
        f.write(mutmut_config(target))


def run_target(target: Target, jobs: int, log: Path, previous: dict | None = None) -> dict:
    """Mutate ``target`` in a scratch copy with ``jobs`` workers; its row of the record.

    :param previous: the target's row from an earlier run of the same sources: only its
        surviving mutants are run again (against the tests as they are now) and the rest of
        its statuses are kept (a test added later cannot revive a killed mutant).
    """
    mutmut = Path(sys.executable).with_name("mutmut")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    statuses = dict(previous["statuses"]) if previous else {}
    diffs = dict(previous["surviving"]) if previous else {}
    if previous:
        for name, eq in previous["equivalent_mutants"].items():
            diffs[name] = eq["diff"]
    rerun = sorted(n for n, s in statuses.items() if s in (SURVIVED, NO_TESTS))
    if previous and not rerun:
        return previous
    with tempfile.TemporaryDirectory(prefix="memcores-mutate-") as tmp:
        work = Path(tmp)
        scratch_copy(target, work)
        start = time.monotonic()
        with open(log, "w", encoding="utf-8") as out:
            names = rerun if previous else target.globs()
            cmd = [str(mutmut), "run", "--max-children", str(jobs), *names]
            subprocess.run(cmd, cwd=work, env=env, stdout=out, stderr=subprocess.STDOUT)
        wall = time.monotonic() - start + (previous["wall_seconds"] if previous else 0.0)
        meta = work / "mutants" / PACKAGE / f"{target.path}.meta"
        if not meta.is_file():
            raise SystemExit(f"mutmut wrote no results for {target.path}; see {log}")
        codes = json.loads(meta.read_text())["exit_code_by_key"]
        for name, code in codes.items():
            if target.selects(name) and (not previous or name in rerun):
                statuses[name] = (
                    STATUS_BY_EXIT_CODE.get(code, KILLED) if code is not None else NOT_RUN
                )
        for name, status in statuses.items():
            if (status in (SURVIVED, NO_TESTS) or name in EQUIVALENT) and name not in diffs:
                diffs[name] = show(mutmut, name, work, env)
    result = row(target, statuses, diffs, wall)
    result["command"] = f"python tests/mutate.py --targets {target.path} --jobs {jobs}"
    again = ", then the survivors again with --survivors"
    if previous:  # one mention however many times the survivors ran again
        result["command"] = previous["command"].removesuffix(again) + again
    return result


def show(mutmut: Path, name: str, work: Path, env: dict[str, str]) -> str:
    """The diff of mutant ``name`` (mutmut ``show``, header line dropped)."""
    out = subprocess.run(
        [str(mutmut), "show", name], cwd=work, env=env, capture_output=True, text=True
    ).stdout
    lines = [ln for ln in out.splitlines() if ln.startswith(("-", "+")) and ln[:3] not in "---+++"]
    return "\n".join(lines)


def row(target: Target, statuses: dict[str, str], diffs: dict[str, str], wall: float) -> dict:
    """Counts and the score of one target (equivalent mutants left out of the score)."""
    statuses = {n: s for n, s in statuses.items() if target.selects(n)}
    equivalent = sorted(n for n in statuses if n in EQUIVALENT)
    counted = {n: s for n, s in statuses.items() if n not in EQUIVALENT and s != NOT_RUN}
    count = {s: sum(v == s for v in counted.values()) for s in (KILLED, SURVIVED, NO_TESTS)}
    count[TIMEOUT] = sum(v == TIMEOUT for v in counted.values())
    detected = count[KILLED] + count[TIMEOUT]
    return {
        "module": target.path,
        "functions": list(target.functions) or ["(all)"],
        "tests": list(target.tests),
        "mutants": len(counted) + len(equivalent),
        "equivalent": len(equivalent),
        "killed": count[KILLED],
        "timeout": count[TIMEOUT],
        "survived": count[SURVIVED],
        "no_tests": count[NO_TESTS],
        "not_run": sum(v == NOT_RUN for v in statuses.values()),
        "score": detected / len(counted) if counted else None,
        "wall_seconds": round(wall, 1),
        "surviving": {n: diffs[n] for n, s in sorted(counted.items()) if s in (SURVIVED, NO_TESTS)},
        "equivalent_mutants": {n: {"reason": EQUIVALENT[n], "diff": diffs[n]} for n in equivalent},
        "statuses": dict(sorted(statuses.items())),
    }


def machine() -> str:
    import torch

    cpu = platform.processor() or platform.machine()
    python = platform.python_version()
    return f"{os.cpu_count()}-core {cpu} CPU, Python {python}, torch {torch.__version__}"


def write_record(rows: dict[str, dict]) -> None:
    """``summary.json`` (every number) and ``README.md`` (the table and the mutants)."""
    RECORD_DIR.mkdir(parents=True, exist_ok=True)
    summary = {
        "format": "memcores-mutation/1",
        "tool": f"mutmut {mutmut_version()}",
        "command": "make mutate",
        "hardware": machine(),
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "modules": [rows[t.path] for t in TARGETS if t.path in rows],
    }
    SUMMARY.write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
    (RECORD_DIR / "README.md").write_text(readme(summary), encoding="utf-8")


def readme(summary: dict) -> str:
    total_wall = sum(m["wall_seconds"] for m in summary["modules"])
    lines = [
        "# Mutation testing of the maths the results rest on",
        "",
        f"{summary['tool']} on {summary['hardware']}, 2 mutants at a time, the CPU shared with",
        f"other work (wall times are upper bounds): {total_wall / 60:.0f} minutes of runs for the",
        "modules below. Each module's row was written by the command in its section;",
        f"`{summary['command']}` runs every module in the order of the table.",
        "",
        "Score = killed / (mutants - equivalent); a mutant of a function that no selected test",
        'calls ("no tests") counts as surviving. Each module runs only the tests of its area.',
        "",
        "| module | functions | mutants | equivalent | killed | survived | no tests | score "
        "| wall (s) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for m in summary["modules"]:
        functions = "all" if m["functions"] == ["(all)"] else f"{len(m['functions'])} named"
        score = "-" if m["score"] is None else f"{100 * m['score']:.1f}%"
        mutants = str(m["mutants"]) + (f" (+{m['not_run']} not run)" if m.get("not_run") else "")
        lines.append(
            f"| `{m['module']}` | {functions} | {mutants} | {m['equivalent']} | "
            f"{m['killed'] + m['timeout']} | {m['survived']} | {m['no_tests']} | {score} | "
            f"{m['wall_seconds']:.0f} |"
        )
    measured = {m["module"] for m in summary["modules"]}
    missing = [t.path for t in TARGETS if t.path not in measured]
    if missing:
        lines += ["", "Not measured in this record: " + ", ".join(f"`{p}`" for p in missing) + "."]
    for m in summary["modules"]:
        lines += ["", f"## `{m['module']}`", "", f"`{m['command']}`", ""]
        lines += ["Tests: " + ", ".join(m["tests"]) + "."]
        if m["functions"] != ["(all)"]:
            lines += ["Functions: " + ", ".join(f"`{f}`" for f in m["functions"]) + "."]
        if m["equivalent_mutants"]:
            lines += ["", "Equivalent:", ""]
            for name, eq in m["equivalent_mutants"].items():
                lines += [f"- `{name}`: {eq['reason']}", "", _block(eq["diff"])]
        if m["surviving"]:
            lines += ["", "Surviving:", ""]
            for name, diff in m["surviving"].items():
                lines += [f"- `{name}`", "", _block(diff)]
    return "\n".join(lines) + "\n"


def named(module_row: dict) -> dict:
    """A record's row with its mutants under their import names (``memcores.cores.lru...``):
    rows written before the subpackages moved into ``memcores`` named them by path alone."""

    def fix(names: dict) -> dict:
        return {n if n.startswith(f"{PACKAGE}.") else f"{PACKAGE}.{n}": v for n, v in names.items()}

    keys = ("statuses", "surviving", "equivalent_mutants")
    return module_row | {key: fix(module_row[key]) for key in keys if key in module_row}


def _block(diff: str) -> str:
    return "  ```diff\n" + "\n".join("  " + ln for ln in diff.splitlines()) + "\n  ```"


def mutmut_version() -> str:
    from importlib.metadata import version

    return version("mutmut")


def main(argv: list[str] | None = None) -> int:
    known = {t.path: t for t in TARGETS}
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", nargs="+", metavar="MODULE", help=", ".join(known))
    parser.add_argument("--jobs", type=int, default=2, help="mutants tested at once")
    parser.add_argument(
        "--refresh",
        action="store_true",
        help="rewrite the record from summary.json with the current EQUIVALENT (runs nothing)",
    )
    parser.add_argument(
        "--survivors",
        action="store_true",
        help="run only the recorded survivors again (after adding tests; same sources)",
    )
    args = parser.parse_args(argv)
    unknown = [t for t in args.targets or () if t not in known]
    if unknown:
        print(f"unknown target {unknown[0]!r}; valid: {', '.join(known)}", file=sys.stderr)
        return 2
    if shutil.which("mutmut", path=str(Path(sys.executable).parent)) is None:
        print("mutmut is not installed: pip install -c constraints.txt mutmut", file=sys.stderr)
        return 2
    chosen = [known[t] for t in args.targets] if args.targets else list(TARGETS)
    rows = {}
    if SUMMARY.is_file():
        rows = {m["module"]: named(m) for m in json.loads(SUMMARY.read_text())["modules"]}
    if args.refresh:
        for path, old in rows.items():
            diffs = {**old["surviving"]}
            diffs |= {n: eq["diff"] for n, eq in old["equivalent_mutants"].items()}
            fresh = row(known[path], old["statuses"], diffs, old["wall_seconds"])
            rows[path] = fresh | {"command": old["command"]}
        write_record(rows)
        return 0
    logs = Path(tempfile.gettempdir())
    for target in chosen:
        log = logs / f"memcores-mutate-{target.module}.log"
        print(f"{target.path}: mutating (log: {log})", flush=True)
        previous = rows.get(target.path) if args.survivors else None
        rows[target.path] = row_ = run_target(target, args.jobs, log, previous)
        score = "-" if row_["score"] is None else f"{100 * row_['score']:.1f}%"
        detected, counted = row_["killed"] + row_["timeout"], row_["mutants"] - row_["equivalent"]
        print(f"{target.path}: {detected}/{counted} killed ({score})", flush=True)
        write_record(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
