"""sgl-kernel's MoE routers (topk.cpp): topk_softmax_cpu, topk_sigmoid_cpu,
grouped_topk_cpu, biased_grouped_topk_cpu on tilejit's top-k kernels."""

import operator

import torch

import tilejit

from ._common import _core, _flag, _int, _need, _real, _shown, _tensor


def _router_out(op, gating_output, topk, renormalize):
    """The empty (topk_weights, topk_ids) of a router call, its arguments
    checked first (every router's: gating_output, topk, renormalize)."""
    _router_dtype(op, "gating_output", gating_output)
    try:
        # int, numpy and 0-d torch integers; not True (an int to operator.index, read as 1).
        k = 0 if isinstance(topk, bool) else operator.index(topk)
    except TypeError:
        k = 0
    _need(k >= 1, f"{op}: topk={topk!r}; allowed: an integer >= 1")
    _flag(op, "renormalize", renormalize)
    _need(gating_output.dim() == 2,
          f"{op}: gating_output has shape {tuple(gating_output.shape)}; allowed: [T, E]")
    t = gating_output.shape[0]
    return (torch.empty((t, topk), dtype=torch.float32),
            torch.empty((t, topk), dtype=torch.int32))


# The _core note of the routers: the core's argument names in sgl-kernel's terms (k is
# topk; topk_weights / topk_ids are what the op returns, allocated here).
_NOTE = ("tilejit's logits are gating_output, its topk_weights / topk_ids [T, topk] the "
         "returned pair")


def _router_dtype(op, arg, t):
    """t, a router's float input (gating_output, correction_bias), or a
    tilejit.Error naming its dtype: float32 or bf16, what sglang's gate and
    e_score_correction_bias give and what the core reads. Anything else was
    converted to float32 here: an int32 tensor of logits (a caller's bug)
    routed as if it were scores, float64 rounded, float16 taken against
    the library's rule."""
    _tensor(arg, t, op)
    _need(t.dtype in (torch.float32, torch.bfloat16),
          f"{op}: {arg}.dtype={t.dtype}; allowed: torch.float32, torch.bfloat16")
    return t


def _non_padded(op, v):
    """num_token_non_padded as an int or None. sglang passes
    ForwardBatch.num_token_non_padded, a 0-d int32 tensor; int() read a float
    tensor 2.7 or a float 2.7 as 2, a str "2" as 2 and True as 1."""
    if v is None:
        return None
    allowed = "None, an int or a one-element integer tensor (the count of real tokens, >= 0)"
    if isinstance(v, torch.Tensor):
        ok = v.numel() == 1 and v.dtype in (torch.int32, torch.int64, torch.int16, torch.int8,
                                            torch.uint8)
        _need(ok, f"{op}: num_token_non_padded={_shown(v)}; allowed: {allowed}")
        return int(v.reshape(()).item())
    return _int(op, "num_token_non_padded", v, allowed)


def _mask_padded(op, w, ids, n):
    # sglang's _mask_topk_ids_padded_region: tokens past the real ones get id -1.
    if n is not None:
        # ids[n:] with n < 0 would mask only the last -n tokens (Python's
        # negative index), not sglang's "every token from n on".
        _need(n >= 0, f"{op}: num_token_non_padded={n}; allowed: >= 0 (the count of real tokens)")
        ids[n:] = -1
    return w, ids


def topk_softmax_cpu(hidden_states, gating_output, topk, renormalize):
    """sgl-kernel ``topk_softmax_cpu(hidden_states, gating_output, topk,
    renormalize) -> (topk_weights f32, topk_ids int32)``: softmax over the E
    experts, the topk best. hidden_states is unused (as in sgl-kernel: only
    its token count matters). Any E (sgl-kernel: a fixed list)."""
    op = "topk_softmax_cpu"
    w, ids = _router_out(op, gating_output, topk, renormalize)
    _core(op, _NOTE, tilejit.topk_softmax, gating_output, w, ids,
          renormalize=renormalize)
    return w, ids


