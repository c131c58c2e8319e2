"""Who gets the CPU cores: the thread policy of the host kernels.

The heavy kernels (Conv, ConvTranspose, Gemm, MatMul) spend their time in BLAS calls on the
OpenBLAS library that numpy ships; everything around them (im2col, padding, pooling,
elementwise work) is Numba. Both have thread pools, and on a small machine they fight.

Measured on the 2-core reference machine (AMD EPYC, Zen 5; numpy 2.4 with OpenBLAS 0.3.31,
numba 0.68 with the ``omp`` threading layer), a ResNet-like chain of 1x1-conv GEMMs with a
``prange`` ReLU after each:

=====================================================  ========
policy                                                  time
=====================================================  ========
GEMMs alone (OpenBLAS, 2 threads)                        4.1 ms
GEMM + prange ReLU, defaults (OMP spins, BLAS spins)    44   ms   <- the trap: 8x slower
GEMM + serial ReLU (Numba single-threaded)                6.0 ms
GEMM + prange ReLU, ``OMP_WAIT_POLICY=PASSIVE``            4.8 ms
OpenBLAS limited to 1 thread, prange ReLU                 6.4 ms
=====================================================  ========

After a parallel region GNU OpenMP workers busy-wait (``GOMP_SPINCOUNT``) on every core
while the next BLAS call wants those cores, and OpenBLAS workers spin after a GEMM. The
policy chosen here is therefore **BLAS owns the cores**: OpenBLAS keeps one thread per core,
the conv/gemm/pool/norm kernels of this package run their Numba parts single-threaded (they
are memory-bound next to the GEMMs, and a second thread bought little once the spinning was
removed), and for kernels elsewhere that do use ``prange`` the OpenMP pool is made passive
(workers sleep as soon as a region ends) so it never steals the cores from BLAS.

OpenBLAS picks its SGEMM kernels from the CPU (AVX-512 "SkylakeX" ones on that machine) unless
``OPENBLAS_CORETYPE`` says otherwise; the development environment sets
``OPENBLAS_CORETYPE=Haswell`` (AVX2), which halves SGEMM throughput there (ResNet-50 layer
shapes: 220-250 GFLOP/s instead of 340-440 on 2 cores). That is the user's choice and is left
alone; :func:`blas_info` reports the kernel set in use so benchmarks can say which it was.

:func:`configure` runs once, when this module is imported (that is, when the kernel package
is imported, before any kernel can run), and may be called again (it is idempotent).
Environment switches: ``BYOC_THREAD_POLICY=off`` leaves every library as it is;
``OMP_WAIT_POLICY`` set by the user is respected.
"""

from __future__ import annotations

import ctypes
import glob
import os
import threading
from typing import Any

import numpy as np

__all__ = ["blas_info", "configure", "openblas", "openblas_symbol", "set_blas_threads"]

_lock = threading.RLock()
_configured = False
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


def configure() -> dict[str, Any]:
    """Apply the thread policy (once per process); returns what was done."""
    global _configured
    if _configured:
        return dict(_info)
    with _lock:
        if _configured:
            return dict(_info)
        if os.environ.get("BYOC_THREAD_POLICY", "").lower() in ("off", "0", "none"):
            _info["policy"] = "off (BYOC_THREAD_POLICY)"
        else:
            _info["policy"] = "BLAS owns the cores; Numba parts of conv/gemm/pool/norm single-threaded"
            _info["omp"] = _make_omp_passive()
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
    info["cblas_sgemm"] = openblas_symbol("cblas_sgemm") is not None
    return info


configure()
