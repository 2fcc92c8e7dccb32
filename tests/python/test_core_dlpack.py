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
                 device=(1, 0)):
        self.base, self.deleted, self.capsule = base, 0, None
        self.shape = (ctypes.c_int64 * len(shape))(*shape)
        self.strides = None if strides is None else (ctypes.c_int64 * len(strides))(*strides)
        self.managed = DLManagedTensor()
        t = self.managed.dl_tensor
        t.data = base.ctypes.data
        t.device = DLDevice(*device)
        t.ndim = len(shape)
        t.dtype = DLDataType(code, bits, lanes)
        t.shape = self.shape
        t.strides = self.strides  # None: a NULL pointer (compact row-major)
        t.byte_offset = byte_offset

        def deleter(_):
            self.deleted += 1

        self.deleter = DELETER(deleter)
        self.managed.deleter = self.deleter

    def __dlpack__(self, stream=None):
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
