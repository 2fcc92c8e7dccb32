"""tilejit.rms_norm / fused_add_rms_norm / act_and_mul from torch and numpy,
and tilejit.sgl's rmsnorm_cpu, l2norm_cpu, fused_add_rmsnorm_cpu and the
*_and_mul_cpu ops, against float64 references.

Bounds (docs/rowwise.md): norms 8 f32 units of |ref| plus, for bf16 out,
2^-8 |ref| (one bf16 rounding); act_and_mul 4e-6 max(1, |gate|) |up| (the
vector math, kVectorMathError) plus the same roundings; the residual of
fused_add_rms_norm bit-exact (f32 sum, one rounding to its dtype).
"""

import math

import numpy as np
import pytest
import torch

import tilejit
from tilejit import sgl


def f64(t):
    return t.detach().to(torch.float64).numpy()


def norm_ref(v, w, eps, plus_one=False):
    rstd = 1.0 / np.sqrt((v * v).mean(axis=-1, keepdims=True) + eps)
    if w is None:
        return v * rstd
    return v * rstd * (w + (1.0 if plus_one else 0.0))


def norm_tol(ref, bf16_out):
    tol = 8 * 2.0**-24 * np.abs(ref) + 2.0**-140
    return tol + (2.0**-8 * (np.abs(ref) + tol) if bf16_out else 0)


def check(got, ref, tol):
    err = np.abs(got - ref)
    assert (err <= tol).all(), f"max err {err.max()} (bound {tol.flat[err.argmax()]})"


