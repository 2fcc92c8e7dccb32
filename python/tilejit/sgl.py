"""tilejit.sgl: sgl-kernel's CPU ops (``torch.ops.sgl_kernel.*_cpu``) on tilejit.

Same names, argument order and semantics as sgl-kernel's CPU schemas, so an
engine written against sgl-kernel can swap the import::

    from tilejit import sgl as ops     # instead of torch.ops.sgl_kernel

torch tensors in and out (this module imports torch; ``import tilejit``
does not). Every difference from sgl-kernel is in the function's docstring
and in the table of docs/python.md ("## tilejit.sgl"). In short:

- Shapes sgl-kernel refuses run here: any N (not only N % 32 == 0), any even
  head size (80, 96, 112, 192, ...), any fp8 block size (not only 128), any
  number of experts / groups / k for the routers.
- ``convert_weight_packed`` returns a :class:`PackedWeight` object, not a
  tensor: keep it as a plain attribute (``torch.nn.Parameter`` cannot hold it).
- Scratch and sizing arguments of sgl-kernel's kernels (``attn_logits``,
  ``max_seqlen_*``, ``max_len_extend``, ``is_vnni`` when a packed weight is
  given) have no meaning here; they are accepted and ignored.
- A bad argument raises ``tilejit.Error`` naming the argument, the value and
  what is allowed (sgl-kernel raises RuntimeError from TORCH_CHECK).
"""

import operator

import torch

import tilejit
from tilejit import Error

__all__ = [
    "PackedWeight", "convert_weight_packed", "weight_packed_linear", "fused_experts_cpu",
    "topk_softmax_cpu", "topk_sigmoid_cpu", "grouped_topk_cpu", "biased_grouped_topk_cpu",
    "rotary_embedding_cpu", "multimodal_rotary_embedding_cpu", "apply_multidimensional_rope_cpu",
    "flash_attn_varlen_func", "decode_attention_cpu", "extend_attention_cpu",
]


def _need(cond, msg):
    if not cond:
        raise Error(msg)


def _tensor(arg, t):
    _need(isinstance(t, torch.Tensor),
          f"{arg}: expected a torch.Tensor, got {type(t).__name__}")
    return t


def _i32(arg, t):
    """An index tensor as int32 (tilejit's index dtype for these)."""
    _tensor(arg, t)
    _need(t.dtype in (torch.int32, torch.int64),
          f"{arg}.dtype={t.dtype}; allowed: torch.int32, torch.int64")
    return t if t.dtype == torch.int32 else t.to(torch.int32)


# ---- Weights and linear --------------------------------------------------------

class PackedWeight:
    """What :func:`convert_weight_packed` returns: the weight packed for
    tilejit's kernels. 2-D bf16 weights [N, K] are packed at once (a
    ``tilejit.PackedWeight``); 3-D expert weights [E, rows, cols] are packed
    at the first ``fused_experts_cpu`` call that uses them, because only the
    call says whether a tensor is w1 (gate_up) or w2 (down), and for int8 /
    fp8 weights which scales go with it. ``weight`` keeps the original
    tensor (tilejit's packed bytes are machine-specific; the original is what
    to save). ``shape`` and ``dtype`` are the original's.
    """

    def __init__(self, weight):
        self.weight = weight
        self.shape = weight.shape
        self.dtype = weight.dtype
        self._packed = {}
        if weight.dim() == 2 and weight.dtype == torch.bfloat16:
            self._packed["linear"] = tilejit.pack_weight(weight)

    def size(self, dim=None):
        return self.shape if dim is None else self.shape[dim]

    def dim(self):
        return len(self.shape)

    def linear(self):
        p = self._packed.get("linear")
        _need(p is not None,
              f"weight_packed_linear: mat2 is a packed {self.dtype} weight of shape "
              f"{tuple(self.shape)}; allowed: a 2-D torch.bfloat16 weight [N, K]")
        return p

    def experts(self, key, scale, make):
        """The experts packed for key (format, projection, block), packed
        again when the call's scales differ from those of the last packing.
        sgl-kernel reads the scales at every call, so a cache keyed by the
        scale tensor's identity was wrong: a freed tensor's id comes back for
        another tensor, and the same tensor may be changed in place. The
        scales are compared bit for bit (NaN included); one packing per key
        is kept, so new scales replace the old packing instead of adding one."""
        snap = None if scale is None else scale.detach().to(torch.float32).contiguous()
        entry = self._packed.get(key)
        if entry is not None and _same_bits(entry[0], snap):
            return entry[1]
        p = make(self.weight)
        self._packed[key] = (None if snap is None else snap.clone(), p)
        return p

    def __repr__(self):
        return f"tilejit.sgl.PackedWeight(shape={tuple(self.shape)}, dtype={self.dtype})"


