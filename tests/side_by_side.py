"""Triton's interpreter with a launch's programs running side by side, one thread each.

The interpreter runs a grid's programs one after the other, so a kernel whose programs wait
for each other (the unit-split kernels' barriers, :mod:`cores.triton_kernels`) would wait
forever there: without this, those kernels run under the interpreter with one part per tile.
Inside :func:`programs_side_by_side` every program of a launch runs in its own thread and
reads its own ``tl.program_id``, so the parts of a tile meet at their barriers as on a GPU:
the barriers' logic (which step, which counters, which values still unwritten, the prefetched
reads) runs as written, with every ordering the threads happen to take. What it cannot show
is the GPU's memory model: the interpreter's loads and stores reach memory at once.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import itertools
import random
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any
from unittest import mock

from triton.runtime import interpreter

WAIT_LIMIT_S = 120.0
"""A launch whose programs have not all returned by then is reported as hung."""
STALL_CHANCE = 0.5
STALL_MAX_S = 0.05
"""Before each of its stores a program stalls with this chance, for up to this long, so the
parts drift apart as a GPU's do and a read that a barrier fails to hold back sees stale data
(in lock step a missing wait would go unnoticed)."""


class _Cancelled(Exception):
    """Raised in a program whose launch has already failed or timed out, so its thread ends."""


class _ThreadGridIndex:
    """``InterpreterBuilder.grid_idx`` kept per thread (each program reads its own), with the
    program's random stalls and its launch's cancel flag."""

    def __init__(self) -> None:
        self._local = threading.local()

    def __get__(self, builder: Any, owner: type | None = None) -> Any:
        return getattr(self._local, "index", None)

    def __set__(self, builder: Any, index: tuple[int, int, int]) -> None:
        self._local.index = index
        self._local.stalls = random.Random(hash(index))

    def join(self, cancelled: threading.Event) -> None:
        """Tie the current thread's program to its launch's cancel flag."""
        self._local.cancelled = cancelled

    def check(self) -> None:
        """Raise :class:`_Cancelled` in a program whose launch has been given up on (a program
        left spinning at a barrier would otherwise hold the interpreter for the rest of the
        test run)."""
        cancelled = getattr(self._local, "cancelled", None)
        if cancelled is not None and cancelled.is_set():
            raise _Cancelled

    def stall(self) -> None:
        """Sleep a random while, at random (the current program's own draws)."""
        self.check()
        stalls = getattr(self._local, "stalls", None)
        if stalls is not None and stalls.random() < STALL_CHANCE:
            time.sleep(stalls.uniform(0.0, STALL_MAX_S))


def _call_side_by_side(
    executor: Any, *args_dev: Any, absent: frozenset = frozenset(), **kwargs: Any
) -> None:
    """``GridExecutor.__call__`` with the grid's programs in threads, but for the ``absent``
    ones, which never start: the arguments move to the host and back as the interpreter's own
    call does (Triton 3.9, pinned in constraints.txt)."""
    spec = inspect.getfullargspec(executor.fn)
    kwargs = {k: v for k, v in kwargs.items() if k in spec.args or k in spec.kwonlyargs}
    args_hst, kwargs_hst = executor._init_args_hst(args_dev, kwargs)
    for hook in executor.pre_run_hooks:
        hook(*args_hst, **kwargs_hst)
    scope = interpreter._patch_lang(executor.fn)
    try:
        args = inspect.getcallargs(executor.fn, *args_hst, **kwargs_hst)
        args = {
            name: arg if name in executor.constexprs else interpreter._implicit_cvt(arg)
            for name, arg in args.items()
        }
        grid = executor.grid(args) if callable(executor.grid) else executor.grid
        grid = tuple(grid) + (1,) * (3 - len(grid))
        builder = interpreter.interpreter_builder
        builder.set_grid_dim(*grid)
        thread_index: _ThreadGridIndex = vars(type(builder))["grid_idx"]
        errors: list[BaseException] = []
        cancelled = threading.Event()

        def program(index: tuple[int, int, int]) -> None:
            try:
                builder.set_grid_idx(*index)
                thread_index.join(cancelled)
                executor.fn(**args)
            except _Cancelled:
                pass
            except BaseException as err:  # noqa: BLE001 - re-raised in the caller's thread
                errors.append(err)

        indices = [i for i in itertools.product(*(range(n) for n in grid)) if i not in absent]
        threads = [
            threading.Thread(target=program, args=(index,), daemon=True) for index in indices
        ]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + WAIT_LIMIT_S
        try:
            while any(thread.is_alive() for thread in threads) and not errors:
                if time.monotonic() > deadline:
                    waiting = [i for i, t in zip(indices, threads, strict=True) if t.is_alive()]
                    raise TimeoutError(
                        f"programs {waiting} of {executor.fn.__name__} on grid {grid} did not "
                        f"return within {WAIT_LIMIT_S:.0f} s: a barrier waits for a part that "
                        "never arrives"
                    )
                time.sleep(0.01)
            if errors:  # (a program that failed leaves the others of its tile waiting)
                raise interpreter.InterpreterError(repr(errors[0])) from errors[0]
        finally:
            cancelled.set()  # the programs still waiting end at their next read or store
            for thread in threads:
                thread.join(1.0)
    finally:
        scope.restore()
    executor._restore_args_dev(args_dev, args_hst, kwargs, kwargs_hst)


def _after(hook: Callable[[], None], method: Callable[..., Any]) -> Callable[..., Any]:
    """``method`` (an ``InterpreterBuilder`` method), run after ``hook``."""

    def hooked(builder: Any, *args: Any) -> Any:
        hook()
        return method(builder, *args)

    return hooked


def _locked(lock: threading.RLock, fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn``, called under ``lock``."""

    def locked(*args: Any) -> Any:
        with lock:
            return fn(*args)

    return locked


@contextlib.contextmanager
def programs_side_by_side(absent: set[tuple[int, int, int]] = frozenset()) -> Iterator[None]:
    """Inside the block, every interpreted launch runs its programs concurrently, except the
    programs at the grid indices ``absent``, which never start (as a GPU whose
    multiprocessors are all held may never start some)."""
    builder = interpreter.InterpreterBuilder
    index = _ThreadGridIndex()
    # a device function's first call rewrites it and adds the interpreter's names to its
    # module's globals, which another program's call may be iterating (_patch_lang): one lock
    lock = threading.RLock()
    with contextlib.ExitStack() as patches:
        for target, name, value in (
            (builder, "grid_idx", index),
            (builder, "create_masked_store", _after(index.stall, builder.create_masked_store)),
            (builder, "create_masked_load", _after(index.check, builder.create_masked_load)),
            (builder, "create_atomic_rmw", _after(index.check, builder.create_atomic_rmw)),
            (interpreter, "_patch_lang", _locked(lock, interpreter._patch_lang)),
            (
                interpreter.InterpretedFunction,
                "rewrite",
                _locked(lock, interpreter.InterpretedFunction.rewrite),
            ),
            (
                interpreter.GridExecutor,
                "__call__",
                functools.partialmethod(_call_side_by_side, absent=frozenset(absent)),
            ),
        ):
            patches.enter_context(mock.patch.object(target, name, value, create=True))
        # the builder's own index, if one was set, would hide the per-thread one
        patches.enter_context(mock.patch.dict(vars(interpreter.interpreter_builder)))
        vars(interpreter.interpreter_builder).pop("grid_idx", None)
        # a waiting program spins; hand the interpreter lock on often so the others advance
        previous_interval = sys.getswitchinterval()
        sys.setswitchinterval(1e-4)
        patches.callback(sys.setswitchinterval, previous_interval)
        yield
