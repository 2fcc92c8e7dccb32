"""The DLPack consumer side, with a producer written here in ctypes: NULL
strides, byte_offset, the capsule renamed "used_dltensor", the deleter
called exactly once (also when the tensor is refused), bad dtypes/devices
found in the DLTensor itself."""

import ctypes

import numpy as np
import pytest
import torch

import tilejit
from conftest import bf16, bf16_to_u16, to_f64


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int), ("device_id", ctypes.c_int)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int),
                ("dtype", DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class DLManagedTensor(ctypes.Structure):
    pass


DELETER = ctypes.CFUNCTYPE(None, ctypes.POINTER(DLManagedTensor))
DLManagedTensor._fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p),
                            ("deleter", DELETER)]

_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_capsule_name = ctypes.pythonapi.PyCapsule_GetName
_capsule_name.restype = ctypes.c_char_p
_capsule_name.argtypes = [ctypes.py_object]


class Producer:
    """Exports `base` (a numpy array, kept alive here) as shape/strides/
    byte_offset/dtype chosen by the test; counts deleter calls."""

    def __init__(self, base, shape, strides=None, byte_offset=0, code=4, bits=16, lanes=1,
                 device=(1, 0), ndim=None, data=None):
        self.base, self.deleted, self.capsule, self.exports = base, 0, None, 0
        self.shape = (ctypes.c_int64 * len(shape))(*shape)
        self.strides = None if strides is None else (ctypes.c_int64 * len(strides))(*strides)
        self.managed = DLManagedTensor()
        t = self.managed.dl_tensor
        t.data = base.ctypes.data if data is None else data
        t.device = DLDevice(*device)
        t.ndim = len(shape) if ndim is None else ndim  # ndim: a producer that lies
        t.dtype = DLDataType(code, bits, lanes)
        t.shape = self.shape
        t.strides = self.strides  # None: a NULL pointer (compact row-major)
        t.byte_offset = byte_offset

        def deleter(_):
            self.deleted += 1

        self.deleter = DELETER(deleter)
        self.managed.deleter = self.deleter

    def __dlpack__(self, stream=None):
        self.exports += 1
        self.capsule = _capsule_new(ctypes.addressof(self.managed), b"dltensor", None)
        return self.capsule


def test_null_strides_byte_offset_and_the_protocol():
    k, n = 32, 8
    rows = bf16((4, k), 1)
    # The tensor is rows 1..2 of the buffer: byte_offset skips row 0, NULL strides.
    p = Producer(bf16_to_u16(rows).copy(), shape=(2, k), byte_offset=2 * k)
    w = bf16((n, k), 2)
    out = torch.empty(2, n)
    tilejit.gemm(p, tilejit.pack_weight(w), out=out)
    expected = torch.empty(2, n)
    tilejit.gemm(rows[1:3], tilejit.pack_weight(w), out=expected)
    assert torch.equal(out, expected)
    assert p.deleted == 1  # the consumer calls the deleter, once
    assert _capsule_name(p.capsule) == b"used_dltensor"


def test_explicit_strides_in_elements():
    base = bf16_to_u16(bf16((6, 64), 3)).copy()
    p = Producer(base, shape=(3, 32), strides=(128, 1))  # every other row, first half
    w = bf16((8, 32), 4)
    out = tilejit.gemm(p, tilejit.pack_weight(w), out_dtype="f32")
    ref = to_f64(torch.from_numpy(base.view(np.int16)).view(torch.bfloat16)[::2, :32]) @ to_f64(w).T
    assert np.abs(np.from_dlpack(out) - ref).max() <= 2.0**-16 * np.abs(ref).max() * 32


@pytest.mark.parametrize("kw,match", [
    ({"device": (2, 0)}, r"DLPack device \(2, 0\) \(CUDA\)"),
    ({"lanes": 2}, r"\(code 4, 16 bits, 2 lanes\) has no tilejit type"),
    ({"code": 2, "bits": 64}, r"\(code 2, 64 bits, 1 lanes\) has no tilejit type"),
])
def test_refused_in_the_dltensor_still_deleted(kw, match):
    p = Producer(np.zeros((2, 32), np.uint16), shape=(2, 32), **kw)
    with pytest.raises(tilejit.Error, match=match):
        tilejit.gemm(p, tilejit.pack_weight(bf16((8, 32), 5)), out=torch.empty(2, 8))
    assert p.deleted == 1


