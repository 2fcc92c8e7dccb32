"""tilejit.rope in place, from torch and numpy, against a float64 reference.

Bound (docs/rope.md), per element with mag = |x cos| + |x' sin|: f32 out
<= 2^-22 mag; bf16 out <= 2^-7 |ref| + 2^-21 mag. Elements past rotary_dim
keep their bits.
"""

import numpy as np
import pytest
import torch

import tilejit
from conftest import bf16, bf16_to_u16, to_f64, u16_to_f64


def cos_sin(max_pos, width, base=10000.0):
    inv = 1.0 / base ** (np.arange(0, width, 2) / width)
    ang = np.arange(max_pos)[:, None] * inv[None, :]
    return np.concatenate([np.cos(ang), np.sin(ang)], axis=1).astype(np.float32)


def ref_rope(x, pos, cache, style, r):
    """x [T, H, D] float64; returns (rotated, mag)."""
    x = x.copy()
    c = cache[pos][:, None, : r // 2].astype(np.float64)
    s = cache[pos][:, None, r // 2: r].astype(np.float64)
    if style == "neox":
        a, b = x[..., : r // 2], x[..., r // 2: r]
    else:
        a, b = x[..., 0:r:2], x[..., 1:r:2]
    ra, rb = a * c - b * s, b * c + a * s
    mag = np.zeros_like(x)
    ma, mb = np.abs(a * c) + np.abs(b * s), np.abs(b * c) + np.abs(a * s)
    if style == "neox":
        x[..., : r // 2], x[..., r // 2: r] = ra, rb
        mag[..., : r // 2], mag[..., r // 2: r] = ma, mb
    else:
        x[..., 0:r:2], x[..., 1:r:2] = ra, rb
        mag[..., 0:r:2], mag[..., 1:r:2] = ma, mb
    return x, mag


def check(got, ref, mag, is_bf16):
    tol = (2.0**-7 * np.abs(ref) + 2.0**-21 * mag) if is_bf16 else 2.0**-22 * mag
    err = np.abs(got - ref)
    assert (err <= tol + 1e-30).all(), f"max err {err.max()}"


@pytest.mark.parametrize("style", ["neox", "gptj"])
@pytest.mark.parametrize("dt", [torch.float32, torch.bfloat16])
def test_rope_torch_fused_qkv(style, dt):
    t, hq, hk, d, r = 7, 4, 2, 64, 48
    # q and k are column slices of one qkv buffer (row stride (hq + 2 hk)·d).
    qkv = torch.randn(t, (hq + 2 * hk) * d, generator=torch.Generator().manual_seed(1)).to(dt)
    q = qkv[:, : hq * d].view(t, hq, d)
    k = qkv[:, hq * d: (hq + hk) * d].view(t, hk, d)
    v_before = qkv[:, (hq + hk) * d:].clone()
    q0, k0 = to_f64(q), to_f64(k)
    pos = torch.tensor([0, 5, 3, 99, 1, 7, 2], dtype=torch.int64)
    cache = torch.from_numpy(cos_sin(128, r))
    rq, rk = tilejit.rope(q, k, pos, cache, style=style, rotary_dim=r)
    assert rq is q and rk is k
    for got, x0 in ((q, q0), (k, k0)):
        ref, mag = ref_rope(x0, pos.numpy(), cache.numpy(), style, r)
        check(to_f64(got), ref, mag, dt == torch.bfloat16)
        assert np.array_equal(to_f64(got)[..., r:], x0[..., r:])  # past rotary_dim: untouched
    assert torch.equal(qkv[:, (hq + hk) * d:], v_before)


def test_rope_numpy_bf16_k_none_int32_positions():
    t, h, d = 5, 3, 32
    q = bf16_to_u16(bf16((t, h, d), 2)).copy()
    q0 = u16_to_f64(q)
    pos = np.array([4, 0, 1, 2, 3], np.int32)
    cache = bf16_to_u16(torch.from_numpy(cos_sin(8, d)).bfloat16())
    tilejit.rope(q, None, pos, cache, style="neox", dtype="bf16")
    ref, mag = ref_rope(q0, pos, u16_to_f64(cache), "neox", d)
    check(u16_to_f64(q), ref, mag, True)


def test_rope_mrope_sections():
    t, h, d = 4, 2, 32
    q = torch.randn(t, h, d, generator=torch.Generator().manual_seed(3))
    q0 = to_f64(q)
    pos = torch.tensor([[0, 1, 2, 3], [5, 6, 7, 8], [9, 3, 1, 0]], dtype=torch.int64)
    cache = torch.from_numpy(cos_sin(16, d))
    section = [4, 6, 6]  # sum = d / 2
    tilejit.rope(q, None, pos, cache, mrope_section=section)
    # Frequency i in section s takes cos / sin from the row of positions[s].
    sec = np.repeat(np.arange(3), section)
    cs = cache.numpy().astype(np.float64)
    c = np.stack([cs[pos[sec[i]].numpy(), i] for i in range(d // 2)], axis=1)[:, None, :]
    s = np.stack([cs[pos[sec[i]].numpy(), d // 2 + i] for i in range(d // 2)], axis=1)[:, None, :]
    a, b = q0[..., : d // 2], q0[..., d // 2:]
    ref = np.concatenate([a * c - b * s, b * c + a * s], axis=-1)
    mag = np.concatenate([np.abs(a * c) + np.abs(b * s), np.abs(b * c) + np.abs(a * s)], axis=-1)
    check(to_f64(q), ref, mag, False)


@pytest.mark.parametrize("style", ["neox", "gptj"])
@pytest.mark.parametrize("dt", [torch.float32, torch.bfloat16])
def test_rope_mrope_interleaved(style, dt):
    # Odd sections: h's slice 1:3*7:3 runs past d / 2 = 15 (it ends at the
    # table's end, as in sglang); t takes the rest.
    t, h, d, section = 6, 2, 30, [5, 7, 3]
    q = torch.randn(t, h, d, generator=torch.Generator().manual_seed(4)).to(dt)
    q0 = to_f64(q)
    pos = torch.randint(0, 16, (3, t), generator=torch.Generator().manual_seed(5))
    cache = torch.from_numpy(cos_sin(16, d))
    tilejit.rope(q, None, pos, cache, style=style, mrope_section=section,
                 mrope_interleaved=True)
    # sglang's apply_interleaved_rope on the gathered [3, T, d] rows, in float64.
    rows = torch.from_numpy(cache.numpy().astype(np.float64))[pos]
    cs = rows[0].clone()
    for s in (1, 2):
        for part in (slice(0, d // 2), slice(d // 2, d)):
            sub = cs[:, part]
            sub[:, s:section[s] * 3:3] = rows[s][:, part][:, s:section[s] * 3:3]
    # One cache row per token: the plain reference over it.
    ref, mag = ref_rope(q0, np.arange(t), cs.numpy(), style, d)
    check(to_f64(q), ref, mag, dt == torch.bfloat16)
    with pytest.raises(tilejit.Error,
                       match=r"mrope_interleaved=true with mrope_section=\[5, 10\]"):
        tilejit.rope(q, None, pos[:2], cache, mrope_section=[5, 10], mrope_interleaved=True)


def test_rope_position_out_of_range_is_the_library_error():
    q = torch.zeros(2, 1, 8)
    with pytest.raises(tilejit.Error, match="positions"):
        tilejit.rope(q, None, torch.tensor([0, 8]), torch.from_numpy(cos_sin(8, 8)))
    with pytest.raises(tilejit.Error, match='style: "yarn" is not allowed; allowed: neox, gptj'):
        tilejit.rope(q, None, torch.tensor([0, 1]), torch.from_numpy(cos_sin(8, 8)), style="yarn")
