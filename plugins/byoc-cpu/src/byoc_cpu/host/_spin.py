"""The pool's nogil loops (:mod:`byoc_cpu.host.threads`: a helper's :func:`serve`, a caller's
:func:`spin` and compiled jobs' :func:`post` and :func:`run_and_close`): atomic loads of a shared
word with ``pause`` between them, and a release store before them. A module of its own so that
:mod:`byoc_cpu.host.threads` imports Numba only when a pool first waits."""

from __future__ import annotations

import platform

import numba
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from byoc_cpu.host._words import ACTIVE, ARGS, DONE, FN, OPEN, POSTED

_X86 = platform.machine().lower() in ("x86_64", "amd64", "i386", "i686")


@intrinsic
def _load_acquire(typingctx, arr, idx):
    sig = types.int64(arr, types.intp)

    def codegen(context, builder, signature, args):
        a = context.make_array(signature.args[0])(context, builder, args[0])
        value = builder.load_atomic(builder.gep(a.data, [args[1]]), "acquire", 8)
        if _X86:  # tell the core this is a spin-wait loop (saves power, frees the sibling thread)
            fn = builder.module.globals.get("llvm.x86.sse2.pause")
            if fn is None:
                fn = ir.Function(builder.module, ir.FunctionType(ir.VoidType(), []), name="llvm.x86.sse2.pause")
            builder.call(fn, [])
        return value

    return sig, codegen


def _atomic_store(order: str):
    """An intrinsic ``store(arr, idx, value)``: an atomic store with memory order ``order``."""

    @intrinsic
    def store(typingctx, arr, idx, value):
        sig = types.void(arr, types.intp, types.int64)

        def codegen(context, builder, signature, args):
            a = context.make_array(signature.args[0])(context, builder, args[0])
            builder.store_atomic(args[2], builder.gep(a.data, [args[1]]), order, 8)
            return context.get_dummy_value()

        return sig, codegen

    return store


_store_release = _atomic_store("release")


@numba.njit(nogil=True, cache=True)
def spin(word, idx, seen, polls, sidx, svalue):
    """Store ``svalue`` at ``word[sidx]`` first when ``sidx >= 0`` (outside the GIL: whoever
    waits for it finds the GIL free), then poll ``word[idx]`` until it differs from ``seen``
    (returns True) or ``polls`` run out."""
    if sidx >= 0:
        _store_release(word, sidx, svalue)
    for _ in range(polls):
        if _load_acquire(word, idx) != seen:
            return True
    return False


# -------------------------------------------------------------------------------------------------
# work units shared by the threads that run one compiled region (byoc_cpu's native driver):
# ``sync`` holds two counters per unit, claimed chunks at ``2*u`` and finished ones at ``2*u + 1``,
# and last an abort flag (:func:`byoc_cpu.host.threads.run_spmd` sets it when a thread raises)


@intrinsic
def _fetch_add(typingctx, arr, idx, value):
    sig = types.int64(arr, types.intp, types.int64)

    def codegen(context, builder, signature, args):
        a = context.make_array(signature.args[0])(context, builder, args[0])
        return builder.atomic_rmw("add", builder.gep(a.data, [args[1]]), args[2], "seq_cst")

    return sig, codegen


@numba.njit(nogil=True, cache=True)
def claim(sync, unit):
    """The next chunk of work unit ``unit`` for the calling thread (a number at or past the unit's
    chunk count: none is left)."""
    return _fetch_add(sync, 2 * unit, 1)


@numba.njit(nogil=True, cache=True)
def finish(sync, unit):
    """Mark one chunk of ``unit`` done (its writes become visible to whoever sees the count)."""
    _fetch_add(sync, 2 * unit + 1, 1)


@numba.njit(nogil=True, cache=True)
def wait_done(sync, unit, chunks):
    """Wait until all ``chunks`` chunks of ``unit`` are done. Only chunks another thread claimed
    can be outstanding here (the caller ran out of unclaimed ones), so this never waits for work
    nobody runs, unless that thread raised: then the abort flag (``sync[-1]``) ends the wait, the
    remaining work runs on garbage and the error reaches the caller."""
    abort = sync.size - 1
    while _load_acquire(sync, 2 * unit + 1) < chunks:
        if _load_acquire(sync, abort) != 0:
            return


