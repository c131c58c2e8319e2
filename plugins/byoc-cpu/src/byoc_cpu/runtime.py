"""Runtime: an artifact -> a callable, through a verified, cached, imported module.

Loading an artifact never trusts it:

1. the program is checked (:func:`byoc_cpu.verify.verify`: types, known instructions and
   kernels, every memory access inside its buffer);
2. the source is *regenerated* from the program and must equal, byte for byte, the source
   the artifact carries, whose SHA-256 must equal ``metadata["source_sha256"]``; the
   constants' SHA-256 is checked the same way;
3. only then is the source written to ``<cache>/byoc_cpu_<sha256>.py`` (once: rewriting it
   would change its mtime and invalidate Numba's cache) and imported. Its fused loops are
   shared files beside it, one per distinct loop body (:mod:`byoc_cpu.loops`), with explicit
   signatures and ``cache=True``, so the first import anywhere compiles a loop and every later
   one (any region, any model, any process) loads the machine code from Numba's cache
   (``__pycache__`` beside the file, or ``NUMBA_CACHE_DIR``): loading the same bundle again
   does not recompile.

The cache folder is the target option ``cache_dir``, else ``$BYOC_CPU_CACHE``, else
``~/.cache/byoc/cpu`` (never a bundle's: ``cache_dir`` is machine-local). Numba's cache index is
a pickle, so the folder is used only when this user owns it, nobody else can write it and byoc-cpu
made it (:func:`check_cache_dir`); otherwise, or when it cannot be written, a private temporary
folder is used (a warning says so, and nothing is cached across processes).
"""

from __future__ import annotations

import importlib.util
import sys
import threading
import time
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from byoc.contract import environment as _env
from byoc.contract import InputError, PluginError
from byoc.contract import Artifact

from byoc_cpu import CODEGEN_VERSION, loops
from byoc_cpu.cache import (  # noqa: F401  (re-exported: the runtime's cache folder API)
    DEFAULT_MAX_MODULES,
    LOOPS_PER_MODULE,
    MARKER,
    cache_dir,
    check_cache_dir,
    evict,
    max_modules,
    write_once,
    writable_dir,
)
from byoc_cpu.artifact import FORMAT, TARGET, sha256, unpack_constants
from byoc_cpu.emit import emit
from byoc_cpu.verify import ProgramError, verify
from byoc_cpu.tuning import THREADS

_lock = threading.Lock()
_modules: dict[str, Any] = {}  # source sha256 -> imported module (one import per process)
def _module_file(folder: Path, source: str, digest: str) -> Path:
    path = write_once(folder / f"byoc_cpu_{digest}.py", source)
    evict(folder, max_modules(), keep=set(_modules) | {digest})
    evict(folder, LOOPS_PER_MODULE * max_modules(), keep=loops.imported(), prefix="byoc_loop_")
    return path


def import_source(source: str, digest: str, folder: Path) -> Any:
    """Import ``source`` (whose SHA-256 is ``digest``) from the cache folder, once per process."""
    with _lock:
        mod = _modules.get(digest)
        if mod is not None:
            return mod
        folder = writable_dir(folder)
        path = _module_file(folder, source, digest)
        name = f"byoc_cpu_generated_{digest[:16]}"
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:  # pragma: no cover
            raise PluginError(f"cpu: cannot import the generated module {str(path)!r}")
        mod = importlib.util.module_from_spec(spec)
        # the file may have been replaced since it was checked: execute the text we verified
        code = compile(source, str(path), "exec")
        sys.modules[name] = mod
        try:
            with loops.folder_for_imports(folder):  # its shared loops live beside it
                exec(code, mod.__dict__)  # noqa: S102 - the verified, regenerated source (see the module doc)
        except BaseException:
            sys.modules.pop(name, None)
            raise
        _modules[digest] = mod
        return mod


