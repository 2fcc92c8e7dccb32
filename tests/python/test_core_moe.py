"""Expert packing, fused_experts and the routers against float64 references.

fused_experts bound: the intermediate glu(...) is stored as bf16, so each
activation may round to either bf16 neighbour of the reference's (one ulp,
<= 2^-7 relative); with mag = sum_j |w_j| (|W2_e| @ |a|), |out - ref| <=
2^-7 mag (+ 2^-8 |ref| for a bf16 out; the fp32 sums are far below that).
"""

import numpy as np
import pytest
import torch

import tilejit
from conftest import bf16, bf16_to_u16, to_f64, u16_to_f64


def bf16_round(a):
    return torch.from_numpy(a).to(torch.bfloat16).double().numpy()


def ref_moe(x, w13, w2, tw, ti, rsf=1.0, with_wmag=False):
    """(out, mag), and with with_wmag the effect of the kernel's weights
    being within 2^-8 |w| of these (quantized experts dequantized to bf16
    inside the GEMMs): gate / up off by dg = 2^-8 (|W13| @ |x|), so
    |da| <= |silu'(g)| dg |u| + |silu(g)| du (|silu'| <= 1.1), carried
    through |W2|, plus 2^-8 (|W2| @ |a|) for the down weights."""
    x, w13, w2, tw = to_f64(x), to_f64(w13), to_f64(w2), to_f64(tw)
    ti = np.asarray(ti)
    i = w2.shape[2]
    out, mag = np.zeros((x.shape[0], w2.shape[1])), np.zeros((x.shape[0], w2.shape[1]))
    wmag = np.zeros_like(out)
    for t in range(x.shape[0]):
        for j in range(ti.shape[1]):
            e = ti[t, j]
            gu = w13[e] @ x[t]
            g, u = gu[:i], gu[i:]
            silu = g / (1 + np.exp(-g))
            a = bf16_round(silu * u)
            wt = abs(rsf * tw[t, j])
            out[t] += rsf * tw[t, j] * (w2[e] @ a)
            mag[t] += wt * (np.abs(w2[e]) @ np.abs(a))
            d = 2.0**-8 * (np.abs(w13[e]) @ np.abs(x[t]))
            da = 1.1 * d[:i] * np.abs(u) + np.abs(silu) * d[i:]
            wmag[t] += wt * (np.abs(w2[e]) @ (da + 2.0**-8 * np.abs(a)))
    return (out, mag, wmag) if with_wmag else (out, mag)


def check_moe(out, ref, mag, is_bf16):
    tol = 2.0**-7 * mag + (2.0**-8 * np.abs(ref) if is_bf16 else 0) + 1e-30
    err = np.abs(to_f64(out) - ref)
    assert (err <= tol).all(), f"max err {err.max()}"


def ref_topk(scores, k, renormalize):
    ids = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    w = np.take_along_axis(scores, ids, axis=1)
    if renormalize:
        w = w / w.sum(axis=1, keepdims=True)
    return w, ids


E, H, I, T, K = 4, 64, 32, 6, 2


def routed(seed, dt=torch.float32):
    logits = torch.randn(T, E, generator=torch.Generator().manual_seed(seed)).to(dt)
    tw = torch.empty(T, K)
    ti = torch.empty(T, K, dtype=torch.int32)
    tilejit.topk_softmax(logits, tw, ti)
    return logits, tw, ti


