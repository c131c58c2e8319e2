"""The ``cpu`` target's options, declared once (``byoc.compile(..., target_options={"cpu": {...}})``).

byoc validates every value against these declarations (an unknown key or a bad value raises
:class:`byoc.OptionError`) and hands the hooks the full set, defaults filled in.
"""

from __future__ import annotations

from byoc.contract import Option, option_defaults

OPTIONS = [
    Option("fuse", True, type=bool,
           doc="fuse elementwise chains into GEMM epilogues and into single loops (False: one loop per node)"),
    Option("concat_in_place", True, type=bool,
           doc="let producers write straight into a Concat's buffer when the pieces are contiguous"),
    Option("conv_strategy", "auto", choices=("auto", "im2col", "shift", "direct", "winograd", "blocked", "phase"),
           doc='"auto" picks per Conv; "im2col" / "shift" / "direct" / "winograd" / "blocked" / "phase" (strided: '
               'the shift strategy over stride phases) force one where it applies (for tests and comparisons)'),
    Option("threads", None, type=int, minimum=1, machine_local=True,
           doc="threads the generated code splits GEMMs and loops for (None: byoc's pool size, BYOC_NUM_THREADS)"),
    Option("native", "auto", choices=("auto", "on", "off"), machine_local=True,
           doc='run a region\'s steps in compiled functions, one thread hand-off per run of steps and no Python '
               'between them ("on"; compiled once per region, then cached on disk), or from the Python driver '
               '("off"); "auto": $BYOC_CPU_NATIVE (0 or 1) if set, else "on" for regions with at least '
               '8 parallel steps, where it pays for its compile time'),
    Option("cache_dir", None, type=str, machine_local=True,
           doc="where generated modules and Numba's machine code are cached (None: $BYOC_CPU_CACHE or "
               "~/.cache/byoc/cpu)"),
]

#: ``{name: default}``
DEFAULTS = option_defaults(OPTIONS)

__all__ = ["DEFAULTS", "OPTIONS"]
