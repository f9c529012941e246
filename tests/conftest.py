"""Suite-wide settings. The suite runs on pytest-xdist workers, one per core (`-n 2` in pyproject.toml): each
worker, and each process a test starts, computes on one thread (torch and BLAS), so the workers do not fight over
the cores (a 2048-d FID eigendecomposition takes ~1.5 s on one BLAS thread, ~20 s with threads spinning against
another busy process)."""

import os

import pytest

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


@pytest.fixture
def fresh_accelerate_state():
    """After the test, accelerate's process-wide state is reset, so the next in-process training starts as a fresh
    process would (a module asks for it: ``pytestmark = pytest.mark.usefixtures("fresh_accelerate_state")``)."""
    from tinydata import reset_accelerate  # numpy: imported after the thread settings above

    yield
    reset_accelerate()
