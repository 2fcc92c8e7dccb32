"""tilejit.gemm and the weight packers from torch and numpy, against float64
references computed here.

Tolerances (bf16 inputs, fp32 accumulation): a bf16 output is rounded once,
within 2^-9 relative (2^-8 allows the nearest-even tie either way); the fp32
sum over K is off by at most ~K·2^-24·Σ|x·w|, bounded here by 2^-16·Σ|x·w|
(K ≤ 512). Quantized paths add their own term, stated per test.
"""

import copy
import pickle

import numpy as np
import pytest
import torch

import tilejit
from conftest import bf16, bf16_to_u16, to_f64, u16_to_f64


def ref_linear(x, w, bias=None, act="none"):
    y = to_f64(x) @ to_f64(w).T
    if bias is not None:
        y = y + to_f64(bias)
    if act == "silu":
        y = y / (1 + np.exp(-y))
    elif act == "relu":
        y = np.maximum(y, 0)
    elif act == "relu2":
        y = np.maximum(y, 0) ** 2
    return y


def bound(x, w, y_ref, out_bf16=True, extra=0.0):
    mag = np.abs(to_f64(x)) @ np.abs(to_f64(w)).T
    return (2.0**-8 * np.abs(y_ref) if out_bf16 else 0) + 2.0**-16 * mag + extra + 1e-30


def check(y, y_ref, tol):
    err = np.abs(to_f64(y) - y_ref)
    assert (err <= tol).all(), f"max err {err.max()} (bound {tol.flat[np.argmax(err - tol)]})"


@pytest.mark.parametrize("m,n,k", [(1, 64, 64), (5, 17, 40), (33, 130, 96)])
def test_gemm_torch_bf16(m, n, k):
    x, w = bf16((m, k), 1), bf16((n, k), 2)
    pw = tilejit.pack_weight(w)
    assert (pw.n, pw.k, pw.format, pw.dtype) == (n, k, "bf16", "bf16")
    assert pw.packed_bytes >= n * k * 2 and pw.layout.startswith("bf16_")
    y = tilejit.gemm(x, pw)
    assert isinstance(y, torch.Tensor) and y.dtype == torch.bfloat16 and y.shape == (m, n)
    ref = ref_linear(x, w)
    check(y, ref, bound(x, w, ref))


def test_gemm_torch_f32_out_bias_silu():
    x, w = bf16((7, 48), 3), bf16((20, 48), 4)
    bias = torch.randn(20, generator=torch.Generator().manual_seed(5))
    y = tilejit.gemm(x, tilejit.pack_weight(w), bias=bias, act="silu", out_dtype="f32")
    assert y.dtype == torch.float32
    ref = ref_linear(x, w, bias, "silu")
    check(y, ref, bound(x, w, ref, out_bf16=False))


def test_gemm_relu2_nemotron_up_projection():
    # Squared ReLU (Nemotron-H's MLP): relu2's slope 2|y| stretches the dot
    # product's error e to (2|y| + 3e)·e (runtime::activation_error).
    x, w = bf16((5, 96), 11), bf16((70, 96), 12)
    y = tilejit.gemm(x, tilejit.pack_weight(w), act="relu2", out_dtype="f32")
    pre = ref_linear(x, w)
    ref = ref_linear(x, w, act="relu2")
    e = 2.0**-16 * (np.abs(to_f64(x)) @ np.abs(to_f64(w)).T)
    check(y, ref, (2 * np.abs(pre) + 3 * e) * e + 2.0**-23 * np.abs(ref) + 1e-30)
    assert (to_f64(y)[pre < 0] == 0).all()


def test_gemm_numpy_uint16_bf16():
    x, w = bf16((4, 64), 6), bf16((32, 64), 7)
    pw = tilejit.pack_weight(bf16_to_u16(w), dtype="bf16")
    y = tilejit.gemm(bf16_to_u16(x), pw, dtype="bf16")
    assert isinstance(y, np.ndarray) and y.dtype == np.uint16 and y.shape == (4, 32)
    ref = ref_linear(x, w)
    check(u16_to_f64(y), ref, bound(x, w, ref))
    y32 = tilejit.gemm(bf16_to_u16(x), pw, out_dtype="f32", dtype="bf16")
    assert y32.dtype == np.float32
    check(y32, ref, bound(x, w, ref, out_bf16=False))


