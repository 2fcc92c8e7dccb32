#!/usr/bin/python3
"""One Llama decoder layer, decode step, through tilejit vs plain torch.

    PYTHONPATH=build/python /usr/bin/python3 examples/python/llama_layer.py
    ... --llama3-8b            # hidden 4096, 32 / 8 heads of 128, MLP 14336

A batch of B sequences, each with `--ctx` tokens already in a paged KV cache
(block size `--block-size`), produces one new token each:

    h = rmsnorm(x)                          torch (both paths)
    qkv = h @ Wqkv^T                        tilejit.gemm       | torch.matmul
    q, k = rope(q, k, positions)            tilejit.rope       | torch (neox)
    store k, v at slot(seq, ctx)            tilejit.store_kv   | index_put
    a = attention(q, cache[:ctx + 1])       tilejit.decode_attention | torch softmax
    x = x + a @ Wo^T                        tilejit.gemm       | torch.matmul
    h = rmsnorm(x); g, u = h @ Wgu^T        tilejit.gemm       | torch.matmul
    x = x + (silu(g) * u) @ Wd^T            torch silu*up, tilejit.gemm | torch

Both paths take the same bf16 weights, cache and inputs; the printed error
is max |tilejit - torch| over the layer output relative to the output's max
magnitude. Expected: a few bf16 ulps (<= 2 % of max |out|: the two paths
round the bf16 intermediates — qkv, attention output, MLP activation — at
different points, each such rounding is 2^-9 relative, and they compound
through four GEMMs). tokens/s counts B tokens per step, median of
`--iters` steps after a warm-up step (the first tilejit step compiles its
kernels).
"""

import argparse
import math
import os
import statistics
import sys
import time

# Before torch starts its OpenMP team: spinning OpenMP workers and tilejit's
# pool would steal the cores from each other between the alternating torch
# and tilejit calls of a step (measured: both paths 2-80x slower).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

import tilejit  # noqa: E402


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--inter", type=int, default=1408)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--ctx", type=int, default=256, help="tokens already in each sequence's cache")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--threads", type=int, default=0, help="0: tilejit's default")
    p.add_argument("--llama3-8b", action="store_true", help="Llama-3-8B sizes")
    a = p.parse_args()
    if a.llama3_8b:
        a.hidden, a.heads, a.kv_heads, a.head_dim, a.inter = 4096, 32, 8, 128, 14336
    return a


def rmsnorm(x, w, eps=1e-5):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w.float()).to(x.dtype)


