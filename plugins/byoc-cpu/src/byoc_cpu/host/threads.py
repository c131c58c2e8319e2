"""Who gets the CPU cores: the thread policy of the host kernels.

The heavy kernels (Conv, ConvTranspose, Gemm, MatMul) spend their time in BLAS calls on the
OpenBLAS library that numpy ships; everything around them (im2col, padding, pooling,
elementwise work) is Numba. Both libraries bring thread pools, and on a small machine they
fight. Measurements on the 2-core development machine (AMD EPYC Zen 5; numpy 2.4 with
OpenBLAS 0.3.31, numba 0.68 with the ``omp`` threading layer):

1. OpenBLAS threads and Numba ``prange`` threads oversubscribe the cores. A ResNet-like chain
   of 1x1-conv GEMMs with a ``prange`` ReLU after each took 4.1 ms as GEMMs alone, 44 ms with
   the ReLUs (8x), 6.0 ms with serial ReLUs and 4.8 ms with ``OMP_WAIT_POLICY=PASSIVE``: after
   a parallel region GNU OpenMP workers busy-wait on every core while the next GEMM needs them.
2. OpenBLAS's own threads collapse when the machine is busy. With other processes running
   (load average 6 on the 2 cores, as when several test suites run), a 0.85 ms single-threaded
   SGEMM (ResNet-50 layer shape) took 8-36 ms with 2 OpenBLAS threads: the calling thread
   waits for a worker that is not scheduled, for whole scheduler time slices.

The policy is therefore **one pool, owned by byoc**: OpenBLAS runs single-threaded, and the
kernels split their work into chunks (column or row blocks of a GEMM, channel blocks of a
Numba loop) that :func:`parallel_for` hands to the calling thread plus one helper thread per
further core. The calling thread claims chunks itself, so a helper that is not scheduled in
time costs nothing: on a busy machine a kernel degrades to single-threaded speed instead of
collapsing (same load as above: 0.85 ms single-threaded, 0.58-0.9 ms through the pool); on an
idle one both cores work (byoc's own GEMM, gemm.py: 215-245 GFLOP/s on one core, 400-440 on
two). BLAS calls (ctypes and numpy) and ``nogil`` Numba kernels release the GIL inside a
chunk. Handing a chunk over costs the helper's wake-up and a GIL hand-off; helpers therefore
poll for the next job outside the GIL for ~200 us before they sleep, and announce a job's last
chunk from there (see "waiting without the GIL" below): 27-30 us a hand-off instead of 88 on the
2-core machine. A kernel whose chunks are all compiled code posts a *compiled job* instead
(:func:`run_job`: a C function and its argument block, the threads sharing its chunks through
atomic claims): a polling helper runs it from its poll loop without ever taking the GIL, so a
hand-off costs nothing measurable, and the work can be cut finer than Python chunks allow (the
host's blocked convolutions). A model run calls :func:`wake` first, so that helpers asleep
since the last run poll again by its first kernel. Kernels elsewhere that use ``prange`` still
get their OpenMP pool, made passive
(``OMP_WAIT_POLICY=PASSIVE``) so it sleeps as soon as a region ends and never spins while the
pool works. What a runtime needs to do: nothing beyond importing the kernels (the policy is
applied then); :func:`blas_info` says what is in force.

OpenBLAS picks its SGEMM kernels from the CPU (AVX-512 "SkylakeX" ones on that machine) unless
``OPENBLAS_CORETYPE`` says otherwise; the development environment sets
``OPENBLAS_CORETYPE=Haswell`` (AVX2), which halves SGEMM throughput there. That is the
user's choice and is left alone (byoc's float32 GEMM does not depend on it);
:func:`blas_info` reports the kernel set in use.

:func:`configure` runs once, when this module is imported (that is, when the kernel package
is imported, before any kernel can run), and may be called again (it is idempotent).
Environment switches: ``BYOC_NUM_THREADS`` sets the pool size (default: the CPUs this process
may run on); ``BYOC_THREAD_POLICY=off`` leaves OpenBLAS and OpenMP as they are and runs every
chunk on the calling thread; ``BYOC_THREAD_POLICY=blas`` gives the GEMMs to OpenBLAS's own
threads instead: each product (each tap of a shift convolution) is one OpenBLAS call from the
calling thread (:func:`gemm_split`, :func:`gemm_for`), whose threads share the packed operands
where byoc's chunks each pack the weights again, while the pool still runs every other kernel:
faster on an idle machine, fragile on a busy one (point 2); an ``OMP_WAIT_POLICY`` set by the
user is respected.
"""