def test_gemm_strided_views_into_caller_output():
    # x: every other row of a wider buffer, columns 8..8+K (row stride 2·96);
    # out: a column slice of a wider f32 buffer. Strides go straight through.
    big = bf16((20, 96), 8)
    x = big[::2, 8:72]
    w_big = bf16((24, 128), 9)
    w = w_big[:, :64]  # row stride 128
    assert not x.is_contiguous() and not w.is_contiguous()
    buf = torch.full((10, 40), 7.0)
    out = buf[:, 4:28]
    r = tilejit.gemm(x, tilejit.pack_weight(w), out=out)
    assert r is out
    ref = ref_linear(x, w)
    check(out, ref, bound(x, w, ref, out_bf16=False))
    assert (buf[:, :4] == 7).all() and (buf[:, 28:] == 7).all()  # nothing outside the view


def test_gemm_numpy_strided():
    x = bf16_to_u16(bf16((9, 80), 10))[1::2, :64]
    w = bf16((16, 64), 11)
    out = np.zeros((4, 16), np.float32)
    tilejit.gemm(x, tilejit.pack_weight(w), out=out, dtype="bf16")
    ref = to_f64(u16_to_f64(x)) @ to_f64(w).T
    check(out, ref, bound(u16_to_f64(x), w, ref, out_bf16=False))


def test_gemm_transposed_x_is_the_library_error():
    x = bf16((64, 4), 12).T  # K stride 4: the C++ API requires 1
    with pytest.raises(tilejit.Error, match="x"):
        tilejit.gemm(x, tilejit.pack_weight(bf16((8, 64), 13)))


class Dlpack:
    """Any DLPack producer that is neither torch nor numpy."""

    def __init__(self, a):
        self.a = a

    def __dlpack__(self, stream=None):
        return self.a.__dlpack__()

    def __dlpack_device__(self):
        return self.a.__dlpack_device__()


def test_gemm_other_dlpack_producer_returns_buffer():
    x, w = bf16((3, 32), 14), bf16((8, 32), 15)
    y = tilejit.gemm(Dlpack(bf16_to_u16(x)), tilejit.pack_weight(w), out_dtype="f32",
                     dtype="bf16")
    assert isinstance(y, tilejit.Buffer) and y.shape == (3, 8) and y.dtype == "f32"
    ref = ref_linear(x, w)
    check(np.from_dlpack(y), ref, bound(x, w, ref, out_bf16=False))
    yb = tilejit.gemm(Dlpack(bf16_to_u16(x)), tilejit.pack_weight(w), dtype="bf16")
    assert yb.dtype == "bf16"
    check(torch.from_dlpack(yb), ref, bound(x, w, ref))


def test_pack_weight_unpack_roundtrip():
    w = bf16((70, 40), 16)
    pw = tilejit.pack_weight(w)
    u = pw.unpack()
    assert isinstance(u, torch.Tensor) and torch.equal(u.view(torch.int16), w.view(torch.int16))
    out = torch.empty(70, 40, dtype=torch.bfloat16)
    assert pw.unpack(out) is out and torch.equal(out, w)
    pn = tilejit.pack_weight(bf16_to_u16(w), dtype="bf16")
    un = pn.unpack()
    assert isinstance(un, np.ndarray) and (un == bf16_to_u16(w)).all()
    d = pw.dequantize()
    assert d.dtype == torch.float32 and torch.equal(d, w.float())
    assert tilejit.pack_weight(pw) is pw  # packing a packed weight: the same data
    assert copy.copy(pw) is pw and copy.deepcopy(pw) is pw


def test_pickling_refused():
    pw = tilejit.pack_weight(bf16((8, 16), 17))
    with pytest.raises(tilejit.Error, match="cannot be pickled.*this machine"):
        pickle.dumps(pw)


