"""Errors, devices, threads, pickling, the info calls and Buffer."""

import os
import pickle
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import torch

import tilejit
from conftest import bf16, bf16_to_u16


class FakeCuda:
    """A DLPack producer on device (kDLCUDA, 0): refused before __dlpack__."""

    def __init__(self):
        self.exported = False

    def __dlpack_device__(self):
        return (2, 0)

    def __dlpack__(self, stream=None):
        self.exported = True
        raise AssertionError("a non-CPU tensor must be refused before it is exported")


@pytest.fixture(scope="module")
def pw():
    return tilejit.pack_weight(bf16((16, 32), 1))


def test_error_is_an_exception_class():
    assert issubclass(tilejit.Error, Exception)
    assert issubclass(tilejit.InternalError, tilejit.Error)


def test_non_dlpack_object(pw):
    with pytest.raises(tilejit.Error, match="x: an object of type 'list' is not a DLPack tensor"):
        tilejit.gemm([[1.0] * 32], pw, out=torch.empty(1, 16))
    with pytest.raises(tilejit.Error, match="out: an object of type 'str'"):
        tilejit.gemm(bf16((1, 32), 2), pw, out="y")


def test_wrong_device(pw):
    fake = FakeCuda()
    with pytest.raises(tilejit.Error, match=r"x: a tensor on DLPack device \(2, 0\) \(CUDA\); "
                                            "tilejit runs on CPU memory only"):
        tilejit.gemm(fake, pw, out=torch.empty(1, 16))
    assert not fake.exported


def test_wrong_dtype_is_the_library_text(pw):
    # The C++ check's message, unchanged.
    with pytest.raises(tilejit.Error) as e:
        tilejit.gemm(torch.zeros(1, 32), pw)
    assert str(e.value) == "gemm: x.dtype=f32 is not allowed; allowed: bf16"
    with pytest.raises(tilejit.Error, match=r'uint16 array holding bfloat16 needs dtype="bf16"'):
        tilejit.gemm(np.zeros((1, 32), np.uint16), pw)
    with pytest.raises(tilejit.Error, match=r"has no tilejit type"):
        tilejit.gemm(np.zeros((1, 32), np.complex64), pw)
    with pytest.raises(tilejit.Error, match=r"dtype: 'f16' is not allowed; allowed: None"):
        tilejit.gemm(np.zeros((1, 32), np.uint16), pw, dtype="f16")
    with pytest.raises(tilejit.Error, match='act: "swish" is not allowed; allowed: none, relu, '
                                            "silu, gelu_tanh, gelu_erf"):
        tilejit.gemm(bf16((1, 32), 3), pw, act="swish")
    with pytest.raises(tilejit.Error, match="w: expected a tilejit.PackedWeight"):
        tilejit.gemm(bf16((1, 32), 3), bf16((16, 32), 4), out=torch.empty(1, 16))
    with pytest.raises(tilejit.Error, match="x: expected 2 dims"):
        tilejit.gemm(bf16((32,), 3), pw)


def test_readonly_numpy_is_an_error_not_a_crash(pw):
    a = bf16_to_u16(bf16((1, 32), 5)).copy()
    a.setflags(write=False)
    with pytest.raises(tilejit.Error, match="x: __dlpack__.*failed"):
        tilejit.gemm(a, pw, dtype="bf16")


def test_many_bad_calls_leave_the_interpreter_working(pw):
    bad = [None, 3, object(), torch.zeros(2, 2, 2), np.zeros(4, np.float64), FakeCuda()]
    for x in bad:
        with pytest.raises(tilejit.Error):
            tilejit.gemm(x, pw, out=torch.empty(1, 16))
    y = tilejit.gemm(bf16((1, 32), 6), pw)
    assert y.shape == (1, 16)


def test_requires_grad_parameters_pack():
    w = torch.nn.Parameter(bf16((8, 32), 7))  # torch's __dlpack__ refuses these; tilejit reads them
    assert torch.equal(tilejit.pack_weight(w).unpack(), w.detach())


def test_pickling_packed_experts_refused():
    p = tilejit.pack_experts(bf16((2, 64, 32), 8), "gate_up")
    with pytest.raises(tilejit.Error, match="PackedExperts cannot be pickled"):
        pickle.dumps(p)


