"""The pool's nogil poll loop (:func:`byoc.kernels.threads._spin_wait`): atomic loads of a shared
word with ``pause`` between them, and a release store before them. A module of its own so that
:mod:`byoc.kernels.threads` imports Numba only when a pool first waits."""

from __future__ import annotations

import platform

import numba
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

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


@intrinsic
def _store_release(typingctx, arr, idx, value):
    sig = types.void(arr, types.intp, types.int64)

    def codegen(context, builder, signature, args):
        a = context.make_array(signature.args[0])(context, builder, args[0])
        builder.store_atomic(args[2], builder.gep(a.data, [args[1]]), "release", 8)
        return context.get_dummy_value()

    return sig, codegen


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
# and last an abort flag (:func:`byoc.kernels.threads.run_spmd` sets it when a thread raises)


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