def _same_bits(a, b):
    """Whether two f32 tensors (or None) hold the same bits."""
    if a is None or b is None:
        return a is None and b is None
    return a.shape == b.shape and torch.equal(a.view(torch.int32), b.view(torch.int32))


def convert_weight_packed(weight):
    """sgl-kernel ``convert_weight_packed(Tensor weight) -> Tensor``.

    Differences: returns a :class:`PackedWeight` (not a VNNI tensor); its
    ``weight`` is the input. 2-D bf16 weights are packed now (tilejit's
    blocked layout for its AMX / AVX-512 kernels, any N and K, where
    sgl-kernel needs N % 32 == 0 for its VNNI packing); 3-D expert weights
    (bf16, int8, or fp8 e4m3 codes as uint8: torch 1.13 has no float8) are
    packed at first use by :func:`fused_experts_cpu`.
    """
    _tensor("weight", weight)
    _need(weight.dim() in (2, 3), f"convert_weight_packed: weight has {weight.dim()} dims "
          f"(shape {tuple(weight.shape)}); allowed: 2 ([N, K]) or 3 ([E, rows, cols])")
    return PackedWeight(weight)


def weight_packed_linear(mat1, mat2, bias=None, is_vnni=True):
    """sgl-kernel ``weight_packed_linear(mat1, mat2, bias, is_vnni) -> Tensor``:
    ``mat1 [M, K] @ mat2.T + bias`` into a new bf16 tensor [M, N].

    mat1: bf16 [M, K] (more leading dims are flattened); mat2: what
    :func:`convert_weight_packed` returned, a ``tilejit.PackedWeight``, or
    (``is_vnni=False``) a plain bf16 [N, K] tensor, packed for this call
    only; bias: [N] f32 or bf16. Differences: ``is_vnni`` only says whether
    mat2 is already packed (a packed mat2 is used whatever it says); any N
    (sgl-kernel: N % 32 == 0); mat1 must be bf16 (sgl-kernel also takes f16
    and f32).
    """
    _tensor("mat1", mat1)
    _need(mat1.dtype == torch.bfloat16,
          f"weight_packed_linear: mat1.dtype={mat1.dtype}; allowed: torch.bfloat16")
    if isinstance(mat2, PackedWeight):
        w = mat2.linear()
    elif isinstance(mat2, tilejit.PackedWeight):
        w = mat2
    else:
        _tensor("mat2", mat2)
        w = tilejit.pack_weight(mat2)
    lead = mat1.shape[:-1]
    x = mat1.reshape(-1, mat1.shape[-1]) if mat1.dim() != 2 else mat1
    if x.dim() == 2 and x.shape[-1] > 0 and x.stride(-1) != 1:
        x = x.contiguous()
    out = torch.empty((x.shape[0], w.n), dtype=torch.bfloat16)
    tilejit.gemm(x, w, out=out, bias=bias)
    return out.reshape(*lead, w.n) if mat1.dim() != 2 else out


# ---- Mixture of experts ----------------------------------------------------------

def _expert_pack(w, proj, arg, use_int8, use_fp8, scale, block_size):
    """The PackedExperts of w1 / w2 for this call (cached on a PackedWeight)."""
    if isinstance(w, tilejit.PackedExperts):
        return w
    holder = w if isinstance(w, PackedWeight) else None
    t = holder.weight if holder is not None else _tensor(arg, w)
    _need(t.dim() == 3, f"fused_experts_cpu: {arg} has shape {tuple(t.shape)}; allowed: "
          "[E, 2I, H] (w1) / [E, H, I] (w2)")
    if use_int8:
        _need(t.dtype == torch.int8 and scale is not None,
              f"fused_experts_cpu: use_int8_w8a8 needs {arg} int8 (got {t.dtype}) and "
              f"{arg}_scale f32 [E, N] (got {None if scale is None else tuple(scale.shape)})")
        key = ("int8", proj)

        def make(t):
            s = scale.to(torch.float32).reshape(t.shape[0], -1)
            return tilejit.pack_experts_int8([(t[e], s[e]) for e in range(t.shape[0])], proj=proj)
    elif use_fp8:
        _need(t.dtype == torch.uint8 and scale is not None,
              f"fused_experts_cpu: use_fp8_w8a16 needs {arg} as uint8 e4m3 codes (got "
              f"{t.dtype}; torch 1.13 has no float8: pass weight.view(torch.uint8)) and "
              f"{arg}_scale f32")
        bn, bk = (0, 0) if block_size is None else (int(block_size[0]), int(block_size[1]))
        key = ("fp8", proj, bn, bk)

        def make(t):
            s = scale.to(torch.float32)
            return tilejit.pack_experts_fp8([(t[e], s[e]) for e in range(t.shape[0])],
                                            block_n=bn, block_k=bk, proj=proj)
    else:
        _need(t.dtype == torch.bfloat16,
              f"fused_experts_cpu: {arg}.dtype={t.dtype}; allowed: torch.bfloat16 (or int8 / "
              "uint8 fp8 codes with use_int8_w8a8 / use_fp8_w8a16)")
        key = ("bf16", proj)

        def make(t):
            return tilejit.pack_experts(t, proj=proj)
    if holder is None:
        return make(t)
    return holder.experts(key, scale if (use_int8 or use_fp8) else None, make)


