"""Where the pool's shared words live (:mod:`byoc_cpu.host.threads` and its nogil loops in
:mod:`byoc_cpu.host._spin`): int64 slots a cache line apart. ``POSTED``: twice the generation of
the last job posted, plus one for a compiled job; ``DONE``: the last Python job a helper
finished; ``FN``, ``ARGS``: a compiled job's function and argument block; ``OPEN``: the posted
value of the compiled job still open (0 once closed); ``ACTIVE``: how many helpers are inside it."""

POSTED, DONE, FN, ARGS, OPEN, ACTIVE = 0, 8, 16, 17, 24, 32
WORDS = 40
