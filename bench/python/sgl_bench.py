#!/usr/bin/python3
"""Each tilejit.sgl function timed against a plain-torch implementation of
the same sgl-kernel semantics, on the same tensors.

    PYTHONPATH=build/python /usr/bin/python3 bench/python/sgl_bench.py [--reps N] [--threads N]

sgl-kernel's and vLLM's CPU ops are not installable here (no PyPI on this
machine), so the peer is plain torch: what an engine runs when those ops are
missing (sglang's forward_native paths): bf16 matmuls (oneDNN in Debian's
torch 1.13, with AMX here) and f32 element-wise math. Each number is
the median of --reps calls after one warm-up call (the warm-up compiles
tilejit's kernels), tilejit and torch on the same thread count (OpenMP
waiting passively, see below); every row also checks that both sides agree (max
relative difference printed), so a fast wrong result cannot pass unnoticed.
"""

import argparse
import math
import os
import statistics
import time

# Before torch starts its OpenMP team: spinning OpenMP workers and tilejit's
# pool (which spins 100 us after a call) would otherwise steal the two cores
# from each other in alternating calls (seen: torch's softmax 12 ms instead
# of 0.1 ms). Set OMP_WAIT_POLICY yourself to override.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

import tilejit  # noqa: E402
from tilejit import sgl  # noqa: E402

BF = torch.bfloat16


def med(f, reps):
    f()
    t = []
    for _ in range(reps):
        t0 = time.perf_counter()
        f()
        t.append(time.perf_counter() - t0)
    return statistics.median(t)


def rnd(shape, seed, scale=1.0, dtype=BF):
    return (torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * scale).to(dtype)


def rel(a, b):
    a, b = a.float(), b.float()
    return ((a - b).abs().max() / b.abs().max().clamp(min=1e-30)).item()


ROWS = []


def row(name, shape, f_tj, f_torch, reps, check):
    tj, tt = med(f_tj, reps), med(f_torch, reps)
    err = check()
    ROWS.append((name, shape, tj, tt, err))
    print(f"{name:34s} {shape:34s} {tj * 1e6:11.1f} {tt * 1e6:12.1f} {tt / tj:8.2f}x  {err:.1e}",
          flush=True)


# ---- plain-torch versions of the sgl-kernel ops ------------------------------------

# The torch side computes as an engine's native bf16 path does: matmuls on
# bf16 tensors (oneDNN in this torch build; its f32 matmul is the generic
# reference BLAS, ~200x slower), element-wise math in f32.

def torch_linear(x, w, b):
    return (x @ w.T + b).to(BF)


def torch_experts(x, w1, w2, tw, ti):
    out = torch.zeros(x.shape[0], w2.shape[1])
    inter = w2.shape[2]
    for e in ti.unique().tolist():
        tok, slot = (ti == e).nonzero(as_tuple=True)
        gu = (x[tok] @ w1[e].T).float()
        a = (torch.nn.functional.silu(gu[:, :inter]) * gu[:, inter:]).to(BF)
        out.index_add_(0, tok, tw[tok, slot, None] * (a @ w2[e].T).float())
    return out.to(BF)


def torch_topk(logits, k, sig):
    s = torch.sigmoid(logits) if sig else torch.softmax(logits, -1)
    w, i = torch.topk(s, k)
    return w / w.sum(-1, keepdim=True), i.to(torch.int32)