from __future__ import annotations

import ctypes
import glob
import itertools
import math
import os
import threading
from typing import Any

import numpy as np

from byoc.contract import environment as _env
from byoc_cpu.host import _words
from byoc_cpu.tuning import THREADS

__all__ = ["run_ranges", "blas_gemms", "blas_info", "configure", "gemm_for", "gemm_split", "num_threads", "openblas",
           "openblas_symbol", "parallel_for", "run_job", "run_spmd", "wake", "scratch", "set_blas_threads"]

_lock = threading.RLock()
_configured = False
_blas_gemms = False
_info: dict[str, Any] = {}

# (prefix, suffix) of the OpenBLAS symbol names, in the order tried: numpy's own build
# (scipy-openblas64, ILP64), a plain ILP64 build, a plain LP64 build
_NAMINGS = (("scipy_", "64_"), ("", "64_"), ("", ""))

_lib: ctypes.CDLL | None = None
_naming: tuple[str, str] | None = None
_int64 = True
_searched = False

def _numpy_openblas_path() -> str | None:
    """The OpenBLAS shared library that numpy's BLAS calls go to, if it is OpenBLAS."""
    candidates = []
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                fields = line.split(maxsplit=5)
                if len(fields) == 6 and "openblas" in os.path.basename(fields[5]).lower():
                    path = fields[5].strip()
                    if path not in candidates:
                        candidates.append(path)
    except OSError:
        pass
    numpy_dir = os.path.dirname(os.path.dirname(np.__file__))
    candidates.sort(key=lambda p: (not p.startswith(numpy_dir), "numpy" not in p))
    if not candidates:
        candidates = sorted(glob.glob(os.path.join(numpy_dir, "numpy.libs", "*openblas*")))
    return candidates[0] if candidates else None


def openblas() -> ctypes.CDLL | None:
    """A ctypes handle on numpy's OpenBLAS, or ``None`` when numpy uses another BLAS."""
    global _lib, _naming, _int64, _searched
    if _searched:
        return _lib
    with _lock:
        if _searched:
            return _lib
        path = _numpy_openblas_path()
        if path is not None:
            try:
                lib = ctypes.CDLL(path)
            except OSError:
                lib = None
            if lib is not None:
                for prefix, suffix in _NAMINGS:
                    if hasattr(lib, f"{prefix}cblas_sgemm{suffix}"):
                        _lib, _naming = lib, (prefix, suffix)
                        break
        if _lib is not None and _naming is not None:
            config = getattr(_lib, f"{_naming[0]}openblas_get_config{_naming[1]}", None)
            if config is not None:
                config.restype = ctypes.c_char_p
                config.argtypes = []
                _int64 = b"USE64BITINT" in (config() or b"")
            else:
                _int64 = _naming[1] == "64_"
        _searched = True
    return _lib


def openblas_symbol(name: str):
    """The OpenBLAS function ``name`` (API name, e.g. ``"cblas_sgemm"``) or ``None``."""
    lib = openblas()
    if lib is None or _naming is None:
        return None
    prefix, suffix = _naming
    return getattr(lib, f"{prefix}{name}{suffix}", None)


def blas_int64() -> bool:
    """Whether the OpenBLAS integer arguments are 64-bit."""
    openblas()
    return _int64


def _corename() -> str | None:
    fn = openblas_symbol("openblas_get_corename")
    if fn is None:
        return None
    fn.restype = ctypes.c_char_p
    fn.argtypes = []
    name = fn()
    return name.decode() if name else None


