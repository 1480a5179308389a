"""Compile the Triton kernels for a CUDA target without a GPU and print each one's shared
memory; used by ``tests/test_triton_kernels.py`` in a process without ``TRITON_INTERPRET``
(the interpreter replaces the compiler), specialised as a launch at ``LAUNCH_SHAPE`` would
be. Usage: ``python tests/triton_compile.py H [--spills]``:
a line per kernel with its shared memory and its asynchronous copies; with ``--spills`` also
the bytes per thread that ``ptxas -v`` spills to local memory (stores, then loads)."""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.backends.nvidia.compiler import get_ptxas
from triton.compiler import ASTSource, compile

from memcores.cores import triton_engine, triton_kernels

POINTERS_INT8 = ("starts_ptr", "detach_ptr")
POINTERS_INT32 = ("flags_ptr",)
ARCH = 90
# the steps and batch the kernels are compiled for: bench gpu's cores table
LAUNCH_SHAPE = dict(T=256, B=64)


def launch_attributes(kernel, ints: dict[str, int]) -> dict:
    """What Triton's launcher specialises a launch on, as it would for ``ints`` (the integer
    arguments' values) and PyTorch's tensors: ``tt.divisibility`` 16 on every pointer (PyTorch
    allocates 16-byte aligned) and on every integer divisible by 16, so the compiled code is
    the one a launch at that shape runs (its vector widths, its shared memory)."""
    divisible = [
        name
        for name in kernel.arg_names
        if name.endswith("_ptr") or (name in ints and ints[name] % 16 == 0)
    ]
    return {(kernel.arg_names.index(name),): [["tt.divisibility", 16]] for name in divisible}


def compiled(kernel, constants: dict, num_warps: int = 4, ints: dict[str, int] | None = None):
    """``kernel`` compiled for an sm_90 GPU (float32 tensors), specialised as a launch with
    integer arguments ``ints`` would be (:func:`launch_attributes`; none without)."""
    signature = {}
    for name in kernel.arg_names:
        if name in constants:
            signature[name] = "constexpr"
        elif name in POINTERS_INT8:
            signature[name] = "*i8"
        elif name in POINTERS_INT32:
            signature[name] = "*i32"
        else:
            signature[name] = "*fp32" if name.endswith("_ptr") else "i32"
    constexprs = {(kernel.arg_names.index(k),): v for k, v in constants.items()}
    attrs = launch_attributes(kernel, ints or {})
    source = ASTSource(fn=kernel, signature=signature, constexprs=constexprs, attrs=attrs)
    options = {"num_warps": num_warps}
    return compile(source, target=GPUTarget("cuda", ARCH, 32), options=options)


def spill_bytes(kernel) -> tuple[int, int]:
    """Bytes per thread a compiled kernel spills to local memory (stores, loads), from
    ``ptxas -v`` on its PTX (the assembler Triton itself runs, with its report)."""
    with tempfile.TemporaryDirectory() as folder:
        ptx = Path(folder) / "kernel.ptx"
        ptx.write_text(kernel.asm["ptx"])
        report = subprocess.run(
            [get_ptxas(ARCH).path, "-v", f"--gpu-name=sm_{ARCH}a", str(ptx), "-o", "/dev/null"],
            capture_output=True,
            text=True,
            check=True,
        ).stderr
    found = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", report)
    if found is None:
        raise RuntimeError(f"no spill line in ptxas's report:\n{report}")
    return int(found[1]), int(found[2])


def describe(
    kernel, constants: dict, ints: dict[str, int], num_warps: int = 4, spills: bool = False
) -> str:
    """The kernel's shared memory in bytes, how many asynchronous copies from global memory
    its ``ttgir`` holds (where Triton's software pipeliner issued a later step's read ahead)
    and, with ``spills``, its spilled bytes."""
    binary = compiled(kernel, constants, num_warps, ints)
    copies = binary.asm["ttgir"].count("async_copy_global_to_local")
    fields = [binary.metadata.shared, copies, *(spill_bytes(binary) if spills else ())]
    return " ".join(str(f) for f in fields)


def split_meta(hidden: int, precision: str, num_warps: int | None) -> tuple[dict, int]:
    """The unit-split kernels' compile-time parameters at ``hidden`` units and their warps
    (``None``: the launcher's, :func:`cores.triton_engine.split_warps`)."""
    parts = triton.cdiv(hidden, triton_engine.SPLIT_UNITS)
    plan = triton_engine.SplitPlan(16, triton_engine.SPLIT_UNITS, hidden, 1, parts, precision)
    meta = plan.meta()
    warps = meta.pop("num_warps")
    return meta, num_warps or warps


def main(hidden: int, spills: bool = False) -> None:
    """Each kernel at full float32 products (what the tests run), and at TF32 (PyTorch's
    default for its RNNs on a GPU, :func:`cores.triton_engine.recurrent_precision`): one line
    per kernel, ``<family>.<way>[_split][<variant>]``."""
    shape = dict(LAUNCH_SHAPE, H=hidden)
    cpu = torch.device("cpu")
    family = triton_engine.family
    base = dict(HAS_STARTS=True, **triton_engine.block_meta(hidden))
    warps = base.pop("num_warps")  # the one-program-per-tile kernels' default
    lstm = family("lstm", 0, 4, 2, cpu, ACT=0, TIED=True, REFINE=True, R=2)[1]
    gru = family("gru", 1, 4, 1, cpu, ACT=1, REFINE=True)[1]
    families = (
        ("lstm", lstm),
        ("gru", gru),
        ("slstm", family("slstm", 2, 4, 4, cpu, EPS=1e-6)[1]),
        # the power-law cells, with an r that takes the general |x|^r
        ("lstm_power", dict(lstm, POWER=1.5)),
        ("gru_power", dict(gru, POWER=1.5)),
    )
    variants = [("", "ieee", None), ("_tf32", "tf32", None)]
    if spills:  # what the default's warps (triton_engine.split_warps) are chosen against
        variants.append(("_4_warps", "ieee", 4))
    for name, cell in families:
        cell = dict(base, **{k: v for k, v in cell.items() if k != "PREC"})
        backward = dict(cell, HAS_DETACH=True)
        for suffix, precision in (("", "ieee"), ("_tf32", "tf32")):
            forward = describe(
                triton_kernels.forward_kernel, {**cell, "PREC": precision}, shape, warps, spills
            )
            print(f"{name}.forward{suffix}", forward, flush=True)
            info = describe(
                triton_kernels.backward_kernel, {**backward, "PREC": precision}, shape, warps,
                spills,
            )  # fmt: skip
            print(f"{name}.backward{suffix}", info, flush=True)
        for suffix, precision, num_warps in variants:
            meta, split_warps = split_meta(hidden, precision, num_warps)
            for way, kernel, consts in (
                ("forward", triton_kernels.forward_split_kernel, cell),
                ("backward", triton_kernels.backward_split_kernel, backward),
            ):
                consts = {k: v for k, v in consts.items() if k != "BLOCK_K"}
                info = describe(kernel, {**consts, **meta}, shape, split_warps, spills)
                print(f"{name}.{way}_split{suffix}", info, flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]), "--spills" in sys.argv[2:])