@pytest.mark.parametrize("dt", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("h", [1, 17, 4096, 5123])
@pytest.mark.parametrize("plus_one", [False, True])
def test_rms_norm(dt, h, plus_one):
    g = torch.Generator().manual_seed(h)
    x = torch.randn(3, 5, h, generator=g).to(dt)
    w = torch.randn(h, generator=g).to(torch.float32)
    out = tilejit.rms_norm(x, w, eps=1e-5, weight_plus_one=plus_one)
    assert out.dtype == dt and out.shape == x.shape
    ref = norm_ref(f64(x), f64(w), 1e-5, plus_one)
    check(f64(out), ref, norm_tol(ref, dt == torch.bfloat16))


def test_rms_norm_in_place_padded_rows_and_f32_out():
    x = torch.randn(6, 100).to(torch.bfloat16)[:, :72]  # row stride 100
    x0 = f64(x)
    tilejit.rms_norm(x, None, out=x)
    check(f64(x), norm_ref(x0, None, 1e-6), norm_tol(norm_ref(x0, None, 1e-6), True))
    y = tilejit.rms_norm(x, None, out_dtype="f32")
    assert y.dtype == torch.float32


@pytest.mark.parametrize("res_dt", [torch.float32, torch.bfloat16])
def test_fused_add_rms_norm(res_dt):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(4, 300, generator=g).to(torch.bfloat16)
    r = torch.randn(4, 300, generator=g).to(res_dt)
    w = torch.randn(300, generator=g).to(torch.bfloat16)
    want_res = (x.to(torch.float32) + r.to(torch.float32)).to(res_dt)
    out, res = tilejit.fused_add_rms_norm(x, r, w)
    assert out is x and res is r
    assert torch.equal(r, want_res)
    ref = norm_ref(f64(want_res), f64(w), 1e-6)
    check(f64(x), ref, norm_tol(ref, True))


@pytest.mark.parametrize("act", ["silu", "gelu_tanh", "gelu_erf", "relu", "none"])
@pytest.mark.parametrize("rows", ["halves", "interleaved"])
def test_act_and_mul(act, rows):
    g = torch.Generator().manual_seed(7)
    x = (4 * torch.randn(5, 2 * 77, generator=g)).to(torch.bfloat16)
    out = tilejit.act_and_mul(x, act=act, rows=rows)
    assert out.shape == (5, 77) and out.dtype == torch.bfloat16
    xv = f64(x)
    gate, up = (xv[:, :77], xv[:, 77:]) if rows == "halves" else (xv[:, 0::2], xv[:, 1::2])
    f = {"silu": lambda v: v / (1 + np.exp(-v)),
         "gelu_tanh": lambda v: 0.5 * v * (1 + np.tanh(math.sqrt(2 / math.pi) *
                                                        (v + 0.044715 * v**3))),
         "gelu_erf": lambda v: 0.5 * v * (1 + np.vectorize(math.erf)(v / math.sqrt(2))),
         "relu": lambda v: np.maximum(v, 0), "none": lambda v: v}[act]
    ref = f(gate) * up
    tol = 4e-6 * np.maximum(1, np.abs(gate)) * np.abs(up) * 2 + 2.0**-22 * np.abs(ref)
    check(f64(out), ref, tol + 2.0**-8 * (np.abs(ref) + tol) + 2.0**-130)


def test_numpy_f32():
    x = np.random.default_rng(1).standard_normal((3, 40)).astype(np.float32)
    y = tilejit.rms_norm(x)
    ref = norm_ref(x.astype(np.float64), None, 1e-6)
    check(y.astype(np.float64), ref, norm_tol(ref, False))


def test_errors():
    x = torch.randn(2, 8).to(torch.bfloat16)
    with pytest.raises(tilejit.Error, match="rms_norm: eps=0"):
        tilejit.rms_norm(x, eps=0.0)
    with pytest.raises(tilejit.Error, match=r"weight has shape \[7\]"):
        tilejit.rms_norm(x, torch.ones(7))
    with pytest.raises(tilejit.Error, match="act_and_mul: x has shape"):
        tilejit.act_and_mul(torch.ones(2, 9))
    with pytest.raises(tilejit.Error, match="rows"):
        tilejit.act_and_mul(torch.ones(2, 8), rows="pairs")
    with pytest.raises(tilejit.Error, match="overlaps x"):
        tilejit.fused_add_rms_norm(x, x)


def test_sgl_ops():
    g = torch.Generator().manual_seed(11)
    x = torch.randn(3, 256, generator=g).to(torch.bfloat16)
    w = torch.randn(256, generator=g).to(torch.bfloat16)
    out = sgl.rmsnorm_cpu(x, w, 1e-6)
    ref = norm_ref(f64(x), f64(w), 1e-6)
    check(f64(out), ref, norm_tol(ref, True))
    l2 = sgl.l2norm_cpu(x, 1e-6)
    ref = norm_ref(f64(x), None, 1e-6)
    check(f64(l2), ref, norm_tol(ref, True))
    inp, res = x.clone(), torch.randn(3, 256, generator=g).to(torch.bfloat16)
    res0 = res.clone()
    assert sgl.fused_add_rmsnorm_cpu(inp, res, w, 1e-6) is None
    assert torch.equal(res, (x.float() + res0.float()).to(torch.bfloat16))
    ref = norm_ref(f64(res), f64(w), 1e-6)
    check(f64(inp), ref, norm_tol(ref, True))
    both = torch.randn(4, 64, generator=g).to(torch.bfloat16)
    for fn, want in [(sgl.silu_and_mul_cpu, torch.nn.functional.silu),
                     (sgl.gelu_and_mul_cpu, torch.nn.functional.gelu)]:
        y = fn(both)
        r = (want(both[:, :32].double()) * both[:, 32:].double()).numpy()
        check(f64(y), r, 2.0**-8 * np.abs(r) + 1e-5 * np.abs(f64(both[:, 32:])) + 1e-30)
    y = sgl.gelu_tanh_and_mul_cpu(both)
    r = (torch.nn.functional.gelu(both[:, :32].double(), approximate="tanh")
         * both[:, 32:].double()).numpy()
    check(f64(y), r, 2.0**-8 * np.abs(r) + 1e-5 * np.abs(f64(both[:, 32:])) + 1e-30)


def test_bool_keywords_take_bools():
    """A str where a bool goes is pybind11's TypeError (docs/python.md), not
    its truth value: weight_plus_one="no" ran Gemma's (1 + w)."""
    x = torch.randn(2, 8).to(torch.bfloat16)
    for kw in [dict(weight_plus_one="no"), dict(weight_plus_one=[])]:
        with pytest.raises(TypeError):
            tilejit.rms_norm(x, torch.ones(8), **kw)
        with pytest.raises(TypeError):
            tilejit.fused_add_rms_norm(x.clone(), x.clone(), torch.ones(8), **kw)
    with pytest.raises(TypeError):
        tilejit.act_and_mul(x, clamped_swiglu="false")
    with pytest.raises(TypeError):
        tilejit.rope(torch.ones(1, 1, 8), None, torch.zeros(1, dtype=torch.int32),
                     torch.ones(4, 8), mrope_interleaved="no")


def test_qk_norm_on_fused_qkv_heads_in_place():
    t, hq, hk, d = 3, 4, 2, 64
    qkv = torch.randn(t, (hq + 2 * hk) * d).to(torch.bfloat16)
    before = qkv.clone()
    w = torch.randn(d).to(torch.bfloat16)
    q = qkv[:, :hq * d].view(t, hq, d)
    tilejit.rms_norm(q, w, out=q)
    ref = norm_ref(f64(before[:, :hq * d].view(t, hq, d)), f64(w), 1e-6)
    check(f64(q), ref, norm_tol(ref, True))
    assert torch.equal(qkv[:, hq * d:], before[:, hq * d:])


def test_sgl_errors_name_the_op():
    x = torch.randn(2, 8).to(torch.bfloat16)
    with pytest.raises(tilejit.Error, match="rmsnorm_cpu: eps='a'"):
        sgl.rmsnorm_cpu(x, torch.ones(8), "a")
    with pytest.raises(tilejit.Error, match="rmsnorm_cpu: .*eps=0"):
        sgl.rmsnorm_cpu(x, torch.ones(8), 0.0)
    with pytest.raises(tilejit.Error, match="silu_and_mul_cpu: input.dtype=torch.float16"):
        sgl.silu_and_mul_cpu(torch.ones(2, 8, dtype=torch.float16))
    with pytest.raises(tilejit.Error, match="fused_add_rmsnorm_cpu: .*residual .*overlaps x"):
        sgl.fused_add_rmsnorm_cpu(x, x, torch.ones(8), 1e-6)
