"""tilejit.layer_norm / fused_add_layer_norm / rms_norm_gated from torch and
numpy, and tilejit.sgl's layernorm_cpu, fused_add_layernorm_cpu,
fused_rmsnorm_gated_cpu and the Gemma norms, against float64 references.

Bounds (docs/rowwise.md, runtime/reference_error_bounds.h): the layer norm's
layer_norm_output_bound (the f32 mean and its correction, the corrected
two-pass variance, three roundings), the gated norm's 9 f32 units plus the
activation's vector-math error (4e-6 max(1, |gate|)), each plus one bf16
rounding (2^-8) for a bf16 out; residuals bit-exact.
"""

import numpy as np
import pytest
import torch

import tilejit
from tilejit import sgl

U = 2.0**-24


def f64(t):
    return t.detach().to(torch.float64).numpy()


def bf16_round(t):
    return t.to(torch.bfloat16).to(torch.float64).numpy()


def layer_ref(v, w, b, eps, plus_one=False):
    mean = v.mean(axis=-1, keepdims=True)
    var = ((v - mean) ** 2).mean(axis=-1, keepdims=True)
    rstd = 1.0 / np.sqrt(var + eps)
    wv = 1.0 if w is None else w + (1.0 if plus_one else 0.0)
    bv = 0.0 if b is None else b
    ref = (v - mean) * rstd * wv + bv
    # layer_norm_output_bound, row by row (broadcast).
    dev = v - mean
    mean_abs = np.abs(v).mean(axis=-1, keepdims=True)
    dev_abs = np.abs(dev).mean(axis=-1, keepdims=True)
    delta = 8 * U * mean_abs
    a = dev_abs + delta
    e = 9 * U * a + 2 * U * (np.abs(dev) + delta)
    var_err = 9 * U * (var + delta**2) + 16 * U * delta * a + 64 * U * U * a * a
    rel = 0.5 * var_err / (var + eps) + 2 * U
    scaled = np.abs(dev) * rstd * np.abs(wv)
    tol = np.abs(wv) * rstd * e * (1 + rel) + scaled * (rel + 3 * U) + U * (
        np.abs(bv) + np.abs(ref)) + 2.0**-145
    return ref, tol


def out_tol(ref, tol, bf16_out):
    return tol + (2.0**-8 * (np.abs(ref) + tol) + 2.0**-134 if bf16_out else 0)


def check(got, ref, tol):
    err = np.abs(got - ref)
    assert (err <= tol).all(), f"max err {err.max()} (bound {tol.flat[err.argmax()]})"