def test_threads_concurrent_gemm_correct():
    # Several Python threads calling gemm at once (the GIL is released in the
    # C++ call): every result equals the same call made alone.
    weights = [tilejit.pack_weight(bf16((64, 96), 10 + i)) for i in range(4)]
    xs = [bf16((9, 96), 20 + i) for i in range(8)]
    expected = {(i, j): tilejit.gemm(xs[j], weights[i]) for i in range(4) for j in range(8)}
    errors = []

    def worker(i):
        try:
            for _ in range(5):
                for j in range(8):
                    y = tilejit.gemm(xs[j], weights[i])
                    if not torch.equal(y, expected[(i, j)]):
                        errors.append((i, j))
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_cpu_info_and_cache_stats():
    info = tilejit.cpu_info()
    assert info["isa"] in ("scalar", "llvm", "avx512", "amx")
    assert info["max_isa"] in ("scalar", "llvm", "avx512", "amx")
    assert isinstance(info["vendor"], str) and isinstance(info["amx_bf16"], bool)
    assert info["num_threads"] == tilejit.num_threads()
    before = tilejit.cache_stats()
    assert set(before) >= {"hits", "misses", "compiles", "compile_seconds", "kernels",
                           "disk_loads", "disk_stores", "disk_dir", "tuned_plans",
                           "disk_evictions"}
    tilejit.gemm(bf16((3, 64), 30), tilejit.pack_weight(bf16((8, 64), 31)))
    after = tilejit.cache_stats()
    assert after["hits"] + after["misses"] > before["hits"] + before["misses"]


def test_load_tuning_db_error_is_the_library_text(tmp_path):
    bad = tmp_path / "db.json"
    bad.write_text("not json")
    with pytest.raises(tilejit.Error, match=str(bad)):
        tilejit.load_tuning_db(str(bad))


def test_set_num_threads():
    tilejit.set_num_threads(1)
    assert tilejit.num_threads() == 1
    assert tilejit.cpu_info()["num_threads"] == 1
    with pytest.raises(tilejit.Error) as e:
        tilejit.set_num_threads(0)
    assert str(e.value) == "set_num_threads: n=0 is not allowed; allowed: 1 to 4096"


def test_env_knobs_read_at_first_call():
    # TILEJIT_ISA / TILEJIT_NUM_THREADS set before the first call apply (a
    # fresh interpreter: the path is chosen once per process).
    env = dict(os.environ, TILEJIT_ISA="scalar", TILEJIT_NUM_THREADS="1")
    code = "import tilejit; i = tilejit.cpu_info(); print(i['isa'], i['num_threads'])"
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["scalar", "1"]


