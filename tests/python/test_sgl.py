"""tilejit.sgl (sgl-kernel's CPU op signatures) against torch float64
references of sgl-kernel's semantics, written here from its kernels and
sglang's native paths; shapes sgl-kernel rejects (N = 33, head sizes 80 / 96
/ 112 / 192, fp8 block 32 x 64, E = 10) included.

Bounds, each with its reason:
- linear: |y - ref| <= 2^-8 |ref| + 2^-20 (|x| @ |w|^T): the bf16 output
  rounding (half an ulp is 2^-9 relative, doubled) plus fp32 accumulation of
  exact bf16 products (K 2^-24 relative to the magnitude sum, K <= 96).
- attention: 2^-7 max|v| + 2^-8 |ref| (docs/attention.md: P rounded to
  bf16 moves the output by <= 2^-9 max|v|; the bf16 output adds 2^-9 |ref|).
- RoPE: 2^-7 |ref| + 2^-21 mag, mag = |x cos| + |x' sin| (docs/rope.md: one
  bf16 ulp of the result plus the f32 product / fma error).
- W8A8 linear (int8_scaled_mm_with_quant): the per-token quantization of x,
  half a code per element, 0.51 s_x sum_k |w_deq| (s_x = max|x| / 127),
  plus 2^-20 of the magnitude (f32 sums and scale products) and, for a bf16
  output, 2^-8 |ref|; int8_scaled_mm_cpu (codes given): 2^-20 of the
  magnitude (f32 roundings of exact int sums) plus the output rounding.
- fp8 W8A16 linear: 2^-8 (|x| @ |w_deq|^T) (the weight dequantized to bf16,
  2^-9 relative, and f32 sums) plus the output rounding.
- MoE (bf16): 2^-7 mag + 2^-8 |ref| (the bf16 intermediate activation may
  round to either neighbour; mag = sum_j |w_j| |W2| @ |a|); quantized: 5 %
  of max|ref| (per-token activation quantization feeds through both
  projections; the int8 / fp8 weight values themselves are exact).
- routers: weights rtol 2^-20 (double arithmetic, f32 store), ids exact.
"""

import math

import pytest
import torch

import tilejit
from tilejit import sgl

F64 = torch.float64


def rnd(shape, seed, scale=1.0, dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * scale).to(dtype)


def within(got, ref, tol, what=""):
    err = (got.to(F64) - ref).abs()
    bad = err > tol
    assert not bool(bad.any()), f"{what}: max err {err.max().item()} (tol at worst " \
        f"{tol.expand_as(err)[bad].min().item() if bad.any() else 0})"


# ---- linear -----------------------------------------------------------------------

@pytest.mark.parametrize("n", [64, 33])
def test_weight_packed_linear(n):
    k = 96
    w, x, b = rnd((n, k), 1, 0.1), rnd((5, k), 2), rnd((n,), 3, dtype=torch.float32)
    ref = x.to(F64) @ w.to(F64).T + b.to(F64)
    mag = x.to(F64).abs() @ w.to(F64).abs().T
    packed = sgl.convert_weight_packed(w)
    assert packed.shape == w.shape and packed.weight is w
    for mat2, vnni in ((packed, True), (w, False)):
        y = sgl.weight_packed_linear(x, mat2, b, vnni)
        assert y.dtype == torch.bfloat16 and y.shape == (5, n)
        within(y, ref, 2.0**-8 * ref.abs() + 2.0**-20 * mag, f"n={n} vnni={vnni}")
    y3 = sgl.weight_packed_linear(x.view(1, 5, k), packed, None, True)
    assert y3.shape == (1, 5, n)
    within(y3[0], ref - b.to(F64), 2.0**-8 * (ref - b.to(F64)).abs() + 2.0**-20 * mag, "3-D")


def test_bmm_cpu_absorbed_mla():
    """sglang's DeepSeek absorbed MLA: bmm_cpu(out, q_nope.transpose(0, 1), w_kc, True, None)
    with w_kc from convert_weight_packed, out a head-major view of a token-major
    tensor; against float64, and bit-equal to the unpacked (is_vnni=False) call."""
    heads, t, k, n = 4, 3, 64, 48
    q = rnd((t, heads, k), 40)
    w_kc = rnd((heads, n, k), 41, 0.1)
    packed = sgl.convert_weight_packed(w_kc)
    out = torch.full((t, heads, n), float("nan")).to(torch.bfloat16)
    ret = sgl.bmm_cpu(out.transpose(0, 1), q.transpose(0, 1), packed, True, None)
    assert ret.data_ptr() == out.data_ptr()
    ref = torch.einsum("thk,hnk->thn", q.to(F64), w_kc.to(F64))
    mag = torch.einsum("thk,hnk->thn", q.to(F64).abs(), w_kc.to(F64).abs())
    within(out, ref, 2.0**-8 * ref.abs() + 2.0**-20 * mag, "bmm_cpu")
    again = torch.empty(heads, t, n, dtype=torch.bfloat16)
    sgl.bmm_cpu(again, q.transpose(0, 1), w_kc, False, None)
    assert torch.equal(again, out.transpose(0, 1))
    with pytest.raises(tilejit.Error, match="bmm_cpu: scale is given"):
        sgl.bmm_cpu(again, q.transpose(0, 1), packed, True, torch.ones(1))
    with pytest.raises(tilejit.Error, match="bmm_cpu: .*w holds 3 weights"):
        sgl.bmm_cpu(again, q.transpose(0, 1), w_kc[:3], False, None)


def test_linear_errors():
    w = rnd((32, 16), 4)
    with pytest.raises(tilejit.Error, match="mat1.dtype"):
        sgl.weight_packed_linear(torch.randn(2, 16), sgl.convert_weight_packed(w), None, True)
    with pytest.raises(tilejit.Error, match="allowed: a 2-D torch.bfloat16"):
        sgl.weight_packed_linear(rnd((2, 16), 5), sgl.convert_weight_packed(rnd((2, 32, 16), 6)),
                                 None, True)
    with pytest.raises(tilejit.Error, match="allowed: 2"):
        sgl.convert_weight_packed(torch.zeros(4))


# ---- quantized linear (W8A8 int8, fp8 W8A16) --------------------------------------

def int8_case(m, n, k, seed):
    g = torch.Generator().manual_seed(seed)
    x = rnd((m, k), seed + 1)
    w = torch.randint(-127, 128, (n, k), generator=g, dtype=torch.int8)
    s = torch.rand(n, 1, generator=g) * 0.01 + 0.001  # sglang's layer.weight_scale [N, 1]
    return x, w, s


def w8a8_ref(x, w, s, b):
    """The float64 linear of bf16 x and the dequantized weight, and the W8A8
    bound: half a code of x per element, 0.51 s_x sum_k |w_deq| with
    s_x = max|x| / 127 per row (tilejit and sgl-kernel quantize x per token),
    plus the f32 sums and scale products (2^-20 of the magnitude)."""
    wd = w.to(F64) * s.to(F64).reshape(-1, 1)
    ref = x.to(F64) @ wd.T + (0 if b is None else b.to(F64))
    sx = x.to(F64).abs().amax(dim=1, keepdim=True) / 127
    tol = 0.51 * sx * wd.abs().sum(dim=1) + 2.0**-20 * (x.to(F64).abs() @ wd.abs().T)
    return ref, tol


@pytest.mark.parametrize("n,out_dtype,bias", [(64, torch.bfloat16, "f32"),
                                              (70, torch.float32, None),
                                              (70, torch.bfloat16, "bf16")])
def test_int8_scaled_mm_with_quant(n, out_dtype, bias):
    k = 96
    x, w, s = int8_case(5, n, k, 200 + n)
    b = None if bias is None else rnd((n,), 203, dtype=getattr(torch, {"f32": "float32",
                                                                      "bf16": "bfloat16"}[bias]))
    ref, tol = w8a8_ref(x, w, s, b)
    if out_dtype == torch.bfloat16:
        tol = tol + 2.0**-8 * ref.abs()
    packed = sgl.convert_weight_packed(w)
    for mat2, vnni in ((packed, True), (w, False)):
        y = sgl.int8_scaled_mm_with_quant(x, mat2, s, b, out_dtype, vnni)
        assert y.dtype == out_dtype and y.shape == (5, n)
        within(y, ref, tol, f"n={n} vnni={vnni}")
    y3 = sgl.int8_scaled_mm_with_quant(x.view(1, 5, k), packed, s.view(-1), b, out_dtype, True)
    assert y3.shape == (1, 5, n)
    within(y3[0], ref, tol, "3-D mat1, scales2 [N]")


def test_per_token_quant_int8_cpu():
    x = rnd((4, 40), 210, 3.0)
    x[2] = 0                                   # a zero row: amax is sgl-kernel's eps 1e-7
    x[3, :4] = torch.tensor([127.0, 0.5, 1.5, -2.5])  # x * 127 / amax at ties: rne
    x[3, 4:] = 0
    aq, a_s = sgl.per_token_quant_int8_cpu(x)
    assert aq.dtype == torch.uint8 and aq.shape == (4, 40)
    assert a_s.dtype == torch.float32 and a_s.shape == (4,)
    amax = x.to(F64).abs().amax(dim=1).clamp(min=1e-7)
    assert torch.equal(a_s, (amax / 127).to(torch.float32))
    q = aq.to(F64) - 128
    assert bool(((q - x.to(F64) * 127 / amax[:, None]).abs() <= 0.5 + 1e-5).all())
    assert torch.equal(aq[2], torch.full((40,), 128, dtype=torch.uint8))
    assert aq[3, :4].tolist() == [255, 128, 130, 126]
    a16, s16 = sgl.per_token_quant_int8_cpu(x[:2].to(torch.float16))  # f16 widens exactly
    assert torch.equal(a16, aq[:2]) and torch.equal(s16, a_s[:2])


@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16])
def test_int8_scaled_mm_cpu(out_dtype):
    n, k = 70, 96
    x, w, s = int8_case(6, n, k, 220)
    b = rnd((n,), 223, dtype=torch.float32)
    aq, a_s = sgl.per_token_quant_int8_cpu(x)
    q = aq.to(F64) - 128
    # sgl-kernel's W8A8 on the given codes: exact int sums times scales1 * scales2, plus bias;
    # here up to five f32 roundings.
    ref = (q @ w.to(F64).T) * a_s.to(F64)[:, None] * s.to(F64).reshape(1, -1) + b.to(F64)
    tol = 2.0**-20 * ((q.abs() @ w.to(F64).abs().T) * a_s.to(F64)[:, None] *
                      s.to(F64).reshape(1, -1) + b.to(F64).abs())
    if out_dtype == torch.bfloat16:
        tol = tol + 2.0**-8 * ref.abs()
    packed = sgl.convert_weight_packed(w)
    y = sgl.int8_scaled_mm_cpu(aq, packed, a_s, s, b, out_dtype, True)
    assert y.dtype == out_dtype and y.shape == (6, n)
    within(y, ref, tol, "uint8 codes")
    ys8 = sgl.int8_scaled_mm_cpu((aq.to(torch.int16) - 128).to(torch.int8), w, a_s.view(-1, 1),
                                 s, b, out_dtype, False)
    assert torch.equal(ys8, y), "int8 codes q give the uint8 codes q + 128's result"