@pytest.mark.parametrize("dt", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("h", [1, 17, 4096, 5123])
@pytest.mark.parametrize("bias", [False, True])
def test_layer_norm(dt, h, bias):
    g = torch.Generator().manual_seed(h)
    x = (torch.randn(3, 5, h, generator=g) + 4).to(dt)
    w = torch.randn(h, generator=g).to(dt)
    b = torch.randn(h, generator=g).to(torch.float32) if bias else None
    out = tilejit.layer_norm(x, w, b, eps=1e-5)
    assert out.dtype == dt and out.shape == x.shape
    ref, tol = layer_ref(f64(x), f64(w), None if b is None else f64(b), 1e-5)
    check(f64(out), ref, out_tol(ref, tol, dt == torch.bfloat16))


def test_layer_norm_numpy_in_place_and_f32_out():
    x = np.random.default_rng(1).standard_normal((4, 130)).astype(np.float32) * 3 + 1000
    x0 = x.astype(np.float64)
    y = tilejit.layer_norm(x, None, None, out_dtype="f32")
    ref, tol = layer_ref(x0, None, None, 1e-5)
    check(y.astype(np.float64), ref, tol)
    tilejit.layer_norm(x, None, None, out=x)
    check(x.astype(np.float64), ref, tol)


def test_fused_add_layer_norm():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(7, 300, generator=g).to(torch.bfloat16)
    r = torch.randn(7, 300, generator=g).to(torch.bfloat16)
    w = torch.randn(300, generator=g).to(torch.bfloat16)
    b = torch.randn(300, generator=g).to(torch.bfloat16)
    s = bf16_round(x.float() + r.float())  # f32 sum, one rounding to bf16
    out, res = tilejit.fused_add_layer_norm(x, r, w, b)
    assert out is x and res is r
    assert (f64(r) == s).all()
    ref, tol = layer_ref(s, f64(w), f64(b), 1e-5)
    check(f64(x), ref, out_tol(ref, tol, True))


def gated_ref(x, gate, w, eps, before):
    a = gate / (1 + np.exp(-gate))  # silu
    v = x if before else x * a
    rstd = 1.0 / np.sqrt((v * v).mean(axis=-1, keepdims=True) + eps)
    n = v * rstd * (1.0 if w is None else w)
    return n * a if before else n


@pytest.mark.parametrize("before", [True, False])
@pytest.mark.parametrize("h", [16, 129, 2048])
def test_rms_norm_gated(before, h):
    g = torch.Generator().manual_seed(h)
    x = torch.randn(6, h, generator=g).to(torch.bfloat16)
    z = (torch.randn(6, h, generator=g) * 3).to(torch.bfloat16)
    w = torch.randn(h, generator=g).to(torch.bfloat16)
    out = tilejit.rms_norm_gated(x, z, w, norm_before_gate=before)
    ref = gated_ref(f64(x), f64(z), f64(w), 1e-6, before)
    # The activation's error 4e-6·max(1, |gate|) relative to the output,
    # pushed through rstd (gate first) at most once more.
    tol = (9 * U + 8e-6 * np.maximum(1, np.abs(f64(z)))) * np.abs(ref) + 1e-6 * np.abs(
        ref).max() * (0 if before else 1)
    check(f64(out), ref, out_tol(ref, tol, True))


def test_rms_norm_gated_errors():
    x = torch.randn(2, 8).to(torch.bfloat16)
    with pytest.raises(tilejit.Error, match=r"rms_norm_gated: gate has shape \[3, 8\]"):
        tilejit.rms_norm_gated(x, torch.randn(3, 8).to(torch.bfloat16))
    with pytest.raises(tilejit.Error, match="act"):
        tilejit.rms_norm_gated(x, x, act="tanh")
    with pytest.raises(tilejit.Error, match="layer_norm: bias has shape"):
        tilejit.layer_norm(x, None, torch.ones(9))


def test_sgl_layernorm_forms():
    g = torch.Generator().manual_seed(5)
    x = torch.randn(5, 3, 64, generator=g).to(torch.bfloat16)
    w = torch.randn(64, generator=g).to(torch.bfloat16)
    b = torch.randn(64, generator=g).to(torch.bfloat16)
    out = sgl.layernorm_cpu(x, w, b, 1e-5)
    ref, tol = layer_ref(f64(x), f64(w), f64(b), 1e-5)
    check(f64(out), ref, out_tol(ref, tol, True))
    assert sgl.layernorm_cpu(x, w, None, eps=1e-5).shape == x.shape
    # The first schema: no bias, written over input.
    y = x.clone()
    assert sgl.layernorm_cpu(y, w, 1e-5) is None
    ref, tol = layer_ref(f64(x), f64(w), None, 1e-5)
    check(f64(y), ref, out_tol(ref, tol, True))
    r = torch.randn(5, 3, 64, generator=g).to(torch.bfloat16)
    r0 = r.clone()
    out = sgl.fused_add_layernorm_cpu(x, r, w, b, 1e-5)
    s = bf16_round(x.float() + r0.float())
    assert (f64(r) == s).all()
    ref, tol = layer_ref(s, f64(w), f64(b), 1e-5)
    check(f64(out), ref, out_tol(ref, tol, True))
    with pytest.raises(tilejit.Error, match="layernorm_cpu: eps"):
        sgl.layernorm_cpu(x, w, b, "a")


def test_sgl_gated_and_gemma():
    g = torch.Generator().manual_seed(6)
    x = torch.randn(9, 128, generator=g).to(torch.bfloat16)
    z = torch.randn(9, 128, generator=g).to(torch.bfloat16)
    w = torch.randn(128, generator=g).to(torch.bfloat16)
    out = sgl.fused_rmsnorm_gated_cpu(x, w, z, 1e-6)
    ref = gated_ref(f64(x), f64(z), f64(w), 1e-6, True)
    check(f64(out), ref, out_tol(ref, (9 * U + 8e-6 * np.maximum(1, np.abs(f64(z)))) * np.abs(ref),
                                 True))
    gemma = sgl.gemma_rmsnorm_cpu(x, w, 1e-6)
    v = f64(x)
    gref = v / np.sqrt((v * v).mean(-1, keepdims=True) + 1e-6) * (1 + f64(w))
    check(f64(gemma), gref, out_tol(gref, 8 * U * np.abs(gref), True))
    assert torch.equal(sgl.gemma3_rmsnorm_cpu(x, w, 1e-6), gemma)
    res = torch.randn(9, 128, generator=g).to(torch.bfloat16)
    inp = x.clone()
    assert sgl.gemma_fused_add_rmsnorm_cpu(inp, res, w, 1e-6) is None
    # q / k heads of a padded fused projection.
    qkv = torch.randn(4, 3 * 64 + 2 * 64 + 8, generator=g).to(torch.bfloat16)
    q, k = qkv[:, :192], qkv[:, 192:320]
    qw, kw = w[:64], w[64:]
    qo, ko = sgl.fused_qk_gemma_rmsnorm_cpu(q, k, qw, kw, 1e-6, 64)
    for t, wt, o in ((q, qw, qo), (k, kw, ko)):
        hv = f64(t).reshape(4, -1, 64)
        ref = hv / np.sqrt((hv * hv).mean(-1, keepdims=True) + 1e-6) * (1 + f64(wt))
        check(f64(o).reshape(4, -1, 64), ref, out_tol(ref, 8 * U * np.abs(ref), True))
    with pytest.raises(tilejit.Error, match="fused_qk_gemma_rmsnorm_cpu: q has shape"):
        sgl.fused_qk_gemma_rmsnorm_cpu(q, k, qw, kw, 1e-6, 50)


def test_outside_tester_findings():
    # out_dtype sizes an allocated output only: with out given it is refused.
    x = torch.randn(2, 17)
    with pytest.raises(tilejit.Error, match="out_dtype='bf16' with out given"):
        tilejit.layer_norm(x, out=torch.empty(2, 17), out_dtype="bf16")
    with pytest.raises(tilejit.Error, match="out_dtype='f32' with out given"):
        tilejit.rms_norm_gated(x, x, out=torch.empty(2, 17), out_dtype="f32")
    # The gated norm takes Gemma's (1 + w) from Python too.
    w = torch.randn(17)
    a = tilejit.rms_norm_gated(x, x, w, weight_plus_one=True)
    b = tilejit.rms_norm_gated(x, x, w + 1)
    assert torch.allclose(a, b, rtol=1e-6, atol=1e-6)
    # x * act(gate) is an f32 value: an overflow is Inf, the row's Inf rule
    # follows on every path (the scalar one in the C++ test).
    big = torch.full((1, 4), 1e20)
    z = torch.tensor([[1e20, 1.0, 1.0, 1.0]])
    out = tilejit.rms_norm_gated(big, z, None, norm_before_gate=False)
    assert torch.isnan(out[0, 0]) and (out[0, 1:] == 0).all()
    # layer_norm's eps default is NormOptions' (1e-6), as in C and C++.
    c = torch.tensor([[0.0, 1e-3]])
    got = tilejit.layer_norm(c)
    ref = (c - c.mean()) / torch.sqrt(c.var(unbiased=False) + 1e-6)
    assert torch.allclose(got, ref, rtol=1e-5)
