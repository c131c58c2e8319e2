import os

# Numba parallel threads and OpenBLAS threads must not oversubscribe the cores.
os.environ.setdefault("OMP_NUM_THREADS", "1")
