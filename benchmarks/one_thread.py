"""Import first: one BLAS/OpenMP thread for the in-process benchmarks.

As in a simulated client (Ray starts an actor with num_cpus=1 with
OMP_NUM_THREADS=1); on a loaded 2-core machine a multithreaded BLAS turns
every ``np.linalg.norm`` into a lottery. Must run before numpy is imported.
Not used by the scripts that start Flower runs: their processes keep the
environment Flower gives them.
"""

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")