def torch_biased_grouped(logits, bias, k, groups, tg):
    s = torch.sigmoid(logits)
    key = s + bias
    t, e = key.shape
    gs = key.view(t, groups, -1).topk(2, -1).values.sum(-1)
    keep = torch.zeros(t, groups, dtype=torch.bool).scatter_(1, gs.topk(tg, -1).indices, True)
    ids = key.masked_fill(~keep.repeat_interleave(e // groups, 1), -math.inf).topk(k, -1).indices
    w = s.gather(1, ids)
    return w / w.sum(-1, keepdim=True), ids.to(torch.int32)


def torch_rope(pos, q, k, d, cache):
    cs = cache[pos]
    cos, sin = cs[:, None, :d // 2], cs[:, None, d // 2:]

    def one(x):
        xf = x.view(x.shape[0], -1, d).float()
        x1, x2 = xf[..., :d // 2], xf[..., d // 2:]
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1).to(x.dtype)
    return one(q), one(k)


def torch_attn(q, k, v, causal, scale):
    """One sequence; q [n, Hq, D], k/v [m, Hkv, D]; bottom-right causal."""
    grp = q.shape[1] // k.shape[1]
    kh = k.repeat_interleave(grp, 1).transpose(0, 1)  # [H, m, D] bf16
    vh = v.repeat_interleave(grp, 1).transpose(0, 1)
    s = torch.matmul(q.transpose(0, 1), kh.transpose(1, 2)).float() * scale  # [H, n, m]
    if causal:
        n, m = q.shape[0], k.shape[0]
        mask = torch.arange(m)[None, :] > (m - n + torch.arange(n))[:, None]
        s = s.masked_fill(mask, -math.inf)
    return torch.matmul(torch.softmax(s, -1).to(BF), vh).transpose(0, 1)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--threads", type=int, default=0)
    a = p.parse_args()
    if a.threads:
        tilejit.set_num_threads(a.threads)
    torch.set_num_threads(tilejit.num_threads())
    r = a.reps
    print(f"threads {tilejit.num_threads()} (tilejit and torch), isa {tilejit.cpu_info()['isa']}, "
          f"torch {torch.__version__}; median of {r}")
    print(f"{'op':34s} {'shape':34s} {'tilejit us':>11s} {'torch us':>12s} {'speedup':>9s}  "
          "max rel diff")
    torch.set_grad_enabled(False)

    # linear
    for m in (1, 32, 256):
        n, k = 2048, 2048
        x, w, b = rnd((m, k), 1), rnd((n, k), 2, 0.02), rnd((n,), 3, dtype=torch.float32)
        pw = sgl.convert_weight_packed(w)
        row("weight_packed_linear", f"M {m} N {n} K {k}",
            lambda: sgl.weight_packed_linear(x, pw, b, True), lambda: torch_linear(x, w, b), r,
            lambda: rel(sgl.weight_packed_linear(x, pw, b, True), torch_linear(x, w, b)))

    # MoE
    e, h, inter, kk = 8, 1024, 512, 2
    w1, w2 = rnd((e, 2 * inter, h), 4, 0.03), rnd((e, h, inter), 5, 0.04)
    p1, p2 = sgl.convert_weight_packed(w1), sgl.convert_weight_packed(w2)
    for t in (1, 64):
        x = rnd((t, h), 6)
        tw, ti = torch.topk(torch.softmax(torch.randn(t, e), -1), kk)
        ti = ti.to(torch.int32)
        row("fused_experts_cpu (bf16)", f"T {t} E {e} H {h} I {inter} k {kk}",
            lambda: sgl.fused_experts_cpu(x, p1, p2, tw, ti, False),
            lambda: torch_experts(x, w1, w2, tw, ti), r,
            lambda: rel(sgl.fused_experts_cpu(x, p1, p2, tw, ti, False),
                        torch_experts(x, w1, w2, tw, ti)))

    # routers
    logits, bias = torch.randn(256, 64), torch.randn(64) * 0.1
    row("topk_softmax_cpu", "T 256 E 64 k 8", lambda: sgl.topk_softmax_cpu(None, logits, 8, True),
        lambda: torch_topk(logits, 8, False), r,
        lambda: rel(sgl.topk_softmax_cpu(None, logits, 8, True)[0], torch_topk(logits, 8, False)[0]))
    row("topk_sigmoid_cpu", "T 256 E 64 k 8", lambda: sgl.topk_sigmoid_cpu(None, logits, 8, True),
        lambda: torch_topk(logits, 8, True), r,
        lambda: rel(sgl.topk_sigmoid_cpu(None, logits, 8, True)[0], torch_topk(logits, 8, True)[0]))
    row("biased_grouped_topk_cpu", "T 256 E 64 groups 8/4 k 8",
        lambda: sgl.biased_grouped_topk_cpu(None, logits, bias, 8, True, 8, 4),
        lambda: torch_biased_grouped(logits, bias, 8, 8, 4), r,
        lambda: rel(sgl.biased_grouped_topk_cpu(None, logits, bias, 8, True, 8, 4)[0],
                    torch_biased_grouped(logits, bias, 8, 8, 4)[0]))

    # RoPE (the issue-15 shape)
    t, hq, hk, d = 512, 32, 8, 128
    q, k = rnd((t, hq * d), 7), rnd((t, hk * d), 8)
    # A real cos / sin table: rotations keep the magnitudes, so calling the
    # op in place again and again never drifts into subnormals or Inf.
    theta = torch.arange(8192.0)[:, None] * (500000.0 ** (-torch.arange(0, d, 2) / d))[None]
    cache = torch.cat([theta.cos(), theta.sin()], 1)
    pos = torch.randint(0, 8192, (t,))
    qc, kc = q.clone(), k.clone()
    row("rotary_embedding_cpu", f"T {t} Hq {hq} Hk {hk} D {d} neox",
        lambda: sgl.rotary_embedding_cpu(pos, q, k, d, cache, True),
        lambda: torch_rope(pos, q, k, d, cache), r,
        lambda: rel(sgl.rotary_embedding_cpu(pos, qc.clone(), kc.clone(), d, cache, True)[0]
                    .view(t, hq, d), torch_rope(pos, qc, kc, d, cache)[0]))

    # attention
    hq, hkv, d = 32, 8, 128
    lens = [512, 512]
    tq = sum(lens)
    q, k, v = rnd((tq, hq, d), 10), rnd((tq, hkv, d), 11), rnd((tq, hkv, d), 12)
    cu = torch.tensor([0, 512, 1024], dtype=torch.int32)
    sc = 1 / math.sqrt(d)

    def torch_varlen():
        return torch.cat([torch_attn(q[s:e_], k[s:e_], v[s:e_], True, sc)
                          for s, e_ in ((0, 512), (512, 1024))])
    row("flash_attn_varlen_func", "B 2 x 512 causal 32/8 x 128",
        lambda: sgl.flash_attn_varlen_func(q, k, v, cu, cu, 512, 512, True, sc), torch_varlen, r,
        lambda: rel(sgl.flash_attn_varlen_func(q, k, v, cu, cu, 512, 512, True, sc),
                    torch_varlen()))

    bsz, ctx, slots = 16, 1024, 16 * 1024 + 64
    kb, vb = rnd((slots, hkv, d), 13), rnd((slots, hkv, d), 14)
    req_to_token = torch.randperm(slots)[:bsz * ctx].view(bsz, ctx).to(torch.int32)
    rpi, seq_lens = torch.arange(bsz), torch.full((bsz,), ctx)
    qd, kn, vn = rnd((bsz, hq, d), 15), rnd((bsz, hkv, d), 16), rnd((bsz, hkv, d), 17)
    loc = req_to_token[:, ctx - 1].long()
    out = torch.empty(bsz, hq, d, dtype=BF)

    def torch_decode():
        kb[loc], vb[loc] = kn, vn
        return torch.stack([torch_attn(qd[b:b + 1], kb[req_to_token[b].long()],
                                       vb[req_to_token[b].long()], False, sc)[0]
                            for b in range(bsz)])

    def tj_decode():
        sgl.decode_attention_cpu(qd, kb, vb, out, kn, vn, loc, None, req_to_token, rpi, seq_lens,
                                 sc, 0.0)
        return out
    row("decode_attention_cpu", f"B {bsz} ctx {ctx} 32/8 x 128 (block 1)", tj_decode,
        torch_decode, r, lambda: rel(tj_decode().clone(), torch_decode()))

    bsz, pre, ext = 2, 512, 128
    rt = req_to_token[:bsz, :pre + ext].contiguous()
    qe, ke, ve = rnd((bsz * ext, hq, d), 18), rnd((bsz * ext, hkv, d), 19), rnd((bsz * ext, hkv, d), 20)
    oe = torch.empty(bsz * ext, hq, d, dtype=BF)
    sl, el = torch.full((bsz,), pre + ext), torch.full((bsz,), ext)
    st = torch.arange(bsz) * ext

    def tj_extend():
        sgl.extend_attention_cpu(qe, ke, ve, oe, kb, vb, rt, torch.arange(bsz), sl, el, st, ext,
                                 sc, 0.0)
        return oe

    def torch_extend():
        outs = []
        for b in range(bsz):
            s = slice(b * ext, (b + 1) * ext)
            kk_ = torch.cat([kb[rt[b, :pre].long()], ke[s]])
            vv_ = torch.cat([vb[rt[b, :pre].long()], ve[s]])
            outs.append(torch_attn(qe[s], kk_, vv_, True, sc))
        return torch.cat(outs)
    row("extend_attention_cpu", f"B {bsz} prefix {pre} extend {ext} 32/8 x 128", tj_extend,
        torch_extend, r, lambda: rel(tj_extend().clone(), torch_extend()))


if __name__ == "__main__":
    main()
