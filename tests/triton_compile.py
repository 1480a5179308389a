"""Compile the Triton kernels for a CUDA target without a GPU and print each one's shared
memory; used by ``tests/test_triton_kernels.py`` in a process without ``TRITON_INTERPRET``
(the interpreter replaces the compiler). Usage: ``python tests/triton_compile.py H``."""

from __future__ import annotations

import sys

from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, compile

from cores import triton_gates, triton_gru, triton_lstm, triton_slstm

POINTERS_INT8 = ("starts_ptr", "detach_ptr")
POINTERS_INT32 = ("flags_ptr",)


def shared_bytes(kernel, constants: dict) -> int:
    """Compile ``kernel`` for an sm_90 GPU (float32 tensors) and return its shared memory."""
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
    source = ASTSource(fn=kernel, signature=signature, constexprs=constexprs)
    return compile(source, target=GPUTarget("cuda", 90, 32)).metadata.shared


def main(hidden: int) -> None:
    base = dict(PREC="ieee", HAS_STARTS=True, **triton_gates.block_meta(hidden))
    lstm = dict(base, NG=4, ACT=0, TIED=True, REFINE=True, R=2, CLAMP=10.0)
    gru = dict(base, NG=4, ACT=1, REFINE=True, CLAMP=10.0)
    slstm = dict(base, EPS=1e-6)
    slstm_split = {k: v for k, v in slstm.items() if k != "BLOCK_K"}
    slstm_split.update(BLOCK_N=triton_gates.SPLIT_UNITS, BLOCK_H=hidden)
    split = {k: v for k, v in lstm.items() if k != "BLOCK_K"}
    split.update(BLOCK_N=triton_gates.SPLIT_UNITS, BLOCK_H=hidden)
    gru_split = {k: v for k, v in gru.items() if k != "BLOCK_K"}
    gru_split.update(BLOCK_N=triton_gates.SPLIT_UNITS, BLOCK_H=hidden)
    for name, kernel, constants in (
        ("lstm.forward", triton_lstm.forward_kernel, lstm),
        ("lstm.backward", triton_lstm.backward_kernel, dict(lstm, HAS_DETACH=True)),
        ("lstm.forward_split", triton_lstm.forward_split_kernel, split),
        ("lstm.backward_split", triton_lstm.backward_split_kernel, dict(split, HAS_DETACH=True)),
        ("gru.forward", triton_gru.forward_kernel, gru),
        ("gru.backward", triton_gru.backward_kernel, gru),
        ("gru.forward_split", triton_gru.forward_split_kernel, gru_split),
        ("gru.backward_split", triton_gru.backward_split_kernel, gru_split),
        ("slstm.forward", triton_slstm.forward_kernel, slstm),
        ("slstm.backward", triton_slstm.backward_kernel, slstm),
        ("slstm.forward_split", triton_slstm.forward_split_kernel, slstm_split),
        ("slstm.backward_split", triton_slstm.backward_split_kernel, slstm_split),
    ):
        print(name, shared_bytes(kernel, constants), flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]))