def _omp_loaded() -> bool:
    try:
        with open("/proc/self/maps") as f:
            return any("libgomp" in line for line in f)
    except OSError:
        return False


def _make_omp_passive() -> str:
    if "OMP_WAIT_POLICY" in os.environ:
        return f"OMP_WAIT_POLICY={os.environ['OMP_WAIT_POLICY']} (set by the user)"
    if _omp_loaded():
        # libgomp reads its environment once, when it is loaded
        return "libgomp already loaded: its wait policy could not be changed"
    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
    return "OMP_WAIT_POLICY=PASSIVE"


def set_blas_threads(n: int) -> bool:
    """Set the number of OpenBLAS threads; ``False`` when numpy's BLAS is not OpenBLAS."""
    fn = openblas_symbol("openblas_set_num_threads")
    if fn is None:
        return False
    fn.argtypes = [ctypes.c_int]
    fn.restype = None
    fn(int(n))
    return True


def _default_threads() -> int:
    return _env.num_threads()


# -------------------------------------------------------------------------------------------------
# the pool


# -------------------------------------------------------------------------------------------------
# waiting without the GIL
#
# A pool thread woken through a condition variable takes 50-100 us to run (futex wake-up, then
# the GIL): measured 88 us of overhead per two-chunk hand-off on the 2-core machine, about what
# a 1x1 convolution of ResNet-50's last stage costs. So a thread that expects work soon first
# polls a shared word for a while *outside the GIL* (a nogil Numba loop of atomic loads and
# ``pause``), and only then sleeps on the condition variable.

#: polls of the shared word before a waiting thread sleeps (each ``pause`` is ~10-100 cycles:
#: about 200 microseconds in all on the development machine, enough to bridge the Python
#: between two kernels)
SPIN_POLLS = THREADS["spin_polls"]


def _spin_wait(word: np.ndarray, idx: int, seen: int, sidx: int = -1, svalue: int = 0) -> bool:
    """Poll ``word[idx] != seen`` outside the GIL (after storing ``svalue`` at ``word[sidx]``)."""
    _compiled()
    return bool(_spin(word, idx, seen, SPIN_POLLS, sidx, svalue))


class _Job:
    __slots__ = ("fn", "n", "claim", "done", "lock", "finished", "error", "generation")

    def __init__(self, fn, n: int, generation: int = 0):
        self.generation = generation  # the pool's count of posted jobs, this one included
        self.fn = fn
        self.n = n
        self.claim = itertools.count()  # next() is atomic under the GIL
        self.done = 0
        self.lock = threading.Lock()
        self.finished = threading.Event()
        self.error: BaseException | None = None

    def work(self) -> bool:
        """Run chunks until none is left; True when this thread finished the job's last one
        (a helper then announces it in the pool's word, see :meth:`_Pool._loop`)."""
        last = False
        while True:
            i = next(self.claim)
            if i >= self.n:
                return last
            try:
                self.fn(i)
            except BaseException as exc:  # re-raised on the calling thread
                self.error = exc
            with self.lock:
                self.done += 1
                if self.done == self.n:
                    last = True
                    self.finished.set()


# the pool's shared words (byoc_cpu.host._words)
_POSTED, _DONE, _WORDS = _words.POSTED, _words.DONE, _words.WORDS
# the nogil loops (byoc_cpu.host._spin), imported on first use: one dispatcher each for every thread
_spin = _serve = _post = _run_and_close = _run_alone = None


def _compiled():
    global _spin, _serve, _post, _run_and_close, _run_alone
    if _serve is None:
        with _lock:
            if _serve is None:
                from byoc_cpu.host import _spin as loops
                _spin, _post, _run_and_close, _run_alone = loops.spin, loops.post, loops.run_and_close, loops.run_alone
                _serve = loops.serve