def test_a_used_capsule_is_refused():
    class Reuses:
        def __init__(self):
            self.cap = torch.zeros(1, 32, dtype=torch.bfloat16).__dlpack__()

        def __dlpack__(self, stream=None):
            return self.cap

    r = Reuses()
    pw = tilejit.pack_weight(bf16((8, 32), 6))
    tilejit.gemm(r, pw, out=torch.empty(1, 8))
    with pytest.raises(tilejit.Error, match='did not return an unused "dltensor" capsule'):
        tilejit.gemm(r, pw, out=torch.empty(1, 8))


# ---- What a producer can get wrong, checked before it is used ------------------

def _x_and_weight():
    x = bf16_to_u16(bf16((5, 72), 7)).copy()
    return x, tilejit.pack_weight(bf16((33, 72), 8))


@pytest.mark.parametrize("ndim", [65, 100, 1_000_000])
def test_ndim_past_the_cap_is_refused_before_the_shape_is_read(ndim):
    # A 2-entry shape array declared ndim deep: the shape was read ndim
    # entries deep (1_000_000: a segfault; 100: 98 words of other memory
    # printed in the message).
    x, pw = _x_and_weight()
    p = Producer(x, shape=(5, 72), ndim=ndim)
    with pytest.raises(tilejit.Error) as e:
        tilejit.gemm(p, pw, out=torch.empty(5, 33))
    assert str(e.value) == f"x: DLPack ndim {ndim} is not allowed; allowed: 0 to 64 dims"
    assert p.deleted == 1


@pytest.mark.parametrize("data,offset,match", [
    (None, 2**63, r"x: DLPack data 0x[0-9a-f]+ \+ byte_offset 9223372036854775808 is past the user "
                  r"address space \(which ends at 0x(8|1)0+\); allowed: data \+ byte_offset below"),
    (None, 2**64 - 8, r"x: DLPack data 0x[0-9a-f]+ \+ byte_offset 18446744073709551608 is past"),
    (0, 64, r"x: DLPack data is null with byte_offset 64; allowed: byte_offset 0 with null data"),
])
def test_byte_offset_is_checked_before_use(data, offset, match):
    # 2**63: a segfault; 2**64 - 8: data + byte_offset wraps to just below
    # data (a read of other memory); null + 64: address 0x40.
    x, pw = _x_and_weight()
    p = Producer(x, shape=(5, 72), byte_offset=offset, data=data)
    with pytest.raises(tilejit.Error, match=match):
        tilejit.gemm(p, pw, out=torch.empty(5, 33))
    assert p.deleted == 1


def test_a_negative_dim_is_named_as_the_shape_before_strides_or_allocation():
    x, pw = _x_and_weight()
    # out: the row-major strides derived from [5, -33] were blamed
    # ("gemm: y has strides [-33, 1]").
    out = Producer(np.zeros(165, np.uint16), shape=(5, -33))
    with pytest.raises(tilejit.Error) as e:
        tilejit.gemm(x, pw, out=out, dtype="bf16")
    assert str(e.value) == "out: DLPack shape [5, -33] has dim 1 = -33; allowed: dims >= 0"
    # x with out=None: the output was allocated from the shape first
    # ("Buffer: shape[0] = -5 is not allowed").
    with pytest.raises(tilejit.Error) as e:
        tilejit.gemm(Producer(x, shape=(-5, 72)), pw)
    assert str(e.value) == "x: DLPack shape [-5, 72] has dim 0 = -5; allowed: dims >= 0"