def topk_sigmoid_cpu(hidden_states, gating_output, topk, renormalize):
    """sgl-kernel ``topk_sigmoid_cpu``: sigmoid per expert, the topk best,
    optionally renormalized. hidden_states is unused."""
    op = "topk_sigmoid_cpu"
    w, ids = _router_out(op, gating_output, topk, renormalize)
    _core(op, _NOTE, tilejit.topk_sigmoid, gating_output, w, ids,
          renormalize=renormalize)
    return w, ids


def _grouped(op, score, hidden_states, gating_output, correction_bias, topk, renormalize,
             num_expert_group, topk_group, num_fused_shared_experts, routed_scaling_factor,
             num_token_non_padded):
    # Every argument checked before any routing (num_expert_group / topk_group here too,
    # not by the core: it read True as 1).
    shared = _int(op, "num_fused_shared_experts", num_fused_shared_experts)
    _need(shared == 0,
          f"{op}: num_fused_shared_experts={shared}; allowed: 0 (pass the shared "
          "expert to tilejit.fused_experts as shared_w13 / shared_w2 instead)")
    groups = _int(op, "num_expert_group", num_expert_group)
    topk_group = _int(op, "topk_group", topk_group)
    n = _non_padded(op, num_token_non_padded)
    w, ids = _router_out(op, gating_output, topk, renormalize)
    bias = None if correction_bias is None else correction_bias.to(torch.float32).contiguous()
    _core(op, _NOTE, tilejit.grouped_topk, gating_output, w, ids, score=score,
          num_expert_group=groups, topk_group=topk_group, renormalize=renormalize,
          routed_scaling_factor=1.0, correction_bias=bias)
    return _mask_padded(op, w, ids, n)


def grouped_topk_cpu(hidden_states, gating_output, topk, renormalize, num_expert_group,
                     topk_group, num_fused_shared_experts=0, routed_scaling_factor=None,
                     num_token_non_padded=None):
    """sgl-kernel ``grouped_topk_cpu`` (DeepSeek-V2): softmax scores, a
    group's score its best expert, the topk_group best groups, the topk
    best experts in them. ``routed_scaling_factor`` must be None or 1.0 (an
    Error otherwise, as sgl-kernel's topk.cpp TORCH_CHECK: it is never
    applied to the weights); ``num_fused_shared_experts`` must be 0.
    num_token_non_padded: tokens from that index on get id -1 (sglang's
    rule; sgl-kernel refuses the argument). Any E, group count and k
    (sgl-kernel: fixed sizes)."""
    op = "grouped_topk_cpu"
    allowed = "None or 1.0 (as sgl-kernel: the weights are not scaled by this op)"
    _need(routed_scaling_factor is None
          or _real(op, "routed_scaling_factor", routed_scaling_factor, allowed) == 1.0,
          f"{op}: routed_scaling_factor={_shown(routed_scaling_factor)}; allowed: {allowed}")
    return _grouped(op, "softmax", hidden_states, gating_output, None, topk, renormalize,
                    num_expert_group, topk_group, num_fused_shared_experts,
                    routed_scaling_factor, num_token_non_padded)


def biased_grouped_topk_cpu(hidden_states, gating_output, correction_bias, topk, renormalize,
                            num_expert_group, topk_group, num_fused_shared_experts=0,
                            routed_scaling_factor=None, num_token_non_padded=None):
    """sgl-kernel ``biased_grouped_topk_cpu`` (DeepSeek-V3): sigmoid scores,
    selection on score + correction_bias, a group's score the sum of its
    two best biased scores; weights are the unbiased scores (renormalized
    if asked). ``routed_scaling_factor`` is accepted and not applied, as
    sgl-kernel's topk.cpp (sglang uses it only to weight fused shared
    experts, which are refused: ``num_fused_shared_experts`` must be 0).
    Otherwise as :func:`grouped_topk_cpu`."""
    op = "biased_grouped_topk_cpu"
    _router_dtype(op, "correction_bias", correction_bias)
    # Not applied, but read: a str or NaN there is a caller's bug all the same.
    if routed_scaling_factor is not None:
        _real(op, "routed_scaling_factor", routed_scaling_factor,
              "None or a finite int or float (accepted and not applied, as sgl-kernel)")
    return _grouped(op, "sigmoid", hidden_states, gating_output, correction_bias, topk,
                    renormalize, num_expert_group, topk_group, num_fused_shared_experts,
                    routed_scaling_factor, num_token_non_padded)