def _static_act_scales(a1_scale, a2_scale, use_int8):
    """fused_experts' kwargs for a1_scale / a2_scale: {} (dynamic per-token
    quantization) when both are None, else act_quant="fixed" with their
    values (checked finite > 0 by tilejit as act_scale13 / act_scale2)."""
    if a1_scale is None and a2_scale is None:
        return {}
    _need(use_int8, "fused_experts_cpu: a1_scale / a2_scale given without use_int8_w8a8; "
          "allowed: static activation scales only with int8 (W8A8) experts")
    _need(a1_scale is not None and a2_scale is not None,
          f"fused_experts_cpu: a1_scale is {'None' if a1_scale is None else 'given'} and a2_scale "
          f"is {'None' if a2_scale is None else 'given'}; allowed: both (static scales for "
          "both projections) or neither (per-token dynamic)")

    def one(arg, v):
        if isinstance(v, torch.Tensor):
            _need(v.numel() == 1,
                  f"fused_experts_cpu: {arg} has shape {tuple(v.shape)}; allowed: one element "
                  "(a per-tensor static scale; per-token or per-expert scales are not supported)")
            return float(v.reshape(()).item())
        _need(isinstance(v, (float, int)) and not isinstance(v, bool),
              f"fused_experts_cpu: {arg} is a {type(v).__name__}; allowed: a one-element tensor "
              "or a float")
        return float(v)
    # zero point 128: the u8 codes of s8 clamp(rne(x / s), -128, 127).
    return dict(act_quant="fixed", act_scale13=one("a1_scale", a1_scale),
                act_scale2=one("a2_scale", a2_scale), act_zero_point13=128, act_zero_point2=128)