class _Pool:
    """The calling thread plus ``workers`` helper threads; one job at a time.

    A job is either Python (:meth:`run`: chunks of a Python function, which a helper runs with
    the GIL) or compiled (:meth:`run_compiled`: a C function that shares its work among the
    threads that call it, which a helper runs from its nogil poll loop without ever taking the
    GIL: no wake-up and no GIL hand-off per job while the helper polls)."""

    def __init__(self, workers: int):
        self.size = workers + 1
        self._busy = threading.Lock()
        self._cv = threading.Condition()
        self._job: _Job | None = None
        self._generation = 0
        self._sleepers = 0
        self._wakes = 0  # wake() calls: a sleeping helper goes back to polling
        self._word = np.zeros(_WORDS, np.int64)
        for i in range(workers):
            threading.Thread(target=self._loop, name=f"byoc-worker-{i}", daemon=True).start()

    def _loop(self) -> None:
        with self._cv:  # no polling before the first job: an idle process compiles and polls nothing
            self._sleepers += 1
            while self._generation == 0:
                self._cv.wait()
            self._sleepers -= 1
        _compiled()
        # the posted value this helper handled last, the Python job it finished last (announced
        # in the word from the poll loop: the caller, polling too, then takes the GIL without
        # waiting for this thread to drop it)
        state = np.array([0, -1], np.int64)
        while True:
            if _serve(self._word, state, SPIN_POLLS):  # a Python job was posted
                with self._cv:
                    job = self._job
                if job is not None and 2 * job.generation == state[0] and job.work():
                    state[1] = job.generation
                continue
            with self._cv:  # nothing new for a while: sleep until a job is posted (or wake())
                self._sleepers += 1
                wakes = self._wakes
                while int(self._word[_POSTED]) == int(state[0]) and self._wakes == wakes:
                    self._cv.wait()
                self._sleepers -= 1

    def wake(self) -> None:
        """Send sleeping helpers back to polling: work is coming (a wake-up takes 50-300 us on
        the development machines, more than a small job)."""
        if self._sleepers:
            with self._cv:
                self._wakes += 1
                self._cv.notify_all()

    def run_compiled(self, fn: int, address: int) -> None:
        """Run the compiled job ``fn`` (the address of a ``void f(int64 *)``) with the argument
        block at ``address`` on the calling thread and every helper that polls."""
        _compiled()
        if self.size == 1 or not self._busy.acquire(blocking=False):
            _run_alone(fn, address)
            return
        try:
            self._generation += 1
            self._job = None
            _post(self._word, 2 * self._generation + 1, fn, address)
            if self._sleepers:
                with self._cv:
                    self._cv.notify_all()
            _run_and_close(self._word, fn, address)
        finally:
            self._busy.release()

    def run(self, fn, n: int) -> None:
        # a job already running (another thread's kernel): this one runs on its caller alone
        if n <= 1 or self.size == 1 or not self._busy.acquire(blocking=False):
            for i in range(n):
                fn(i)
            return
        try:
            # a helper announces a job it finished in word[_DONE]; a late announcement of an
            # earlier job only ends this one's polling early (the event decides)
            done_before = int(self._word[_DONE])
            with self._cv:
                self._generation += 1
                job = _Job(fn, n, self._generation)
                self._job = job
                self._word[_POSTED] = 2 * self._generation
                if self._sleepers:
                    self._cv.notify_all()
            job.work()
            if not job.finished.is_set():
                # a helper thread runs the last chunk: poll for its announcement, then sleep
                _spin_wait(self._word, _DONE, done_before)
                job.finished.wait()
            if job.error is not None:
                raise job.error
        finally:
            self._job = None
            self._busy.release()


_pool: _Pool | None = None

# -------------------------------------------------------------------------------------------------
# per-thread scratch buffers

_tls = threading.local()
# larger workspaces are allocated per call instead of kept
_SCRATCH_MAX_BYTES = THREADS["scratch_max_bytes"]