def test_packed_types_refuse_bare_new():
    # __new__ without __init__ left no C++ object behind the instance: .layout segfaulted.
    for cls in (tilejit.PackedWeight, tilejit.PackedExperts):
        with pytest.raises(TypeError, match="cannot be created directly"):
            cls.__new__(cls)


@pytest.mark.parametrize("kind", ["torch", "numpy"])
def test_int8_w8a8(kind):
    g = torch.Generator().manual_seed(18)
    n, k = 24, 64
    wq = torch.randint(-127, 128, (n, k), generator=g, dtype=torch.int8)
    scales = torch.rand(n, generator=g) * 0.01 + 0.001
    pw = tilejit.pack_int8(*((wq, scales) if kind == "torch" else (wq.numpy(), scales.numpy())))
    assert pw.format == "int8" and pw.dtype == "i8"
    x = bf16((5, k), 19)
    y = tilejit.gemm(x, pw, out_dtype="f32")
    wd = to_f64(wq) * to_f64(scales)[:, None]
    ref = to_f64(x) @ wd.T
    # dynamic_sym: each x element within s_x/2 of its code, s_x = max|x_m|/127.
    sx = np.abs(to_f64(x)).max(axis=1, keepdims=True) / 127
    tol = 0.5 * sx * np.abs(wd).sum(axis=1)[None, :] + 2.0**-16 * np.abs(to_f64(x)) @ np.abs(wd).T
    check(y, ref, tol)
    u = pw.unpack()
    assert isinstance(u["weight"], torch.Tensor if kind == "torch" else np.ndarray)
    np.testing.assert_array_equal(to_f64(u["weight"]), to_f64(wq))
    np.testing.assert_array_equal(to_f64(u["scales"]), to_f64(scales))
    np.testing.assert_array_equal(to_f64(pw.dequantize()), wd.astype(np.float32))


@pytest.mark.parametrize("rule", ["dynamic_sym", "dynamic_asym"])
def test_int8_activation_codes_follow_the_documented_rule(rule):
    # docs/quantized.md "int8 activations", computed here in numpy float32,
    # gives the kernel's codes bit for bit: read back through an identity
    # weight (y[m, k] = (q - z) * s exactly up to one f32 rounding), rows
    # with ties forced (x = max / 2: 63.5 in the reals, x times the rounded
    # reciprocal is what decides).
    f32 = np.float32
    for k in (1, 3, 64, 130):
        x = bf16((6, k), 32 + k)
        if k > 1:
            x[:, 1] = x[:, 0] * 0.5
        x[5] = 0.0
        w = tilejit.pack_int8(torch.eye(k, dtype=torch.int8), torch.ones(k))
        y = tilejit.gemm(x, w, act_quant=rule, out_dtype="f32").numpy()
        xf = x.float().numpy()
        for r in range(6):
            if rule == "dynamic_sym":
                a = f32(np.abs(xf[r]).max())
                inv, s = (f32(1), f32(1)) if a == 0 else (
                    f32(127) / max(a, f32(2.0**-119)), max(a, f32(2.0**-119)) / f32(127))
                z, lo_q, hi_q = 0, -127, 127
            else:
                lo, hi = min(f32(0), xf[r].min()), max(f32(0), xf[r].max())
                rr = f32(hi - lo)
                inv, s = (f32(1), f32(1)) if rr == 0 else (
                    f32(255) / max(rr, f32(2.0**-119)), max(rr, f32(2.0**-119)) / f32(255))
                z = int(np.clip(np.rint(f32(-lo * inv)), 0, 255))
                lo_q, hi_q = 0, 255
            v = np.clip((xf[r] * f32(inv)).astype(f32), -512, 512)
            codes = np.clip(np.rint(v) + z, lo_q, hi_q) - z
            got = np.rint(y[r].astype(np.float64) / np.float64(s))
            np.testing.assert_array_equal(got, codes, err_msg=f"{rule} k={k} row {r}")