def fused_experts_cpu(hidden_states, w1, w2, topk_weights, topk_ids, inplace=False,
                      use_int8_w8a8=False, use_fp8_w8a16=False, w1_scale=None, w2_scale=None,
                      block_size=None, a1_scale=None, a2_scale=None, w1_bias=None, w2_bias=None,
                      alpha=None, limit=None, is_vnni=True):
    """sgl-kernel ``fused_experts_cpu``: ``out[t] = sum_j topk_weights[t, j] *
    w2[e] @ (silu(gate) * up)`` with ``gate, up = halves of w1[e] @ x[t]``,
    ``e = topk_ids[t, j]``; returns out [T, H] bf16 (hidden_states itself
    when ``inplace``).

    w1 [E, 2I, H] (the I gate rows, then the I up rows), w2 [E, H, I]: from
    :func:`convert_weight_packed` (packed once, at the first call) or plain
    tensors (``is_vnni=False``: packed on every call, slow). topk_ids int32
    or int64 [T, k]; a negative id (sglang's padded tokens) contributes
    nothing (it is given weight 0 on expert 0, so a NaN / Inf in expert 0's
    output for that token would still show; sgl-kernel skips it).

    - ``use_int8_w8a8``: w1 / w2 int8 with per-channel f32 scales
      w1_scale [E, 2I] (or [E, 2I, 1]), w2_scale [E, H]; activations are
      quantized per token, dynamically (symmetric), as sgl-kernel does;
      or, given ``a1_scale`` and ``a2_scale`` (one element each: static
      per-tensor scales of w1's and w2's inputs, as vLLM / sglang's triton
      fused_moe; sgl-kernel's CPU kernel refuses them), with those:
      s8 codes ``clamp(rne(x * (1 / s)), -128, 127)`` (act_quant="fixed",
      zero point 128). Per-token or per-expert a-scales are an Error.
    - ``use_fp8_w8a16``: e4m3 codes (uint8 tensors) with block scales
      w1_scale [E, ceil(2I/bn), ceil(H/bk)] and ``block_size = [bn, bk]``
      (any block size; sgl-kernel: 128 x 128), or per-channel scales
      [E, 2I] with ``block_size=None``.
    - ``alpha`` / ``limit`` (GPT-OSS): the clamped SwiGLU
      ``(clamp(up, -limit, limit) + 1) * g * sigmoid(alpha * g)``,
      ``g = clamp(gate, max=limit)``; w1_bias [E, 2I] / w2_bias [E, H] f32.
    - int4 (``use_int4_w4a16`` in newer sgl-kernel builds) has no argument
      here: pack with ``tilejit.pack_experts_int4`` and pass the
      ``tilejit.PackedExperts`` objects as w1 / w2 directly.
    """
    _tensor("hidden_states", hidden_states)
    _need(not (use_int8_w8a8 and use_fp8_w8a16),
          "fused_experts_cpu: use_int8_w8a8 and use_fp8_w8a16 both set; allowed: one")
    aq = _static_act_scales(a1_scale, a2_scale, use_int8_w8a8)
    _need(hidden_states.dtype == torch.bfloat16,
          f"fused_experts_cpu: hidden_states.dtype={hidden_states.dtype}; allowed: torch.bfloat16")
    w13 = _expert_pack(w1, "gate_up", "w1", use_int8_w8a8, use_fp8_w8a16, w1_scale, block_size)
    w2p = _expert_pack(w2, "down", "w2", use_int8_w8a8, use_fp8_w8a16, w2_scale, block_size)
    ids = _i32("topk_ids", topk_ids)
    weights = _tensor("topk_weights", topk_weights).to(torch.float32)
    neg = ids < 0
    if bool(neg.any()):
        ids = torch.where(neg, torch.zeros_like(ids), ids)
        weights = torch.where(neg, torch.zeros_like(weights), weights)
    ids = ids.contiguous()
    weights = weights.contiguous()
    x = hidden_states if hidden_states.stride(-1) == 1 else hidden_states.contiguous()
    out = torch.empty_like(x)
    clamped = alpha is not None or limit is not None
    kw = {}
    if clamped:
        kw = dict(clamped_swiglu=True, swiglu_alpha=1.702 if alpha is None else float(alpha),
                  swiglu_limit=7.0 if limit is None else float(limit))
    b13 = None if w1_bias is None else w1_bias.to(torch.float32).contiguous()
    b2 = None if w2_bias is None else w2_bias.to(torch.float32).contiguous()
    tilejit.fused_experts(x, w13, w2p, weights, ids, out=out, b13=b13, b2=b2, **kw, **aq)
    if inplace:
        hidden_states.copy_(out)
        return hidden_states
    return out


# ---- Routing ---------------------------------------------------------------------

def _router_out(gating_output, topk):
    _tensor("gating_output", gating_output)
    try:
        k = operator.index(topk)  # int, numpy and 0-d torch integers
    except TypeError:
        k = 0
    _need(k >= 1, f"topk={topk!r}; allowed: an integer >= 1")
    _need(gating_output.dim() == 2,
          f"gating_output has shape {tuple(gating_output.shape)}; allowed: [T, E]")
    t = gating_output.shape[0]
    return (torch.empty((t, topk), dtype=torch.float32),
            torch.empty((t, topk), dtype=torch.int32))


def _logits(g):
    return g if g.dtype in (torch.float32, torch.bfloat16) else g.to(torch.float32)


def _mask_padded(w, ids, num_token_non_padded):
    # sglang's _mask_topk_ids_padded_region: tokens past the real ones get id -1.
    if num_token_non_padded is not None:
        n = int(num_token_non_padded)
        # ids[n:] with n < 0 would mask only the last -n tokens (Python's
        # negative index), not sglang's "every token from n on".
        _need(n >= 0, f"num_token_non_padded={n}; allowed: >= 0 (the count of real tokens)")
        ids[n:] = -1
    return w, ids


def topk_softmax_cpu(hidden_states, gating_output, topk, renormalize):
    """sgl-kernel ``topk_softmax_cpu(hidden_states, gating_output, topk,
    renormalize) -> (topk_weights f32, topk_ids int32)``: softmax over the E
    experts, the topk best. hidden_states is unused (as in sgl-kernel: only
    its token count matters). Any E (sgl-kernel: a fixed list)."""
    w, ids = _router_out(gating_output, topk)
    tilejit.topk_softmax(_logits(gating_output), w, ids, renormalize=renormalize)
    return w, ids


def topk_sigmoid_cpu(hidden_states, gating_output, topk, renormalize):
    """sgl-kernel ``topk_sigmoid_cpu``: sigmoid per expert, the topk best,
    optionally renormalized. hidden_states is unused."""
    w, ids = _router_out(gating_output, topk)
    tilejit.topk_sigmoid(_logits(gating_output), w, ids, renormalize=renormalize)
    return w, ids