def scratch(name: str, shape, dtype) -> np.ndarray:
    """A reusable work buffer of the calling thread (contents undefined), never a kernel output.

    Kernels allocate several large temporaries per call (padded inputs, patch matrices,
    Winograd tiles); fresh ones are returned to the OS by ``free`` and page-faulted back in on
    every call, which measured 2-3x the cost of the arithmetic for a 3x3 conv on a 56x56 plane.
    Buffers are keyed by ``name`` and grow as needed; a kernel must use distinct names for
    buffers alive at the same time.
    """
    dtype = np.dtype(dtype)
    n = math.prod(int(d) for d in shape) * dtype.itemsize
    if n > _SCRATCH_MAX_BYTES:
        return np.empty(shape, dtype=dtype)
    bufs = getattr(_tls, "bufs", None)
    if bufs is None:
        bufs = _tls.bufs = {}
    buf = bufs.get(name)
    if buf is None or buf.nbytes < n:
        buf = bufs[name] = np.empty(max(n, 64), dtype=np.uint8)
    return buf[:n].view(dtype).reshape(shape)


def num_threads() -> int:
    """How many threads :func:`parallel_for` uses (the caller included)."""
    configure()
    return _pool.size if _pool is not None else 1


def blas_gemms() -> bool:
    """Whether GEMMs run as single OpenBLAS calls on OpenBLAS's own threads
    (``BYOC_THREAD_POLICY=blas``) instead of being cut into chunks for byoc's pool."""
    configure()
    return _blas_gemms


def gemm_split() -> int:
    """How many pieces a kernel cuts a GEMM into for the pool (1 under the ``blas`` policy)."""
    return 1 if blas_gemms() else num_threads()


def gemm_for(fn, n: int) -> None:
    """:func:`parallel_for` for chunks that call BLAS: on the calling thread, in order, under
    the ``blas`` policy (OpenBLAS's threads do the splitting), else over the pool."""
    if blas_gemms():
        for i in range(n):
            fn(i)
    else:
        parallel_for(fn, n)


def parallel_for(fn, n: int) -> None:
    """Call ``fn(i)`` for ``i`` in ``range(n)``, spread over the calling thread and the pool.

    ``fn`` must release the GIL for its bulk (BLAS, ``nogil`` Numba) to run in parallel, and
    chunks must write disjoint memory. Exceptions are re-raised here. Safe to call from many
    threads at once (a call that finds the pool busy runs its chunks itself).
    """
    configure()
    if _pool is None:
        for i in range(n):
            fn(i)
    else:
        _pool.run(fn, n)


#: work (elements touched; see :func:`run_ranges`) below which range work runs in one call on
#: the calling thread, and the least work handed to one thread
PARALLEL_MIN_ELEMENTS = THREADS["ranges_parallel_min_elements"]
PARALLEL_MIN_CHUNK = THREADS["ranges_min_chunk_elements"]