def test_topk_softmax_and_sigmoid():
    logits, tw, ti = routed(1)
    lf = to_f64(logits)
    p = np.exp(lf - lf.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    rw, rid = ref_topk(p, K, True)
    assert np.array_equal(ti.numpy(), rid)
    np.testing.assert_allclose(to_f64(tw), rw, rtol=2**-20)
    # numpy, sigmoid, no renormalization.
    ln = logits.numpy()
    w = np.empty((T, 3), np.float32)
    ids = np.empty((T, 3), np.int32)
    tilejit.topk_sigmoid(ln, w, ids, renormalize=False)
    rw, rid = ref_topk(1 / (1 + np.exp(-lf)), 3, False)
    assert np.array_equal(ids, rid)
    np.testing.assert_allclose(w, rw, rtol=2**-20)


@pytest.mark.parametrize("kind", ["torch", "numpy"])
def test_grouped_topk_deepseek_v3(kind):
    g = torch.Generator().manual_seed(2)
    e, groups, topk_group, k = 16, 4, 2, 3
    logits = torch.randn(T, e, generator=g)
    bias = torch.randn(e, generator=g) * 0.1
    tw, ti = torch.empty(T, k), torch.empty(T, k, dtype=torch.int32)
    args = (logits, tw, ti) if kind == "torch" else (logits.numpy(), tw.numpy(), ti.numpy())
    tilejit.grouped_topk(*args, score="sigmoid", num_expert_group=groups,
                         topk_group=topk_group, routed_scaling_factor=2.5,
                         correction_bias=bias if kind == "torch" else bias.numpy())
    s = 1 / (1 + np.exp(-to_f64(logits)))
    sel = s + to_f64(bias)
    for t in range(T):
        gs = np.sort(sel[t].reshape(groups, -1), axis=1)[:, -2:].sum(axis=1)  # top two per group
        keep = np.argsort(-gs, kind="stable")[:topk_group]
        masked = np.full(e, -np.inf)
        for gr in keep:
            masked[gr * (e // groups):(gr + 1) * (e // groups)] = sel[t, gr * (e // groups):(gr + 1) * (e // groups)]
        ids = np.argsort(-masked, kind="stable")[:k]
        w = s[t, ids] / s[t, ids].sum() * 2.5
        assert sorted(ti[t].tolist()) == sorted(ids.tolist())
        np.testing.assert_allclose(to_f64(tw[t])[np.argsort(ti[t].numpy())], w[np.argsort(ids)],
                                   rtol=2**-20)


@pytest.mark.parametrize("out_dtype", ["bf16", "f32"])
def test_fused_experts_torch(out_dtype):
    w13, w2 = bf16((E, 2 * I, H), 3, 0.2), bf16((E, H, I), 4, 0.2)
    p13, p2 = tilejit.pack_experts(w13, "gate_up"), tilejit.pack_experts(w2, "down")
    assert (p13.num_experts, p13.n, p13.k, p13.proj) == (E, I, H, "gate_up")
    assert (p2.n, p2.k, p2.proj, p2.format) == (H, I, "down", "bf16")
    assert torch.equal(p13.unpack(), w13) and torch.equal(p2.unpack(), w2)
    assert torch.equal(p13.dequantize(), w13.float())
    x = bf16((T, H), 5)
    _, tw, ti = routed(6)
    out = tilejit.fused_experts(x, p13, p2, tw, ti, out_dtype=out_dtype)
    assert out.shape == (T, H) and out.dtype == (torch.bfloat16 if out_dtype == "bf16" else torch.float32)
    ref, mag = ref_moe(x, w13, w2, tw, ti)
    check_moe(out, ref, mag, out_dtype == "bf16")


def test_fused_experts_non_gated_relu2():
    # Nemotron-H's experts: down(relu(up(x))^2), w1 packed proj="up" [E, I, H].
    w1, w2 = bf16((E, I, H), 31, 0.2), bf16((E, H, I), 32, 0.2)
    p1, p2 = tilejit.pack_experts(w1, "up"), tilejit.pack_experts(w2, "down")
    assert (p1.n, p1.k, p1.proj) == (I, H, "up") and torch.equal(p1.unpack(), w1)
    x = bf16((T, H), 33)
    _, tw, ti = routed(34)
    out = tilejit.fused_experts(x, p1, p2, tw, ti, act="relu2", routed_scaling_factor=2.5,
                                out_dtype="f32")
    xd, w1d, w2d, twd = to_f64(x), to_f64(w1), to_f64(w2), to_f64(tw)
    ref, mag = np.zeros((T, H)), np.zeros((T, H))
    for t in range(T):
        for j in range(ti.shape[1]):
            e = int(ti[t, j])
            a = bf16_round(np.maximum(w1d[e] @ xd[t], 0) ** 2)
            ref[t] += 2.5 * twd[t, j] * (w2d[e] @ a)
            mag[t] += abs(2.5 * twd[t, j]) * (np.abs(w2d[e]) @ np.abs(a))
    check_moe(out, ref, mag, False)
    with pytest.raises(tilejit.Error, match="clamped_swiglu with w13 packed as ExpertProj::up"):
        tilejit.fused_experts(x, p1, p2, tw, ti, clamped_swiglu=True)


def test_fused_experts_torch_topk_dtypes():
    """Hugging Face's routing as it comes: torch.topk's int64 ids, bf16 weights
    (a bf16 router's softmax). Same values as int32 / f32: the same output."""
    w13, w2 = bf16((E, 2 * I, H), 3, 0.2), bf16((E, H, I), 4, 0.2)
    p13, p2 = tilejit.pack_experts(w13, "gate_up"), tilejit.pack_experts(w2, "down")
    x = bf16((T, H), 5)
    logits = torch.randn(T, E, generator=torch.Generator().manual_seed(11)).to(torch.bfloat16)
    tw, ti = torch.topk(torch.softmax(logits, dim=-1), K, dim=-1)
    assert ti.dtype == torch.int64 and tw.dtype == torch.bfloat16
    out = tilejit.fused_experts(x, p13, p2, tw, ti, out_dtype="f32")
    want = tilejit.fused_experts(x, p13, p2, tw.float(), ti.to(torch.int32), out_dtype="f32")
    assert torch.equal(out, want)
    ref, mag = ref_moe(x, w13, w2, tw.float(), ti)
    check_moe(out, ref, mag, False)
    bad = ti.clone()
    bad[-1, -1] = 2**32  # would wrap to expert 0 if narrowed
    with pytest.raises(tilejit.Error, match=r"topk_ids\[5, 1\] = 4294967296 is out of range"):
        tilejit.fused_experts(x, p13, p2, tw, bad)


def test_fused_experts_numpy_strided_hidden():
    w13, w2 = bf16((E, 2 * I, H), 7, 0.2), bf16((E, H, I), 8, 0.2)
    p13 = tilejit.pack_experts(bf16_to_u16(w13), "gate_up", dtype="bf16")
    p2 = tilejit.pack_experts(bf16_to_u16(w2), "down", dtype="bf16")
    assert isinstance(p13.unpack(), np.ndarray)
    xb = bf16_to_u16(bf16((T, 2 * H), 9))
    x = xb[:, H:]  # row stride 2H
    _, tw, ti = routed(10)
    out = tilejit.fused_experts(x, p13, p2, tw.numpy(), ti.numpy(), dtype="bf16")
    assert isinstance(out, np.ndarray) and out.dtype == np.uint16
    ref, mag = ref_moe(u16_to_f64(x), w13, w2, tw, ti)
    check_moe(u16_to_f64(out), ref, mag, True)


def test_gated_shared_expert():
    """Qwen2-MoE: out += sigmoid(gate(x_t)) * shared(x_t), the weight per token."""
    w13, w2 = bf16((E, 2 * I, H), 15, 0.2), bf16((E, H, I), 16, 0.2)
    s13, s2 = bf16((1, 2 * 48, H), 17, 0.2), bf16((1, H, 48), 18, 0.2)
    p13, p2 = tilejit.pack_experts(w13, "gate_up"), tilejit.pack_experts(w2, "down")
    ps13, ps2 = tilejit.pack_experts(s13, "gate_up"), tilejit.pack_experts(s2, "down")
    x = bf16((T, H), 19)
    _, tw, ti = routed(20)
    sw = torch.sigmoid(torch.randn(T, generator=torch.Generator().manual_seed(21)))
    out = tilejit.fused_experts(x, p13, p2, tw, ti, shared_w13=ps13, shared_w2=ps2,
                                shared_weights=sw, out_dtype="f32")
    ref, mag = ref_moe(x, w13, w2, tw, ti)
    sref, smag = ref_moe(x, s13, s2, sw[:, None], torch.zeros(T, 1, dtype=torch.int32))
    check_moe(out, ref + sref, mag + smag, False)
    with pytest.raises(tilejit.Error, match="shared_weights given without a shared expert"):
        tilejit.fused_experts(x, p13, p2, tw, ti, shared_weights=sw)


def test_int8_experts_roundtrip_and_run():
    g = torch.Generator().manual_seed(11)
    w13 = [(torch.randint(-127, 128, (2 * I, H), generator=g, dtype=torch.int8),
            torch.rand(2 * I, generator=g) * 0.004 + 0.001) for _ in range(E)]
    w2 = [(torch.randint(-127, 128, (H, I), generator=g, dtype=torch.int8),
           torch.rand(H, generator=g) * 0.004 + 0.001) for _ in range(E)]
    p13 = tilejit.pack_experts_int8(w13, proj="gate_up")
    p2 = tilejit.pack_experts_int8(w2, proj="down")
    assert p13.format == "int8"
    for (a, b), (ua, ub) in zip(w13, p13.unpack()):
        assert torch.equal(a, ua) and torch.equal(b, ub)
    d13, d2 = p13.dequantize(), p2.dequantize()
    np.testing.assert_array_equal(to_f64(d13[1]), (to_f64(w13[1][0]) * to_f64(w13[1][1])[:, None]).astype(np.float32))
    x = bf16((T, H), 12)
    _, tw, ti = routed(13)
    out = tilejit.fused_experts(x, p13, p2, tw, ti, out_dtype="f32")
    ref, mag = ref_moe(x, d13, d2, tw, ti)
    # W8A8: each input of each projection quantized per token (s = max|x|/127,
    # an error of s/2 per element); the bound below is loose on purpose: the
    # quantization of the intermediate feeds through the down projection.
    err = np.abs(to_f64(out) - ref)
    assert err.max() <= 0.05 * np.abs(ref).max()


def test_mxfp4_experts_unpack():
    rng = np.random.default_rng(14)
    w = [(rng.integers(0, 256, (2 * I, H // 32, 16), dtype=np.uint8),
          rng.integers(120, 130, (2 * I, H // 32), dtype=np.uint8)) for _ in range(E)]
    p = tilejit.pack_experts_mxfp4(w, proj="gate_up", glu_rows="interleaved")
    assert p.format == "mxfp4" and p.num_experts == E
    for (a, b), (ua, ub) in zip(w, p.unpack()):
        np.testing.assert_array_equal(a, ua)
        np.testing.assert_array_equal(b, ub)


def test_pack_experts_errors():
    with pytest.raises(tilejit.Error,
                       match='proj: "sideways" is not allowed; allowed: gate_up, down, up'):
        tilejit.pack_experts(bf16((E, 2 * I, H), 15), proj="sideways")
    with pytest.raises(tilejit.Error, match=r"w\[0\]: expected a \(weight, scales\) pair"):
        tilejit.pack_experts_int8([torch.zeros(2, 2)])
    with pytest.raises(tilejit.Error, match=r"w\[1\]: expected a \(weight, scales\) pair"):
        tilejit.pack_experts_int8([(torch.zeros(2, 2, dtype=torch.int8), torch.ones(2)), 3])
    with pytest.raises(tilejit.Error, match="weight: an object of type 'int'"):
        tilejit.pack_int8(3, torch.ones(2))
    p13 = tilejit.pack_experts(bf16((E, 2 * I, H), 16), "gate_up")
    _, tw, ti = routed(17)
    with pytest.raises(tilejit.Error, match="w2: expected a tilejit.PackedExperts"):
        tilejit.fused_experts(bf16((T, H), 18), p13, torch.zeros(1), tw, ti)


def fp8_codes(shape, rng):
    c = rng.integers(0, 256, shape, dtype=np.uint8)
    c[(c & 0x7F) == 0x7F] = 0x38  # no NaN codes (refused)
    c[((c >> 3) & 15) > 8] &= 0xC7  # |w| <= 2: the GEMMs stay in a sane range
    return c


def test_fp8_experts_block_scales_torch():
    rng = np.random.default_rng(20)
    w13 = [(torch.from_numpy(fp8_codes((2 * I, H), rng)), torch.rand(1, 1) * 0.05 + 0.01)
           for _ in range(E)]
    w2 = [(torch.from_numpy(fp8_codes((H, I), rng)), torch.rand(1, 1) * 0.05 + 0.01)
          for _ in range(E)]
    p13 = tilejit.pack_experts_fp8(w13, block_n=128, block_k=128, proj="gate_up")
    p2 = tilejit.pack_experts_fp8(w2, block_n=128, block_k=128, proj="down")
    assert p13.format == "fp8_e4m3" and p2.num_experts == E
    for (a, b), (ua, ub) in zip(w13, p13.unpack()):
        assert torch.equal(a, ua) and torch.equal(b, ub)
    x = bf16((T, H), 21)
    _, tw, ti = routed(22)
    out = tilejit.fused_experts(x, p13, p2, tw, ti, out_dtype="f32")
    ref, mag, wmag = ref_moe(x, p13.dequantize(), p2.dequantize(), tw, ti, with_wmag=True)
    err = np.abs(to_f64(out) - ref)
    assert (err <= 2.0**-7 * mag + wmag + 1e-30).all(), err.max()


def test_int4_experts_numpy_roundtrip():
    rng = np.random.default_rng(23)
    gs = 32

    def expert(n, k):
        return {"qweight": rng.integers(-2**31, 2**31, (k // 8, n), dtype=np.int64).astype(np.int32),
                "scales": (rng.random((k // gs, n)) * 0.01 + 0.001).astype(np.float32)}

    w13 = [expert(2 * I, H) for _ in range(E)]
    w2 = [expert(H, I) for _ in range(E)]
    p13 = tilejit.pack_experts_int4(w13, format="gptq", group_size=gs, proj="gate_up")
    p2 = tilejit.pack_experts_int4(w2, format="gptq", group_size=gs, proj="down")
    assert p13.format == "int4_gptq" and (p13.n, p13.k) == (I, H)
    for e, u in zip(w13, p13.unpack()):
        np.testing.assert_array_equal(u["qweight"], e["qweight"])
        np.testing.assert_array_equal(u["scales"], e["scales"])
    # Symmetric (no qzeros): z = 8. Expert 0's gate/up rows by the GPTQ rule.
    q = (w13[0]["qweight"].astype(np.uint32)[:, None, :] >> (4 * np.arange(8))[None, :, None]) & 15
    q = q.reshape(H, 2 * I).astype(np.float64)
    wd = ((q - 8) * np.repeat(w13[0]["scales"].astype(np.float64), gs, axis=0)).T
    np.testing.assert_allclose(to_f64(p13.dequantize()[0]), wd, rtol=2**-23, atol=0)
    x = bf16_to_u16(bf16((T, H), 24))
    _, tw, ti = routed(25)
    out = tilejit.fused_experts(x, p13, p2, tw.numpy(), ti.numpy(), out_dtype="f32", dtype="bf16")
    ref, mag, wmag = ref_moe(u16_to_f64(x), p13.dequantize(), p2.dequantize(), tw, ti,
                             with_wmag=True)
    err = np.abs(out - ref)
    assert (err <= 2.0**-7 * mag + wmag + 1e-30).all(), err.max()
    # W4A8: x and the activation row quantized per token (dynamic_sym,
    # s = max|v| / 127: half a code per element), the weights exact.
    out8 = tilejit.fused_experts(x, p13, p2, tw.numpy(), ti.numpy(), out_dtype="f32",
                                 dtype="bf16", int4_route="w4a8")
    assert not np.array_equal(out8, out)  # the route was taken
    err8 = np.abs(out8 - ref)
    assert (err8 <= 2.0**-7 * mag + w4a8_bound(u16_to_f64(x), p13.dequantize(),
                                               p2.dequantize(), tw, ti) + 1e-30).all(), err8.max()
    with pytest.raises(tilejit.Error, match="int4_route"):
        tilejit.fused_experts(x, p13, p2, tw.numpy(), ti.numpy(), dtype="bf16", int4_route="w4a4")


def w4a8_bound(x, w13, w2, tw, ti):
    """What quantizing x and the activation row per token (half a code
    each, 0.51 for the f32 steps) adds to ref_moe's error: gate / up off by
    dg = 0.51 s_x |W13| @ 1, so |da| <= 1.1 dg |u| + |silu(g)| du + 1.1 dg du,
    then half a code s_a of the requantized row, through |W2|."""
    x, w13, w2, tw = to_f64(x), to_f64(w13), to_f64(w2), to_f64(tw)
    ti = np.asarray(ti)
    i = w2.shape[2]
    b = np.zeros((x.shape[0], w2.shape[1]))
    for t in range(x.shape[0]):
        s_x = np.abs(x[t]).max() / 127
        for j in range(ti.shape[1]):
            e = ti[t, j]
            gu = w13[e] @ x[t]
            g, u = gu[:i], gu[i:]
            silu = g / (1 + np.exp(-g))
            d = 0.51 * s_x * np.abs(w13[e]).sum(axis=1)
            da = 1.1 * d[:i] * np.abs(u) + np.abs(silu) * d[i:] + 1.1 * d[:i] * d[i:]
            s_a = (np.abs(silu * u).max() * (1 + 2.0**-7) + da.max()) / 127
            b[t] += abs(tw[t, j]) * (np.abs(w2[e]) @ (da + 0.51 * s_a))
    return b


def test_topk_softmax_bf16_logits():
    logits = bf16((T, E), 26)
    tw, ti = torch.empty(T, K), torch.empty(T, K, dtype=torch.int32)
    tilejit.topk_softmax(logits, tw, ti, renormalize=False)
    lf = to_f64(logits)
    p = np.exp(lf - lf.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    rw, rid = ref_topk(p, K, False)
    assert np.array_equal(ti.numpy(), rid)  # ties in bf16 logits: lower id first (stable sort)
    np.testing.assert_allclose(to_f64(tw), rw, rtol=2**-20)