class CpuRegion:
    """The callable byoc runs for one region: checks the inputs, lends an arena, calls ``run``."""

    def __init__(self, name: str, module: Any, consts: list[np.ndarray], program: dict[str, Any],
                 load_seconds: float, native: str = "auto"):
        self.name = name
        self.module = module
        self.consts = tuple(consts)
        self.weights = tuple(prepare_weights(program, consts))
        #: whether calls go through ``run_native`` (see :func:`use_native`)
        self.native = hasattr(module, "run_native") and use_native(program, native) and \
            all(w.packed is not None or w.narrow is not None for w in self.weights)
        if self.native:
            packed = tuple(w.narrow if w.narrow is not None else w.packed for w in self.weights)
            narrow = np.array([w.narrow is not None for w in self.weights] or [False])
            run_native = module.run_native

            def run(arena, consts, weights, *inputs):
                return run_native(arena, consts, weights, packed, narrow, *inputs)

            self._run = run
        else:
            self._run = module.run
        self.specs = [(x["name"], tuple(int(d) for d in x["shape"])) for x in program["inputs"]]
        self.arena_size = max(1, int(program["arena"]))
        self.load_seconds = load_seconds

    def _input(self, i: int, x: Any) -> np.ndarray:
        name, shape = self.specs[i]
        a = np.asarray(x)
        if a.dtype != np.float32:
            raise InputError(f"cpu region {self.name!r}: input {name!r} is {a.dtype}, expected float32")
        if a.shape != shape:
            raise InputError(f"cpu region {self.name!r}: input {name!r} has shape {list(a.shape)}, "
                             f"the region was compiled for {list(shape)}")
        if not a.flags.c_contiguous or not a.flags.writeable:
            a = np.array(a, dtype=np.float32, order="C")
        return a.reshape(-1)

    def __call__(self, *inputs: Any) -> list[np.ndarray]:
        if len(inputs) != len(self.specs):
            raise InputError(f"cpu region {self.name!r}: {len(inputs)} inputs, expected {len(self.specs)}")
        flat = [self._input(i, x) for i, x in enumerate(inputs)]
        arena = ARENAS.borrow(self.arena_size)
        try:
            return self._run(arena[:self.arena_size], self.consts, self.weights, *flat)
        finally:
            ARENAS.give_back(arena)


class ArenaPool:
    """Scratch arenas lent to region calls, shared by every region of the process.

    A region's arena holds its intermediate tensors during a call and nothing between calls, so a
    model's regions, and the regions of its shape specialisations, hold none of their own: twenty
    specialisations of an image model would otherwise keep twenty sets of activations. A call
    borrows the smallest idle arena that fits (else a new one) and gives it back; the pool keeps
    the ``max_idle`` largest idle arenas, so warm runs reuse memory whose pages are mapped."""

    def __init__(self, max_idle: int = 4):
        self.max_idle = max_idle
        self._idle: list[np.ndarray] = []  # smallest first
        self._lock = threading.Lock()

    def borrow(self, size: int) -> np.ndarray:
        with self._lock:
            for i, arena in enumerate(self._idle):
                if arena.size >= size:
                    return self._idle.pop(i)
        return np.empty(size, dtype=np.float32)

    def give_back(self, arena: np.ndarray) -> None:
        with self._lock:
            self._idle.append(arena)
            self._idle.sort(key=lambda a: a.size)
            del self._idle[:-self.max_idle]

    def idle_bytes(self) -> int:
        """Bytes held by idle arenas."""
        with self._lock:
            return sum(a.nbytes for a in self._idle)


#: the process's arenas (see :class:`ArenaPool`)
ARENAS = ArenaPool()


#: parallel steps from which ``native="auto"`` compiles a region's steps: each saves a thread
#: hand-off and Python dispatch (~15-30 us a run), the compile costs ~50 ms per step once per
#: region and machine (then Numba's disk cache serves it); below this, tests and small models
#: keep the Python driver
NATIVE_MIN_PAR = THREADS["native_min_parallel"]


