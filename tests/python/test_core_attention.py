"""Attention and store_kv from torch and numpy against a float64 reference.

Bound (docs/attention.md "Accuracy"): |out - ref| <= 2^-7 max|v| + 2^-8 |ref|
(P rounded to bf16 moves the output by <= 2^-9 max|v|, the bf16 output adds
2^-9 |ref|); an fp8 cache is compared on its dequantized values.
"""

import numpy as np
import pytest
import torch

import tilejit
from conftest import bf16, bf16_to_u16, to_f64, u16_to_f64


def ref_attn(q, k, v, causal=False, scale=None, wl=-1, wr=-1, softcap=0.0, sinks=None,
             alibi=None, visible=None):
    """One sequence: q [n, Hq, D], k [m, Hkv, D], v [m, Hkv, Dv] float64;
    query i sits at position m - n + i (bottom-right alignment). visible
    [n, m] bool, when given, is the mask itself."""
    n, hq, d = q.shape
    m, hkv, _ = k.shape
    g = hq // hkv
    scale = 1 / np.sqrt(d) if scale is None else scale
    out = np.zeros((n, hq, v.shape[2]))
    ipos = m - n + np.arange(n)[:, None]
    j = np.arange(m)[None, :]
    for h in range(hq):
        s = q[:, h] @ k[:, h // g].T * scale
        if softcap:
            s = softcap * np.tanh(s / softcap)
        if alibi is not None:
            s = s + alibi[h] * (j - ipos)
        vis = np.ones(s.shape, bool)
        if causal:
            vis &= j <= ipos
        if wl >= 0:
            vis &= j >= ipos - wl
        if wr >= 0:
            vis &= j <= ipos + wr
        if visible is not None:
            vis = visible
        s = np.where(vis, s, -np.inf)
        mx = s.max(axis=1, keepdims=True)
        if sinks is not None:
            mx = np.maximum(mx, sinks[h])
        mx = np.where(np.isfinite(mx), mx, 0)
        e = np.exp(s - mx)
        den = e.sum(axis=1, keepdims=True)
        if sinks is not None:
            den = den + np.exp(sinks[h] - mx)
        p = np.divide(e, den, out=np.zeros_like(e), where=den > 0)
        out[:, h] = p @ v[:, h // g]
    return out


def check(out, ref, vmax):
    err = np.abs(to_f64(out) - ref)
    tol = 2.0**-7 * vmax + 2.0**-8 * np.abs(ref)
    assert (err <= tol).all(), f"max err {err.max()}"


@pytest.mark.parametrize("opts", [
    {},
    {"causal": True},
    {"causal": True, "window_left": 2, "softcap": 5.0},
    {"sm_scale": 0.3, "sinks": True, "alibi": True},
])
def test_flash_attn_varlen_torch(opts):
    hq, hkv, d, dv = 4, 2, 64, 32
    q, k, v = bf16((8, hq, d), 1), bf16((12, hkv, d), 2), bf16((12, hkv, dv), 3)
    cu_q = torch.tensor([0, 5, 8], dtype=torch.int32)
    cu_k = torch.tensor([0, 5, 12], dtype=torch.int32)
    sinks = torch.tensor([0.5, -1.0, 2.0, 0.0]) if opts.get("sinks") else None
    alibi = torch.tensor([0.1, 0.2, 0.05, 0.0]) if opts.get("alibi") else None
    kw = {key: val for key, val in opts.items() if key not in ("sinks", "alibi")}
    out = tilejit.flash_attn_varlen(q, k, v, cu_q, cu_k, sinks=sinks, alibi_slopes=alibi, **kw)
    assert isinstance(out, torch.Tensor) and out.shape == (8, hq, dv)
    assert out.dtype == torch.bfloat16
    rk = {"causal": kw.get("causal", False), "scale": kw.get("sm_scale"),
          "wl": kw.get("window_left", -1), "softcap": kw.get("softcap", 0.0),
          "sinks": None if sinks is None else to_f64(sinks),
          "alibi": None if alibi is None else to_f64(alibi)}
    for b in range(2):
        qs, ks = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        ref = ref_attn(to_f64(q[qs]), to_f64(k[ks]), to_f64(v[ks]), **rk)
        check(out[qs], ref, np.abs(to_f64(v[ks])).max())


def test_flash_attn_varlen_numpy_fused_qkv_strided():
    # q, k, v: head slices of one fused [T, 3, H, D] buffer (non-contiguous).
    t, h, d = 6, 2, 32
    qkv = bf16_to_u16(bf16((t, 3, h, d), 4))
    q, k, v = qkv[:, 0], qkv[:, 1], qkv[:, 2]
    assert not q.flags.c_contiguous
    cu = np.array([0, t], np.int32)
    out = tilejit.flash_attn_varlen(q, k, v, cu, cu, causal=True, dtype="bf16")
    assert isinstance(out, np.ndarray) and out.dtype == np.uint16 and out.shape == (t, h, d)
    vf = u16_to_f64(v)
    ref = ref_attn(u16_to_f64(q), u16_to_f64(k), vf, causal=True)
    check(u16_to_f64(out), ref, np.abs(vf).max())


def paged(keys, block_size, num_blocks, seed, capacity=None):
    """A paged cache holding each sequence's rows [L, Hkv, D] in a random
    permutation of blocks, room for capacity[b] rows (default L); returns
    cache, block_table int32."""
    rng = np.random.default_rng(seed)
    hkv, d = keys[0].shape[1:]
    cache = bf16((num_blocks, block_size, hkv, d), seed + 100)
    perm = rng.permutation(num_blocks)
    capacity = capacity or [len(x) for x in keys]
    blocks = [-(-c // block_size) for c in capacity]
    table = np.zeros((len(keys), max(blocks)), np.int32)
    used = 0
    for b, x in enumerate(keys):
        table[b, :blocks[b]] = perm[used:used + blocks[b]]
        used += blocks[b]
        for p in range(len(x)):
            cache[table[b, p // block_size], p % block_size] = x[p]
    assert used <= num_blocks
    return cache, torch.from_numpy(table)


@pytest.mark.parametrize("block_size", [1, 4, 16])
def test_decode_attention_paged(block_size):
    lens = [5, 9, 1]
    hq, hkv, d = 8, 2, 64
    ks = [bf16((n, hkv, d), 10 + i) for i, n in enumerate(lens)]
    vs = [bf16((n, hkv, d), 20 + i) for i, n in enumerate(lens)]
    nblk = sum(-(-n // block_size) for n in lens) + 2
    k_cache, table = paged(ks, block_size, nblk, 30)
    v_cache, _ = paged(vs, block_size, nblk, 30)  # same permutation: the same table
    q = bf16((3, hq, d), 40)
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    out = tilejit.decode_attention(q, k_cache, v_cache, table, seq_lens, softcap=20.0)
    assert out.shape == (3, hq, d)
    for b in range(3):
        ref = ref_attn(to_f64(q[b:b + 1]), to_f64(ks[b]), to_f64(vs[b]), softcap=20.0)
        check(out[b:b + 1], ref, np.abs(to_f64(vs[b])).max())


def test_decode_attention_deterministic_is_batch_invariant():
    # deterministic=True: a sequence's output is the same bits alone (split
    # over 2 threads) and beside a longer one.
    hq, hkv, d, bs = 8, 2, 64, 16
    lens = [700, 3000]
    ks = [bf16((n, hkv, d), 50 + i) for i, n in enumerate(lens)]
    vs = [bf16((n, hkv, d), 60 + i) for i, n in enumerate(lens)]
    nblk = sum(-(-n // bs) for n in lens) + 2
    k_cache, table = paged(ks, bs, nblk, 70)
    v_cache, _ = paged(vs, bs, nblk, 70)
    q = bf16((2, hq, d), 80)
    saved = tilejit.num_threads()
    try:
        tilejit.set_num_threads(2)
        alone = tilejit.decode_attention(q[:1], k_cache, v_cache, table[:1],
                                         torch.tensor(lens[:1], dtype=torch.int32),
                                         deterministic=True)
        both = tilejit.decode_attention(q, k_cache, v_cache, table,
                                        torch.tensor(lens, dtype=torch.int32),
                                        deterministic=True)
    finally:
        tilejit.set_num_threads(saved)
    assert torch.equal(alone.view(torch.int16), both[:1].view(torch.int16))
    ref = ref_attn(to_f64(q[:1]), to_f64(ks[0]), to_f64(vs[0]))
    check(alone, ref, np.abs(to_f64(vs[0])).max())


def e4m3_to_f64(codes):
    c = np.asarray(codes).astype(np.int64)
    sign = np.where(c & 0x80, -1.0, 1.0)
    e, m = (c >> 3) & 15, c & 7
    mag = np.where(e == 0, m * 2.0**-9, (1 + m / 8) * 2.0**(e - 7))
    return sign * mag


def test_decode_attention_fp8_cache_uint8_codes():
    rng = np.random.default_rng(50)
    nb, bs, hkv, d = 4, 8, 2, 32
    k_codes = rng.integers(0, 256, (nb, bs, hkv, d), dtype=np.uint8)
    v_codes = rng.integers(0, 256, (nb, bs, hkv, d), dtype=np.uint8)
    for c in (k_codes, v_codes):
        c[(c & 0x7F) == 0x7F] = 0x30  # no NaN codes
        c[((c >> 3) & 15) > 9] &= 0xCF  # magnitudes <= 2^3: softmax not saturated
    q = bf16_to_u16(bf16((1, 4, d), 51))
    table = np.array([[2, 0, 3]], np.int32)
    seq_len = 20
    out = tilejit.decode_attention(q, k_codes, v_codes, table, np.array([seq_len], np.int32),
                                   k_scale=0.25, v_scale=2.0, dtype="bf16")
    rows = [(table[0, p // bs], p % bs) for p in range(seq_len)]
    kf = np.stack([e4m3_to_f64(k_codes[b, o]) for b, o in rows]) * 0.25
    vf = np.stack([e4m3_to_f64(v_codes[b, o]) for b, o in rows]) * 2.0
    ref = ref_attn(u16_to_f64(q), kf, vf)
    check(u16_to_f64(out), ref, np.abs(vf).max())


def e5m2_to_f64(codes):
    """e5m2 codes from their bit fields: sign, 5 exponent bits (bias 15), 2
    mantissa bits; exponent 31 is Inf (mantissa 0) or NaN."""
    c = np.asarray(codes).astype(np.int64)
    sign = np.where(c & 0x80, -1.0, 1.0)
    e, m = (c >> 2) & 31, c & 3
    mag = np.where(e == 0, m * 2.0**-16, (1 + m / 4) * 2.0**(e - 15))
    mag = np.where(e == 31, np.where(m == 0, np.inf, np.nan), mag)
    return sign * mag


def e5m2_nearest(x):
    """store_kv's rule on float64 values x (already divided by the scale):
    the nearest e5m2 code, ties to the even code, saturating at 0x7B
    (57344); a negative value rounding to zero is -0 (0x80)."""
    x = np.asarray(x, np.float64).ravel()
    pos = np.arange(0x7C)  # 0 .. 57344
    vals = e5m2_to_f64(pos)
    ax = np.minimum(np.abs(x), vals[-1])
    dist = np.abs(vals[None, :] - ax[:, None])
    best = dist.min(axis=1, keepdims=True)
    # Among the nearest (one, or two on a tie), the even code.
    tie_even = np.where(dist == best, np.where(pos % 2 == 0, 0, 1), 2)
    code = tie_even.argmin(axis=1)
    return (code | np.where(np.signbit(x), 0x80, 0)).astype(np.uint8)  # -0 keeps its sign


def test_e5m2_reference_decoder():
    # The test's own decoder against values anyone can check by hand.
    assert e5m2_to_f64([0x3C, 0xBC, 0x01, 0x7B, 0x04])[:4].tolist() == [1.0, -1.0, 2.0**-16,
                                                                         57344.0]
    assert e5m2_to_f64(0x04) == 2.0**-14 and e5m2_to_f64(0x3D) == 1.25
    assert np.isinf(e5m2_to_f64(0x7C)) and np.isnan(e5m2_to_f64(0x7F))
    assert e5m2_nearest([1.125, 1.375, -3e9, 0.0, -1e-9]).tolist() == [0x3C, 0x3E, 0xFB, 0x00,
                                                                         0x80]


@pytest.mark.parametrize("block_size", [1, 4])
def test_store_kv_e5m2_cache_then_decode_and_extend(block_size):
    """cache_dtype="f8e5m2": store_kv writes e5m2(x / scale) into uint8
    caches, decode and extend read them as code * scale."""
    prefix, new = [6, 3], [2, 4]
    hq, hkv, d, dv = 4, 2, 32, 16
    ks_scale, vs_scale = 0.5, 2.0
    total = [p + n for p, n in zip(prefix, new)]
    ks = [bf16((t, hkv, d), 300 + i, scale=3.0) for i, t in enumerate(total)]
    vs = [bf16((t, hkv, dv), 310 + i, scale=3.0) for i, t in enumerate(total)]
    nblk = sum(-(-t // block_size) for t in total) + 1
    perm = np.random.default_rng(320).permutation(nblk)
    per_seq = max(-(-t // block_size) for t in total)
    table = np.zeros((2, per_seq), np.int32)
    used = 0
    for b, t in enumerate(total):
        nb = -(-t // block_size)
        table[b, :nb] = perm[used:used + nb]
        used += nb
    slots = torch.tensor([int(table[b, p // block_size]) * block_size + p % block_size
                          for b in range(2) for p in range(total[b])], dtype=torch.int64)
    k_cache = torch.zeros(nblk, block_size, hkv, d, dtype=torch.uint8)
    v_cache = torch.zeros(nblk, block_size, hkv, dv, dtype=torch.uint8)
    k_all, v_all = torch.cat(ks), torch.cat(vs)
    tilejit.store_kv(k_all, v_all, k_cache, v_cache, slots, k_scale=ks_scale, v_scale=vs_scale,
                     cache_dtype="f8e5m2")
    # The codes are store_kv's rule, to the bit.
    s = slots.numpy()
    got_k = k_cache.numpy()[s // block_size, s % block_size]
    got_v = v_cache.numpy()[s // block_size, s % block_size]
    assert (got_k.ravel() == e5m2_nearest(to_f64(k_all) / ks_scale)).all()
    assert (got_v.ravel() == e5m2_nearest(to_f64(v_all) / vs_scale)).all()
    # e4m3 codes (the default for uint8) of the same values differ.
    k_e4 = torch.zeros_like(k_cache)
    tilejit.store_kv(k_all, v_all, k_e4, torch.zeros_like(v_cache), slots, k_scale=ks_scale,
                     v_scale=vs_scale)
    assert not torch.equal(k_e4, k_cache)

    # What the cache holds per sequence, as the kernels read it.
    def rows(cache, b, n, scale):
        c = cache.numpy()
        return np.stack([e5m2_to_f64(c[table[b, p // block_size], p % block_size])
                         for p in range(n)]) * scale

    kd = [rows(k_cache, b, total[b], ks_scale) for b in range(2)]
    vd = [rows(v_cache, b, total[b], vs_scale) for b in range(2)]
    scales = dict(k_scale=ks_scale, v_scale=vs_scale, cache_dtype="f8e5m2")
    # Decode: one query per sequence over all its rows.
    q = bf16((2, hq, d), 330)
    out = tilejit.decode_attention(q, k_cache, v_cache, torch.from_numpy(table),
                                   torch.tensor(total, dtype=torch.int32), **scales)
    assert out.shape == (2, hq, dv)
    for b in range(2):
        ref = ref_attn(to_f64(q[b:b + 1]), kd[b], vd[b])
        check(out[b:b + 1], ref, np.abs(vd[b]).max())
    # Read as e4m3 (no cache_dtype), the same bytes give another answer.
    wrong = tilejit.decode_attention(q, k_cache, v_cache, torch.from_numpy(table),
                                     torch.tensor(total, dtype=torch.int32), k_scale=ks_scale,
                                     v_scale=vs_scale)
    assert not torch.equal(wrong, out)
    # Extend: the new tokens over their prefix, all rows from the cache.
    qe = bf16((sum(new), hq, d), 340)
    qo = torch.tensor([0, new[0], sum(new)], dtype=torch.int32)
    oute = tilejit.extend_attention(qe, k_cache, v_cache, qo, torch.from_numpy(table),
                                    torch.tensor(prefix, dtype=torch.int32), **scales)
    for b in range(2):
        qs = slice(int(qo[b]), int(qo[b + 1]))
        ref = ref_attn(to_f64(qe[qs]), kd[b], vd[b], causal=True)
        check(oute[qs], ref, np.abs(vd[b]).max())


@pytest.mark.parametrize("scale", [1.0, 0.5, 3.0])
def test_store_kv_e5m2_every_bf16_value(scale):
    # All 65536 bf16 bit patterns (subnormals, ties, past the range, Inf,
    # NaN) through store_kv into an e5m2 cache: fp8(f32(x) / scale) exactly.
    bits = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    k = torch.from_numpy(bits.view(np.int16).copy()).view(torch.bfloat16).reshape(1024, 1, 64)
    kc = torch.zeros(1024, 1, 1, 64, dtype=torch.uint8)
    vc = torch.zeros_like(kc)
    tilejit.store_kv(k, k, kc, vc, torch.arange(1024), k_scale=scale, v_scale=scale,
                     cache_dtype="f8e5m2")
    with np.errstate(invalid="ignore", over="ignore"):  # NaN bits, x / 0.5 past f32
        x = u16_to_f64(bits)
        q = (x.astype(np.float32) / np.float32(scale)).astype(np.float64)
    want = e5m2_nearest(np.where(np.isnan(q), 0.0, q))
    want[np.isnan(x)] = 0x7F
    assert (kc.numpy().ravel() == want).all()
    assert (vc.numpy().ravel() == want).all()


def test_decode_attention_e5m2_cache_numpy_codes():
    # Random e5m2 codes (no Inf / NaN; magnitudes <= 3.5: softmax not
    # saturated), numpy uint8 caches, per-head scales.
    rng = np.random.default_rng(350)
    nb, bs, hkv, d = 4, 8, 2, 32

    def codes():
        e = rng.integers(0, 17, (nb, bs, hkv, d))
        return ((rng.integers(0, 2, e.shape) << 7) | (e << 2)
                | rng.integers(0, 4, e.shape)).astype(np.uint8)

    k_codes, v_codes = codes(), codes()
    q = bf16_to_u16(bf16((1, 4, d), 351))
    table = np.array([[3, 1, 0]], np.int32)
    seq_len = 19
    khs, vhs = np.array([0.25, 0.5], np.float32), np.array([2.0, 1.0], np.float32)
    out = tilejit.decode_attention(q, k_codes, v_codes, table, np.array([seq_len], np.int32),
                                   k_head_scales=khs, v_head_scales=vhs, cache_dtype="f8e5m2",
                                   dtype="bf16")
    rows = [(table[0, p // bs], p % bs) for p in range(seq_len)]
    kf = np.stack([e5m2_to_f64(k_codes[b, o]) for b, o in rows]) * khs[None, :, None]
    vf = np.stack([e5m2_to_f64(v_codes[b, o]) for b, o in rows]) * vhs[None, :, None]
    ref = ref_attn(u16_to_f64(q), kf, vf)
    check(u16_to_f64(out), ref, np.abs(vf).max())


def test_store_kv_e5m2_saturates_and_nan():
    # Past 57344 (e5m2's largest finite value), Inf included, the code
    # saturates to +-0x7B; NaN stores 0x7F. e4m3 (the default) saturates to
    # +-0x7E (448).
    x = torch.tensor([1e6, -1e6, float("inf"), float("-inf"), float("nan"), 57344.0, 1.0, 0.0])
    k = x.to(torch.bfloat16).reshape(1, 1, 8)
    for cache_dtype, want in (("f8e5m2", [0x7B, 0xFB, 0x7B, 0xFB, 0x7F, 0x7B, 0x3C, 0x00]),
                              (None, [0x7E, 0xFE, 0x7E, 0xFE, 0x7F, 0x7E, 0x38, 0x00])):
        kc = torch.zeros(1, 1, 1, 8, dtype=torch.uint8)
        vc = torch.zeros(1, 1, 1, 8, dtype=torch.uint8)
        tilejit.store_kv(k, k, kc, vc, torch.tensor([0]), cache_dtype=cache_dtype)
        assert kc.flatten().tolist() == want, cache_dtype
        assert vc.flatten().tolist() == want, cache_dtype


def test_cache_dtype_refused_values():
    k = bf16((1, 1, 8), 360)
    u8 = torch.zeros(1, 1, 1, 8, dtype=torch.uint8)
    b16 = torch.zeros(1, 1, 1, 8, dtype=torch.bfloat16)
    q = bf16((1, 1, 8), 361)
    table, lens = torch.zeros(1, 1, dtype=torch.int32), torch.ones(1, dtype=torch.int32)
    calls = {
        "store_kv": lambda c, cd: tilejit.store_kv(k, k, c, c.clone(), torch.tensor([0]),
                                                   cache_dtype=cd),
        "decode_attention": lambda c, cd: tilejit.decode_attention(q, c, c, table, lens,
                                                                   cache_dtype=cd),
        "extend_attention": lambda c, cd: tilejit.extend_attention(
            q, c, c, torch.tensor([0, 1], dtype=torch.int32), table,
            torch.zeros(1, dtype=torch.int32), k_new=k, v_new=k, cache_dtype=cd),
    }
    # A bad string and a value of another type list the same allowed values
    # (one function builds the text): the string's said "allowed: f8e4m3,
    # f8e5m2" (no None, unquoted), the others' 'None, "f8e4m3" or "f8e5m2"'.
    allowed = 'allowed: None, "f8e4m3", "f8e5m2" (the codes a uint8 KV cache holds)'
    for name, call in calls.items():
        for bad in ("f8e4m2", "fp8_e5m2", "e5m2", "bf16", "u8", ""):
            with pytest.raises(tilejit.Error) as e:
                call(u8, bad)
            assert str(e.value) == f'cache_dtype: "{bad}" is not allowed; {allowed}', name
        for bad, shown in ((5, "5"), (b"f8e5m2", "b'f8e5m2'"), (True, "True")):
            with pytest.raises(tilejit.Error) as e:
                call(u8, bad)
            assert str(e.value) == f"cache_dtype: {shown} is not allowed; {allowed}", name
        # cache_dtype names a uint8 cache's codes: a bf16 cache refuses it.
        for cd in ("f8e4m3", "f8e5m2"):
            with pytest.raises(tilejit.Error, match=f'^k_cache: cache_dtype="{cd}" with a bf16 '
                               "cache; allowed: cache_dtype=None"):
                call(b16, cd)
        call(b16, None)  # the bf16 cache itself is fine
        call(u8, "f8e4m3")  # the default spelled out


def test_buffer_f8e5m2_is_uint8():
    b = tilejit.Buffer([2, 3], "f8e5m2")
    assert np.asarray(b).dtype == np.uint8 and np.asarray(b).shape == (2, 3)
    assert torch.utils.dlpack.from_dlpack(b).dtype == torch.uint8


def test_store_kv_then_extend_both_modes():
    prefix, new = [3, 5], [2, 3]
    hq, hkv, d, bs = 4, 2, 32, 4
    total = [p + n for p, n in zip(prefix, new)]
    ks = [bf16((t, hkv, d), 60 + i) for i, t in enumerate(total)]
    vs = [bf16((t, hkv, d), 70 + i) for i, t in enumerate(total)]
    nblk = sum(-(-t // bs) for t in total) + 1
    # The caches hold the prefixes only; the new rows arrive through store_kv.
    k_cache, table = paged([x[:p] for x, p in zip(ks, prefix)], bs, nblk, 80, total)
    v_cache, _ = paged([x[:p] for x, p in zip(vs, prefix)], bs, nblk, 80, total)
    k_new = torch.cat([x[p:] for x, p in zip(ks, prefix)])
    v_new = torch.cat([x[p:] for x, p in zip(vs, prefix)])
    q = bf16((sum(new), hq, d), 90)
    qo = torch.tensor([0, new[0], sum(new)], dtype=torch.int32)
    pl = torch.tensor(prefix, dtype=torch.int32)
    out_new = tilejit.extend_attention(q, k_cache, v_cache, qo, table, pl, k_new=k_new,
                                       v_new=v_new)
    slots = []
    for b in range(2):
        for p in range(prefix[b], total[b]):
            slots.append(int(table[b, p // bs]) * bs + p % bs)
    slots = torch.tensor(slots, dtype=torch.int64)
    before = k_cache.clone()
    tilejit.store_kv(k_new, v_new, k_cache, v_cache, slots)
    for i, s in enumerate(slots.tolist()):
        assert torch.equal(k_cache[s // bs, s % bs], k_new[i])
        assert torch.equal(v_cache[s // bs, s % bs], v_new[i])
    changed = (k_cache != before).flatten(2).any(dim=2)
    assert changed.sum() <= len(slots)  # nothing else written
    out_cache = tilejit.extend_attention(q, k_cache, v_cache, qo, table, pl)
    for out in (out_new, out_cache):
        for b in range(2):
            qs = slice(int(qo[b]), int(qo[b + 1]))
            ref = ref_attn(to_f64(q[qs]), to_f64(ks[b]), to_f64(vs[b]), causal=True)
            check(out[qs], ref, np.abs(to_f64(vs[b])).max())


def test_store_kv_negative_slot_skips():
    k_cache = torch.zeros(2, 4, 1, 8, dtype=torch.bfloat16)
    v_cache = torch.zeros(2, 4, 1, 8, dtype=torch.bfloat16)
    k, v = bf16((2, 1, 8), 95), bf16((2, 1, 8), 96)
    tilejit.store_kv(k, v, k_cache, v_cache, torch.tensor([-1, 5], dtype=torch.int32))
    assert torch.equal(k_cache[1, 1], k[1]) and torch.equal(v_cache[1, 1], v[1])
    assert int((k_cache != 0).sum()) == int((k[1] != 0).sum())
    with pytest.raises(tilejit.Error, match="slot_mapping"):
        tilejit.store_kv(k, v, k_cache, v_cache, torch.tensor([0, 8], dtype=torch.int32))


def test_extend_numpy_tree_mask_and_store_kv_numpy():
    # One sequence: a prefix of 4 in the cache, 3 new tokens in a tree (token
    # 2 sees 0 and itself, not 1), K/V of the new tokens stored with
    # store_kv from numpy (int64 slots), then read from the cache.
    prefix, n, hq, hkv, d, bs = 4, 3, 2, 1, 16, 4
    ks, vs = bf16((prefix + n, hkv, d), 200), bf16((prefix + n, hkv, d), 201)
    k_cache, table = paged([ks[:prefix]], bs, 3, 202, [prefix + n])
    v_cache, _ = paged([vs[:prefix]], bs, 3, 202, [prefix + n])
    k_cache, v_cache = bf16_to_u16(k_cache).copy(), bf16_to_u16(v_cache).copy()
    table = table.numpy()
    slots = np.array([table[0, p // bs] * bs + p % bs for p in range(prefix, prefix + n)],
                     np.int64)
    tilejit.store_kv(bf16_to_u16(ks[prefix:]), bf16_to_u16(vs[prefix:]), k_cache, v_cache, slots,
                     dtype="bf16")
    for i, sl in enumerate(slots):
        assert (k_cache[sl // bs, sl % bs] == bf16_to_u16(ks[prefix + i])).all()
    mask = np.array([[1, 0, 0], [1, 1, 0], [1, 0, 1]], np.uint8)
    q = bf16_to_u16(bf16((n, hq, d), 203))
    out = tilejit.extend_attention(q, k_cache, v_cache, np.array([0, n], np.int32), table,
                                   np.array([prefix], np.int32), tree_mask=mask.flatten(),
                                   dtype="bf16")
    assert isinstance(out, np.ndarray) and out.dtype == np.uint16
    visible = np.concatenate([np.ones((n, prefix), bool), mask.astype(bool)], axis=1)
    ref = ref_attn(u16_to_f64(q), to_f64(ks), to_f64(vs), visible=visible)
    check(u16_to_f64(out), ref, np.abs(to_f64(vs)).max())
    # The mask matters: the causal answer differs from it for token 2.
    causal = ref_attn(u16_to_f64(q), to_f64(ks), to_f64(vs), causal=True)
    assert np.abs(causal[2] - ref[2]).max() > 1e-2


def test_bf16_sinks_and_slopes_match_f32_on_every_op():
    """GPT-OSS checkpoints ship bf16 sinks: prefill, decode and extend take bf16
    sinks / ALiBi slopes as their exact f32 values (the same output, bit for bit)."""
    hq, hkv, d, bs = 4, 2, 32, 4
    sinks = torch.tensor([0.5, -1.0, 2.0, 0.25]).to(torch.bfloat16)
    slopes = torch.tensor([0.125, 0.25, 0.0625, 0.5]).to(torch.bfloat16)
    q, k, v = bf16((6, hq, d), 101), bf16((6, hkv, d), 102), bf16((6, hkv, d), 103)
    cu = torch.tensor([0, 6], dtype=torch.int32)
    for kw in ({"sinks": sinks}, {"alibi_slopes": slopes}, {"sinks": sinks, "alibi_slopes": slopes}):
        f32 = {key: val.float() for key, val in kw.items()}
        a = tilejit.flash_attn_varlen(q, k, v, cu, cu, causal=True, **kw)
        b = tilejit.flash_attn_varlen(q, k, v, cu, cu, causal=True, **f32)
        assert torch.equal(a, b)
        k_cache, table = paged([k], bs, 3, 104)
        v_cache, _ = paged([v], bs, 3, 104)
        lens = torch.tensor([6], dtype=torch.int32)
        qd = q[-1:]
        assert torch.equal(tilejit.decode_attention(qd, k_cache, v_cache, table, lens, **kw),
                           tilejit.decode_attention(qd, k_cache, v_cache, table, lens, **f32))
        qo = torch.tensor([0, 2], dtype=torch.int32)
        pl = torch.tensor([4], dtype=torch.int32)
        qe = q[4:]
        assert torch.equal(tilejit.extend_attention(qe, k_cache, v_cache, qo, table, pl, **kw),
                           tilejit.extend_attention(qe, k_cache, v_cache, qo, table, pl, **f32))
    # The sinks act (else the check above proves nothing).
    assert not torch.equal(tilejit.flash_attn_varlen(q, k, v, cu, cu, causal=True, sinks=sinks),
                           tilejit.flash_attn_varlen(q, k, v, cu, cu, causal=True))
    with pytest.raises(tilejit.Error, match=r"sinks.dtype=f16 is not allowed; allowed: f32, bf16"):
        tilejit.flash_attn_varlen(q, k, v, cu, cu, sinks=sinks.to(torch.float16))
