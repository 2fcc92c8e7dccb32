"""sgl-kernel's fused_experts_cpu on tilejit.fused_experts: its four schema
versions (A-D), the experts packed at first use on a PackedWeight, static
activation scales."""

import operator

import torch

import tilejit

from ._common import _MISSING, _bind, _core, _flag, _i32, _is_bool, _is_int, _need, _no_f16, \
    _opt_tensor, _real, _shown, _tensor
from .packed_weight import PackedWeight


def _expert_pack(w, proj, arg, use_int8, use_fp8, scale, block_size, quant):
    """The PackedExperts of w1 / w2 for this call (cached on a PackedWeight).
    quant names the argument that chose int8 / fp8 as the call spelled it
    (use_int8_w8a8=True or moe_comp_method=1 (INT8_W8A8), ...)."""
    if isinstance(w, tilejit.PackedExperts):
        return w
    holder = w if isinstance(w, PackedWeight) else None
    t = holder.weight if holder is not None else _tensor(arg, w, "fused_experts_cpu")
    # E >= 1: the int8 scales are reshaped to [E, -1] below, a torch error for E = 0.
    _need(t.dim() == 3 and t.shape[0] >= 1, f"fused_experts_cpu: {arg} has shape "
          f"{tuple(t.shape)}; allowed: [E, 2I, H] (w1) / [E, H, I] (w2), E >= 1")
    e, n = t.shape[0], t.shape[1]
    # Each quantized branch checks the weight's dtype and its scale apart, so
    # that the message names only what is wrong (one message for both named
    # the weight's dtype when only the scale was missing).
    if use_int8:
        _need(t.dtype == torch.int8, f"fused_experts_cpu: {arg}.dtype={t.dtype} with {quant}; "
              "allowed: torch.int8")
        allowed = (f"a float32 tensor of E·N = {e * n} values ([E, N] = [{e}, {n}] or [E, N, 1]:"
                   f" per-channel scales of {arg}) or of E = {e} (one per expert)")
        _need(scale is not None, f"fused_experts_cpu: {arg}_scale=None with {quant}; allowed: "
              f"{allowed}")
        # What the reshape to [E, -1] and tilejit's per-expert check ([N] or [1]) take.
        _need(scale.numel() in (e * n, e), f"fused_experts_cpu: {arg}_scale has shape "
              f"{tuple(scale.shape)} with {quant}; allowed: {allowed}")
        key = ("int8", proj)

        def make(t):
            s = scale.to(torch.float32).reshape(t.shape[0], -1)
            return tilejit.pack_experts_int8([(t[e], s[e]) for e in range(t.shape[0])], proj=proj)
    elif use_fp8:
        _need(t.dtype == torch.uint8, f"fused_experts_cpu: {arg}.dtype={t.dtype} with {quant}; "
              "allowed: torch.uint8 e4m3 codes (torch 1.13 has no float8: pass "
              "weight.view(torch.uint8))")
        ok = block_size is None or (
            isinstance(block_size, (list, tuple, torch.Size)) and len(block_size) == 2
            and all(_is_int(v) and operator.index(v) > 0 for v in block_size))
        _need(ok, f"fused_experts_cpu: block_size={block_size!r} with {quant}; allowed: None "
              "(per-channel scales) or two positive ints [block_n, block_k]")
        bn, bk = (0, 0) if block_size is None else (operator.index(v) for v in block_size)
        allowed = (f"a float32 tensor [E, N] = [{e}, {n}] with block_size=None, or "
                   f"[E, ceil(N / block_n), ceil(K / block_k)] with a block_size (scales of "
                   f"{arg})")
        _need(scale is not None, f"fused_experts_cpu: {arg}_scale=None with {quant}; allowed: "
              f"{allowed}")
        # One row per expert (scale[e] below; the rest of the shape is tilejit's check).
        _need(scale.dim() >= 1 and scale.shape[0] == e, f"fused_experts_cpu: {arg}_scale has "
              f"shape {tuple(scale.shape)} with {arg} of {e} experts; allowed: {allowed}")
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
    def packed(t):
        return _core("fused_experts_cpu", f"packing {arg} with {arg}_scale", make, t)
    if holder is None:
        return packed(t)
    return holder.experts(key, scale if (use_int8 or use_fp8) else None, packed)


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


