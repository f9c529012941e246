"""Suite-wide settings. The suite runs on pytest-xdist workers, one per core (`-n 2` in pyproject.toml): each
worker, and each process a test starts, computes on one thread (torch and BLAS), so the workers do not fight over
the cores (a 2048-d FID eigendecomposition takes ~1.5 s on one BLAS thread, ~20 s with threads spinning against
another busy process)."""

import os

if os.environ.get("PYTEST_XDIST_WORKER"):
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, "1")

    import torch

    torch.set_num_threads(1)
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # numpy then keeps the thread count it read from the variables above at its import
        pass
    else:
        threadpool_limits(1)