def test_int8_fixed_act_quant_bf16_bias():
    # ActQuant::fixed: x quantized with the one given scale and zero point.
    g = torch.Generator().manual_seed(25)
    n, k = 16, 32
    wq = torch.randint(-127, 128, (n, k), generator=g, dtype=torch.int8)
    scales = torch.full((1,), 0.01)
    bias = bf16((n,), 26)
    x = bf16((3, k), 27)
    s, zp = 0.02, 128
    y = tilejit.gemm(x, tilejit.pack_int8(wq, scales), bias=bias, act_quant="fixed",
                     act_scale=s, act_zero_point=zp, out_dtype="f32")
    xq = (np.clip(np.round(to_f64(x) / s) + zp, 0, 255) - zp) * s  # the codes x is read as
    wd = to_f64(wq) * 0.01
    ref = xq @ wd.T + to_f64(bias)
    # Exact int32 dot products, then fp32 scaling: a few fp32 roundings.
    check(y, ref, 2.0**-20 * (np.abs(xq) @ np.abs(wd).T + np.abs(to_f64(bias))))
    with pytest.raises(tilejit.Error, match="act_scale"):
        tilejit.gemm(x, tilejit.pack_int8(wq, scales), act_quant="fixed", act_scale=0.0)


def test_fp8_block_scales():
    g = torch.Generator().manual_seed(20)
    n, k = 40, 96
    codes = torch.randint(0, 256, (n, k), generator=g, dtype=torch.uint8)
    codes[(codes & 0x7F) == 0x7F] = 0x10  # no NaN codes (refused)
    scales = torch.rand(2, 2, generator=g) + 0.5  # blocks of 32 x 64, partial last ones
    pw = tilejit.pack_fp8(codes, scales, block_n=32, block_k=64)
    assert pw.format == "fp8_e4m3"
    wd = to_f64(pw.dequantize())
    x = bf16((3, k), 21, 0.1)
    y = tilejit.gemm(x, pw, out_dtype="f32")
    ref = to_f64(x) @ wd.T
    # w rounded to bf16 inside the GEMM: within 2^-8·|w| of the exact value.
    tol = (2.0**-8 + 2.0**-16) * np.abs(to_f64(x)) @ np.abs(wd).T
    check(y, ref, tol)
    u = pw.unpack()
    assert torch.equal(u["weight"], codes) and torch.equal(u["scales"], scales)