# The argument lists after (hidden_states, w1, w2, topk_weights, topk_ids, inplace)
# of the sgl-kernel schema versions (torch_extension_cpu.cpp over 2025).
_FE_A = ("use_int8_w8a8", "use_fp8_w8a16", "w1_scale", "w2_scale", "block_size", "a1_scale",
         "a2_scale", "is_vnni")
_FE_B = ("use_int8_w8a8", "use_fp8_w8a16", "w1_scale", "w2_scale", "block_size", "a1_scale",
         "a2_scale", "w1_bias", "w2_bias", "alpha", "limit", "is_vnni")
_FE_C = ("moe_comp_method", "w1_scale", "w2_scale", "w1_zero", "w2_zero", "block_size",
         "is_vnni")
_FE_D = ("moe_comp_method", "w1_scale", "w2_scale", "w1_zero", "w2_zero", "block_size",
         "w1_bias", "w2_bias", "alpha", "limit", "is_vnni", "activation")
_FE_DEFAULTS = dict(use_int8_w8a8=False, use_fp8_w8a16=False, moe_comp_method=0,
                    w1_scale=None, w2_scale=None, w1_zero=None, w2_zero=None, block_size=None,
                    a1_scale=None, a2_scale=None, w1_bias=None, w2_bias=None, alpha=None,
                    limit=None, is_vnni=True, activation=None)
# sglang's CPUQuantMethod (python/sglang/srt/layers/amx_utils.py).
_MOE_METHODS = {0: "UNQUANT", 1: "INT8_W8A8", 2: "FP8_W8A16", 3: "INT4_W4A8", 4: "MXFP4"}
# fused_experts_cpu's activation strings -> tilejit.fused_experts' act names.
_MOE_ACTS = {None: "silu", "silu": "silu", "gelu": "gelu_erf", "gelu_tanh": "gelu_tanh"}


def _fe_schema(args, kwargs):
    """Which sgl-kernel schema a fused_experts_cpu call is written against,
    from the 7th positional argument's type (or the keywords): a bool is
    use_int8_w8a8 (A / B), an int that is not a bool moe_comp_method (C / D)."""
    first = args[0] if args else _MISSING
    if "moe_comp_method" in kwargs or _is_int(first):
        # C ends with is_vnni (a bool) at its 7th extra argument, where D has w1_bias.
        return _FE_C if len(args) >= 7 and _is_bool(args[6]) else _FE_D
    _need(first is _MISSING or _is_bool(first), "fused_experts_cpu: the argument after "
          f"inplace is a {type(first).__name__} ({first!r}); allowed: a bool (use_int8_w8a8) "
          "or an int (moe_comp_method, sglang's CPUQuantMethod)")
    # A ends with is_vnni (a bool) at its 8th extra argument, where B has w1_bias.
    return _FE_A if len(args) >= 8 and _is_bool(args[7]) else _FE_B