def fp8_case(n, k, bn, bk, seed):
    g = torch.Generator().manual_seed(seed)
    c = torch.randint(0, 0x38, (n, k), generator=g, dtype=torch.int64)  # finite, |v| <= 1
    w = (c + 128 * torch.randint(0, 2, (n, k), generator=g)).to(torch.uint8)
    s = torch.rand(-(-n // bn), -(-k // bk), generator=g) * 0.05 + 0.01
    wd = e4m3_to_f64(w) * s.to(F64).repeat_interleave(bn, 0)[:n].repeat_interleave(bk, 1)[:, :k]
    return w, s, wd


@pytest.mark.parametrize("m,k,block,out_dtype,bias", [
    (5, 130, (128, 128), torch.bfloat16, True),   # sglang's block; K = 130: a partial block
    (20, 96, (128, 128), torch.float32, False),   # the dequant route (M > 16), one K block
    (3, 130, (32, 64), torch.float32, True),      # sgl-kernel refuses bk != 128
])
def test_fp8_scaled_mm_cpu(m, k, block, out_dtype, bias):
    n = 70
    w, s, wd = fp8_case(n, k, *block, seed=230 + k)
    x = rnd((m, k), 231)
    b = rnd((n,), 232, dtype=torch.float32) if bias else None
    ref = x.to(F64) @ wd.T + (0 if b is None else b.to(F64))
    # The weight dequantized to bf16 (2^-9 relative) and f32 sums: 2^-8 of the magnitude;
    # the bf16 output's rounding: 2^-8 |ref|.
    tol = 2.0**-8 * (x.to(F64).abs() @ wd.abs().T)
    if out_dtype == torch.bfloat16:
        tol = tol + 2.0**-8 * ref.abs()
    packed = sgl.convert_weight_packed(w)
    for mat2, vnni in ((packed, True), (w, False)):
        y = sgl.fp8_scaled_mm_cpu(x, mat2, s, list(block), b, out_dtype, vnni)
        assert y.dtype == out_dtype and y.shape == (m, n)
        within(y, ref, tol, f"k={k} block={block} vnni={vnni}")


@pytest.mark.parametrize("fmt", ["int8", "fp8"])
def test_quantized_linear_follows_new_scales(fmt):
    # One convert_weight_packed weight called with new scales2 tensors (temporaries whose ids
    # come back, then one changed in place): each call uses its own scales, as sgl-kernel does,
    # and the weight keeps one packing.
    n, k = 40, 64
    x = rnd((3, k), 240)
    if fmt == "int8":
        _, w, s = int8_case(3, n, k, 241)

        def call(mat2, sc, vnni):
            return sgl.int8_scaled_mm_with_quant(x, mat2, sc, None, torch.float32, vnni)
    else:
        w, s, _ = fp8_case(n, k, 32, 32, 242)

        def call(mat2, sc, vnni):
            return sgl.fp8_scaled_mm_cpu(x, mat2, sc, [32, 32], None, torch.float32, vnni)
    p = sgl.convert_weight_packed(w)
    first = call(p, s, True)
    for f in (2.0, 3.0, 4.0):
        got = call(p, s * f, True)
        assert torch.equal(got, call(w, s * f, False)), f"scales2 x{f}"
        assert not torch.equal(got, first)
    s[1:] *= 3  # in place: same tensor, new values
    got = call(p, s, True)
    assert torch.equal(got, call(w, s, False)), "scales2 changed in place"
    assert not torch.equal(got, first)
    assert len(p._packed) == 1


def test_quantized_linear_errors():
    x, w, s = int8_case(2, 40, 64, 250)
    wf, sf, _ = fp8_case(40, 64, 32, 32, 251)
    bf = torch.bfloat16
    i8 = sgl.int8_scaled_mm_with_quant
    f8 = sgl.fp8_scaled_mm_cpu
    cases = [
        ("mat1.dtype", lambda: i8(x.float(), w, s, None, bf, False)),
        ("float16", lambda: i8(x.half(), w, s, None, bf, False)),
        ("float16", lambda: f8(x.half(), wf, sf, [32, 32], None, bf, False)),
        ("mat2 is a torch.bfloat16", lambda: i8(x, w.to(bf), s, None, bf, False)),
        ("mat2 is a list", lambda: i8(x, [w], s, None, bf, False)),
        ("K \\+ 4", lambda: i8(x, torch.zeros(40, 68, dtype=torch.int8), s, None, bf, True)),
        ("mat1 has K=64", lambda: i8(x, w[:, :32], s, None, bf, False)),
        ("scales2 has shape", lambda: i8(x, w, s[:39], None, bf, False)),
        ("scales2.dtype", lambda: i8(x, w, s.double(), None, bf, False)),
        ("scales2: expected a torch.Tensor", lambda: i8(x, w, 0.01, None, bf, False)),
        ("bias is a", lambda: i8(x, w, s, torch.zeros(41), bf, False)),
        ("out_dtype=torch.float16", lambda: i8(x, w, s, None, torch.float16, False)),
        ("out_dtype=torch.int32", lambda: i8(x, w, s, None, torch.int32, False)),
        ("out_dtype='bf16'", lambda: f8(x, wf, sf, [32, 32], None, "bf16", False)),
        ("out_dtype=torch.int8", lambda: f8(x, wf, sf, [32, 32], None, torch.int8, False)),
        ("mat2 is a torch.int8", lambda: f8(x, w, sf, [32, 32], None, bf, False)),
        ("scales2 has shape", lambda: f8(x, wf, sf[:1], [32, 32], None, bf, False)),
        ("scales2.dtype", lambda: f8(x, wf, sf.to(bf), [32, 32], None, bf, False)),
        ("block_k an even", lambda: f8(x, wf, torch.ones(2, 2), [32, 33], None, bf, False)),
        ("scales1 has shape", lambda: sgl.int8_scaled_mm_cpu(
            torch.zeros(2, 64, dtype=torch.uint8), w, torch.ones(3), s, None, bf, False)),
        ("mat1.dtype", lambda: sgl.int8_scaled_mm_cpu(x, w, torch.ones(2), s, None, bf, False)),
        ("out_dtype", lambda: sgl.int8_scaled_mm_cpu(
            torch.zeros(2, 64, dtype=torch.uint8), w, torch.ones(2), s, None, torch.half, False)),
        ("A.dtype", lambda: sgl.per_token_quant_int8_cpu(x.float())),
        ("A has shape", lambda: sgl.per_token_quant_int8_cpu(x[0])),
    ]
    for bs in ([32], [0, 32], [True, 32], (32.0, 32), None, 32, [32, -2]):
        cases.append(("block_size", lambda bs=bs: f8(x, wf, sf, bs, None, bf, False)))
    for want, fn in cases:
        with pytest.raises(tilejit.Error, match=want):
            fn()
    nan = wf.clone()
    nan[0, 3] = 0x7F
    with pytest.raises(tilejit.Error, match="fp8_scaled_mm_cpu: .*NaN code.*mat2"):
        f8(x, sgl.convert_weight_packed(nan), sf, [32, 32], None, bf, True)


# ---- MoE ---------------------------------------------------------------------------

def ref_experts(x, w13, w2, tw, ti, act=None):
    """sgl-kernel fused_experts: sum_j w_j W2[e] (silu(g) * u), g, u the halves
    of W13[e] x; the activation rounded to bf16 as the kernel stores it."""
    x, tw = x.to(F64), tw.to(F64)
    inter = w2.shape[2]
    out = torch.zeros(x.shape[0], w2.shape[1], dtype=F64)
    mag = torch.zeros_like(out)
    for t in range(x.shape[0]):
        for j in range(ti.shape[1]):
            e = int(ti[t, j])
            if e < 0:
                continue
            gu = w13[e] @ x[t]
            g, u = gu[:inter], gu[inter:]
            a = (g * torch.sigmoid(g) * u if act is None else act(g, u))
            a = a.to(torch.bfloat16).to(F64)
            out[t] += tw[t, j] * (w2[e] @ a)
            mag[t] += tw[t, j].abs() * (w2[e].abs() @ a.abs())
    return out, mag


def routed(t, e, k, seed):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(t, e, generator=g)
    tw, ti = torch.topk(torch.softmax(logits, -1), k)
    return tw, ti.to(torch.int32)


def test_fused_experts_bf16_odd_sizes_inplace_and_padding():
    # H = 72, I = 24: neither a multiple of 32 (sgl-kernel's block).
    e, h, inter, t, k = 5, 72, 24, 7, 2
    w1, w2 = rnd((e, 2 * inter, h), 7, 0.1), rnd((e, h, inter), 8, 0.1)
    x = rnd((t, h), 9)
    tw, ti = routed(t, e, k, 10)
    ti[6, 1] = -1  # a padded slot: contributes nothing
    ref, mag = ref_experts(x, w1.to(F64), w2.to(F64), tw, ti)
    p1, p2 = sgl.convert_weight_packed(w1), sgl.convert_weight_packed(w2)
    out = sgl.fused_experts_cpu(x, p1, p2, tw, ti, False)
    within(out, ref, 2.0**-7 * mag + 2.0**-8 * ref.abs(), "packed")
    again = sgl.fused_experts_cpu(x, p1, p2, tw, ti.to(torch.int64), False)  # packed once
    assert torch.equal(out, again)
    plain = sgl.fused_experts_cpu(x, w1, w2, tw, ti, False, is_vnni=False)
    assert torch.equal(out, plain)
    xi = x.clone()
    res = sgl.fused_experts_cpu(xi, p1, p2, tw, ti, True)
    assert res is xi and torch.equal(xi, out)


def test_fused_experts_clamped_swiglu_with_bias():
    e, h, inter, t, k = 3, 64, 32, 4, 2
    w1, w2 = rnd((e, 2 * inter, h), 11, 0.1), rnd((e, h, inter), 12, 0.1)
    b1, b2 = rnd((e, 2 * inter), 13, 0.1, torch.float32), rnd((e, h), 14, 0.1, torch.float32)
    x = rnd((t, h), 15)
    tw, ti = routed(t, e, k, 16)
    alpha, limit = 1.702, 7.0

    def act(g, u):
        g, u = g.clamp(max=limit), u.clamp(-limit, limit)
        return (u + 1) * g * torch.sigmoid(alpha * g)

    w1b = torch.cat([w1.to(F64), b1.to(F64)[:, :, None]], 2)
    xb = torch.cat([x.to(F64), torch.ones(t, 1, dtype=F64)], 1)
    ref, mag = ref_experts(xb, w1b, w2.to(F64), tw, ti, act)
    for j in range(k):
        ref += tw[:, j:j + 1].to(F64) * b2.to(F64)[ti[:, j].long()]
    out = sgl.fused_experts_cpu(x, sgl.convert_weight_packed(w1), sgl.convert_weight_packed(w2),
                                tw, ti, False, w1_bias=b1, w2_bias=b2, alpha=alpha, limit=limit)
    within(out, ref, 2.0**-7 * mag + 2.0**-8 * ref.abs() + 2.0**-8 * b2.abs().max(), "swiglu")


def e4m3_to_f64(codes):
    c = codes.to(torch.int64)
    sign = torch.where(c >= 128, -1.0, 1.0).to(F64)
    ex, m = (c >> 3) & 15, (c & 7).to(F64)
    val = torch.where(ex == 0, m * 2.0**-9, (1 + m / 8) * torch.pow(2.0, (ex - 7).to(F64)))
    return sign * val


@pytest.mark.parametrize("fmt", ["int8", "fp8_block", "fp8_channel"])
def test_fused_experts_quantized(fmt):
    e, h, inter, t, k = 4, 128, 64, 6, 2
    g = torch.Generator().manual_seed(17)
    x = rnd((t, h), 18)
    tw, ti = routed(t, e, k, 19)
    kw = {}
    if fmt == "int8":
        w1 = torch.randint(-127, 128, (e, 2 * inter, h), generator=g, dtype=torch.int8)
        w2 = torch.randint(-127, 128, (e, h, inter), generator=g, dtype=torch.int8)
        s1 = torch.rand(e, 2 * inter, generator=g) * 0.002 + 0.0005
        s2 = torch.rand(e, h, generator=g) * 0.002 + 0.0005
        d1, d2 = w1.to(F64) * s1.to(F64)[:, :, None], w2.to(F64) * s2.to(F64)[:, :, None]
        kw = dict(use_int8_w8a8=True, w1_scale=s1, w2_scale=s2)
    else:
        def codes(shape):  # finite e4m3 codes of magnitude <= 1 (no NaN 0x7f / 0xff)
            c = torch.randint(0, 0x38, shape, generator=g, dtype=torch.int64)
            return (c + 128 * torch.randint(0, 2, shape, generator=g)).to(torch.uint8)
        w1, w2 = codes((e, 2 * inter, h)), codes((e, h, inter))
        if fmt == "fp8_block":  # block 32 x 64 (sgl-kernel: 128 x 128 only)
            bn, bk = 32, 64
            s1 = torch.rand(e, 2 * inter // bn, h // bk, generator=g) * 0.05 + 0.01
            s2 = torch.rand(e, h // bn, inter // bk, generator=g) * 0.05 + 0.01
            d1 = e4m3_to_f64(w1) * s1.to(F64).repeat_interleave(bn, 1).repeat_interleave(bk, 2)
            d2 = e4m3_to_f64(w2) * s2.to(F64).repeat_interleave(bn, 1).repeat_interleave(bk, 2)
            kw = dict(use_fp8_w8a16=True, w1_scale=s1, w2_scale=s2, block_size=[bn, bk])
        else:
            s1 = torch.rand(e, 2 * inter, generator=g) * 0.05 + 0.01
            s2 = torch.rand(e, h, generator=g) * 0.05 + 0.01
            d1 = e4m3_to_f64(w1) * s1.to(F64)[:, :, None]
            d2 = e4m3_to_f64(w2) * s2.to(F64)[:, :, None]
            kw = dict(use_fp8_w8a16=True, w1_scale=s1, w2_scale=s2)
    ref, _ = ref_experts(x, d1, d2, tw, ti)
    out = sgl.fused_experts_cpu(x, sgl.convert_weight_packed(w1), sgl.convert_weight_packed(w2),
                                tw, ti, False, **kw)
    err = (out.to(F64) - ref).abs().max()
    assert err <= 0.05 * ref.abs().max(), f"{fmt}: max err {err} of {ref.abs().max()}"


@pytest.mark.parametrize("fmt", ["int8", "fp8"])
def test_fused_experts_packed_weight_follows_new_scales(fmt):
    # One convert_weight_packed weight called with new scale tensors each time (temporaries
    # whose ids come back, and one tensor changed in place): every call uses its own scales,
    # as sgl-kernel does, and the weight keeps one packing per projection.
    e, h, inter, t, k = 4, 64, 32, 3, 2
    g = torch.Generator().manual_seed(72)
    if fmt == "int8":
        w1 = torch.randint(-127, 128, (e, 2 * inter, h), generator=g, dtype=torch.int8)
        w2 = torch.randint(-127, 128, (e, h, inter), generator=g, dtype=torch.int8)
        s1, s2 = torch.full((e, 2 * inter), 0.001), torch.full((e, h), 0.001)
        flags = dict(use_int8_w8a8=True)
    else:
        w1 = torch.randint(0, 0x38, (e, 2 * inter, h), generator=g, dtype=torch.int64)
        w1, w2 = w1.to(torch.uint8), w1[:, :h, :inter].contiguous().to(torch.uint8)
        s1, s2 = torch.full((e, 2 * inter), 0.05), torch.full((e, h), 0.05)
        flags = dict(use_fp8_w8a16=True)
    p1, p2 = sgl.convert_weight_packed(w1), sgl.convert_weight_packed(w2)
    x = rnd((t, h), 73)
    tw, ti = routed(t, e, k, 74)
    for f in (1.0, 2.0, 3.0, 4.0, 5.0):
        got = sgl.fused_experts_cpu(x, p1, p2, tw, ti, False, w1_scale=s1 * f, w2_scale=s2,
                                    **flags)
        want = sgl.fused_experts_cpu(x, w1, w2, tw, ti, False, w1_scale=s1 * f, w2_scale=s2,
                                     **flags)
        assert torch.equal(got, want), f"w1_scale x{f}"
    s2[1:] *= 3  # in place: same tensor, new values
    got = sgl.fused_experts_cpu(x, p1, p2, tw, ti, False, w1_scale=s1, w2_scale=s2, **flags)
    want = sgl.fused_experts_cpu(x, w1, w2, tw, ti, False, w1_scale=s1, w2_scale=s2, **flags)
    assert torch.equal(got, want), "w2_scale changed in place"
    assert len(p1._packed) == 1 and len(p2._packed) == 1


def test_fused_experts_int8_static_act_scales():
    # vLLM / sglang's static per-tensor a1_scale / a2_scale: s8 codes
    # clamp(round(x / s), -128, 127) of each projection's input, both scales
    # powers of two so x / s is exact (x * (1 / s) in tilejit: the same codes),
    # small enough that codes saturate in both. Bound: the bf16 output
    # (2^-8 |ref|), f32 sums (2^-16 mag), and each activation code one step
    # (s2) off where tilejit's f32 activation rounds to the other bf16
    # neighbour (one bf16 ulp of an unclipped a, <= 2^-7 * 128 s2 = s2, crosses
    # one code midpoint at most).
    e, h, inter, t, k = 4, 128, 64, 6, 2
    g = torch.Generator().manual_seed(23)
    x = rnd((t, h), 24)
    tw, ti = routed(t, e, k, 25)
    w1 = torch.randint(-127, 128, (e, 2 * inter, h), generator=g, dtype=torch.int8)
    w2 = torch.randint(-127, 128, (e, h, inter), generator=g, dtype=torch.int8)
    s1 = torch.rand(e, 2 * inter, generator=g) * 0.002 + 0.0005
    s2 = torch.rand(e, h, generator=g) * 0.002 + 0.0005
    d1, d2 = w1.to(F64) * s1.to(F64)[:, :, None], w2.to(F64) * s2.to(F64)[:, :, None]
    as1, as2 = 2.0**-6, 2.0**-7

    def q(v, s):
        return (v.to(F64) / s).round().clamp(-128, 127) * s

    xq = q(x, as1)
    ref = torch.zeros(t, h, dtype=F64)
    slack = torch.zeros_like(ref)
    mag = torch.zeros_like(ref)
    clipped = int(((x.to(F64) / as1).abs() > 127.5).sum())
    for tt in range(t):
        for j in range(k):
            ex = int(ti[tt, j])
            gu = d1[ex] @ xq[tt]
            a = (gu[:inter] * torch.sigmoid(gu[:inter]) * gu[inter:]).to(torch.bfloat16)
            clipped += int(((a.to(F64) / as2).abs() > 127.5).sum())
            aq = q(a, as2)
            ref[tt] += tw[tt, j] * (d2[ex] @ aq)
            mag[tt] += tw[tt, j].abs() * (d2[ex].abs() @ aq.abs())
            slack[tt] += tw[tt, j].abs() * as2 * d2[ex].abs().sum(1)
    assert clipped > 0  # the saturation is exercised
    p1, p2 = sgl.convert_weight_packed(w1), sgl.convert_weight_packed(w2)
    kw = dict(use_int8_w8a8=True, w1_scale=s1, w2_scale=s2)
    out = sgl.fused_experts_cpu(x, p1, p2, tw, ti, False, a1_scale=torch.tensor([as1]),
                                a2_scale=torch.tensor(as2), **kw)
    within(out, ref, 2.0**-8 * ref.abs() + 2.0**-16 * mag + slack, "static a-scales")
    same = sgl.fused_experts_cpu(x, p1, p2, tw, ti, False, a1_scale=as1, a2_scale=as2, **kw)
    assert torch.equal(out, same)
    dyn = sgl.fused_experts_cpu(x, p1, p2, tw, ti, False, **kw)  # per token: other codes
    assert not torch.equal(out, dyn)
    with pytest.raises(tilejit.Error, match="a1_scale has shape \\(6, 1\\); allowed: one"):
        sgl.fused_experts_cpu(x, p1, p2, tw, ti, False, a1_scale=torch.ones(t, 1),
                              a2_scale=as2, **kw)
    with pytest.raises(tilejit.Error, match="a2_scale is None; allowed: both"):
        sgl.fused_experts_cpu(x, p1, p2, tw, ti, False, a1_scale=as1, **kw)
    with pytest.raises(tilejit.Error, match="act_scale2=0; allowed: finite > 0"):
        sgl.fused_experts_cpu(x, p1, p2, tw, ti, False, a1_scale=as1, a2_scale=0.0, **kw)
    with pytest.raises(tilejit.Error, match="act_scale13=nan"):
        sgl.fused_experts_cpu(x, p1, p2, tw, ti, False, a1_scale=math.nan, a2_scale=as2, **kw)


def test_fused_experts_errors():
    w1, w2 = rnd((2, 64, 32), 20), rnd((2, 32, 32), 21)
    x, tw, ti = rnd((3, 32), 22), torch.ones(3, 1), torch.zeros(3, 1, dtype=torch.int32)
    with pytest.raises(tilejit.Error, match="a1_scale / a2_scale given without use_int8_w8a8"):
        sgl.fused_experts_cpu(x, w1, w2, tw, ti, False, a1_scale=torch.ones(1))
    with pytest.raises(tilejit.Error, match=r"w1.dtype=torch.bfloat16 with use_int8_w8a8=True; "
                       "allowed: torch.int8"):
        sgl.fused_experts_cpu(x, w1, w2, tw, ti, False, use_int8_w8a8=True)
    with pytest.raises(tilejit.Error, match="hidden_states.dtype"):
        sgl.fused_experts_cpu(x.float(), w1, w2, tw, ti, False)
    with pytest.raises(tilejit.Error, match="out of range"):
        sgl.fused_experts_cpu(x, w1, w2, tw, ti + 5, False)


def raised(fn, *args, **kwargs):
    """The message of the tilejit.Error fn(*args, **kwargs) raises."""
    with pytest.raises(tilejit.Error) as e:
        fn(*args, **kwargs)
    return str(e.value)


def test_fused_experts_quantized_errors_name_the_wrong_argument():
    # One message covered the weight's dtype and its scale: a missing w1_scale
    # with a correct int8 w1 read "needs w1 int8 (got torch.int8) and w1_scale
    # ... (got None)". Each branch now names only the argument that is wrong,
    # and the flag as the call spelled it.
    e, n2, h, n = 2, 64, 32, 32
    g = torch.Generator().manual_seed(30)
    w1 = torch.randint(-8, 8, (e, n2, h), generator=g, dtype=torch.int8)
    w2 = torch.randint(-8, 8, (e, h, n), generator=g, dtype=torch.int8)
    s1, s2 = torch.ones(e, n2), torch.ones(e, h)
    x, tw, ti = rnd((3, h), 31), torch.ones(3, 1), torch.zeros(3, 1, dtype=torch.int32)
    fe = sgl.fused_experts_cpu
    int8_s1 = ("allowed: a float32 tensor of E·N = 128 values ([E, N] = [2, 64] or [E, N, 1]: "
               "per-channel scales of w1) or of E = 2 (one per expert)")
    msg = raised(fe, x, w1, w2, tw, ti, False, use_int8_w8a8=True, w2_scale=s2)
    assert msg == "fused_experts_cpu: w1_scale=None with use_int8_w8a8=True; " + int8_s1
    assert "dtype" not in msg and "got torch.int8" not in msg
    assert raised(fe, x, w1, w2, tw, ti, False, CPUQuantMethod(1), w2_scale=s2) == (
        "fused_experts_cpu: w1_scale=None with moe_comp_method=1 (INT8_W8A8); " + int8_s1)
    assert raised(fe, x, w1, w2, tw, ti, False, use_int8_w8a8=True, w1_scale=s1) == (
        "fused_experts_cpu: w2_scale=None with use_int8_w8a8=True; allowed: a float32 tensor "
        "of E·N = 64 values ([E, N] = [2, 32] or [E, N, 1]: per-channel scales of w2) or of "
        "E = 2 (one per expert)")
    # A scale of another expert count: named (it was a torch reshape error in packing).
    assert raised(fe, x, w1, w2, tw, ti, False, use_int8_w8a8=True, w1_scale=torch.ones(3),
                  w2_scale=s2) == ("fused_experts_cpu: w1_scale has shape (3,) with "
                                   "use_int8_w8a8=True; " + int8_s1)
    # A wrong weight with a right scale: the weight's dtype only.
    msg = raised(fe, x, w1.to(torch.bfloat16), w2, tw, ti, False, use_int8_w8a8=True,
                 w1_scale=s1, w2_scale=s2)
    assert msg == "fused_experts_cpu: w1.dtype=torch.bfloat16 with use_int8_w8a8=True; " \
        "allowed: torch.int8"
    # fp8 W8A16 (e4m3 codes as uint8), the same split.
    c1, c2 = w1.view(torch.uint8) & 0x3f, w2.view(torch.uint8) & 0x3f  # finite codes
    fp8_s1 = ("allowed: a float32 tensor [E, N] = [2, 64] with block_size=None, or "
              "[E, ceil(N / block_n), ceil(K / block_k)] with a block_size (scales of w1)")
    msg = raised(fe, x, c1, c2, tw, ti, False, use_fp8_w8a16=True, w2_scale=s2)
    assert msg == "fused_experts_cpu: w1_scale=None with use_fp8_w8a16=True; " + fp8_s1
    assert "uint8" not in msg
    assert raised(fe, x, c1, c2, tw, ti, False, CPUQuantMethod(2), w1_scale=s1[:1],
                  w2_scale=s2) == ("fused_experts_cpu: w1_scale has shape (1, 64) with w1 of 2 "
                                   "experts; " + fp8_s1)
    msg = raised(fe, x, w1, w2, tw, ti, False, use_fp8_w8a16=True, w1_scale=s1, w2_scale=s2)
    assert msg == ("fused_experts_cpu: w1.dtype=torch.int8 with use_fp8_w8a16=True; allowed: "
                   "torch.uint8 e4m3 codes (torch 1.13 has no float8: pass "
                   "weight.view(torch.uint8))")
    assert raised(fe, x, c1, c2, tw, ti, False, use_fp8_w8a16=True, w1_scale=s1, w2_scale=s2,
                  block_size=128) == ("fused_experts_cpu: block_size=128 with "
                                      "use_fp8_w8a16=True; allowed: None (per-channel scales) "
                                      "or two positive ints [block_n, block_k]")
    # The right arguments run (the checks refuse nothing valid).
    assert fe(x, w1, w2, tw, ti, False, use_int8_w8a8=True, w1_scale=s1.view(e, n2, 1),
              w2_scale=s2, is_vnni=False).shape == (3, h)


# ---- routers -------------------------------------------------------------------------

def ref_topk(scores, k, renormalize):
    w, ids = torch.topk(scores, k)
    if renormalize:
        w = w / w.sum(-1, keepdim=True)
    return w, ids


def same_topk(w, ids, rw, rids):
    assert w.dtype == torch.float32 and ids.dtype == torch.int32
    assert torch.equal(ids.long(), rids), f"{ids} vs {rids}"
    torch.testing.assert_close(w.to(F64), rw, rtol=2.0**-20, atol=0)


@pytest.mark.parametrize("renormalize", [True, False])
def test_topk_softmax_and_sigmoid(renormalize):
    logits = rnd((6, 10), 23, dtype=torch.float32)  # E = 10: not in sgl-kernel's list
    w, ids = sgl.topk_softmax_cpu(None, logits, 3, renormalize)
    same_topk(w, ids, *ref_topk(torch.softmax(logits.to(F64), -1), 3, renormalize))
    w, ids = sgl.topk_sigmoid_cpu(None, logits, 3, renormalize)
    same_topk(w, ids, *ref_topk(torch.sigmoid(logits.to(F64)), 3, renormalize))


def ref_grouped(scores, bias, k, groups, topk_group, renormalize):
    t, e = scores.shape
    key = scores if bias is None else scores + bias
    g = key.view(t, groups, e // groups)
    gscore = g.max(-1).values if bias is None else g.topk(2, -1).values.sum(-1)
    keep = torch.zeros(t, groups, dtype=torch.bool)
    keep.scatter_(1, gscore.topk(topk_group, -1).indices, True)
    masked = key.masked_fill(~keep.repeat_interleave(e // groups, 1), -math.inf)
    ids = masked.topk(k, -1).indices
    w = scores.gather(1, ids)
    if renormalize:
        w = w / w.sum(-1, keepdim=True)
    return w, ids


def test_router_and_rope_argument_errors():
    logits = rnd((4, 8), 75, dtype=torch.float32)
    for bad in (-1, 0, 2.5, True):  # True: operator.index read it as 1
        with pytest.raises(tilejit.Error, match=f"topk={bad!r}; allowed: an integer >= 1"):
            sgl.topk_softmax_cpu(None, logits, bad, True)
    # A 4-D query whose [B, S] cannot be merged into one token dim (rotated in place).
    q = rnd((2, 6, 4, 64), 76).transpose(0, 1)
    k = rnd((6, 2, 1, 64), 77)
    cache = rnd((16, 64), 78, dtype=torch.float32)
    with pytest.raises(tilejit.Error, match="query has shape .* cannot be viewed"):
        sgl.rotary_embedding_cpu(torch.zeros(6, 2, dtype=torch.int64), q, k, 64, cache, True)


def test_rope_errors_carry_the_op_name():
    # The query / key checks shared by the RoPE ops raised without the op's
    # name ("query has shape (2, 100); allowed: ..."), and a 1-D cache, a float
    # head_size or an int mrope_section were torch / Python errors.
    rope, mrope, md = (sgl.rotary_embedding_cpu, sgl.multimodal_rotary_embedding_cpu,
                       sgl.apply_multidimensional_rope_cpu)
    cache = rnd((16, 64), 79, dtype=torch.float32)
    pos, q, k = torch.arange(2), rnd((2, 128), 80), rnd((2, 64), 81)
    assert raised(rope, pos, rnd((2, 100), 82), k, 64, cache, True) == (
        "rotary_embedding_cpu: query has shape (2, 100); allowed: [T, H * head_size] with "
        "head_size=64")
    assert raised(mrope, pos, q, rnd((2, 100), 82), 64, cache) == (
        "multimodal_rotary_embedding_cpu: key has shape (2, 100); allowed: [T, H * head_size] "
        "with head_size=64")
    assert raised(rope, pos, q, k, 0, cache, True) == \
        "rotary_embedding_cpu: head_size=0; allowed: an int > 0"
    assert raised(rope, pos, q, k, 64.0, cache, True) == \
        "rotary_embedding_cpu: head_size=64.0; allowed: an int > 0"
    assert raised(rope, pos, q.view(1, 2, 2, 1, 64), k, 64, cache, True) == (
        "rotary_embedding_cpu: query has 5 dims (shape (1, 2, 2, 1, 64)); allowed: 2, 3, 4")
    assert raised(rope, [0, 1], q, k, 64, cache, True) == \
        "rotary_embedding_cpu: positions: expected a torch.Tensor, got list"
    assert raised(rope, pos, q, k, 64, cache[0], True) == (
        "rotary_embedding_cpu: cos_sin_cache has shape (64,); allowed: [max_position, "
        "rotary_dim]")
    # [B, S] that cannot merge into one token dim (rotated in place, so not copied).
    q4, k4 = rnd((2, 6, 4, 64), 85).transpose(0, 1), rnd((6, 2, 1, 64), 86)
    assert raised(rope, torch.zeros(6, 2, dtype=torch.int64), q4, k4, 64, cache, True) == (
        "rotary_embedding_cpu: query has shape (6, 2, 4, 64) and strides (256, 1536, 64, 1), "
        "which cannot be viewed as (-1, 4, 64) (rotated in place: no copy); allowed: tokens "
        "one row stride apart, each head's elements contiguous")
    assert raised(mrope, torch.zeros(3, 2, dtype=torch.int64), q, k, 64, cache, 16) == (
        "multimodal_rotary_embedding_cpu: mrope_section=16; allowed: a list of ints (frequency "
        "counts per position row)")
    q3, cs = rnd((2, 1, 8), 83), torch.ones(2, 8)
    assert raised(md, None, q3, cs, cs) == \
        "apply_multidimensional_rope_cpu: query: expected a torch.Tensor, got NoneType"
    assert raised(md, q3.half(), q3.half(), cs, cs).startswith(
        "apply_multidimensional_rope_cpu: query.dtype=torch.float16 is refused")
    # The core's own check (key's token count) under the op's name, as the other ops'.
    assert raised(md, q3, rnd((3, 1, 8), 84), cs, cs).startswith(
        "apply_multidimensional_rope_cpu: rope: k has shape [3, 1, 8]")


def test_grouped_topk_and_biased():
    t, e, groups, tg, k = 5, 12, 3, 2, 3  # 12 experts in 3 groups: sizes sgl-kernel refuses
    logits = rnd((t, e), 24, dtype=torch.float32)
    bias = rnd((e,), 25, 0.3, torch.float32)
    w, ids = sgl.grouped_topk_cpu(None, logits, k, True, groups, tg)
    same_topk(w, ids, *ref_grouped(torch.softmax(logits.to(F64), -1), None, k, groups, tg, True))
    w, ids = sgl.biased_grouped_topk_cpu(None, logits, bias, k, False, groups, tg, 0, 2.5)
    rw, rids = ref_grouped(torch.sigmoid(logits.to(F64)), bias.to(F64), k, groups, tg, False)
    same_topk(w, ids, rw, rids)  # routed_scaling_factor not applied (sgl-kernel's rule)
    _, ids = sgl.biased_grouped_topk_cpu(None, logits, bias, k, True, groups, tg, 0, None,
                                         torch.tensor(3))
    assert bool((ids[3:] == -1).all()) and bool((ids[:3] >= 0).all())
    with pytest.raises(tilejit.Error, match="num_token_non_padded=-1; allowed: >= 0"):
        sgl.biased_grouped_topk_cpu(None, logits, bias, k, True, groups, tg, 0, None,
                                    torch.tensor(-1))
    with pytest.raises(tilejit.Error, match="num_fused_shared_experts=1"):
        sgl.grouped_topk_cpu(None, logits, k, True, groups, tg, 1)


# ---- RoPE --------------------------------------------------------------------------

def ref_rope(x, pos_rows, cos_sin, neox, rd):
    """x [T, H, D] float64; cos_sin [T, rd] float64 (the row of each token):
    vLLM / sglang forward_native."""
    x = x.clone()
    cos, sin = cos_sin[:, None, :rd // 2], cos_sin[:, None, rd // 2:]
    r = x[..., :rd]
    if neox:
        a, b = r[..., :rd // 2], r[..., rd // 2:]
    else:
        a, b = r[..., 0::2], r[..., 1::2]
    oa, ob = a * cos - b * sin, b * cos + a * sin
    mag = torch.cat([(a * cos).abs() + (b * sin).abs(), (b * cos).abs() + (a * sin).abs()], -1)
    if neox:
        x[..., :rd] = torch.cat([oa, ob], -1)
    else:
        x[..., :rd] = torch.stack([oa, ob], -1).flatten(-2)
        mag = torch.stack([mag[..., :rd // 2], mag[..., rd // 2:]], -1).flatten(-2)
    full = torch.zeros_like(x)
    full[..., :rd] = mag
    return x, full


def rope_tol(ref, mag):
    return 2.0**-7 * ref.abs() + 2.0**-21 * mag


@pytest.mark.parametrize("d,rd,neox,layout", [
    (128, 128, True, 2), (80, 80, True, 2), (96, 64, False, 2), (112, 112, True, 4),
    (192, 96, True, 3), (64, 64, False, 3)])
def test_rotary_embedding(d, rd, neox, layout):
    t, hq, hk = 9, 4, 2
    q0, k0 = rnd((t, hq, d), 26), rnd((t, hk, d), 27)
    cache = rnd((64, rd), 28, dtype=torch.float32)
    pos = torch.randint(0, 64, (t,), generator=torch.Generator().manual_seed(29))
    rq, mq = ref_rope(q0.to(F64), pos, cache.to(F64)[pos], neox, rd)
    rk, mk = ref_rope(k0.to(F64), pos, cache.to(F64)[pos], neox, rd)
    if layout == 2:
        q, k = q0.reshape(t, hq * d).clone(), k0.reshape(t, hk * d).clone()
    elif layout == 4:
        q, k = q0.view(1, t, hq, d).clone(), k0.view(1, t, hk, d).clone()
    else:
        q, k = q0.clone(), k0.clone()
    oq, ok = sgl.rotary_embedding_cpu(pos, q, k, d, cache, neox)
    if layout == 3:  # out of place: inputs untouched
        assert torch.equal(q, q0) and torch.equal(k, k0)
    else:
        assert oq is q and ok is k
    within(oq.reshape(t, hq, d), rq, rope_tol(rq, mq), "q")
    within(ok.reshape(t, hk, d), rk, rope_tol(rk, mk), "k")


def test_multimodal_rotary_embedding():
    t, hq, hk, d, section = 6, 2, 1, 64, [8, 12, 12]
    q0, k0 = rnd((t, hq * d), 30), rnd((t, hk * d), 31)
    cache = rnd((40, d), 32, dtype=torch.float32)
    pos = torch.randint(0, 40, (3, t), generator=torch.Generator().manual_seed(33))
    # sglang's MRotaryEmbedding.forward_native: cos / sin of section s from positions[s].
    rows = cache.to(F64)[pos]  # [3, T, d]
    cos, sin = rows[..., :d // 2], rows[..., d // 2:]
    sel = torch.cat([torch.full((n,), s) for s, n in enumerate(section)])
    cs = torch.cat([cos[sel, :, torch.arange(d // 2)].T, sin[sel, :, torch.arange(d // 2)].T], 1)
    rq, mq = ref_rope(q0.to(F64).view(t, hq, d), None, cs, True, d)
    rk, mk = ref_rope(k0.to(F64).view(t, hk, d), None, cs, True, d)
    q, k = q0.clone(), k0.clone()
    sgl.multimodal_rotary_embedding_cpu(pos, q, k, d, cache, section, False, True)
    within(q.view(t, hq, d), rq, rope_tol(rq, mq), "q")
    within(k.view(t, hk, d), rk, rope_tol(rk, mk), "k")
    # Text-only batch: 1-D positions are plain RoPE.
    q, k = q0.clone(), k0.clone()
    sgl.multimodal_rotary_embedding_cpu(pos[0], q, k, d, cache, None, False, True)
    rq, mq = ref_rope(q0.to(F64).view(t, hq, d), None, cache.to(F64)[pos[0]], True, d)
    within(q.view(t, hq, d), rq, rope_tol(rq, mq), "text-only q")


def sglang_interleave(x, section):
    """sglang's apply_interleaved_rope (mrope.py): x [3, T, half] -> [T, half]."""
    out = x[0].clone()
    out[..., 1:section[1] * 3:3] = x[1, ..., 1:section[1] * 3:3]
    out[..., 2:section[2] * 3:3] = x[2, ..., 2:section[2] * 3:3]
    return out


@pytest.mark.parametrize("neox", [True, False])
def test_multimodal_rotary_embedding_interleaved(neox):
    # Qwen3-VL's sections on D = 128 (frequencies 60..63 take the t row), a
    # partial rotary (cache width 96 < D), and T = 37 (several chunks).
    for t, d, rd, section in ((37, 128, 128, [24, 20, 20]), (5, 128, 96, [16, 17, 15])):
        hq, hk = 3, 1
        q0, k0 = rnd((t, hq * d), 60), rnd((t, hk * d), 61)
        cache = rnd((50, rd), 62, dtype=torch.float32)
        pos = torch.randint(0, 50, (3, t), generator=torch.Generator().manual_seed(63))
        # sglang's MRotaryEmbedding.forward_native with mrope_interleaved=True.
        rows = cache.to(F64)[pos]  # [3, T, rd]
        cs = torch.cat([sglang_interleave(rows[..., :rd // 2], section),
                        sglang_interleave(rows[..., rd // 2:], section)], -1)
        rq, mq = ref_rope(q0.to(F64).view(t, hq, d), None, cs, neox, rd)
        rk, mk = ref_rope(k0.to(F64).view(t, hk, d), None, cs, neox, rd)
        q, k = q0.clone(), k0.clone()
        sgl.multimodal_rotary_embedding_cpu(pos, q, k, d, cache, section, True, neox)
        within(q.view(t, hq, d), rq, rope_tol(rq, mq), "q")
        within(k.view(t, hk, d), rk, rope_tol(rk, mk), "k")
        # Not the non-interleaved result: the flag reaches the kernel.
        q2, k2 = q0.clone(), k0.clone()
        sgl.multimodal_rotary_embedding_cpu(pos, q2, k2, d, cache, section, False, neox)
        assert not torch.equal(q2, q)
    # Interleaving needs exactly 3 sections (these 2 sum to rd / 2 = 48).
    with pytest.raises(tilejit.Error,
                       match=r"mrope_interleaved=true with mrope_section=\[24, 24\]"):
        sgl.multimodal_rotary_embedding_cpu(pos, q, k, d, cache, [24, 24], True, neox)


def test_apply_multidimensional_rope():
    t, hq, hk, d = 5, 3, 2, 96  # chunks of 48
    q0, k0 = rnd((t, hq, d), 34), rnd((t, hk, d), 35)
    c = d // 2
    freqs = rnd((t, 2, c // 2), 36, dtype=torch.float32)  # per token, per chunk
    emb = torch.cat([freqs, freqs], -1).reshape(t, d)     # cat(freqs, freqs) per chunk
    cos, sin = emb.cos(), emb.sin()

    def ref(x):  # sglang's _apply_multidimensional_rope_ref
        outs, mags = [], []
        for ch in range(2):
            part = x[..., ch * c:(ch + 1) * c].to(F64)
            cc, ss = cos[:, None, ch * c:(ch + 1) * c].to(F64), sin[:, None, ch * c:(ch + 1) * c].to(F64)
            rot = torch.cat([-part[..., c // 2:], part[..., :c // 2]], -1)
            outs.append(part * cc + rot * ss)
            mags.append((part * cc).abs() + (rot * ss).abs())
        return torch.cat(outs, -1), torch.cat(mags, -1)

    rq, mq = ref(q0)
    rk, mk = ref(k0)
    q, k = q0.clone(), k0.clone()
    oq, ok = sgl.apply_multidimensional_rope_cpu(q, k, cos, sin)
    assert oq is q and ok is k
    within(q, rq, rope_tol(rq, mq), "q")
    within(k, rk, rope_tol(rk, mk), "k")
    bad = cos.clone()
    bad[0, 1] += 0.5
    with pytest.raises(tilejit.Error, match="does not repeat its first half"):
        sgl.apply_multidimensional_rope_cpu(q, k, bad, sin)


# ---- attention -------------------------------------------------------------------------

def ref_attn(q, k, v, causal=False, scale=None, window=-1, cap=0.0, sinks=None,
             top_left=False):
    """One sequence, float64: q [n, Hq, D], k [m, Hkv, D], v [m, Hkv, Dv];
    query i at position m - n + i (bottom-right), or i (top_left)."""
    n, hq, d = q.shape
    m, hkv, _ = k.shape
    grp = hq // hkv
    scale = 1 / math.sqrt(d) if scale is None else scale
    ipos = ((0 if top_left else m - n) + torch.arange(n))[:, None]
    j = torch.arange(m)[None, :]
    out = torch.zeros(n, hq, v.shape[2], dtype=F64)
    for h in range(hq):
        s = q[:, h] @ k[:, h // grp].T * scale
        if cap:
            s = cap * torch.tanh(s / cap)
        vis = torch.ones_like(s, dtype=torch.bool)
        if causal:
            vis &= j <= ipos
        if window >= 0:
            vis &= j >= ipos - window
        s = s.masked_fill(~vis, -math.inf)
        if sinks is not None:
            s = torch.cat([s, torch.full((n, 1), float(sinks[h]), dtype=F64)], 1)
        p = torch.softmax(s, -1)
        out[:, h] = p[:, :m] @ v[:, h // grp]
    return out


def attn_tol(ref, v):
    return 2.0**-7 * v.abs().max() + 2.0**-8 * ref.abs()


@pytest.mark.parametrize("d,causal", [(80, True), (192, False), (112, True)])
def test_flash_attn_varlen_func(d, causal):
    hq, hkv, dv = 4, 2, 64
    q, k, v = rnd((8, hq, d), 37), rnd((11, hkv, d), 38), rnd((11, hkv, dv), 39)
    cu_q = torch.tensor([0, 3, 8], dtype=torch.int32)
    cu_k = torch.tensor([0, 6, 11], dtype=torch.int32)
    out = sgl.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 5, 6, causal, 0.2)
    assert out.shape == (8, hq, dv) and out.dtype == torch.bfloat16
    for b in range(2):  # causal: top-left, as sgl-kernel's flash_attn.cpp
        sq, sk = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        ref = ref_attn(q[sq].to(F64), k[sk].to(F64), v[sk].to(F64), causal, 0.2,
                       top_left=True)
        within(out[sq], ref, attn_tol(ref, v), f"seq {b}")


def token_pool(n_slots, seq_lens, seed):
    """sglang's pools: req_to_token rows of shuffled slots for requests 2, 0, 3."""
    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(n_slots, generator=g)
    req_to_token = torch.zeros(4, 16, dtype=torch.int32)
    req_pool_indices = torch.tensor([2, 0, 3])
    at = 0
    for r, n in zip(req_pool_indices.tolist(), seq_lens):
        req_to_token[r, :n] = perm[at:at + n].to(torch.int32)
        at += n
    return req_to_token, req_pool_indices


@pytest.mark.parametrize("d,opts", [
    (96, {}), (128, {"logit_cap": 30.0, "sliding_window_size": 3}),
    (112, {"sinks": True}), (192, {})])
def test_decode_attention_cpu(d, opts):
    hq, hkv, dv, n_slots = 8, 2, d, 40
    seq_lens = [5, 1, 9]
    req_to_token, rpi = token_pool(n_slots, seq_lens, 40)
    kb, vb = rnd((n_slots, hkv, d), 41), rnd((n_slots, hkv, dv), 42)
    q, key, value = rnd((3, hq, d), 43), rnd((3, hkv, d), 44), rnd((3, hkv, dv), 45)
    loc = torch.stack([req_to_token[r, n - 1] for r, n in zip(rpi.tolist(), seq_lens)]).long()
    sinks = rnd((hq,), 46, dtype=torch.float32) if opts.get("sinks") else None
    cap, win = opts.get("logit_cap", 0.0), opts.get("sliding_window_size", -1)
    out = torch.empty(3, hq, dv, dtype=torch.bfloat16)
    attn_logits = torch.empty(3, hq, 4, dv + 1)
    sgl.decode_attention_cpu(q, kb, vb, out, key, value, loc, attn_logits, req_to_token, rpi,
                             torch.tensor(seq_lens), 0.15, cap, win, sinks)
    assert torch.equal(kb[loc], key) and torch.equal(vb[loc], value)  # stored first
    for b, (r, n) in enumerate(zip(rpi.tolist(), seq_lens)):
        slots = req_to_token[r, :n].long()
        ref = ref_attn(q[b:b + 1].to(F64), kb[slots].to(F64), vb[slots].to(F64), False, 0.15,
                       win, cap, sinks)
        within(out[b:b + 1], ref, attn_tol(ref, vb[slots]), f"seq {b}")


@pytest.mark.parametrize("d,mask", [(80, False), (128, True)])
def test_extend_attention_cpu(d, mask):
    hq, hkv, dv, n_slots = 4, 1, 64, 40
    prefix, ext = [3, 0, 6], [4, 2, 3]
    seq_lens = [p + e for p, e in zip(prefix, ext)]
    req_to_token, rpi = token_pool(n_slots, seq_lens, 47)
    kb, vb = rnd((n_slots, hkv, d), 48), rnd((n_slots, hkv, dv), 49)
    tq = sum(ext)
    q, ke, ve = rnd((tq, hq, d), 50), rnd((tq, hkv, d), 51), rnd((tq, hkv, dv), 52)
    start = torch.tensor([0, 4, 6])
    custom = None
    if mask:  # sglang's layout: per request [n_b, seq_len_b], prefix columns set
        g = torch.Generator().manual_seed(53)
        parts = []
        for p, e in zip(prefix, ext):
            m = torch.ones(e, p + e, dtype=torch.bool)
            m[:, p:] = torch.rand(e, e, generator=g) < 0.6
            m[torch.arange(e), p + torch.arange(e)] = True
            parts.append(m.reshape(-1))
        custom = torch.cat(parts)
    out = torch.empty(tq, hq, dv, dtype=torch.bfloat16)
    sgl.extend_attention_cpu(q, ke, ve, out, kb, vb, req_to_token, rpi, torch.tensor(seq_lens),
                             torch.tensor(ext), start, max(ext), 0.125, 0.0, -1, None, custom)
    if custom is not None:  # the same mask in tilejit's layout (new x new per request)
        tm, at = [], 0
        for p, e in zip(prefix, ext):
            tm.append(custom[at:at + e * (p + e)].view(e, p + e)[:, p:].reshape(-1))
            at += e * (p + e)
        out2 = torch.empty_like(out)
        sgl.extend_attention_cpu(q, ke, ve, out2, kb, vb, req_to_token, rpi,
                                 torch.tensor(seq_lens), torch.tensor(ext), start, max(ext),
                                 0.125, tree_mask=torch.cat(tm).to(torch.uint8))
        # Not bit-equal by contract (split-KV may order sums per thread): within one
        # output rounding of each other, 2^-8 |out| + 2^-9 max|v| (P's bf16 rounding).
        within(out2, out.to(F64), 2.0**-8 * out.to(F64).abs() + 2.0**-9 * ve.abs().max()
               + 2.0**-9 * vb.abs().max(), "tree_mask layout")
        with pytest.raises(tilejit.Error, match="custom_mask and tree_mask both given"):
            sgl.extend_attention_cpu(q, ke, ve, out2, kb, vb, req_to_token, rpi,
                                     torch.tensor(seq_lens), torch.tensor(ext), start, max(ext),
                                     0.125, custom_mask=custom, tree_mask=torch.cat(tm))
    at_mask = 0
    for b, (r, p, e) in enumerate(zip(rpi.tolist(), prefix, ext)):
        s = slice(int(start[b]), int(start[b]) + e)
        slots = req_to_token[r, :p].long()
        kk = torch.cat([kb[slots], ke[s]]).to(F64)
        vv = torch.cat([vb[slots], ve[s]]).to(F64)
        if custom is None:
            ref = ref_attn(q[s].to(F64), kk, vv, True, 0.125)
        else:
            mb = custom[at_mask:at_mask + e * (p + e)].view(e, p + e)
            ref = torch.zeros(e, hq, dv, dtype=F64)
            for i in range(e):  # row by row: keys visible by the mask
                vis = mb[i].nonzero().flatten()
                ref[i] = ref_attn(q[s][i:i + 1].to(F64), kk[vis], vv[vis], False, 0.125)[0]
        at_mask += e * (p + e)
        within(out[s], ref, attn_tol(ref, vv), f"seq {b}")


def test_attention_errors():
    kb, vb = rnd((8, 1, 64), 54), rnd((8, 1, 64), 55)
    req_to_token, rpi = torch.zeros(1, 4, dtype=torch.int32), torch.tensor([0])
    q, out = rnd((2, 2, 64), 56), torch.empty(2, 2, 64, dtype=torch.bfloat16)
    with pytest.raises(tilejit.Error, match="extend_start_loc"):
        sgl.extend_attention_cpu(q, q[:, :1], q[:, :1], out, kb, vb, req_to_token, rpi,
                                 torch.tensor([2]), torch.tensor([2]), torch.tensor([1]), 2, 0.1)
    with pytest.raises(tilejit.Error, match="req_pool_indices"):
        sgl.decode_attention_cpu(q[:1], kb, vb, out[:1], q[:1, :1], q[:1, :1], torch.tensor([0]),
                                 None, req_to_token, torch.tensor([3]), torch.tensor([1]), 0.1)
    with pytest.raises(tilejit.Error, match="seq_lens"):
        sgl.decode_attention_cpu(q[:1], kb, vb, out[:1], q[:1, :1], q[:1, :1], torch.tensor([0]),
                                 None, req_to_token, rpi, torch.tensor([9]), 0.1)
    # A custom_mask shorter than sum(extend_seq_lens * seq_lens): named, not a torch reshape error.
    with pytest.raises(tilejit.Error, match="custom_mask has 3 elements; allowed: .* = 4"):
        sgl.extend_attention_cpu(q, q[:, :1], q[:, :1], out, kb, vb, req_to_token, rpi,
                                 torch.tensor([2]), torch.tensor([2]), torch.tensor([0]), 2, 0.1,
                                 custom_mask=torch.ones(3, dtype=torch.bool))
    # k_scale / v_scale None (sglang's value for a bf16 cache) are 1.
    sgl.decode_attention_cpu(q[:1], kb, vb, out[:1], q[:1, :1], q[:1, :1], torch.tensor([0]),
                             None, req_to_token, rpi, torch.tensor([1]), 0.1, k_scale=None,
                             v_scale=None)
    with pytest.raises(tilejit.Error):  # the library's own check: out of bf16
        sgl.flash_attn_varlen_func(q.float(), q, q, torch.tensor([0, 2], dtype=torch.int32),
                                   torch.tensor([0, 2], dtype=torch.int32), 2, 2, False)


def test_attention_seq_lens_bounded_by_req_to_token():
    # tilejit checked seq_lens against the block table cut here at the longest
    # sequence, so seq_lens=[0] read "allowed: 1 .. max_blocks·block_size = 1",
    # a width the sglang caller never chose; the bound is req_to_token.shape[1].
    kb, vb = rnd((8, 1, 64), 90), rnd((8, 1, 64), 91)
    r2t = torch.arange(16, dtype=torch.int32).view(2, 8) % 8
    q, out = rnd((2, 2, 64), 92), torch.empty(2, 2, 64, dtype=torch.bfloat16)

    def decode(seq_lens, rpi=(0,), key=None):
        b = len(seq_lens)
        loc = None if key is None else torch.arange(b)
        return raised(sgl.decode_attention_cpu, q[:b], kb, vb, out[:b], key,
                      None if key is None else key.clone(), loc, None, r2t, torch.tensor(rpi),
                      torch.tensor(seq_lens), 0.1, 0.0)
    assert decode([0]) == \
        "decode_attention_cpu: seq_lens[0]=0; allowed: 1 .. req_to_token.shape[1] = 8"
    assert decode([9]) == \
        "decode_attention_cpu: seq_lens[0]=9; allowed: 1 .. req_to_token.shape[1] = 8"
    assert decode([3, -1], (0, 1)) == \
        "decode_attention_cpu: seq_lens[1]=-1; allowed: 1 .. req_to_token.shape[1] = 8"
    # An int64 length past int32 is checked before the int32 cast (it would wrap to 3).
    assert decode([2**32 + 3]) == ("decode_attention_cpu: seq_lens[0]=4294967299; allowed: "
                                   "1 .. req_to_token.shape[1] = 8")
    assert decode([[3]]) == ("decode_attention_cpu: seq_lens has shape (1, 1); allowed: [B] "
                             "(one length per request)")
    assert decode([3], (2,)) == \
        "decode_attention_cpu: req_pool_indices has 2..2; allowed: [0, 2)"
    # Checked before the new token is stored: the cache is untouched.
    before = kb.clone()
    assert decode([0], key=rnd((1, 1, 64), 93)).startswith("decode_attention_cpu: seq_lens[0]=0")
    assert torch.equal(kb, before)

    # extend: seq_lens[b] counts the prefix and the new tokens.
    def extend(seq_lens, ext, start=(0,)):
        return raised(sgl.extend_attention_cpu, q, q[:, :1], q[:, :1], out, kb, vb, r2t,
                      torch.tensor([0]), torch.tensor(seq_lens), torch.tensor(ext),
                      torch.tensor(start), 2, 0.1)
    assert extend([1], [2]) == ("extend_attention_cpu: seq_lens[0]=1; allowed: "
                                "extend_seq_lens[0] = 2 .. req_to_token.shape[1] = 8")
    assert extend([9], [2]) == ("extend_attention_cpu: seq_lens[0]=9; allowed: "
                                "extend_seq_lens[0] = 2 .. req_to_token.shape[1] = 8")
    assert extend([2], [-1]) == "extend_attention_cpu: extend_seq_lens[0]=-1; allowed: >= 0"
    assert extend([2, 2], [2]) == ("extend_attention_cpu: seq_lens has shape (2,) and "
                                   "extend_seq_lens (1,); allowed: [B] each (one length per "
                                   "request)")
    assert extend([2], [2], (1,)) == ("extend_attention_cpu: extend_start_loc=[1]; allowed: the "
                                      "running sum of extend_seq_lens = [0]")
    # The bounds themselves run: a whole row of req_to_token, and a prefix of 0.
    o = torch.empty(2, 2, 64, dtype=torch.bfloat16)
    sgl.decode_attention_cpu(q, kb, vb, o, None, None, None, None, r2t, torch.tensor([0, 1]),
                             torch.tensor([8, 1]), 0.1, 0.0)
    sgl.extend_attention_cpu(q, q[:, :1], q[:, :1], o, kb, vb, r2t, torch.tensor([1]),
                             torch.tensor([2]), torch.tensor([2]), torch.tensor([0]), 2, 0.1)


def test_rotary_embedding_fused_qkv_views():
    # q and k as column slices of one qkv buffer (row stride (Hq + 2 Hk) D), as sglang passes them.
    t, hq, hk, d = 7, 4, 2, 64
    qkv = rnd((t, (hq + 2 * hk) * d), 57)
    q, k = qkv[:, :hq * d], qkv[:, hq * d:(hq + hk) * d]
    v0 = qkv[:, (hq + hk) * d:].clone()
    cache = rnd((16, d), 58, dtype=torch.float32)
    pos = torch.arange(t) % 16
    rq, mq = ref_rope(q.to(F64).reshape(t, hq, d), pos, cache.to(F64)[pos], True, d)
    oq, _ = sgl.rotary_embedding_cpu(pos, q, k, d, cache, True)
    assert oq is q
    within(qkv[:, :hq * d].reshape(t, hq, d), rq, rope_tol(rq, mq), "fused q")
    assert torch.equal(qkv[:, (hq + hk) * d:], v0)  # v untouched


def test_fused_experts_takes_packed_experts():
    # int4 and other formats without an sgl-kernel flag: PackedExperts passed as w1 / w2.
    e, h, inter, t = 3, 64, 32, 4
    w1, w2 = rnd((e, 2 * inter, h), 59, 0.1), rnd((e, h, inter), 60, 0.1)
    x = rnd((t, h), 61)
    tw, ti = routed(t, e, 2, 62)
    out = sgl.fused_experts_cpu(x, tilejit.pack_experts(w1, proj="gate_up"),
                                tilejit.pack_experts(w2, proj="down"), tw, ti, False)
    ref, mag = ref_experts(x, w1.to(F64), w2.to(F64), tw, ti)
    within(out, ref, 2.0**-7 * mag + 2.0**-8 * ref.abs(), "PackedExperts")


def test_decode_attention_cpu_fp8_cache():
    # uint8 e4m3 codes with sglang's k_scale / v_scale (cache holds e4m3(x / scale)); the
    # reference reads the same codes (the new token's as store_kv wrote them) times the scale.
    hq, hkv, d, n_slots, ks, vs = 4, 2, 96, 24, 0.05, 0.02
    seq_lens = [4, 7, 2]
    req_to_token, rpi = token_pool(n_slots, seq_lens, 63)
    g = torch.Generator().manual_seed(64)
    kb = torch.randint(0, 0x70, (n_slots, hkv, d), generator=g, dtype=torch.int64)
    kb = (kb + 128 * torch.randint(0, 2, kb.shape, generator=g)).to(torch.uint8)
    vb = torch.randint(0, 0x70, (n_slots, hkv, d), generator=g, dtype=torch.int64).to(torch.uint8)
    q, key, value = rnd((3, hq, d), 65), rnd((3, hkv, d), 66, 0.5), rnd((3, hkv, d), 67, 0.5)
    loc = torch.stack([req_to_token[r, n - 1] for r, n in zip(rpi.tolist(), seq_lens)]).long()
    out = torch.empty(3, hq, d, dtype=torch.bfloat16)
    sgl.decode_attention_cpu(q, kb, vb, out, key, value, loc, None, req_to_token, rpi,
                             torch.tensor(seq_lens), 0.1, 0.0, -1, None, ks, vs)
    # The new rows were quantized: within half an e4m3 step (2^-4 relative) of key / scale.
    kn = e4m3_to_f64(kb[loc]) * ks
    assert bool(((kn - key.to(F64)).abs() <= 2.0**-4 * key.to(F64).abs() + 2.0**-9 * ks).all())
    for b, (r, n) in enumerate(zip(rpi.tolist(), seq_lens)):
        slots = req_to_token[r, :n].long()
        kk, vv = e4m3_to_f64(kb[slots]) * ks, e4m3_to_f64(vb[slots]) * vs
        ref = ref_attn(q[b:b + 1].to(F64), kk, vv, False, 0.1)
        within(out[b:b + 1], ref, attn_tol(ref, vv), f"fp8 seq {b}")


def test_decode_attention_cpu_mla_pool():
    # sglang's MLA pool: v_buffer = k_buffer[..., :Dv] and value = key[..., :Dv] (one latent
    # row per token); the store writes the key once and V is read from its first Dv columns.
    hq, d, dv, n_slots = 4, 192, 128, 32
    seq_lens = [4, 9, 1]
    req_to_token, rpi = token_pool(n_slots, seq_lens, 68)
    kb = rnd((n_slots, 1, d), 69)
    vb = kb.narrow(2, 0, dv)
    q, key = rnd((3, hq, d), 70), rnd((3, 1, d), 71)
    value = key.narrow(2, 0, dv)
    loc = torch.stack([req_to_token[r, n - 1] for r, n in zip(rpi.tolist(), seq_lens)]).long()
    out = torch.empty(3, hq, dv, dtype=torch.bfloat16)
    sgl.decode_attention_cpu(q, kb, vb, out, key, value, loc, None, req_to_token, rpi,
                             torch.tensor(seq_lens), 1 / math.sqrt(d))
    assert torch.equal(kb[loc], key)
    for b, (r, n) in enumerate(zip(rpi.tolist(), seq_lens)):
        slots = req_to_token[r, :n].long()
        kk = kb[slots].to(F64)
        ref = ref_attn(q[b:b + 1].to(F64), kk, kk[..., :dv], False, 1 / math.sqrt(d))
        within(out[b:b + 1], ref, attn_tol(ref, kk[..., :dv]), f"mla seq {b}")


# ---- sgl-kernel schema versions, errors by sgl argument name ------------------------

class CPUQuantMethod(int):  # stands in for sglang's IntEnum (an int, not a bool)
    pass


def moe_case(seed=80, e=4, h=64, inter=32, t=5, k=2):
    w1, w2 = rnd((e, 2 * inter, h), seed, 0.1), rnd((e, h, inter), seed + 1, 0.1)
    x = rnd((t, h), seed + 2)
    tw, ti = routed(t, e, k, seed + 3)
    return x, w1, w2, tw, ti


def test_fused_experts_schema_versions():
    x, w1, w2, tw, ti = moe_case()
    p1, p2 = sgl.convert_weight_packed(w1), sgl.convert_weight_packed(w2)
    ref, mag = ref_experts(x, w1.to(F64), w2.to(F64), tw, ti)
    b = sgl.fused_experts_cpu(x, p1, p2, tw, ti, False, False, False, None, None, None, None,
                              None, None, None, None, None, True)        # B, 18 args
    within(b, ref, 2.0**-7 * mag + 2.0**-8 * ref.abs(), "B")
    calls = {
        "A 14": (False, False, None, None, None, None, None, True),
        "C 13": (CPUQuantMethod(0), None, None, None, None, None, True),
        "D 17": (0, None, None, None, None, None, None, None, None, None, True),
        "D 18": (0, None, None, None, None, None, None, None, None, None, True, "silu"),
    }
    for name, rest in calls.items():
        got = sgl.fused_experts_cpu(x, p1, p2, tw, ti, False, *rest)
        assert torch.equal(got, b), name
    kw = sgl.fused_experts_cpu(x, p1, p2, tw, ti, inplace=False, moe_comp_method=0,
                               is_vnni=True, activation=None)
    assert torch.equal(kw, b)
    # int8 through moe_comp_method=1 (D) and use_int8_w8a8 (A) agree.
    g = torch.Generator().manual_seed(84)
    q1 = torch.randint(-127, 128, w1.shape, generator=g, dtype=torch.int8)
    q2 = torch.randint(-127, 128, w2.shape, generator=g, dtype=torch.int8)
    s1, s2 = torch.full(w1.shape[:2], 0.002), torch.full(w2.shape[:2], 0.002)
    d = sgl.fused_experts_cpu(x, q1, q2, tw, ti, False, 1, s1, s2, None, None, None, None,
                              None, None, None, False)
    a = sgl.fused_experts_cpu(x, q1, q2, tw, ti, False, True, False, s1, s2, None, None, None,
                              False)
    assert torch.equal(a, d)


def test_fused_experts_activation_gelu():
    x, w1, w2, tw, ti = moe_case(90)

    def gelu_erf(g, u):
        return 0.5 * g * (1 + torch.erf(g / math.sqrt(2))) * u

    def gelu_tanh(g, u):
        return 0.5 * g * (1 + torch.tanh(math.sqrt(2 / math.pi) * (g + 0.044715 * g**3))) * u

    for name, f in (("gelu", gelu_erf), ("gelu_tanh", gelu_tanh)):
        ref, mag = ref_experts(x, w1.to(F64), w2.to(F64), tw, ti, f)
        out = sgl.fused_experts_cpu(x, w1, w2, tw, ti, False, 0, None, None, None, None, None,
                                    None, None, None, None, False, name)
        within(out, ref, 2.0**-7 * mag + 2.0**-8 * ref.abs(), name)
    silu = sgl.fused_experts_cpu(x, w1, w2, tw, ti, False, 0, is_vnni=False)
    assert not torch.equal(silu, out)
    with pytest.raises(tilejit.Error, match="activation='relu'; allowed: None, 'silu'"):
        sgl.fused_experts_cpu(x, w1, w2, tw, ti, False, 0, activation="relu", is_vnni=False)
    with pytest.raises(tilejit.Error, match="alpha / limit .* with activation='gelu'"):
        sgl.fused_experts_cpu(x, w1, w2, tw, ti, False, 0, alpha=1.7, activation="gelu",
                              is_vnni=False)


def test_fused_experts_int4_and_mxfp4_methods():
    e, h, inter, t, gs = 3, 64, 32, 4, 32
    rng = torch.Generator().manual_seed(95)

    def expert(n, k):
        return {"qweight": torch.randint(-2**31, 2**31 - 1, (k // 8, n), generator=rng,
                                         dtype=torch.int64).to(torch.int32),
                "scales": torch.rand(k // gs, n, generator=rng) * 0.01 + 0.001}

    p13 = tilejit.pack_experts_int4([expert(2 * inter, h) for _ in range(e)], format="gptq",
                                    group_size=gs, proj="gate_up")
    p2 = tilejit.pack_experts_int4([expert(h, inter) for _ in range(e)], format="gptq",
                                   group_size=gs, proj="down")
    x = rnd((t, h), 96)
    tw, ti = routed(t, e, 2, 97)
    got = sgl.fused_experts_cpu(x, p13, p2, tw, ti, False, CPUQuantMethod(3), None, None, None,
                                None, None, True)
    want = torch.empty_like(x)
    tilejit.fused_experts(x, p13, p2, tw, ti, out=want, int4_route="w4a8")
    assert torch.equal(got, want)  # the W4A8 route, as sgl-kernel's INT4_W4A8
    w1, w2 = rnd((e, 2 * inter, h), 98), rnd((e, h, inter), 99)
    for m in (3, 4):
        with pytest.raises(tilejit.Error, match=f"moe_comp_method={m} .* with w1 a Tensor; "
                           "allowed: a tilejit.PackedExperts"):
            sgl.fused_experts_cpu(x, w1, w2, tw, ti, False, m, None, None, None, None, None,
                                  True)
    with pytest.raises(tilejit.Error, match="moe_comp_method=4 .* packed as int4_gptq"):
        sgl.fused_experts_cpu(x, p13, p2, tw, ti, False, 4, None, None, None, None, None, True)
    with pytest.raises(tilejit.Error, match="w1_scale given with moe_comp_method=3"):
        sgl.fused_experts_cpu(x, p13, p2, tw, ti, False, 3, torch.ones(1), None, None, None,
                              None, True)
    with pytest.raises(tilejit.Error, match="moe_comp_method=5; allowed: 0 \\(UNQUANT\\)"):
        sgl.fused_experts_cpu(x, w1, w2, tw, ti, False, 5, is_vnni=False)


def test_fused_experts_argument_errors():
    x, w1, w2, tw, ti = moe_case(100)
    with pytest.raises(tilejit.Error, match="w1_bias: expected a torch.Tensor, got list"):
        sgl.fused_experts_cpu(x, w1, w2, tw, ti, False, False, False, None, None, None, None,
                              None, [1.0], None, None, None, False)
    with pytest.raises(tilejit.Error, match="unexpected keyword argument 'w1_zero'"):
        sgl.fused_experts_cpu(x, w1, w2, tw, ti, False, False, w1_zero=torch.ones(1))
    with pytest.raises(tilejit.Error, match="after inplace is a str"):
        sgl.fused_experts_cpu(x, w1, w2, tw, ti, False, "int8")
    with pytest.raises(tilejit.Error, match="w1_zero given with moe_comp_method=0"):
        sgl.fused_experts_cpu(x, w1, w2, tw, ti, False, 0, None, None, torch.ones(1))
    with pytest.raises(tilejit.Error, match="hidden_states.dtype=torch.float16 is refused"):
        sgl.fused_experts_cpu(x.half(), w1, w2, tw, ti, False, 0, is_vnni=False)
    # A core error names the sgl op and maps the core's names.
    with pytest.raises(tilejit.Error, match=r"fused_experts_cpu: .*hidden.*\(tilejit.fused_"
                       "experts' hidden is hidden_states"):
        sgl.fused_experts_cpu(rnd((5, 66), 101), w1, w2, tw, ti, False, 0, is_vnni=False)


def decode_case(seed=110, d=64, hq=4, hkv=2, n_slots=40, seq_lens=(5, 1, 9)):
    req_to_token, rpi = token_pool(n_slots, list(seq_lens), seed)
    kb, vb = rnd((n_slots, hkv, d), seed + 1), rnd((n_slots, hkv, d), seed + 2)
    q, key, value = (rnd((3, hq, d), seed + 3), rnd((3, hkv, d), seed + 4),
                     rnd((3, hkv, d), seed + 5))
    loc = torch.stack([req_to_token[r, n - 1] for r, n in zip(rpi.tolist(), seq_lens)]).long()
    return req_to_token, rpi, kb, vb, q, key, value, loc, torch.tensor(seq_lens)


def check_decode(out, q, kb, vb, req_to_token, rpi, seq_lens, scale, window=-1):
    for b, (r, n) in enumerate(zip(rpi.tolist(), seq_lens.tolist())):
        slots = req_to_token[r, :n].long()
        ref = ref_attn(q[b:b + 1].to(F64), kb[slots].to(F64), vb[slots].to(F64), False, scale,
                       window)
        within(out[b:b + 1], ref, attn_tol(ref, vb[slots]), f"seq {b}")


def test_decode_attention_cpu_new_schemas():
    r2t, rpi, kb, vb, q, key, value, loc, sl = decode_case()
    # sglang's intel_amx_backend: (..., logit_cap, is_cross_attention, sliding_window_size + 1,
    # encoder_lens, sinks). A layer without a window passes -1 + 1 = 0: no window.
    for w in (-1, 3):
        k1, v1, out = kb.clone(), vb.clone(), torch.empty(3, 4, 64, dtype=torch.bfloat16)
        sgl.decode_attention_cpu(q, k1, v1, out, key, value, loc, None, r2t, rpi, sl, 0.125,
                                 0.0, False, w + 1, None, None)
        assert torch.equal(k1[loc], key) and torch.equal(v1[loc], value)
        check_decode(out, q, k1, v1, r2t, rpi, sl, 0.125, w)
        # The vendored form with buffer scales in 4th / 5th place (bf16 cache: 1.0).
        k2, v2, out2 = kb.clone(), vb.clone(), torch.empty_like(out)
        sgl.decode_attention_cpu(q, k2, v2, 1.0, 1.0, out2, key, value, loc, None, r2t, rpi, sl,
                                 0.125, 0.0, False, w + 1, None, None)
        assert torch.equal(out2, out)
    # key / value / loc None: nothing stored (the new token already in the cache).
    k3 = kb.clone()
    k3[loc], v3 = key, vb.clone()
    v3[loc] = value
    out3 = torch.empty_like(out)
    before = k3.clone()
    sgl.decode_attention_cpu(q, k3, v3, out3, None, None, None, None, r2t, rpi, sl, 0.125, 0.0,
                             False, 4, None, None)
    assert torch.equal(k3, before)
    assert torch.equal(out3, out)
    with pytest.raises(tilejit.Error, match="is_cross_attn=True; allowed: False"):
        sgl.decode_attention_cpu(q, kb, vb, out, key, value, loc, None, r2t, rpi, sl, 0.125,
                                 0.0, True, 0, None, None)
    with pytest.raises(tilejit.Error, match="encoder_lens given; allowed: None"):
        sgl.decode_attention_cpu(q, kb, vb, out, key, value, loc, None, r2t, rpi, sl, 0.125,
                                 0.0, False, 0, torch.zeros(3, dtype=torch.int64), None)


def test_decode_attention_cpu_errors_name_sgl_arguments():
    r2t, rpi, kb, vb, q, key, value, loc, sl = decode_case(120)
    out = torch.empty(3, 4, 64, dtype=torch.bfloat16)
    args = (None, r2t, rpi, sl, 0.125, 0.0)
    bad = loc.clone()
    bad[1] = -1  # tilejit's store_kv would skip it silently
    with pytest.raises(tilejit.Error, match=r"loc has -1\.\.\d+; allowed: \[0, 40\)"):
        sgl.decode_attention_cpu(q, kb, vb, out, key, value, bad, *args)
    with pytest.raises(tilejit.Error, match=r"loc has \d+\.\.1027; allowed: \[0, 40\)"):
        sgl.decode_attention_cpu(q, kb, vb, out, key, value, loc.clamp(max=5) + 1022 * (
            torch.arange(3) == 2), *args)
    far = r2t.clone()
    far[2, 0] = 1000
    with pytest.raises(tilejit.Error, match=r"decode_attention_cpu: .*block_table is "
                       r"req_to_token\[req_pool_indices\]"):
        sgl.decode_attention_cpu(q, kb, vb, out, key, value, loc, None, far, rpi, sl, 0.125, 0.0)
    with pytest.raises(tilejit.Error, match="key is None and value is given"):
        sgl.decode_attention_cpu(q, kb, vb, out, None, value, loc, *args)
    with pytest.raises(tilejit.Error, match="query.dtype=torch.float16 is refused"):
        sgl.decode_attention_cpu(q.half(), kb.half(), vb.half(), out.half(), key.half(),
                                 value.half(), loc, *args)


def test_decode_attention_cpu_mixed_schema_versions():
    # The classic list's int sliding_window_size in 14th place with the newer
    # list's keyword encoder_lens was bound to the newer list: -1 became
    # is_cross_attn (an Error naming only is_cross_attn), and 0 became
    # is_cross_attn=False with the window silently dropped. Now the message
    # names the versions each argument fits.
    r2t, rpi, kb, vb, q, key, value, loc, sl = decode_case(150)
    out = torch.empty(3, 4, 64, dtype=torch.bfloat16)
    head = (q, kb, vb, out, key, value, loc, None, r2t, rpi, sl, 0.125, 0.0)
    for w in (-1, 0):
        with pytest.raises(tilejit.Error, match=(
                r"decode_attention_cpu: the call mixes sgl-kernel schema versions: argument 4 "
                rf"\(a Tensor\) and argument 14 \({w}, not a bool\) fit only the classic version, "
                r"keyword encoder_lens only the new / scaled versions; allowed: the arguments of "
                r"one version, classic \(.*logit_cap, sliding_window_size, sinks, k_scale, "
                r"v_scale\); new \(.*logit_cap, is_cross_attn, sliding_window_size, "
                r"encoder_lens, .*\); scaled \(query, k_buffer, v_buffer, k_buf_scale, ")):
            sgl.decode_attention_cpu(*head, w, encoder_lens=None)
    with pytest.raises(tilejit.Error, match=r"argument 4 \(a Tensor\) fits only the classic / "
                       "new versions, keyword k_buf_scale only the scaled version"):
        sgl.decode_attention_cpu(*head, k_buf_scale=1.0)
    with pytest.raises(tilejit.Error, match=r"argument 4 \(1.0, not a Tensor\) fits only the "
                       "scaled version, keyword k_scale only the classic / new versions"):
        sgl.decode_attention_cpu(q, kb, vb, 1.0, 1.0, out, key, value, loc, None, r2t, rpi, sl,
                                 0.125, 0.0, k_scale=1.0)


def test_extend_attention_cpu_new_schema_window():
    hq, hkv, d, n_slots = 4, 2, 64, 40
    prefix, ext = [3, 0, 6], [4, 2, 3]
    seq_lens = [p + e for p, e in zip(prefix, ext)]
    r2t, rpi = token_pool(n_slots, seq_lens, 130)
    kb, vb = rnd((n_slots, hkv, d), 131), rnd((n_slots, hkv, d), 132)
    tq = sum(ext)
    q, ke, ve = rnd((tq, hq, d), 133), rnd((tq, hkv, d), 134), rnd((tq, hkv, d), 135)
    start = torch.tensor([0, 4, 6])
    for w in (-1, 2):  # sglang passes layer.sliding_window_size + 1
        out = torch.empty(tq, hq, d, dtype=torch.bfloat16)
        sgl.extend_attention_cpu(q, ke, ve, out, kb, vb, r2t, rpi, torch.tensor(seq_lens),
                                 torch.tensor(ext), start, max(ext), 0.125, 0.0, False, w + 1,
                                 None, None)
        for b, (r, p, e) in enumerate(zip(rpi.tolist(), prefix, ext)):
            s = slice(int(start[b]), int(start[b]) + e)
            slots = r2t[r, :p].long()
            kk, vv = torch.cat([kb[slots], ke[s]]).to(F64), torch.cat([vb[slots], ve[s]]).to(F64)
            ref = ref_attn(q[s].to(F64), kk, vv, True, 0.125, w)
            within(out[s], ref, attn_tol(ref, vv), f"w={w} seq {b}")
    # A bool tree mask (sgl-kernel's QLEN_ONLY layout) is taken as tilejit's uint8 one.
    tm = torch.cat([torch.tril(torch.ones(e, e, dtype=torch.bool)).reshape(-1) for e in ext])
    o1, o2 = torch.empty_like(out), torch.empty_like(out)
    args = (q, ke, ve, None, kb, vb, r2t, rpi, torch.tensor(seq_lens), torch.tensor(ext), start,
            max(ext), 0.125, 0.0, False, 0, None, None)
    sgl.extend_attention_cpu(*args[:3], o1, *args[4:], tm)
    sgl.extend_attention_cpu(*args[:3], o2, *args[4:], tm.to(torch.uint8))
    assert torch.equal(o1, o2)
    with pytest.raises(tilejit.Error, match="is_cross_attn=True; allowed: False"):
        sgl.extend_attention_cpu(*args[:3], o1, *args[4:14], True, 0, None, None)
    # Mixed versions, as decode_attention_cpu's (test above), the bool one place later.
    with pytest.raises(tilejit.Error, match=r"extend_attention_cpu: the call mixes sgl-kernel "
                       r"schema versions: argument 15 \(-1, not a bool\) fits only the classic "
                       "version, keyword encoder_lens only the new version"):
        sgl.extend_attention_cpu(*args[:3], o1, *args[4:14], -1, encoder_lens=None)
    with pytest.raises(tilejit.Error, match=r"argument 15 \(False\) fits only the new version, "
                       "keyword custom_mask only the classic version"):
        sgl.extend_attention_cpu(*args[:3], o1, *args[4:], custom_mask=None)
    with pytest.raises(tilejit.Error, match="k_extend: expected a torch.Tensor, got NoneType"):
        sgl.extend_attention_cpu(q, None, None, o1, *args[4:])


@pytest.mark.parametrize("lens_q,lens_k", [([2, 5], [5, 5]), ([6], [3]), ([3, 1, 4], [3, 6, 2])])
def test_flash_attn_varlen_func_top_left(lens_q, lens_k):
    # sgl-kernel's flash_attn.cpp: query i sees keys j <= i (top-left), whatever Tq / Tk.
    hq, hkv, d = 2, 1, 64
    tq, tk = sum(lens_q), sum(lens_k)
    q, k, v = rnd((tq, hq, d), 140), rnd((tk, hkv, d), 141), rnd((tk, hkv, d), 142)
    cu_q = torch.tensor([0] + lens_q, dtype=torch.int32).cumsum(0).to(torch.int32)
    cu_k = torch.tensor([0] + lens_k, dtype=torch.int32).cumsum(0).to(torch.int32)
    out = sgl.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), True)
    for b in range(len(lens_q)):
        sq, sk = slice(int(cu_q[b]), int(cu_q[b + 1])), slice(int(cu_k[b]), int(cu_k[b + 1]))
        ref = ref_attn(q[sq].to(F64), k[sk].to(F64), v[sk].to(F64), True, top_left=True)
        within(out[sq], ref, attn_tol(ref, v[sk]), f"seq {b}")


def test_routers_and_rope_refuse_what_they_would_ignore():
    logits = rnd((4, 8), 150, dtype=torch.float32)
    with pytest.raises(tilejit.Error, match="routed_scaling_factor=2.5; allowed: None or 1.0"):
        sgl.grouped_topk_cpu(None, logits, 2, True, 2, 1, 0, 2.5, None)
    w, _ = sgl.grouped_topk_cpu(None, logits, 2, True, 2, 1, 0, 1.0, None)
    assert w.shape == (4, 2)
    cache = rnd((16, 64), 151, dtype=torch.float32)
    q, k = rnd((3, 128), 152), rnd((3, 64), 153)
    with pytest.raises(tilejit.Error, match="positions: expected a torch.Tensor, got list"):
        sgl.rotary_embedding_cpu([0, 1, 2], q, k, 64, cache, True)
    with pytest.raises(tilejit.Error, match="key: expected a torch.Tensor, got NoneType"):
        sgl.rotary_embedding_cpu(torch.arange(3), q, None, 64, cache, True)
    with pytest.raises(tilejit.Error, match="query.dtype=torch.float16 is refused"):
        sgl.rotary_embedding_cpu(torch.arange(3), q.half(), k.half(), 64, cache.half(), True)
    with pytest.raises(tilejit.Error, match="mat1.dtype=torch.float16 is refused"):
        sgl.weight_packed_linear(q.half(), rnd((8, 128), 154).half(), None, False)


# ---- argument errors shared by every op ----------------------------------------------

def bool_arg_calls():
    """(op, argument, call(value)) for every bool parameter of every tilejit.sgl op,
    each call otherwise valid (True / False run)."""
    x, w1, w2, tw, ti = moe_case(160)
    xl, wl, sl = int8_case(2, 40, 64, 161)
    wf, sf, _ = fp8_case(40, 64, 32, 32, 162)
    bf = torch.bfloat16
    w16 = rnd((8, 64), 163)
    logits = rnd((4, 8), 164, dtype=torch.float32)
    bias = rnd((8,), 165, dtype=torch.float32)
    cache = rnd((16, 64), 166, dtype=torch.float32)
    pos, q, k = torch.arange(3), rnd((3, 128), 167), rnd((3, 64), 168)
    qa, cu = rnd((4, 2, 64), 169), torch.tensor([0, 4], dtype=torch.int32)
    r2t, rpi, kb, vb, qd, key, value, loc, lens = decode_case(170)
    out = torch.empty(3, 4, 64, dtype=torch.bfloat16)
    ext = torch.tensor([1, 1, 1])
    return [
        ("rotary_embedding_cpu", "is_neox",
         lambda v: sgl.rotary_embedding_cpu(pos, q.clone(), k.clone(), 64, cache, v)),
        ("multimodal_rotary_embedding_cpu", "is_neox",
         lambda v: sgl.multimodal_rotary_embedding_cpu(pos, q.clone(), k.clone(), 64, cache,
                                                       None, False, v)),
        ("multimodal_rotary_embedding_cpu", "mrope_interleaved",
         lambda v: sgl.multimodal_rotary_embedding_cpu(pos, q.clone(), k.clone(), 64, cache,
                                                       None, v, True)),
        ("fused_experts_cpu", "inplace",
         lambda v: sgl.fused_experts_cpu(x.clone(), w1, w2, tw, ti, v, is_vnni=False)),
        ("fused_experts_cpu", "use_int8_w8a8",
         lambda v: sgl.fused_experts_cpu(x, w1, w2, tw, ti, False, use_int8_w8a8=v,
                                         is_vnni=False)),
        ("fused_experts_cpu", "use_fp8_w8a16",
         lambda v: sgl.fused_experts_cpu(x, w1, w2, tw, ti, False, False, use_fp8_w8a16=v,
                                         is_vnni=False)),
        ("fused_experts_cpu", "is_vnni",
         lambda v: sgl.fused_experts_cpu(x, w1, w2, tw, ti, False, 0, is_vnni=v)),
        ("weight_packed_linear", "is_vnni",
         lambda v: sgl.weight_packed_linear(rnd((2, 64), 171), w16, None, v)),
        ("bmm_cpu", "is_vnni",
         lambda v: sgl.bmm_cpu(torch.empty(1, 2, 8, dtype=bf), rnd((1, 2, 64), 172),
                               w16.view(1, 8, 64), v)),
        ("int8_scaled_mm_with_quant", "is_vnni",
         lambda v: sgl.int8_scaled_mm_with_quant(xl, wl, sl, None, bf, v)),
        ("int8_scaled_mm_cpu", "is_vnni",
         lambda v: sgl.int8_scaled_mm_cpu(torch.zeros(2, 64, dtype=torch.uint8), wl,
                                          torch.ones(2), sl, None, bf, v)),
        ("fp8_scaled_mm_cpu", "is_vnni",
         lambda v: sgl.fp8_scaled_mm_cpu(xl, wf, sf, [32, 32], None, bf, v)),
        ("topk_softmax_cpu", "renormalize",
         lambda v: sgl.topk_softmax_cpu(None, logits, 2, v)),
        ("topk_sigmoid_cpu", "renormalize",
         lambda v: sgl.topk_sigmoid_cpu(None, logits, 2, v)),
        ("grouped_topk_cpu", "renormalize",
         lambda v: sgl.grouped_topk_cpu(None, logits, 2, v, 2, 1)),
        ("biased_grouped_topk_cpu", "renormalize",
         lambda v: sgl.biased_grouped_topk_cpu(None, logits, bias, 2, v, 2, 1)),
        ("flash_attn_varlen_func", "causal",
         lambda v: sgl.flash_attn_varlen_func(qa, qa, qa, cu, cu, 4, 4, v)),
        # is_cross_attn takes False only (cross-attention is not supported): its
        # message says so rather than "True or False".
        # By keyword: a positional non-bool there is the classic list's
        # sliding_window_size (the schema versions are told apart by that type).
        ("decode_attention_cpu", "is_cross_attn",
         lambda v: sgl.decode_attention_cpu(qd, kb.clone(), vb.clone(), out, key, value, loc,
                                            None, r2t, rpi, lens, 0.1, 0.0, is_cross_attn=v)),
        ("extend_attention_cpu", "is_cross_attn",
         lambda v: sgl.extend_attention_cpu(qd, key, value, out, kb, vb, r2t, rpi, lens, ext,
                                            torch.tensor([0, 1, 2]), 1, 0.1, 0.0,
                                            is_cross_attn=v)),
    ]


@pytest.mark.parametrize("bad", ["yes", 1, 0, None, 1.0, torch.tensor(True)])
def test_bool_arguments_refuse_other_types(bad):
    # is_neox="yes" or inplace="x" ran, read by their truth value (and 0 / None
    # as False): every bool parameter now takes a bool only, checked by one
    # helper (_common._flag), the message naming the op, the argument, the
    # value and what is allowed.
    for op, arg, call in bool_arg_calls():
        allowed = "False (cross-attention is not supported by tilejit.sgl)" \
            if arg == "is_cross_attn" else "True or False"
        got = raised(call, bad)
        assert got == f"{op}: {arg}={bad!r}; allowed: {allowed}", (op, arg, got)


def test_bool_arguments_take_bools():
    for op, arg, call in bool_arg_calls():
        for v in (False, True):
            if arg == "is_cross_attn" and v:
                assert "allowed: False" in raised(call, v)
            elif arg in ("use_int8_w8a8", "use_fp8_w8a16") and v:
                # bf16 experts: the flag is read (and refuses them), not ignored.
                assert f"{arg}=True" in raised(call, v), (op, arg)
            else:
                call(v)


def test_every_shim_error_carries_the_op_name():
    # Argument checks shared by the ops (_tensor, _opt_tensor, _i32 called
    # without op=, _paged, _window_left, the routers' helpers) and the
    # routers' core errors raised without the sgl op's name: e.g.
    # "topk_ids.dtype=torch.float32; allowed: ..." from fused_experts_cpu.
    x, w1, w2, tw, ti = moe_case(180)
    xl, wl, sl = int8_case(2, 40, 64, 181)
    bf = torch.bfloat16
    logits = rnd((4, 8), 182, dtype=torch.float32)
    qa, cu = rnd((4, 2, 64), 183), torch.tensor([0, 4], dtype=torch.int32)
    r2t, rpi, kb, vb, qd, key, value, loc, lens = decode_case(184)
    out = torch.empty(3, 4, 64, dtype=torch.bfloat16)
    ext, start = torch.tensor([1, 1, 1]), torch.tensor([0, 1, 2])

    def dec(**kw):
        a = dict(query=qd, k_cache=kb.clone(), v_cache=vb.clone(), output=out, key=key,
                 value=value, loc=loc, attn_logits=None, req_to_token=r2t,
                 req_pool_indices=rpi, seq_lens=lens, sm_scale=0.1, logit_cap=0.0)
        a.update(kw)
        return lambda: sgl.decode_attention_cpu(**a)

    def extend(**kw):
        a = dict(q_extend=qd, k_extend=key, v_extend=value, o_extend=out, k_buffer=kb,
                 v_buffer=vb, req_to_token=r2t, req_pool_indices=rpi, seq_lens=lens,
                 extend_seq_lens=ext, extend_start_loc=start, max_len_extend=1, sm_scale=0.1,
                 logit_cap=0.0)
        a.update(kw)
        return lambda: sgl.extend_attention_cpu(**a)

    fe = sgl.fused_experts_cpu
    cases = [
        ("fused_experts_cpu: topk_ids.dtype=torch.float32; allowed: torch.int32, torch.int64",
         lambda: fe(x, w1, w2, tw, ti.float(), False, is_vnni=False)),
        ("fused_experts_cpu: topk_ids: expected a torch.Tensor, got list",
         lambda: fe(x, w1, w2, tw, [[0, 1]], False, is_vnni=False)),
        ("fused_experts_cpu: hidden_states: expected a torch.Tensor, got NoneType",
         lambda: fe(None, w1, w2, tw, ti, False, is_vnni=False)),
        ("fused_experts_cpu: topk_weights: expected a torch.Tensor, got list",
         lambda: fe(x, w1, w2, [1.0], ti, False, is_vnni=False)),
        ("fused_experts_cpu: w1_scale: expected a torch.Tensor, got float",
         lambda: fe(x, w1, w2, tw, ti, False, 1, 0.5, None, None, None, None, False)),
        ("flash_attn_varlen_func: q: expected a torch.Tensor, got NoneType",
         lambda: sgl.flash_attn_varlen_func(None, qa, qa, cu, cu)),
        ("flash_attn_varlen_func: cu_seqlens_k.dtype=torch.float32; allowed: torch.int32, "
         "torch.int64", lambda: sgl.flash_attn_varlen_func(qa, qa, qa, cu, cu.float())),
        ("flash_attn_varlen_func: sinks: expected a torch.Tensor, got list",
         lambda: sgl.flash_attn_varlen_func(qa, qa, qa, cu, cu, sinks=[0.0, 0.0])),
        ("decode_attention_cpu: query: expected a torch.Tensor, got NoneType",
         dec(query=None)),
        ("decode_attention_cpu: output: expected a torch.Tensor, got NoneType",
         dec(output=None)),
        ("decode_attention_cpu: key: expected a torch.Tensor, got list", dec(key=[0])),
        ("decode_attention_cpu: loc: expected a torch.Tensor, got list", dec(loc=[0, 1, 2])),
        ("decode_attention_cpu: k_cache has shape (40, 128); allowed: [num_slots, Hkv, D]",
         dec(k_cache=kb.reshape(40, 128))),
        ("decode_attention_cpu: v_cache: expected a torch.Tensor, got NoneType",
         dec(v_cache=None)),
        ("decode_attention_cpu: sinks: expected a torch.Tensor, got list",
         dec(sinks=[0.0] * 4)),
        ("decode_attention_cpu: sliding_window_size=2.0; allowed: an int",
         dec(sliding_window_size=2.0)),
        ("decode_attention_cpu: req_to_token: expected a torch.Tensor, got list",
         dec(req_to_token=[[0]])),
        ("extend_attention_cpu: q_extend: expected a torch.Tensor, got NoneType",
         extend(q_extend=None)),
        ("extend_attention_cpu: tree_mask: expected a torch.Tensor, got list",
         extend(tree_mask=[1])),
        ("extend_attention_cpu: custom_mask: expected a torch.Tensor, got list",
         extend(custom_mask=[1])),
        ("extend_attention_cpu: k_buffer has shape (40, 128); allowed: [num_slots, Hkv, D]",
         extend(k_buffer=kb.reshape(40, 128))),
        ("extend_attention_cpu: sliding_window_size='1'; allowed: an int",
         extend(sliding_window_size="1")),
        ("weight_packed_linear: mat1: expected a torch.Tensor, got NoneType",
         lambda: sgl.weight_packed_linear(None, rnd((8, 64), 185))),
        ("weight_packed_linear: bias: expected a torch.Tensor, got list",
         lambda: sgl.weight_packed_linear(rnd((2, 64), 185), rnd((8, 64), 186), [0.0])),
        ("weight_packed_linear: mat2: expected a torch.Tensor, got list",
         lambda: sgl.weight_packed_linear(rnd((2, 64), 185), [0.0], None, False)),
        ("bmm_cpu: out: expected a torch.Tensor, got NoneType",
         lambda: sgl.bmm_cpu(None, rnd((1, 2, 64), 187), rnd((1, 8, 64), 188), False)),
        ("bmm_cpu: mat2: expected a torch.Tensor, got list",
         lambda: sgl.bmm_cpu(torch.empty(1, 2, 8, dtype=bf), rnd((1, 2, 64), 187), [0],
                             False)),
        ("int8_scaled_mm_with_quant: mat1: expected a torch.Tensor, got NoneType",
         lambda: sgl.int8_scaled_mm_with_quant(None, wl, sl, None, bf, False)),
        ("int8_scaled_mm_with_quant: scales2: expected a torch.Tensor, got float",
         lambda: sgl.int8_scaled_mm_with_quant(xl, wl, 0.01, None, bf, False)),
        ("int8_scaled_mm_with_quant: bias: expected a torch.Tensor, got list",
         lambda: sgl.int8_scaled_mm_with_quant(xl, wl, sl, [0.0], bf, False)),
        ("int8_scaled_mm_cpu: mat1: expected a torch.Tensor, got NoneType",
         lambda: sgl.int8_scaled_mm_cpu(None, wl, torch.ones(2), sl, None, bf, False)),
        ("int8_scaled_mm_cpu: scales1: expected a torch.Tensor, got float",
         lambda: sgl.int8_scaled_mm_cpu(torch.zeros(2, 64, dtype=torch.uint8), wl, 1.0, sl,
                                        None, bf, False)),
        ("per_token_quant_int8_cpu: A: expected a torch.Tensor, got list",
         lambda: sgl.per_token_quant_int8_cpu([[1.0]])),
        ("convert_weight_packed: weight: expected a torch.Tensor, got list",
         lambda: sgl.convert_weight_packed([[1.0]])),
        ("topk_softmax_cpu: gating_output: expected a torch.Tensor, got list",
         lambda: sgl.topk_softmax_cpu(None, [[0.0]], 2, True)),
        ("topk_sigmoid_cpu: topk=0; allowed: an integer >= 1",
         lambda: sgl.topk_sigmoid_cpu(None, logits, 0, True)),
        ("topk_softmax_cpu: gating_output has shape (32,); allowed: [T, E]",
         lambda: sgl.topk_softmax_cpu(None, logits.view(-1), 2, True)),
        ("grouped_topk_cpu: num_fused_shared_experts=1; allowed: 0 (pass the shared expert "
         "to tilejit.fused_experts as shared_w13 / shared_w2 instead)",
         lambda: sgl.grouped_topk_cpu(None, logits, 2, True, 2, 1, 1)),
        ("biased_grouped_topk_cpu: num_token_non_padded=-1; allowed: >= 0 (the count of "
         "real tokens)", lambda: sgl.biased_grouped_topk_cpu(
             None, logits, logits[0], 2, True, 2, 1, 0, None, torch.tensor(-1))),
        ("biased_grouped_topk_cpu: correction_bias: expected a torch.Tensor, got NoneType",
         lambda: sgl.biased_grouped_topk_cpu(None, logits, None, 2, True, 2, 1)),
    ]
    for want, fn in cases:
        assert raised(fn) == want
    # The core's errors under the router's name, as the other ops' (_core).
    for op, fn in (("topk_softmax_cpu: topk_softmax: k = 9",
                    lambda: sgl.topk_softmax_cpu(None, logits, 9, True)),
                   ("topk_sigmoid_cpu: topk_sigmoid: k = 9",
                    lambda: sgl.topk_sigmoid_cpu(None, logits, 9, True)),
                   ("grouped_topk_cpu: grouped_topk: num_expert_group = 3",
                    lambda: sgl.grouped_topk_cpu(None, logits, 2, True, 3, 1)),
                   ("biased_grouped_topk_cpu: grouped_topk: num_expert_group = 3",
                    lambda: sgl.biased_grouped_topk_cpu(None, logits, logits[0], 2, True, 3,
                                                        1))):
        assert raised(fn).startswith(op)


# ---- numeric scalar arguments ----------------------------------------------------------

# What sglang's CPU call sites pass (python/sglang/srt/layers: the attention
# backends' layer.logit_cap / sliding_window_size, the routers' config values,
# GPT-OSS's gemm1_alpha / gemm1_clamp_limit): Python ints and floats, None
# where the schema defaults it; num_token_non_padded is a 0-d int32 tensor.
_REAL = "a finite int or float"
_CAP = "0 (off) or a finite int or float > 0"


def scalar_arg_calls():
    """(op, argument, kind, allowed, call(value)) for every numeric scalar
    argument the shim reads (kind "real", "int", or "list": an entry of a list of
    ints), each call otherwise valid."""
    x, w1, w2, tw, ti = moe_case(190)
    logits = rnd((4, 8), 191, dtype=torch.float32)
    bias = rnd((8,), 192, dtype=torch.float32)
    qa, cu = rnd((4, 2, 64), 193), torch.tensor([0, 4], dtype=torch.int32)
    r2t, rpi, kb, vb, qd, key, value, loc, lens = decode_case(194)
    out = torch.empty(3, 4, 64, dtype=torch.bfloat16)
    ext, start = torch.tensor([1, 1, 1]), torch.tensor([0, 1, 2])
    cache = rnd((16, 64), 195, dtype=torch.float32)
    pos3 = torch.zeros(3, 2, dtype=torch.int64)
    q, k = rnd((2, 128), 196), rnd((2, 64), 197)

    def dec(arg):
        return lambda v: sgl.decode_attention_cpu(
            qd, kb.clone(), vb.clone(), out, key, value, loc, None, r2t, rpi, lens, 0.1,
            **{"logit_cap": 0.0, arg: v})

    def ext_call(arg):
        return lambda v: sgl.extend_attention_cpu(
            qd, key, value, out, kb, vb, r2t, rpi, lens, ext, start, 1, 0.1,
            **{"logit_cap": 0.0, arg: v})

    rsf_g = "None or 1.0 (as sgl-kernel: the weights are not scaled by this op)"
    rsf_b = f"None or {_REAL} (accepted and not applied, as sgl-kernel)"
    return [
        ("flash_attn_varlen_func", "logit_cap", "real", _CAP,
         lambda v: sgl.flash_attn_varlen_func(qa, qa, qa, cu, cu, logit_cap=v)),
        ("flash_attn_varlen_func", "sliding_window_size", "int", "an int",
         lambda v: sgl.flash_attn_varlen_func(qa, qa, qa, cu, cu, sliding_window_size=v)),
        ("decode_attention_cpu", "logit_cap", "real", _CAP, dec("logit_cap")),
        ("decode_attention_cpu", "sliding_window_size", "int", "an int",
         dec("sliding_window_size")),
        ("extend_attention_cpu", "logit_cap", "real", _CAP, ext_call("logit_cap")),
        ("extend_attention_cpu", "sliding_window_size", "int", "an int",
         ext_call("sliding_window_size")),
        ("grouped_topk_cpu", "routed_scaling_factor", "real", rsf_g,
         lambda v: sgl.grouped_topk_cpu(None, logits, 2, True, 2, 1, 0, v)),
        ("biased_grouped_topk_cpu", "routed_scaling_factor", "real", rsf_b,
         lambda v: sgl.biased_grouped_topk_cpu(None, logits, bias, 2, True, 2, 1, 0, v)),
        ("grouped_topk_cpu", "num_fused_shared_experts", "int", "an int",
         lambda v: sgl.grouped_topk_cpu(None, logits, 2, True, 2, 1, v)),
        ("biased_grouped_topk_cpu", "num_fused_shared_experts", "int", "an int",
         lambda v: sgl.biased_grouped_topk_cpu(None, logits, bias, 2, True, 2, 1, v)),
        ("grouped_topk_cpu", "num_expert_group", "int", "an int",
         lambda v: sgl.grouped_topk_cpu(None, logits, 2, True, v, 1)),
        ("biased_grouped_topk_cpu", "topk_group", "int", "an int",
         lambda v: sgl.biased_grouped_topk_cpu(None, logits, bias, 2, True, 2, v)),
        ("fused_experts_cpu", "alpha", "real", f"None or {_REAL}",
         lambda v: sgl.fused_experts_cpu(x, w1, w2, tw, ti, False, alpha=v, is_vnni=False)),
        ("fused_experts_cpu", "limit", "real", f"None or {_REAL} > 0",
         lambda v: sgl.fused_experts_cpu(x, w1, w2, tw, ti, False, limit=v, is_vnni=False)),
        ("multimodal_rotary_embedding_cpu", "mrope_section", "list",
         "a list of ints (frequency counts per position row)",
         lambda v: sgl.multimodal_rotary_embedding_cpu(pos3, q.clone(), k.clone(), 64, cache,
                                                       [v, 16])),
    ]


# Each refused value with the reason it was a problem before: a plain Python
# error (str, None, a list), or silently changed (2.5 cut to 2, True read as 1
# or 1.0, a tensor read as its value); NaN / inf reach no kernel that could use
# them. None is refused only where it is no documented default.
_BAD_REAL = ["x", None, True, float("nan"), float("inf"), torch.tensor(1.0), [1.0]]
_BAD_INT = [2.5, 2.0, "2", True, torch.tensor(2), None]


def message(fn):
    """What fn() raises, as "tilejit.Error: ..." / "TypeError: ...", or "no error"."""
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - the type is what is checked
        return f"{'tilejit.Error' if isinstance(e, tilejit.Error) else type(e).__name__}: {e}"
    return "no error"


@pytest.mark.parametrize("bad", _BAD_REAL + _BAD_INT, ids=repr)
def test_numeric_arguments_refuse_other_types(bad):
    # Every numeric scalar argument takes its type only (_common._real /
    # _int), the message naming the op, the argument, the value and what is
    # allowed; all calls are checked before the assert, so one run lists them all.
    wrong = []
    for op, arg, kind, allowed, call in scalar_arg_calls():
        if not any(bad is b for b in (_BAD_REAL if kind == "real" else _BAD_INT)):
            continue
        if bad is None and (kind == "list" or allowed.startswith("None")):
            continue  # a documented default ([None, 16]: the list's own message)
        shown = f"[{bad!r}, 16]" if kind == "list" else repr(bad)
        want = f"tilejit.Error: {op}: {arg}={shown}; allowed: {allowed}"
        got = message(lambda: call(bad))
        if got != want:
            wrong.append((op, arg, got))
    assert not wrong, "\n".join(map(str, wrong))


def test_numeric_arguments_take_what_sglang_passes():
    # The values of sglang's CPU call sites run, and an int reads as the same
    # float (logit_cap 30 as 30.0, limit 7 as the default 7.0).
    x, w1, w2, tw, ti = moe_case(200)
    logits = rnd((4, 8), 201, dtype=torch.float32)
    bias = rnd((8,), 202, dtype=torch.float32)
    qa, cu = rnd((4, 2, 64), 203), torch.tensor([0, 4], dtype=torch.int32)
    fa = sgl.flash_attn_varlen_func
    for cap in (0.0, 0, 30.0, 30):
        assert torch.equal(fa(qa, qa, qa, cu, cu, causal=True, logit_cap=cap),
                           fa(qa, qa, qa, cu, cu, causal=True, logit_cap=float(cap)))
    for w in (-1, 0, 2):
        fa(qa, qa, qa, cu, cu, causal=True, sliding_window_size=w)
    r2t, rpi, kb, vb, qd, key, value, loc, lens = decode_case(204)
    out = torch.empty(3, 4, 64, dtype=torch.bfloat16)
    for cap, w in ((0.0, -1), (50, 3), (50.0, 0)):
        sgl.decode_attention_cpu(qd, kb.clone(), vb.clone(), out, key, value, loc, None, r2t,
                                 rpi, lens, 0.1, cap, False, w, None, None)
        sgl.extend_attention_cpu(qd, key, value, out, kb, vb, r2t, rpi, lens,
                                 torch.tensor([1, 1, 1]), torch.tensor([0, 1, 2]), 1, 0.1, cap,
                                 False, w, None, None)
    ref = sgl.grouped_topk_cpu(None, logits, 2, True, 2, 1)
    for rsf in (None, 1.0, 1):
        got = sgl.grouped_topk_cpu(None, logits, 2, True, 2, 1, 0, rsf, None)
        assert all(torch.equal(a, b) for a, b in zip(got, ref))
    ref = sgl.biased_grouped_topk_cpu(None, logits, bias, 2, True, 2, 1)
    for rsf, ntnp in ((None, None), (2.5, torch.tensor(4, dtype=torch.int32)), (1, 4)):
        got = sgl.biased_grouped_topk_cpu(None, logits, bias, 2, True, 2, 1, 0, rsf, ntnp)
        assert all(torch.equal(a, b) for a, b in zip(got, ref))
    # bf16 logits and bias (sglang's router output in the model dtype).
    sgl.biased_grouped_topk_cpu(None, logits.bfloat16(), bias.bfloat16(), 2, True, 2, 1)
    sgl.topk_softmax_cpu(None, logits.bfloat16(), 2, True)
    fe = sgl.fused_experts_cpu
    ref = fe(x, w1, w2, tw, ti, False, alpha=1.702, limit=7.0, is_vnni=False)
    # Either one given is the clamped SwiGLU, the other its default.
    for alpha, limit in ((1.702, None), (None, 7), (1.702, 7)):
        got = fe(x, w1, w2, tw, ti, False, alpha=alpha, limit=limit, is_vnni=False)
        assert torch.equal(got, ref), (alpha, limit)


def test_num_token_non_padded_takes_sglangs_tensor():
    # sglang passes ForwardBatch.num_token_non_padded, a 0-d int32 tensor; int()
    # read a float tensor 2.7 as 2 and a str "2" as 2.
    logits = rnd((4, 8), 205, dtype=torch.float32)
    bias = rnd((8,), 206, dtype=torch.float32)
    allowed = ("None, an int or a one-element integer tensor (the count of real tokens, "
               ">= 0)")
    for good in (2, torch.tensor(2, dtype=torch.int32), torch.tensor([2])):
        _, ids = sgl.biased_grouped_topk_cpu(None, logits, bias, 2, True, 2, 1, 0, None, good)
        assert bool((ids[2:] == -1).all()) and bool((ids[:2] >= 0).all())
    for bad in (2.7, "2", True, torch.tensor(2.7), torch.tensor(True), torch.tensor([2, 3])):
        for op, fn in (("grouped_topk_cpu", lambda: sgl.grouped_topk_cpu(
                            None, logits, 2, True, 2, 1, 0, None, bad)),
                       ("biased_grouped_topk_cpu", lambda: sgl.biased_grouped_topk_cpu(
                            None, logits, bias, 2, True, 2, 1, 0, None, bad))):
            shown = repr(bad)
            assert message(fn) == (f"tilejit.Error: {op}: num_token_non_padded={shown}; "
                                   f"allowed: {allowed}"), (op, bad)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.float64, torch.float16,
                                   torch.bool])
def test_routers_refuse_logits_of_other_dtypes(dtype):
    # sglang's router logits are float32 or bf16 (the gate's output); an int32
    # tensor was silently converted to float32 and routed, so were float64
    # (rounded) and float16.
    logits = rnd((4, 8), 207, dtype=torch.float32)
    bias = rnd((8,), 208, dtype=torch.float32)
    bad = (logits * 4).to(dtype)
    allowed = "torch.float32, torch.bfloat16"
    calls = [
        ("topk_softmax_cpu", "gating_output", lambda: sgl.topk_softmax_cpu(None, bad, 2, True)),
        ("topk_sigmoid_cpu", "gating_output", lambda: sgl.topk_sigmoid_cpu(None, bad, 2, True)),
        ("grouped_topk_cpu", "gating_output",
         lambda: sgl.grouped_topk_cpu(None, bad, 2, True, 2, 1)),
        ("biased_grouped_topk_cpu", "gating_output",
         lambda: sgl.biased_grouped_topk_cpu(None, bad, bias, 2, True, 2, 1)),
        ("biased_grouped_topk_cpu", "correction_bias",
         lambda: sgl.biased_grouped_topk_cpu(None, logits, bias.to(dtype), 2, True, 2, 1)),
    ]
    for op, arg, fn in calls:
        assert message(fn) == (f"tilejit.Error: {op}: {arg}.dtype={dtype}; allowed: "
                               f"{allowed}"), (op, arg)


def test_decode_attention_cpu_checks_scalars_before_storing():
    # logit_cap, the window and sinks were read after store_kv had written the
    # new token: an Error left the cache changed.
    r2t, rpi, kb, vb, qd, key, value, loc, lens = decode_case(209)
    out = torch.empty(3, 4, 64, dtype=torch.bfloat16)
    for kw in (dict(logit_cap=-1.0), dict(logit_cap="x"), dict(sliding_window_size=2.5),
               dict(sinks=[0.0] * 4)):
        k1, v1 = kb.clone(), vb.clone()
        args = {"logit_cap": 0.0, **kw}
        msg = message(lambda: sgl.decode_attention_cpu(qd, k1, v1, out, key, value, loc, None,
                                                       r2t, rpi, lens, 0.1, **args))
        assert msg.startswith("tilejit.Error: decode_attention_cpu: "), msg
        assert torch.equal(k1, kb) and torch.equal(v1, vb), kw


def test_number_ranges_name_the_sgl_argument():
    # A negative logit_cap / a limit <= 0 were refused by the core under its
    # own names ("softcap=-1", "clamped swiglu alpha=1.702 limit=0").
    calls = {c[:2]: (c[3], c[4]) for c in scalar_arg_calls()}
    for op, arg, bad in (("flash_attn_varlen_func", "logit_cap", -1.0),
                         ("decode_attention_cpu", "logit_cap", -0.5),
                         ("extend_attention_cpu", "logit_cap", -2),
                         ("fused_experts_cpu", "limit", 0),
                         ("fused_experts_cpu", "limit", -7.0)):
        allowed, call = calls[op, arg]
        assert message(lambda: call(bad)) == \
            f"tilejit.Error: {op}: {arg}={bad!r}; allowed: {allowed}"