def _grouped(score, hidden_states, gating_output, correction_bias, topk, renormalize,
             num_expert_group, topk_group, num_fused_shared_experts, routed_scaling_factor,
             num_token_non_padded):
    _need(int(num_fused_shared_experts) == 0,
          f"num_fused_shared_experts={num_fused_shared_experts}; allowed: 0 (pass the shared "
          "expert to tilejit.fused_experts as shared_w13 / shared_w2 instead)")
    w, ids = _router_out(gating_output, topk)
    bias = None if correction_bias is None else correction_bias.to(torch.float32).contiguous()
    tilejit.grouped_topk(_logits(gating_output), w, ids, score=score,
                         num_expert_group=num_expert_group, topk_group=topk_group,
                         renormalize=renormalize, routed_scaling_factor=1.0,
                         correction_bias=bias)
    return _mask_padded(w, ids, num_token_non_padded)


def grouped_topk_cpu(hidden_states, gating_output, topk, renormalize, num_expert_group,
                     topk_group, num_fused_shared_experts=0, routed_scaling_factor=None,
                     num_token_non_padded=None):
    """sgl-kernel ``grouped_topk_cpu`` (DeepSeek-V2): softmax scores, a
    group's score its best expert, the topk_group best groups, the topk
    best experts in them. routed_scaling_factor is not applied to the
    weights (sgl-kernel uses it only for fused shared experts, which are
    refused here: ``num_fused_shared_experts`` must be 0).
    num_token_non_padded: tokens from that index on get id -1 (sglang).
    Any E, group count and k (sgl-kernel: fixed sizes)."""
    return _grouped("softmax", hidden_states, gating_output, None, topk, renormalize,
                    num_expert_group, topk_group, num_fused_shared_experts,
                    routed_scaling_factor, num_token_non_padded)


def biased_grouped_topk_cpu(hidden_states, gating_output, correction_bias, topk, renormalize,
                            num_expert_group, topk_group, num_fused_shared_experts=0,
                            routed_scaling_factor=None, num_token_non_padded=None):
    """sgl-kernel ``biased_grouped_topk_cpu`` (DeepSeek-V3): sigmoid scores,
    selection on score + correction_bias, a group's score the sum of its
    two best biased scores; weights are the unbiased scores (renormalized
    if asked). Otherwise as :func:`grouped_topk_cpu`."""
    _tensor("correction_bias", correction_bias)
    return _grouped("sigmoid", hidden_states, gating_output, correction_bias, topk,
                    renormalize, num_expert_group, topk_group, num_fused_shared_experts,
                    routed_scaling_factor, num_token_non_padded)


# ---- RoPE ------------------------------------------------------------------------

def _in_place_view(arg, x, shape):
    """x.view(shape), or a tilejit.Error naming arg where its strides do not
    allow one: the rotation is in place, so a copy would not be written back."""
    try:
        return x.view(shape)
    except RuntimeError:
        _need(False, f"{arg} has shape {tuple(x.shape)} and strides {x.stride()}, which cannot "
              f"be viewed as {tuple(shape)} (rotated in place: no copy); allowed: tokens one "
              "row stride apart, each head's elements contiguous")