def fused_experts_cpu(hidden_states, w1, w2, topk_weights, topk_ids, inplace=False, *args,
                      **kwargs):
    """sgl-kernel ``fused_experts_cpu``: ``out[t] = sum_j topk_weights[t, j] *
    w2[e] @ (act(gate) * up)`` with ``gate, up = halves of w1[e] @ x[t]``,
    ``e = topk_ids[t, j]``; returns out [T, H] bf16 (hidden_states itself
    when ``inplace``).

    The arguments after ``inplace`` follow one of sgl-kernel's schema
    versions, told apart by the 7th argument's type (a bool is
    ``use_int8_w8a8``, an int that is not a bool, e.g. sglang's
    ``CPUQuantMethod``, is ``moe_comp_method``) and by the type at the
    schema's last place:

    - A (14 args): ``use_int8_w8a8, use_fp8_w8a16, w1_scale, w2_scale,
      block_size, a1_scale, a2_scale, is_vnni`` (bool 14th).
    - B (18 args): A with ``w1_bias, w2_bias, alpha, limit`` before is_vnni.
    - C (13 args): ``moe_comp_method, w1_scale, w2_scale, w1_zero, w2_zero,
      block_size, is_vnni`` (bool 13th).
    - D (17 / 18 args): C with ``w1_bias, w2_bias, alpha, limit`` before
      is_vnni and ``activation`` (str or None) after it.

    Keyword calls take either family's names (``moe_comp_method=`` or
    ``use_int8_w8a8=``); names of another schema than the one chosen are an
    Error. moe_comp_method: 0 bf16, 1 int8 W8A8, 2 fp8 W8A16 (as the flags
    below); 3 (INT4_W4A8) and 4 (MXFP4) need w1 / w2 as
    ``tilejit.PackedExperts`` from ``tilejit.pack_experts_int4`` /
    ``pack_experts_mxfp4`` (sgl-kernel's own prepacked int4 / mxfp4
    tensors cannot be read here; raw tensors are an Error), run with
    ``int4_route="w4a8"`` for 3; their scales / zeros are inside the
    packing, so w1_scale / w2_scale / w1_zero / w2_zero must be None.
    w1_zero / w2_zero must be None for 0-2. ``activation``: None or "silu"
    (SiLU), "gelu" (erf GELU, as sgl-kernel's gelu_and_mul), "gelu_tanh";
    anything else is an Error.

    w1 [E, 2I, H] (the I gate rows, then the I up rows), w2 [E, H, I]: from
    :func:`convert_weight_packed` (packed once, at the first call) or plain
    tensors (``is_vnni=False``: packed on every call, slow). topk_ids int32
    or int64 [T, k]; a negative id (sglang's padded tokens) contributes
    nothing (it is given weight 0 on expert 0, so a NaN / Inf in expert 0's
    output for that token would still show; sgl-kernel skips it).
    hidden_states must be bf16 (float16, which sgl-kernel takes, is an Error).

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
    - Other formats (int4 with the A / B schemas too): pass
      ``tilejit.PackedExperts`` objects as w1 / w2 directly.
    """
    op = "fused_experts_cpu"
    a = _bind(op, _fe_schema(args, kwargs), _FE_DEFAULTS, args, kwargs)
    _tensor("hidden_states", hidden_states, op)
    _tensor("topk_weights", topk_weights, op)
    for name in ("w1_scale", "w2_scale", "w1_zero", "w2_zero", "w1_bias", "w2_bias"):
        _opt_tensor(name, a.get(name), op)
    # Every schema's bools; is_vnni is not read (a packed weight is used as such), but
    # is_vnni="x" is as wrong as inplace="x".
    _flag(op, "inplace", inplace)
    _flag(op, "is_vnni", a["is_vnni"])
    int4_route, quant = None, None
    if "moe_comp_method" in a:
        m = a["moe_comp_method"]
        _need(_is_int(m), f"{op}: moe_comp_method={m!r}; allowed: an int 0-4 "
              "(sglang's CPUQuantMethod)")
        m = operator.index(m)
        _need(m in _MOE_METHODS, f"{op}: moe_comp_method={m}; allowed: " +
              ", ".join(f"{k} ({v})" for k, v in _MOE_METHODS.items()))
        use_int8, use_fp8 = m == 1, m == 2
        quant = f"moe_comp_method={m} ({_MOE_METHODS[m]})"
        a1_scale = a2_scale = None
        if m in (3, 4):
            want = "tilejit.pack_experts_int4" if m == 3 else "tilejit.pack_experts_mxfp4"
            for arg, w in (("w1", w1), ("w2", w2)):
                _need(isinstance(w, tilejit.PackedExperts), f"{op}: moe_comp_method={m} "
                      f"({_MOE_METHODS[m]}) with {arg} a {type(w).__name__}; allowed: a "
                      f"tilejit.PackedExperts from {want} (sgl-kernel's own prepacked "
                      f"{'int4' if m == 3 else 'mxfp4'} tensors cannot be read by tilejit)")
                ok = w.format.startswith("int4") if m == 3 else w.format == "mxfp4"
                _need(ok, f"{op}: moe_comp_method={m} ({_MOE_METHODS[m]}) with {arg} packed as "
                      f"{w.format}; allowed: experts from {want}")
            for name in ("w1_scale", "w2_scale", "w1_zero", "w2_zero"):
                _need(a.get(name) is None, f"{op}: {name} given with moe_comp_method={m}; allowed: "
                      "None (the scales and zeros are inside the tilejit.PackedExperts)")
            if m == 3:
                int4_route = "w4a8"
        else:
            for name in ("w1_zero", "w2_zero"):
                _need(a.get(name) is None, f"{op}: {name} given with moe_comp_method={m} "
                      f"({_MOE_METHODS[m]}); allowed: None (zero points belong to int4 weights)")
    else:
        use_int8 = _flag(op, "use_int8_w8a8", a["use_int8_w8a8"])
        use_fp8 = _flag(op, "use_fp8_w8a16", a["use_fp8_w8a16"])
        quant = "use_int8_w8a8=True" if use_int8 else "use_fp8_w8a16=True"
        a1_scale, a2_scale = a["a1_scale"], a["a2_scale"]
    act = a.get("activation")
    _need(act in _MOE_ACTS, f"{op}: activation={act!r}; allowed: None, " +
          ", ".join(repr(k) for k in _MOE_ACTS if k is not None))
    alpha, limit = a.get("alpha"), a.get("limit")
    clamped = alpha is not None or limit is not None
    # GPT-OSS's gemm1_alpha / gemm1_clamp_limit (Python floats); None: 1.702 / 7.0 when the
    # other is given. float() read "x" as a ValueError and True as 1.0; limit > 0 here too,
    # so that the message names limit alone.
    real = "a finite int or float"
    alpha = 1.702 if alpha is None else _real(op, "alpha", alpha, f"None or {real}")
    if limit is not None:
        limit = _real(op, "limit", limit, f"None or {real} > 0")
        _need(limit > 0, f"{op}: limit={_shown(a['limit'])}; allowed: None or {real} > 0")
    limit = 7.0 if limit is None else limit
    _need(not clamped or _MOE_ACTS[act] == "silu", f"{op}: alpha / limit (the clamped "
          f"SwiGLU) with activation={act!r}; allowed: activation None or 'silu' with them")
    _need(not (use_int8 and use_fp8),
          f"{op}: use_int8_w8a8 and use_fp8_w8a16 both set; allowed: one")
    aq = _static_act_scales(a1_scale, a2_scale, use_int8)
    _no_f16(op, hidden_states=hidden_states)
    _need(hidden_states.dtype == torch.bfloat16,
          f"{op}: hidden_states.dtype={hidden_states.dtype}; allowed: torch.bfloat16")
    bs = a["block_size"]
    w13 = _expert_pack(w1, "gate_up", "w1", use_int8, use_fp8, a["w1_scale"], bs, quant)
    w2p = _expert_pack(w2, "down", "w2", use_int8, use_fp8, a["w2_scale"], bs, quant)
    ids = _i32("topk_ids", topk_ids, op)
    weights = topk_weights.to(torch.float32)
    neg = ids < 0
    if bool(neg.any()):
        ids = torch.where(neg, torch.zeros_like(ids), ids)
        weights = torch.where(neg, torch.zeros_like(weights), weights)
    ids = ids.contiguous()
    weights = weights.contiguous()
    x = hidden_states if hidden_states.stride(-1) == 1 else hidden_states.contiguous()
    out = torch.empty_like(x)
    kw = dict(act=_MOE_ACTS[act])
    if clamped:
        kw.update(clamped_swiglu=True, swiglu_alpha=alpha, swiglu_limit=limit)
    if int4_route is not None:
        kw["int4_route"] = int4_route
    b13 = None if a.get("w1_bias") is None else a["w1_bias"].to(torch.float32).contiguous()
    b2 = None if a.get("w2_bias") is None else a["w2_bias"].to(torch.float32).contiguous()
    _core(op, "tilejit.fused_experts' hidden is hidden_states, w13 is w1, b13 / b2 are "
          "w1_bias / w2_bias", tilejit.fused_experts, x, w13, w2p, weights, ids, out=out,
          b13=b13, b2=b2, **kw, **aq)
    if inplace:
        hidden_states.copy_(out)
        return hidden_states
    return out
