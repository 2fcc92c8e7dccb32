"""What a tilejit call from Python costs over the C++ call (docs/python.md).

    PYTHONPATH=build/python /usr/bin/python3 tests/python/overhead_bench.py

A tiny GEMM (M = 1, N = 64, K = 64, bf16, caller-given output): the C++
time per call is tilejit::gemm in a C++ loop on views converted once
(_core._time_gemm_ns); the Python time is tilejit.gemm(x, w, out=y) in a
Python loop (argument conversion through DLPack, GIL release, the
pure-Python layer). Medians of 7 runs of 20000 calls, one thread.
"""

import statistics
import sys
import time

import numpy as np
import torch

import tilejit


def per_call_ns(fn, iters):
    fn()
    t0 = time.perf_counter_ns()
    for _ in range(iters):
        fn()
    return (time.perf_counter_ns() - t0) / iters


def main():
    iters, runs = 20000, 7
    tilejit.set_num_threads(1)
    w = tilejit.pack_weight(torch.randn(64, 64).bfloat16())
    rows = []
    for name, x, y, dt in [
        ("torch", torch.randn(1, 64).bfloat16(), torch.empty(1, 64, dtype=torch.bfloat16), None),
        ("numpy", np.zeros((1, 64), np.uint16), np.zeros((1, 64), np.uint16), "bf16"),
    ]:
        cpp = statistics.median(tilejit._core._time_gemm_ns(x, w, y, iters, dt)
                                for _ in range(runs))
        py = statistics.median(per_call_ns(lambda: tilejit.gemm(x, w, out=y, dtype=dt), iters)
                               for _ in range(runs))
        core = statistics.median(
            per_call_ns(lambda: tilejit._core.gemm(x, w, y, None, "none", "dynamic_sym", 0.0,
                                                   128, "automatic", dt), iters) for _ in range(runs))
        alloc = statistics.median(per_call_ns(lambda: tilejit.gemm(x, w, dtype=dt), iters)
                                  for _ in range(runs))
        rows.append((name, cpp, core, py, alloc))
    print(f"{'tensors':8} {'C++ call':>10} {'_core.gemm':>11} {'tilejit.gemm':>13} "
          f"{'overhead':>9} {'out=None':>9}   (us per call)")
    for name, cpp, core, py, alloc in rows:
        print(f"{name:8} {cpp / 1e3:10.2f} {core / 1e3:11.2f} {py / 1e3:13.2f} "
              f"{(py - cpp) / 1e3:9.2f} {alloc / 1e3:9.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