def use_native(program: dict[str, Any], mode: str = "auto") -> bool:
    """Whether a region runs its compiled segments (``run_native``, see :mod:`byoc_cpu.emit`):
    the ``native`` option; ``"auto"`` takes ``$BYOC_CPU_NATIVE`` (``0``/``1``) when set, else
    compiles regions with at least :data:`NATIVE_MIN_PAR` parallel steps."""
    if mode == "auto":
        env = _env.get("BYOC_CPU_NATIVE").lower()
        if env in ("0", "off", "false", "no"):
            return False
        if env in ("1", "on", "true", "yes"):
            return True
        return sum(st["kind"] == "par" for st in program["steps"]) >= NATIVE_MIN_PAR
    return mode == "on"


def _widths(steps: list[Any], out: dict[int, int]) -> None:
    """The widest column range each weight is multiplied into, over ``steps`` and their chunks."""
    for st in steps:
        if st.get("kind") == "wgemm":
            lo, hi = st["args"][1:3]
            wi = int(st["w"])
            out[wi] = max(out.get(wi, 0), int(hi) - int(lo))
        for chunk in st.get("chunks", ()):
            _widths(chunk, out)


def prepare_weights(program: dict[str, Any], consts: list[np.ndarray]) -> list[Any]:
    """The GEMM left operands, packed for the micro-kernel where this CPU runs it at full width:
    in the narrow form when every product a weight takes part in has few columns."""
    from byoc_cpu.host.gemm import FULL_WIDTH, prefers_narrow
    from byoc_cpu.blas import Weight

    widths: dict[int, int] = {}
    _widths(program["steps"], widths)
    out = []
    for i, wt in enumerate(program["weights"]):
        _, index, offset, _ = wt["ref"]
        m, k = int(wt["m"]), int(wt["k"])
        narrow = i in widths and prefers_narrow(widths[i], m)
        out.append(Weight(consts[int(index)], int(offset), m, k, int(wt["ld"]), FULL_WIDTH, narrow))
    return out


def load(artifact: Artifact, options: Mapping[str, Any] | None = None) -> CpuRegion:
    """Verify ``artifact`` and return its callable (see the module documentation)."""
    t0 = time.perf_counter()
    meta = artifact.metadata
    name = str(meta.get("region", "?"))
    if artifact.target != TARGET or artifact.format != FORMAT:
        raise PluginError(f"cpu: artifact of region {name!r} is {artifact.target}/{artifact.format}, "
                          f"expected {TARGET}/{FORMAT}")
    if meta.get("codegen") != CODEGEN_VERSION:
        raise PluginError(f"cpu: region {name!r} was generated by code generator version {meta.get('codegen')!r}; "
                          f"this byoc-cpu writes version {CODEGEN_VERSION}: recompile the model")
    program = meta.get("program")
    try:
        verify(program)
    except ProgramError as exc:
        raise PluginError(f"cpu: region {name!r}: the artifact's program is invalid: {exc}") from None
    if [x["name"] for x in program["inputs"]] != list(artifact.input_names) or \
            [x["name"] for x in program["outputs"]] != list(artifact.output_names):
        raise PluginError(f"cpu: region {name!r}: the program's inputs/outputs differ from the artifact's")
    source = emit(program)
    digest = sha256(source.encode("utf-8"))
    if meta.get("source") != source or meta.get("source_sha256") != digest:
        raise PluginError(f"cpu: region {name!r}: the artifact's source is not the source byoc-cpu generates from "
                          f"its program (edited or from another version); refusing to run it")
    if meta.get("constants_sha256") != sha256(artifact.data):
        raise PluginError(f"cpu: region {name!r}: the constants do not match their SHA-256")
    consts = unpack_constants(artifact.data, program)
    module = import_source(source, digest, cache_dir(options))
    return CpuRegion(name, module, consts, program, time.perf_counter() - t0,
                     native=str((options or {}).get("native", "auto")))


__all__ = ["CpuRegion", "cache_dir", "check_cache_dir", "evict", "import_source", "load"]