def _heads(arg, x, head_size):
    """x as a [T, H, D] view (no copy): 2-D [T, H*D], 3-D [T, H, D] or 4-D
    [B, S, H, D]."""
    _tensor(arg, x)
    _need(head_size > 0, f"head_size={head_size}; allowed: > 0")
    if x.dim() == 2:
        _need(x.shape[1] % head_size == 0, f"{arg} has shape {tuple(x.shape)}; allowed: "
              f"[T, H * head_size] with head_size={head_size}")
        return _in_place_view(arg, x, (x.shape[0], x.shape[1] // head_size, head_size))
    if x.dim() == 4:
        return _in_place_view(arg, x, (-1, x.shape[2], x.shape[3]))
    _need(x.dim() == 3, f"{arg} has {x.dim()} dims (shape {tuple(x.shape)}); allowed: 2, 3, 4")
    return x


def rotary_embedding_cpu(positions, query, key, head_size, cos_sin_cache, is_neox):
    """sgl-kernel ``rotary_embedding_cpu(positions, query, key, head_size,
    cos_sin_cache, is_neox) -> (query, key)``: vLLM / sglang RoPE, the first
    ``cos_sin_cache.shape[1]`` elements of each head rotated (cos half, then
    sin half per cache row). 2-D [T, H*D] and 4-D [B, S, H, D] inputs are
    rotated in place and returned; 3-D [T, H, D] inputs are left untouched
    and new tensors returned (sgl-kernel's rule). Differences: the cache may
    be f32 with bf16 q/k (sgl-kernel: the same dtype); partial rotary
    (rotary_dim < head_size) also on 3-D inputs; any even head size;
    positions int32 or int64 (sgl-kernel: int64)."""
    q = _heads("query", query, head_size)
    k = _heads("key", key, head_size)
    if query.dim() == 3:
        q, k = q.clone(), k.clone()
    tilejit.rope(q, k, positions.reshape(-1), cos_sin_cache,
                 style="neox" if is_neox else "gptj", rotary_dim=cos_sin_cache.shape[1])
    if query.dim() == 3:
        return q, k
    return query, key


def multimodal_rotary_embedding_cpu(positions, query, key, head_size, cos_sin_cache,
                                    mrope_section=None, mrope_interleaved=False, is_neox=True):
    """sgl-kernel ``multimodal_rotary_embedding_cpu``: M-RoPE (Qwen2-VL):
    positions [3, T] with ``mrope_section = [t, h, w]`` (frequency counts,
    summing to rotary_dim / 2), or [T] for text-only batches (plain RoPE);
    in place on query [T, Hq*D] / key [T, Hk*D], returns (query, key).
    ``mrope_interleaved=True`` (Qwen3-VL): frequency i takes the h row when
    i % 3 == 1 and i < 3*h, the w row when i % 3 == 2 and i < 3*w, else the
    t row (sglang's ``apply_interleaved_rope``); it needs exactly 3 sections.
    Not interleaved, any number of sections (sgl-kernel: exactly 3)."""
    q = _heads("query", query, head_size)
    k = _heads("key", key, head_size)
    style = "neox" if is_neox else "gptj"
    rd = cos_sin_cache.shape[1]
    if positions.dim() == 1:
        tilejit.rope(q, k, positions, cos_sin_cache, style=style, rotary_dim=rd)
    else:
        _need(mrope_section is not None, "multimodal_rotary_embedding_cpu: positions has shape "
              f"{tuple(positions.shape)} and mrope_section=None; allowed: a section list "
              "with 2-D positions")
        tilejit.rope(q, k, positions, cos_sin_cache, style=style, rotary_dim=rd,
                     mrope_section=[int(s) for s in mrope_section],
                     mrope_interleaved=bool(mrope_interleaved))
    return query, key


def apply_multidimensional_rope_cpu(query, key, cos, sin):
    """sgl-kernel ``apply_multidimensional_rope_cpu(query, key, cos, sin) ->
    (query, key)`` (Gemma vision, 2-D RoPE): query / key [T, H, D] in place;
    cos / sin [T, D] per token. The head splits into 2 chunks of D/2, chunk
    c rotated (neox) by its own table ``cos[:, c*D/2 : (c+1)*D/2]``.

    Difference: a chunk's table must repeat each frequency in its two
    halves (``cat(freqs, freqs)``, as HF's Gemma4VisionRotaryEmbedding
    builds it), because tilejit reads one cos / sin per rotation pair; a
    table whose halves differ is an Error (checked on every call). Key may
    have another head count than query."""
    q = _tensor("query", query)
    k = _tensor("key", key)
    _need(q.dim() == 3 and k.dim() == 3, f"apply_multidimensional_rope_cpu: query "
          f"{tuple(q.shape)}, key {tuple(k.shape)}; allowed: [T, H, D] each")
    t, _, d = q.shape
    _need(d % 4 == 0, f"apply_multidimensional_rope_cpu: head_dim={d}; allowed: a multiple "
          "of 4 (two chunks of even width)")
    for name, x in (("cos", cos), ("sin", sin)):
        _tensor(name, x)
        _need(tuple(x.shape) == (t, d), f"apply_multidimensional_rope_cpu: {name} has shape "
              f"{tuple(x.shape)}; allowed: [T, D] = [{t}, {d}]")
    c, h = d // 2, d // 4
    # One cache row per (chunk, token): cos of the chunk's first half, then sin.
    cs = torch.empty((2, t, c), dtype=torch.float32)
    for ch in range(2):
        for half, src, name in ((0, cos, "cos"), (1, sin, "sin")):
            part = src[:, ch * c:(ch + 1) * c]
            _need(torch.equal(part[:, :h], part[:, h:]),
                  f"apply_multidimensional_rope_cpu: {name}[:, {ch * c}:{(ch + 1) * c}] does "
                  f"not repeat its first half ({h} values) in its second; allowed: the "
                  "cat(freqs, freqs) tables of a rotary embedding")
            cs[ch, :, half * h:(half + 1) * h] = part[:, :h]
    pos = torch.arange(2 * t, dtype=torch.int32).view(2, t)
    tilejit.rope(q, k, pos, cs.view(2 * t, c), style="neox", rotary_dim=d, ndim=2)
    return query, key


# ---- Attention ------------------------------------------------------------------

def _sinks(sinks):
    return None if sinks is None else sinks.to(torch.float32).contiguous()


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q=None,
                           max_seqlen_k=None, causal=False, sm_scale=None, logit_cap=0.0,
                           sliding_window_size=-1, sinks=None):
    """sgl-kernel ``flash_attn_varlen_func(q, k, v, cu_seqlens_q,
    cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal[, sm_scale])``:
    q [Tq, Hq, D], k [Tk, Hkv, D], v [Tk, Hkv, Dv] bf16, cu_seqlens int32
    [B+1]; returns out [Tq, Hq, Dv] bf16. Causal is bottom-right aligned
    (query i of a sequence with Tq queries and Tk keys sees keys
    j <= Tk - Tq + i, FlashAttention 2.1+). max_seqlen_q / max_seqlen_k have
    no meaning here (ignored). Extras: logit_cap (softcap), sliding_window_size
    (window left), sinks [Hq]. Any even head size up to 576 (sgl-kernel: a fixed
    list)."""
    return tilejit.flash_attn_varlen(q, k, v, _i32("cu_seqlens_q", cu_seqlens_q),
                                     _i32("cu_seqlens_k", cu_seqlens_k), causal=causal,
                                     sm_scale=sm_scale, softcap=float(logit_cap),
                                     window_left=int(sliding_window_size), sinks=_sinks(sinks))


def _paged(arg, buf):
    """sglang's token-granular buffer [num_slots, Hkv, D] as a paged cache of
    block size 1: [num_slots, 1, Hkv, D] (a view)."""
    _tensor(arg, buf)
    _need(buf.dim() == 3, f"{arg} has shape {tuple(buf.shape)}; allowed: [num_slots, Hkv, D]")
    return buf.unsqueeze(1)


def _block_table(req_to_token, req_pool_indices, seq_lens):
    """The block table of block size 1: req_to_token's rows of the batch,
    cut at the longest sequence, as int32."""
    _tensor("req_to_token", req_to_token)
    _tensor("req_pool_indices", req_pool_indices)
    _need(req_to_token.dim() == 2, f"req_to_token has shape {tuple(req_to_token.shape)}; "
          "allowed: [max_num_reqs, max_context_len]")
    longest = int(seq_lens.max()) if seq_lens.numel() else 0
    _need(longest <= req_to_token.shape[1], f"seq_lens has {longest}; allowed: <= "
          f"req_to_token.shape[1] = {req_to_token.shape[1]}")
    idx = req_pool_indices.to(torch.int64)
    if idx.numel():
        lo, hi = int(idx.min()), int(idx.max())
        _need(lo >= 0 and hi < req_to_token.shape[0], f"req_pool_indices has {lo}..{hi}; "
              f"allowed: [0, {req_to_token.shape[0]})")
    return req_to_token[idx, :max(longest, 1)].to(torch.int32)


def decode_attention_cpu(query, k_cache, v_cache, output, key, value, loc, attn_logits,
                         req_to_token, req_pool_indices, seq_lens, sm_scale, logit_cap=0.0,
                         sliding_window_size=-1, sinks=None, k_scale=1.0, v_scale=1.0):
    """sgl-kernel ``decode_attention_cpu``: writes the new tokens' key /
    value [B, Hkv, D / Dv] into k_cache / v_cache [num_slots, Hkv, D / Dv]
    at slots ``loc`` [B], then attends each query [B, Hq, D] to its
    sequence's keys ``req_to_token[req_pool_indices[b], :seq_lens[b]]``
    (seq_lens counts the new token) into output [B, Hq, Dv] bf16.

    Scores ``logit_cap * tanh(q.k * sm_scale / logit_cap)`` when
    logit_cap > 0. ``sliding_window_size`` >= 0 keeps keys
    j >= seq_len - 1 - sliding_window_size (sglang's window-left
    convention); ``sinks`` [Hq] (GPT-OSS) joins the softmax denominator.
    fp8 caches: uint8 e4m3 codes with ``k_scale`` / ``v_scale``.
    ``attn_logits`` (sgl-kernel's split-KV scratch) has no meaning here and is
    not touched. Any even head size up to 576 (tilejit::Limits), any GQA ratio."""
    kc, vc = _paged("k_cache", k_cache), _paged("v_cache", v_cache)
    # sglang passes the layer's k_scale / v_scale, None for a bf16 cache.
    k_scale = 1.0 if k_scale is None else k_scale
    v_scale = 1.0 if v_scale is None else v_scale
    tilejit.store_kv(key, value, kc, vc, _tensor("loc", loc), k_scale=k_scale, v_scale=v_scale)
    bt = _block_table(req_to_token, req_pool_indices, _tensor("seq_lens", seq_lens))
    tilejit.decode_attention(query, kc, vc, bt, _i32("seq_lens", seq_lens), out=output,
                             sm_scale=sm_scale, softcap=float(logit_cap),
                             window_left=int(sliding_window_size), sinks=_sinks(sinks),
                             k_scale=k_scale, v_scale=v_scale)


def _extend_tree_mask(custom_mask, extend_lens, seq_lens):
    """sglang's custom_mask ([sum_b n_b * seq_len_b], row-major per request:
    new token i against every key of the sequence) as tilejit's tree_mask
    ([sum_b n_b^2], new tokens against new tokens). The prefix columns must
    be all visible (tilejit's tree mask covers the new tokens only)."""
    m = custom_mask.reshape(-1)
    want = sum(n * s for n, s in zip(extend_lens.tolist(), seq_lens.tolist()))
    _need(want == m.numel(), f"extend_attention_cpu: custom_mask has {m.numel()} elements; "
          f"allowed: sum of extend_seq_lens * seq_lens = {want}")
    out, at = [], 0
    for n, s in zip(extend_lens.tolist(), seq_lens.tolist()):
        block = m[at:at + n * s].reshape(n, s)
        at += n * s
        _need(bool(block[:, :s - n].all()), "extend_attention_cpu: custom_mask hides a prefix "
              "key; allowed: masks over the new tokens only (the prefix visible to all)")
        out.append(block[:, s - n:].reshape(-1))
    return torch.cat(out).to(torch.uint8) if out else torch.zeros(0, dtype=torch.uint8)


def extend_attention_cpu(q_extend, k_extend, v_extend, o_extend, k_buffer, v_buffer,
                         req_to_token, req_pool_indices, seq_lens, extend_seq_lens,
                         extend_start_loc, max_len_extend, sm_scale, logit_cap=0.0,
                         sliding_window_size=-1, sinks=None, custom_mask=None, tree_mask=None):
    """sgl-kernel ``extend_attention_cpu``: request b's new tokens
    q_extend[extend_start_loc[b] : + extend_seq_lens[b]] (positions
    prefix_len + i, prefix_len = seq_lens[b] - extend_seq_lens[b]) attend to
    the prefix keys in k_buffer / v_buffer [num_slots, Hkv, D / Dv] at
    ``req_to_token[req_pool_indices[b], :prefix_len]`` and causally to the
    new tokens' own k_extend / v_extend; into o_extend [T, Hq, Dv] bf16.

    extend_start_loc must be the running sum of extend_seq_lens (an Error
    otherwise). ``max_len_extend`` has no meaning here (ignored).
    ``custom_mask`` (speculative decoding, sglang's layout: per request
    [n_b, seq_len_b] row-major, flattened) replaces the causal rule among
    the new tokens; its prefix columns must all be set. ``tree_mask``
    instead takes tilejit's layout directly (uint8 [sum_b n_b^2], new token
    i against new token j per request); not both. logit_cap,
    sliding_window_size and sinks as in :func:`decode_attention_cpu`."""
    _need(custom_mask is None or tree_mask is None,
          "extend_attention_cpu: custom_mask and tree_mask both given; allowed: one")
    lens = _i32("extend_seq_lens", extend_seq_lens)
    start = _i32("extend_start_loc", extend_start_loc)
    sl = _i32("seq_lens", seq_lens)
    indptr = torch.zeros(lens.numel() + 1, dtype=torch.int32)
    torch.cumsum(lens, 0, out=indptr[1:])
    _need(torch.equal(indptr[:-1], start), f"extend_start_loc={start.tolist()}; allowed: the "
          f"running sum of extend_seq_lens = {indptr[:-1].tolist()}")
    prefix = sl - lens
    _need(bool((prefix >= 0).all()), f"seq_lens={sl.tolist()} < extend_seq_lens="
          f"{lens.tolist()}; allowed: seq_lens >= extend_seq_lens")
    bt = _block_table(req_to_token, req_pool_indices, sl)
    tm = tree_mask if custom_mask is None else _extend_tree_mask(custom_mask, lens, sl)
    tilejit.extend_attention(q_extend, _paged("k_buffer", k_buffer),
                             _paged("v_buffer", v_buffer), indptr, bt, prefix, out=o_extend,
                             sm_scale=sm_scale, softcap=float(logit_cap),
                             window_left=int(sliding_window_size), sinks=_sinks(sinks),
                             k_new=k_extend, v_new=v_extend, tree_mask=tm)