def test_import_needs_neither_torch_nor_numpy():
    code = ("import sys, tilejit; assert 'torch' not in sys.modules and 'numpy' not in "
            "sys.modules, sorted(m for m in sys.modules if m in ('torch', 'numpy')); "
            "b = tilejit.Buffer([2, 3], 'f32'); print(b.shape, b.dtype)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "(2, 3) f32"


def test_buffer_dlpack():
    b = tilejit.Buffer([3, 4], "f32")
    assert b.shape == (3, 4) and b.strides == (4, 1) and b.dtype == "f32"
    a = np.from_dlpack(b)
    assert a.shape == (3, 4) and (a == 0).all()
    torch.from_dlpack(b)[1, 2] = 5.0  # zero-copy: the same memory (numpy's import is read-only)
    assert a[1, 2] == 5.0
    u = np.asarray(tilejit.Buffer([2, 3], "bf16"))  # the buffer protocol: bf16 bits as uint16
    assert u.dtype == np.uint16 and u.shape == (2, 3) and u.flags.writeable
    b.__dlpack__()  # an unconsumed capsule frees its reference on its own
    assert b.__dlpack_device__() == (1, 0)
    with pytest.raises(tilejit.Error, match='dtype: "float" is not allowed') as e:
        tilejit.Buffer([1], "float")
    # The allowed list is what a Buffer holds: no 4-bit types (no DLPack type).
    assert "i64" in str(e.value) and "u4" not in str(e.value) and "f4e2m1" not in str(e.value)
    with pytest.raises(tilejit.Error, match='dtype: "u4" is not allowed'):
        tilejit.Buffer([2], "u4")
    with pytest.raises(tilejit.Error, match="shape"):
        tilejit.Buffer([-1], "f32")
    assert tilejit.__version__.count(".") == 2


class MlDtypesBf16:
    """Stands for an ml_dtypes bfloat16 numpy array: numpy cannot export the
    dtype through DLPack, the same bytes viewed as uint16 can."""

    def __init__(self, bits):
        self.bits = bits
        self.dtype = "bfloat16"

    def __dlpack__(self, stream=None):
        raise BufferError("DLPack only supports signed/unsigned integers, float and complex")

    def __dlpack_device__(self):
        return (1, 0)

    def view(self, dtype):
        assert dtype == "uint16"
        return self.bits


def test_ml_dtypes_bfloat16_arrays_are_bf16():
    x, w = bf16((2, 32), 40), bf16((8, 32), 41)
    pw = tilejit.pack_weight(MlDtypesBf16(bf16_to_u16(w)))  # no dtype="bf16" needed
    assert torch.equal(torch.from_dlpack(pw.unpack()), w)  # a tilejit.Buffer: neither kind
    y = tilejit.gemm(MlDtypesBf16(bf16_to_u16(x)), pw, out=torch.empty(2, 8))
    assert torch.equal(y, tilejit.gemm(x, tilejit.pack_weight(w), out=torch.empty(2, 8)))


def test_gil_released_during_the_kernel():
    # While one thread is inside a long tilejit call, another runs Python:
    # impossible if the call held the GIL (no Python code runs without it).
    tilejit.set_num_threads(1)
    w = tilejit.pack_weight(bf16((2048, 2048), 50))
    x = bf16((512, 2048), 51)
    out = torch.empty(512, 2048)
    tilejit.gemm(x, w, out=out)  # compiled and warm
    window = []

    def worker():
        t0 = time.perf_counter()
        tilejit.gemm(x, w, out=out)
        window.extend([t0, time.perf_counter()])

    samples = []
    t = threading.Thread(target=worker)
    t.start()
    while t.is_alive():
        samples.append(time.perf_counter())
    t.join()
    t0, t1 = window
    inside = [s for s in samples if t0 < s < t1]
    assert len(inside) > 10, f"{len(inside)} samples in a {1e3 * (t1 - t0):.1f} ms call"


def test_import_in_a_subinterpreter_is_an_import_error():
    # A first import of the pybind11 extension in a subinterpreter hung in
    # PyGILState_Ensure; now an ImportError, in a child that must not hang.
    subs = pytest.importorskip("_xxsubinterpreters")
    del subs
    path = os.path.dirname(os.path.dirname(tilejit.__file__))
    inner = (f"import sys\nsys.path.insert(0, {path!r})\n"
             "try:\n    import tilejit\n    print('imported')\n"
             "except ImportError as e:\n    print('ImportError:', e)\n")
    code = f"import _xxsubinterpreters as s\ns.run_string(s.create(), {inner!r})\n"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "ImportError: tilejit cannot be imported in a Python subinterpreter" in r.stdout


def test_batch_invariant_mode_rows_alone_equal_rows_in_a_batch():
    """set_batch_invariant(True): each gemm row alone = in a batch of 77, bit
    for bit (K 2600: two K chunks; M tails of 1 row); a non-bool is refused."""
    saved = tilejit.batch_invariant()
    try:
        tilejit.set_batch_invariant(True)
        assert tilejit.batch_invariant() is True
        g = torch.Generator().manual_seed(5)
        x = torch.randn(77, 2600, generator=g).to(torch.bfloat16)
        w = tilejit.pack_weight(torch.randn(200, 2600, generator=g).to(torch.bfloat16))
        y = tilejit.gemm(x, w)
        for r in range(77):
            assert torch.equal(tilejit.gemm(x[r:r + 1], w)[0], y[r]), r
        with pytest.raises(tilejit.Error, match=r"set_batch_invariant: on=1 \(a int\); allowed: "
                           r"a Python bool, True or False"):
            tilejit.set_batch_invariant(1)
    finally:
        tilejit.set_batch_invariant(saved)
    assert tilejit.batch_invariant() is saved