def test_an_output_is_not_allocated_from_a_dim_past_the_limit():
    # A torch view may have a dim of 2^31 (stride 0); its [2^31, N] output
    # was allocated before the operator refused x.
    x = torch.zeros(1, 72, dtype=torch.bfloat16).expand(2**31, 72)
    with pytest.raises(tilejit.Error) as e:
        tilejit.gemm(x, tilejit.pack_weight(bf16((33, 72), 8)))
    assert str(e.value) == ("x: shape [2147483648, 72] has dim 0 = 2147483648; allowed: dims "
                            "from 0 to 2147483647 (2^31 - 1)")


def test_a_producer_is_exported_once_per_call():
    # The Python layer reads a non-torch / numpy tensor's shape (to size an
    # output) and shape and dtype (for unpack) from the call's own export: a
    # producer handing out a single capsule failed with "did not return an
    # unused capsule" (its __dlpack__ was called twice).
    x, pw = _x_and_weight()
    p = Producer(x, shape=(5, 72))
    y = tilejit.gemm(p, pw)
    assert p.exports == 1 and p.deleted == 1
    assert torch.equal(torch.from_dlpack(y), tilejit.gemm(torch.from_numpy(x.view(np.int16)).view(
        torch.bfloat16), pw))

    q = Producer(bf16_to_u16(bf16((6, 4, 64), 9)).copy(), shape=(6, 4, 64))
    kv = Producer(bf16_to_u16(bf16((6, 2, 64), 10)).copy(), shape=(6, 2, 64))
    cu = np.array([0, 6], np.int32)
    o = tilejit.flash_attn_varlen(q, kv, kv, cu, cu, causal=True)
    assert o.shape == (6, 4, 64)
    assert (q.exports, kv.exports) == (1, 2)  # kv is passed twice, as k and v

    w = Producer(bf16_to_u16(bf16((16, 32), 11)).copy(), shape=(16, 32))
    packed = tilejit.pack_weight(w)
    assert w.exports == 1
    assert np.array_equal(np.asarray(packed.unpack()), w.base)

    weights = [Producer(np.full((16, 32), e + 1, np.int8), shape=(16, 32), code=0, bits=8)
               for e in range(2)]
    scales = [Producer(np.ones(16, np.float32), shape=(16,), code=2, bits=32) for _ in range(2)]
    pe = tilejit.pack_experts_int8(list(zip(weights, scales)), proj="down")
    assert [p.exports for p in weights + scales] == [1, 1, 1, 1]
    assert np.array_equal(np.asarray(pe.unpack()[1][0]), weights[1].base)

    # What is not a tensor is named as the call names it.
    for call in (lambda: tilejit.gemm([1, 2], pw), lambda: tilejit.pack_int8("w", None),
                 lambda: tilejit.flash_attn_varlen(None, kv, kv, cu, cu),
                 lambda: tilejit.pack_experts_int8([(np.zeros((16, 32), np.int8), [1])])):
        with pytest.raises(tilejit.Error, match=r"^(x|weight|q|w\[0\]\.scales): an object of "
                                                r"type '(list|str|NoneType)' is not a DLPack"):
            call()

    qw = Producer(np.zeros((8, 16), np.int32), shape=(8, 16), code=0, bits=32)
    sc = Producer(np.ones((1, 16), np.float16), shape=(1, 16), code=2, bits=16)
    tilejit.pack_experts_int4([{"qweight": qw, "scales": sc}], group_size=-1, proj="down")
    assert (qw.exports, sc.exports) == (1, 1)


def test_numpy_reads_buffers_but_bf16_through_the_buffer_protocol():
    # docs/python.md: numpy has no bfloat16, so numpy.from_dlpack refuses a
    # bf16 Buffer; numpy.asarray gives its bits as uint16, torch its values.
    f = tilejit.Buffer([2, 3], "f32")
    assert np.from_dlpack(f).dtype == np.float32
    b = tilejit.Buffer([2, 3], "bf16")
    with pytest.raises(RuntimeError, match="Unsupported dtype"):
        np.from_dlpack(b)
    assert np.asarray(b).dtype == np.uint16
    assert torch.from_dlpack(b).dtype == torch.bfloat16