class Layer:
    def __init__(self, a, gen):
        h, d = a.hidden, a.head_dim
        self.a = a
        nq, nk = a.heads * d, a.kv_heads * d

        def w(n, k):
            return (torch.randn(n, k, generator=gen) / math.sqrt(k)).to(torch.bfloat16)

        self.wqkv, self.wo = w(nq + 2 * nk, h), w(h, nq)
        self.wgu, self.wd = w(2 * a.inter, h), w(h, a.inter)
        self.n1 = (1 + 0.1 * torch.randn(h, generator=gen)).to(torch.bfloat16)
        self.n2 = (1 + 0.1 * torch.randn(h, generator=gen)).to(torch.bfloat16)
        # Packed once at load, as an engine does.
        self.p = {name: tilejit.pack_weight(getattr(self, name))
                  for name in ("wqkv", "wo", "wgu", "wd")}
        inv = 1.0 / (500000.0 ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
        ang = torch.arange(a.ctx + 1, dtype=torch.float64)[:, None] * inv[None, :]
        self.cos_sin = torch.cat([ang.cos(), ang.sin()], 1).float()  # [max_pos, d]

    # ---- the two attention back ends over the same paged cache -----------------
    def rope_torch(self, x, pos):
        d = self.a.head_dim
        cs = self.cos_sin[pos][:, None, :]
        cos, sin = cs[..., :d // 2], cs[..., d // 2:]
        xf = x.float()
        x1, x2 = xf[..., :d // 2], xf[..., d // 2:]
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1).to(x.dtype)

    def attn_torch(self, q, kc, vc, block_table, seq_lens):
        a = self.a
        out = torch.empty_like(q)
        grp = a.heads // a.kv_heads
        for b in range(q.shape[0]):
            n = int(seq_lens[b])
            blocks = block_table[b, :(n + a.block_size - 1) // a.block_size].long()
            k = kc[blocks].reshape(-1, a.kv_heads, a.head_dim)[:n].float()
            v = vc[blocks].reshape(-1, a.kv_heads, a.head_dim)[:n].float()
            k, v = k.repeat_interleave(grp, 1), v.repeat_interleave(grp, 1)
            s = torch.einsum("hd,nhd->hn", q[b].float(), k) / math.sqrt(a.head_dim)
            out[b] = torch.einsum("hn,nhd->hd", torch.softmax(s, -1), v).to(q.dtype)
        return out

    def step(self, x, cache, use_tilejit):
        a = self.a
        kc, vc, block_table, seq_lens, slots, pos = cache
        nq, nk = a.heads * a.head_dim, a.kv_heads * a.head_dim
        b = x.shape[0]

        def mm(inp, name):
            if use_tilejit:
                return tilejit.gemm(inp, self.p[name])
            return inp @ getattr(self, name).T

        h = rmsnorm(x, self.n1)
        qkv = mm(h, "wqkv")
        q = qkv[:, :nq].view(b, a.heads, a.head_dim)
        k = qkv[:, nq:nq + nk].view(b, a.kv_heads, a.head_dim)
        v = qkv[:, nq + nk:].view(b, a.kv_heads, a.head_dim)
        if use_tilejit:
            tilejit.rope(q, k, pos, self.cos_sin)  # in place on the qkv views
            tilejit.store_kv(k, v, kc, vc, slots)
            attn = tilejit.decode_attention(q, kc, vc, block_table, seq_lens)
        else:
            q, k = self.rope_torch(q, pos), self.rope_torch(k, pos)
            blk, off = slots // a.block_size, slots % a.block_size
            kc[blk.long(), off.long()] = k
            vc[blk.long(), off.long()] = v
            attn = self.attn_torch(q, kc, vc, block_table, seq_lens)
        x = x + mm(attn.reshape(b, nq), "wo")
        gu = mm(rmsnorm(x, self.n2), "wgu")
        act = torch.nn.functional.silu(gu[:, :a.inter].float()) * gu[:, a.inter:].float()
        return x + mm(act.to(torch.bfloat16), "wd")


def make_cache(a, gen):
    blocks_per_seq = (a.ctx + 1 + a.block_size - 1) // a.block_size
    nb = a.batch * blocks_per_seq
    kc = (torch.randn(nb, a.block_size, a.kv_heads, a.head_dim, generator=gen)).to(torch.bfloat16)
    vc = (torch.randn(nb, a.block_size, a.kv_heads, a.head_dim, generator=gen)).to(torch.bfloat16)
    # Sequences own shuffled blocks, as a paged allocator leaves them.
    perm = torch.randperm(nb, generator=gen).to(torch.int32)
    block_table = perm.view(a.batch, blocks_per_seq).contiguous()
    seq_lens = torch.full((a.batch,), a.ctx + 1, dtype=torch.int32)
    pos = torch.full((a.batch,), a.ctx, dtype=torch.int64)  # the new token's position
    slots = (block_table[:, a.ctx // a.block_size].long() * a.block_size
             + a.ctx % a.block_size)
    return kc, vc, block_table, seq_lens, slots, pos


def timed(f, iters):
    f()  # warm-up (tilejit: kernel compiles)
    t = []
    for _ in range(iters):
        t0 = time.perf_counter()
        f()
        t.append(time.perf_counter() - t0)
    return statistics.median(t)


def main():
    a = parse()
    if a.threads:
        tilejit.set_num_threads(a.threads)
    torch.set_num_threads(tilejit.num_threads())
    gen = torch.Generator().manual_seed(0)
    layer = Layer(a, gen)
    x = torch.randn(a.batch, a.hidden, generator=gen).to(torch.bfloat16)
    cache_t = make_cache(a, torch.Generator().manual_seed(1))
    cache_r = tuple(c.clone() for c in cache_t)
    with torch.no_grad():
        out_t = layer.step(x, cache_t, True)
        out_r = layer.step(x, cache_r, False)
        err = (out_t.float() - out_r.float()).abs().max().item()
        scale = out_r.float().abs().max().item()
        st = timed(lambda: layer.step(x, cache_t, True), a.iters)
        sr = timed(lambda: layer.step(x, cache_r, False), a.iters)
    print(f"llama layer: hidden {a.hidden}, heads {a.heads}/{a.kv_heads} x {a.head_dim}, "
          f"MLP {a.inter}, batch {a.batch}, context {a.ctx}, block {a.block_size}, "
          f"threads {tilejit.num_threads()}, isa {tilejit.cpu_info()['isa']}")
    print(f"max |tilejit - torch| = {err:.4g} ({err / scale:.2%} of max |out| = {scale:.4g}; "
          "tolerance 2 %)")
    print(f"tilejit: {st * 1e3:8.3f} ms/step  {a.batch / st:10.1f} tokens/s")
    print(f"torch:   {sr * 1e3:8.3f} ms/step  {a.batch / sr:10.1f} tokens/s  "
          f"(tilejit {sr / st:.2f}x)")
    if not err <= 0.02 * scale:
        print("FAIL: outputs differ beyond the tolerance", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