def run_ranges(fn, n_units: int, args: tuple, unit_cost: int = 1) -> None:
    """Call ``fn(*args, start, stop)`` so that the ranges cover ``[0, n_units)``: the reference
    kernels' range work, cut into chunks for the pool when large.

    ``fn`` must be a ``nogil`` kernel writing disjoint outputs per unit; ``unit_cost`` is the
    number of elements one unit touches. The calling thread claims chunks too, so a helper that
    is not scheduled costs nothing."""
    work = n_units * max(1, unit_cost)
    workers = num_threads()
    k = int(min(workers * 4, n_units, max(1, work // PARALLEL_MIN_CHUNK)))
    if workers <= 1 or work < PARALLEL_MIN_ELEMENTS or k <= 1:
        fn(*args, 0, n_units)
        return
    bounds = [n_units * i // k for i in range(k + 1)]
    parallel_for(lambda i: fn(*args, bounds[i], bounds[i + 1]), k)


def run_blocks(fn, n: int, unit_cost: int = 1) -> None:
    """``fn(lo, hi)`` over blocks that cover ``range(n)`` (a Python callable; see :func:`run_ranges`)."""
    run_ranges(_call_block, n, (fn,), unit_cost)


def _call_block(fn, lo, hi):
    fn(lo, hi)


def wake() -> None:
    """Tell the pool that kernels are about to run (a model run starts): helpers that sleep go
    back to polling, so that the first job finds them ready. Cheap when none sleeps."""
    if _pool is not None:
        _pool.wake()


def run_job(job, block: np.ndarray, address: int | None = None) -> None:
    """Run a compiled job: ``job`` is a Numba ``cfunc`` of signature ``void(int64 *)`` (or its
    address) that shares its work among the threads calling it, as :func:`run_spmd`'s functions
    do (claims on work units, :func:`byoc_cpu.host._spin.claim`), and ``block`` its int64 argument
    block (addresses of the arrays it reads and writes, and its integers; kept alive by the
    caller for the call), at ``address`` where the caller knows it. The calling thread and every
    helper still polling for work run it; no helper needs the GIL for it. The job must not raise
    (a ``cfunc`` cannot)."""
    configure()
    fn = job if isinstance(job, int) else int(job.address)
    address = block.ctypes.data if address is None else address
    if _pool is None:
        _compiled()
        _run_alone(fn, address)
    else:
        _pool.run_compiled(fn, address)


def run_spmd(fn, sync: np.ndarray, args: tuple = ()) -> None:
    """Call ``fn(sync, *args)`` on the calling thread and on every helper of the pool at once (one
    hand-off for the whole call): ``fn`` is a compiled ``nogil`` function whose threads share its
    work among themselves through ``sync`` (an int64 array: two counters per work unit, then an
    abort flag; see :func:`byoc_cpu.host._spin.claim`), so each call must be safe to run on any
    number of threads, one included, and return once all of the work is done. A helper that
    starts late finds the work done and returns at once; a busy pool leaves it all to the
    calling thread. A thread that raises sets the abort flag, so that the others stop waiting
    for its chunk; the error reaches the caller."""
    configure()

    def body(_: int) -> None:
        try:
            fn(sync, *args)
        except BaseException:
            sync[-1] = 1
            raise

    if _pool is None:
        body(0)
    else:
        _pool.run(body, _pool.size)


def configure() -> dict[str, Any]:
    """Apply the thread policy (once per process); returns what was done."""
    global _configured, _pool, _blas_gemms
    if _configured:
        return dict(_info)
    with _lock:
        if _configured:
            return dict(_info)
        policy = _env.get("BYOC_THREAD_POLICY").lower()
        if policy in ("off", "0", "none"):
            _info["policy"] = "off (BYOC_THREAD_POLICY): libraries untouched, kernels single-threaded"
        elif policy == "blas":
            n = _default_threads()
            _info["policy"] = (f"blas (BYOC_THREAD_POLICY): each GEMM is one OpenBLAS call on {n} OpenBLAS "
                               f"thread(s); byoc pool of {n} thread(s) for the other kernels")
            _info["omp"] = _make_omp_passive()
            if set_blas_threads(n):
                _info["openblas_threads"] = n
                _blas_gemms = True
            if n > 1:
                _pool = _Pool(n - 1)
        else:
            n = _default_threads()
            _info["policy"] = f"byoc pool of {n} thread(s); OpenBLAS single-threaded inside each chunk"
            _info["omp"] = _make_omp_passive()
            if set_blas_threads(1):
                _info["openblas_threads"] = 1
            if n > 1:
                _pool = _Pool(n - 1)
        _configured = True
    _info["openblas_core"] = _corename() or "no OpenBLAS"
    return dict(_info)


def blas_info() -> dict[str, Any]:
    """The policy in force and the BLAS numpy uses (for reports and benchmarks)."""
    info = configure()
    fn = openblas_symbol("openblas_get_num_threads")
    if fn is not None:
        fn.restype = ctypes.c_int
        info["openblas_threads"] = int(fn())
    info["pool_threads"] = num_threads()
    info["cblas_sgemm"] = openblas_symbol("cblas_sgemm") is not None
    return info


configure()