def test_int4_gptq_numpy():
    rng = np.random.default_rng(22)
    n, k, gs = 32, 256, 128
    qweight = rng.integers(-2**31, 2**31, size=(k // 8, n), dtype=np.int64).astype(np.int32)
    scales = (rng.random((k // gs, n)) * 0.02 + 0.001).astype(np.float16)
    qzeros = rng.integers(-2**31, 2**31, size=(k // gs, n // 8), dtype=np.int64).astype(np.int32)
    pw = tilejit.pack_int4(qweight, scales, qzeros, format="gptq", group_size=gs)
    assert (pw.n, pw.k, pw.format) == (n, k, "int4_gptq")
    u = pw.unpack()
    assert isinstance(u["qweight"], np.ndarray)
    for name, a in [("qweight", qweight), ("scales", scales), ("qzeros", qzeros)]:
        np.testing.assert_array_equal(u[name], a)
    assert u["g_idx"] is None
    # The dequantized weight by the GPTQ v1 rule, here: nibble j of
    # qweight[k // 8, n] is q[k = 8·row + j], zero z − 1 stored.
    q = (qweight.astype(np.uint32)[:, None, :] >> (4 * np.arange(8))[None, :, None]) & 15
    q = q.reshape(k, n).astype(np.float64)
    z = (qzeros.astype(np.uint32)[:, :, None] >> (4 * np.arange(8))[None, None, :]) & 15
    z = z.reshape(k // gs, n).astype(np.float64) + 1
    wd = ((q - np.repeat(z, gs, axis=0)) * np.repeat(scales.astype(np.float64), gs, axis=0)).T
    np.testing.assert_allclose(to_f64(pw.dequantize()), wd, rtol=2**-23, atol=0)
    x = bf16((2, k), 23)
    y = tilejit.gemm(bf16_to_u16(x), pw, out_dtype="f32", dtype="bf16")
    tol = (2.0**-8 + 2.0**-16) * np.abs(to_f64(x)) @ np.abs(wd).T
    check(y, to_f64(x) @ wd.T, tol)
    # W4A8: x quantized per row (s = max|x| / 127): half a code per element.
    y8 = tilejit.gemm(bf16_to_u16(x), pw, out_dtype="f32", dtype="bf16", int4_route="w4a8")
    s_x = np.abs(to_f64(x)).max(axis=1, keepdims=True) / 127
    check(y8, to_f64(x) @ wd.T, tol + 0.51 * s_x * np.abs(wd).sum(axis=1)[None, :])
    assert not np.array_equal(y8, y)  # the route was taken
    with pytest.raises(tilejit.Error, match="int4_route"):
        tilejit.gemm(bf16_to_u16(x), pw, out_dtype="f32", dtype="bf16", int4_route="w4a4")


def test_mxfp4():
    rng = np.random.default_rng(24)
    n, k = 16, 64
    blocks = rng.integers(0, 256, size=(n, k // 32, 16), dtype=np.uint8)
    scales = rng.integers(120, 130, size=(n, k // 32), dtype=np.uint8)
    pw = tilejit.pack_mxfp4(blocks, scales)
    assert (pw.n, pw.k, pw.format, pw.dtype) == (n, k, "mxfp4", "f4e2m1")
    lut = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6])
    b = blocks.reshape(n, k // 2)
    codes = np.stack([b & 15, b >> 4], axis=-1).reshape(n, k)
    wd = lut[codes] * np.exp2(np.repeat(scales.astype(np.float64) - 127, 32, axis=1))
    np.testing.assert_array_equal(to_f64(pw.dequantize()), wd)
    u = pw.unpack()
    np.testing.assert_array_equal(u["blocks"], blocks)
    np.testing.assert_array_equal(u["scales"], scales)


def test_gemm_batched_absorbed_mla_views():
    """DeepSeek's absorbed MLA (sgl-kernel's bmm_cpu): per head, q_nope [T, 128]
    @ w_kc[h].T, x a head-major view of the token-major q; each entry equals
    its own gemm bit for bit."""
    heads, t, k, n = 6, 3, 128, 96
    q = bf16((t, heads, k), 301)
    ws = [bf16((n, k), 310 + h) for h in range(heads)]
    pw = [tilejit.pack_weight(w) for w in ws]
    out = tilejit.gemm_batched(q.transpose(0, 1), pw)
    assert out.shape == (heads, t, n) and out.dtype == torch.bfloat16
    for h in range(heads):
        assert torch.equal(out[h], tilejit.gemm(q[:, h, :], pw[h]))
    # Into a token-major output through its head-major view, f32.
    y = torch.full((t, heads, n), float("nan"))
    tilejit.gemm_batched(q.transpose(0, 1), pw, out=y.transpose(0, 1), act="silu")
    for h in range(heads):
        assert torch.equal(y[:, h, :], tilejit.gemm(q[:, h, :], pw[h], act="silu", out_dtype="f32"))
    with pytest.raises(tilejit.Error, match=r"gemm_batched: w holds 5 weights"):
        tilejit.gemm_batched(q.transpose(0, 1), pw[:5])


def test_gemm_batched_quantized_takes_gemm_options():
    """int8 entries with act_quant="dynamic_asym": each entry is its gemm with
    the same options (the options reach the per-entry route)."""
    g = torch.Generator().manual_seed(330)
    b, m, n, k = 3, 4, 40, 64
    x = bf16((b, m, k), 331)
    pw = [tilejit.pack_int8(torch.randint(-127, 128, (n, k), generator=g, dtype=torch.int8),
                            torch.rand(n, generator=g) * 0.01 + 0.001) for _ in range(b)]
    out = tilejit.gemm_batched(x, pw, act_quant="dynamic_asym", out_dtype="f32")
    for i in range(b):
        assert torch.equal(out[i], tilejit.gemm(x[i], pw[i], act_quant="dynamic_asym",
                                                out_dtype="f32"))
    assert not torch.equal(out, tilejit.gemm_batched(x, pw, out_dtype="f32"))
