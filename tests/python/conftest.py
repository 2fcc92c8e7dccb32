"""Shared helpers of the tilejit Python tests.

The module under test is the one on PYTHONPATH (ctest's python_tests sets it
to <build>/python); run by hand, e.g.
    PYTHONPATH=build/python /usr/bin/python3 -m pytest tests/python
"""

import numpy as np
import pytest
import torch

import tilejit

# Every test starts with the same thread count (a test of set_num_threads
# restores it too).
_THREADS = tilejit.num_threads()


@pytest.fixture(autouse=True)
def _restore_threads():
    yield
    tilejit.set_num_threads(_THREADS)


def bf16_to_u16(t):
    """A torch bf16 tensor's bits as a numpy uint16 array (numpy has no bf16)."""
    return t.contiguous().view(torch.int16).numpy().view(np.uint16)


def u16_to_f64(a):
    """numpy uint16 bf16 bits -> float64 values."""
    return (np.asarray(a, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def to_f64(t):
    """torch (any dtype) or numpy float array -> numpy float64."""
    if isinstance(t, torch.Tensor):
        return t.detach().to(torch.float64).numpy()
    return np.asarray(t, dtype=np.float64)


def bf16(shape, seed, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * scale).to(torch.bfloat16)