# -------------------------------------------------------------------------------------------------
# compiled jobs: work that a helper runs without ever taking the GIL (see
# :meth:`byoc_cpu.host.threads._Pool.run_compiled`). A job is a C function ``void f(int64 *args)``
# (a Numba ``cfunc``) and its argument block, posted in the pool's words (byoc_cpu.host._words).

@intrinsic
def _load_seq(typingctx, arr, idx):
    sig = types.int64(arr, types.intp)

    def codegen(context, builder, signature, args):
        a = context.make_array(signature.args[0])(context, builder, args[0])
        return builder.load_atomic(builder.gep(a.data, [args[1]]), "seq_cst", 8)

    return sig, codegen


_store_seq = _atomic_store("seq_cst")


@intrinsic
def _call_job(typingctx, fn, block):
    """Call the C function at address ``fn`` with the argument block at address ``block``."""
    sig = types.void(types.int64, types.int64)

    def codegen(context, builder, signature, args):
        ptr = ir.IntType(64).as_pointer()
        target = builder.inttoptr(args[0], ir.FunctionType(ir.VoidType(), [ptr]).as_pointer())
        builder.call(target, [builder.inttoptr(args[1], ptr)])
        return context.get_dummy_value()

    return sig, codegen


def _pointer_to(dtype):
    @intrinsic
    def to_pointer(typingctx, address):
        sig = types.CPointer(dtype)(types.int64)

        def codegen(context, builder, signature, args):
            return builder.inttoptr(args[0], context.get_value_type(signature.return_type))

        return sig, codegen

    return to_pointer


#: ``float32_at(address)`` / ``int64_at(address)``: typed pointers for ``numba.carray`` inside a job
float32_at = _pointer_to(types.float32)
int64_at = _pointer_to(types.int64)


@numba.njit(nogil=True, cache=True)
def serve(word, state, polls):
    """A helper's wait for work outside the GIL: announce the Python job it finished last
    (``state[1] >= 0``) in ``word[DONE]``, then poll ``word[POSTED]`` for a value other than the
    one it handled last (``state[0]``). A compiled job runs here, and the poll goes on; returns
    True for a Python job (the helper runs it with the GIL), False when ``polls`` polls found
    nothing new (the helper sleeps)."""
    if state[1] >= 0:
        _store_release(word, DONE, state[1])
        state[1] = -1
    seen = state[0]
    n = 0
    while n < polls:
        v = _load_acquire(word, POSTED)
        if v == seen:
            n += 1
            continue
        seen = v
        state[0] = v
        n = 0
        if v % 2 == 0:
            return True
        # enter, then check that the job is still open: the poster closes it (OPEN = 0) before
        # it waits for ACTIVE to drop to zero, so either it waits for this helper or the helper
        # sees it closed and leaves (both sides sequentially consistent)
        _fetch_add(word, ACTIVE, 1)
        if _load_seq(word, OPEN) == v:
            _call_job(word[FN], word[ARGS])
        _fetch_add(word, ACTIVE, -1)
    return False


@numba.njit(cache=True)
def post(word, value, fn, block):
    """Post a compiled job (under the GIL: a helper deciding to sleep reads ``word`` under it too)."""
    word[FN] = fn
    word[ARGS] = block
    _store_seq(word, OPEN, value)
    _store_release(word, POSTED, value)


@numba.njit(nogil=True, cache=True)
def run_and_close(word, fn, block):
    """The poster's share of its compiled job, then close it and wait for the helpers inside to
    leave (the argument block and the buffers it names may then be reused)."""
    _call_job(fn, block)
    _store_seq(word, OPEN, 0)
    while _load_acquire(word, ACTIVE) != 0:
        pass


@numba.njit(nogil=True, cache=True)
def run_alone(fn, block):
    """A compiled job on the calling thread alone (no pool, or the pool busy)."""
    _call_job(fn, block)
