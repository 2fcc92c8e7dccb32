"""sgl-kernel's norm and gated-activation ops on tilejit's row-wise ops:
rmsnorm_cpu, gemma_rmsnorm_cpu, gemma3_rmsnorm_cpu, l2norm_cpu,
fused_add_rmsnorm_cpu, gemma_fused_add_rmsnorm_cpu,
fused_qk_gemma_rmsnorm_cpu, layernorm_cpu, fused_add_layernorm_cpu,
fused_rmsnorm_gated_cpu, silu_and_mul_cpu, gelu_tanh_and_mul_cpu,
gelu_and_mul_cpu. Shapes sgl-kernel refuses run here: any rank from 1 to 4
([..., hidden]), any strides on the leading dims (padded rows, a per-head
view of a fused qkv output; the last dim contiguous), a weight of another
dtype than the input (f32 with bf16 input)."""

import tilejit

import torch

from ._common import _bind, _core, _int, _need, _no_f16, _opt_tensor, _real, _tensor

_NORM_NOTE = "tilejit's x is input"


def _eps(op, eps):
    # A float or int, finite; > 0 is the core's rule (its Error says so).
    return _real(op, "eps", eps)


def _rms(op, input, weight, eps, plus_one=False, has_weight=True):
    """tilejit.rms_norm into a new tensor for the sgl op (l2norm: no weight)."""
    _tensor("input", input, op)
    if has_weight:
        _tensor("weight", weight, op)
    _no_f16(op, input=input, weight=weight)
    return _core(op, _NORM_NOTE, tilejit.rms_norm, input, weight, eps=_eps(op, eps),
                 weight_plus_one=plus_one)


def _fused_add_rms(op, input, residual, weight, eps, plus_one=False):
    """tilejit.fused_add_rms_norm in place on input and residual."""
    _tensor("input", input, op)
    _tensor("residual", residual, op)
    _tensor("weight", weight, op)
    _no_f16(op, input=input, residual=residual, weight=weight)
    _core(op, _NORM_NOTE, tilejit.fused_add_rms_norm, input, residual, weight, out=input,
          eps=_eps(op, eps), weight_plus_one=plus_one)


def rmsnorm_cpu(input, weight, eps):
    """sgl-kernel ``rmsnorm_cpu(input, weight, eps) -> Tensor``: each row
    times 1 / sqrt(mean(row^2) + eps) times weight, in a new tensor of
    input's dtype. The squares are summed in double and eps must be > 0
    (sgl-kernel: f32 sums, any eps)."""
    return _rms("rmsnorm_cpu", input, weight, eps)


def l2norm_cpu(input, eps):
    """sgl-kernel ``l2norm_cpu(input, eps) -> Tensor`` (Llama-4's q / k
    norm): rmsnorm_cpu without a weight."""
    return _rms("l2norm_cpu", input, None, eps, has_weight=False)


def fused_add_rmsnorm_cpu(input, residual, weight, eps):
    """sgl-kernel ``fused_add_rmsnorm_cpu(input, residual, weight, eps) ->
    ()``: residual += input, then input = rmsnorm(residual), both in place.
    Difference: the residual as stored (rounded to its dtype) is what is
    normalised, as the model's reference computes it; sgl-kernel normalises
    the f32 sum before rounding (within one bf16 rounding of each other).
    residual may be f32 with bf16 input (sgl-kernel: the same dtype)."""
    _fused_add_rms("fused_add_rmsnorm_cpu", input, residual, weight, eps)


def gemma_rmsnorm_cpu(input, weight, eps):
    """sgl-kernel ``gemma_rmsnorm_cpu(input, weight, eps) -> Tensor``:
    rmsnorm_cpu with the weight applied as (1 + weight), in f32."""
    return _rms("gemma_rmsnorm_cpu", input, weight, eps, plus_one=True)


def gemma3_rmsnorm_cpu(input, weight, eps):
    """sgl-kernel ``gemma3_rmsnorm_cpu(input, weight, eps) -> Tensor``:
    Gemma 3's form, x * rstd * (1 + weight) all in f32 and rounded once,
    which is what gemma_rmsnorm_cpu computes here too."""
    return _rms("gemma3_rmsnorm_cpu", input, weight, eps, plus_one=True)


def gemma_fused_add_rmsnorm_cpu(input, residual, weight, eps):
    """sgl-kernel ``gemma_fused_add_rmsnorm_cpu(input, residual, weight,
    eps) -> ()``: fused_add_rmsnorm_cpu with (1 + weight)."""
    _fused_add_rms("gemma_fused_add_rmsnorm_cpu", input, residual, weight, eps, plus_one=True)


def fused_qk_gemma_rmsnorm_cpu(q, k, q_weight, k_weight, eps, head_dim):
    """sgl-kernel ``fused_qk_gemma_rmsnorm_cpu(q, k, q_weight, k_weight, eps,
    head_dim) -> (Tensor, Tensor)``: Gemma's RMSNorm over each head_dim
    slice of q [T, Hq*head_dim] and k [T, Hk*head_dim] (rows may be padded),
    into new tensors. One rms_norm per operand over its [T, H, head_dim]
    view."""
    op = "fused_qk_gemma_rmsnorm_cpu"
    for arg, t in (("q", q), ("k", k), ("q_weight", q_weight), ("k_weight", k_weight)):
        _tensor(arg, t, op)
    _no_f16(op, q=q, k=k, q_weight=q_weight, k_weight=k_weight)
    d = _int(op, "head_dim", head_dim, "an int >= 1")
    e = _eps(op, eps)
    outs = []
    for arg, t, w in (("q", q, q_weight), ("k", k, k_weight)):
        _need(d >= 1 and t.dim() == 2 and t.shape[1] % d == 0,
              f"{op}: {arg} has shape {list(t.shape)} with head_dim={head_dim}; allowed: "
              "[T, H*head_dim], head_dim >= 1")
        heads = t.shape[1] // d
        out = torch.empty((t.shape[0], t.shape[1]), dtype=t.dtype)
        view = t.as_strided((t.shape[0], heads, d), (t.stride(0), d * t.stride(1), t.stride(1)))
        _core(op, f"tilejit's x is {arg}", tilejit.rms_norm, view, w,
              out=out.view(t.shape[0], heads, d), eps=e, weight_plus_one=True)
        outs.append(out)
    return outs[0], outs[1]


_LN_FORMS = {
    # The current schema returns the output; the first one (no bias) wrote
    # it over input and returned nothing.
    "new": ("bias", "eps"),
    "old": ("eps",),
}


def _ln_form(op, args, kwargs):
    """(form, bound arguments) of a layernorm call: the old form has one
    argument after the fixed ones, a number (eps)."""
    old = "bias" not in kwargs and len(args) + len(kwargs) == 1 and (
        "eps" in kwargs or not (args[0] is None or isinstance(args[0], torch.Tensor)))
    form = "old" if old else "new"
    return form, _bind(op, _LN_FORMS[form], {}, args, kwargs)


def layernorm_cpu(input, weight, *args, **kwargs):
    """sgl-kernel ``layernorm_cpu(input, weight, bias, eps) -> Tensor``
    (bias may be None): (x - mean) * rstd * weight + bias per row, into a
    new tensor; the first schema ``layernorm_cpu(input, weight, eps) -> ()``
    wrote it over input. The population variance; eps must be > 0."""
    op = "layernorm_cpu"
    form, a = _ln_form(op, args, kwargs)
    _tensor("input", input, op)
    _tensor("weight", weight, op)
    bias = _opt_tensor("bias", a.get("bias"), op)
    _no_f16(op, input=input, weight=weight, bias=bias)
    e = _eps(op, a["eps"])
    if form == "old":
        _core(op, _NORM_NOTE, tilejit.layer_norm, input, weight, None, out=input, eps=e)
        return None
    return _core(op, _NORM_NOTE, tilejit.layer_norm, input, weight, bias, eps=e)


def fused_add_layernorm_cpu(input, residual, weight, *args, **kwargs):
    """sgl-kernel ``fused_add_layernorm_cpu(input, residual, weight, bias,
    eps) -> Tensor``: residual += input in place, then the layer norm of it
    into a new tensor; the first schema (no bias, -> ()) wrote it over
    input. As fused_add_rmsnorm_cpu, the stored residual is what is
    normalised (sgl-kernel: the f32 sum before rounding)."""
    op = "fused_add_layernorm_cpu"
    form, a = _ln_form(op, args, kwargs)
    _tensor("input", input, op)
    _tensor("residual", residual, op)
    _tensor("weight", weight, op)
    bias = _opt_tensor("bias", a.get("bias"), op)
    _no_f16(op, input=input, residual=residual, weight=weight, bias=bias)
    e = _eps(op, a["eps"])
    out = input if form == "old" else torch.empty_like(input, memory_format=torch.contiguous_format)
    _core(op, _NORM_NOTE, tilejit.fused_add_layer_norm, input, residual, weight, bias, out=out,
          eps=e)
    return None if form == "old" else out


def fused_rmsnorm_gated_cpu(input, weight, gate, eps):
    """sgl-kernel ``fused_rmsnorm_gated_cpu(input, weight, gate, eps) ->
    Tensor`` (Qwen3-Next's gated delta net output norm): rmsnorm(input) *
    weight * silu(gate), into a new tensor, all in f32 and rounded once
    (sgl-kernel rounds the normalised value to input's dtype before the
    weight). The core's tilejit.rms_norm_gated takes other activations and
    the gate-first order (Mamba-2) too."""
    op = "fused_rmsnorm_gated_cpu"
    _tensor("input", input, op)
    _tensor("weight", weight, op)
    _tensor("gate", gate, op)
    _no_f16(op, input=input, weight=weight, gate=gate)
    return _core(op, _NORM_NOTE, tilejit.rms_norm_gated, input, gate, weight, eps=_eps(op, eps))


def _act_and_mul(op, input, act):
    _tensor("input", input, op)
    _no_f16(op, input=input)
    return _core(op, "tilejit's x is input", tilejit.act_and_mul, input, act=act)


def silu_and_mul_cpu(input):
    """sgl-kernel ``silu_and_mul_cpu(input) -> Tensor``: silu(input[..., :d])
    * input[..., d:], in a new [..., d] tensor of input's dtype."""
    return _act_and_mul("silu_and_mul_cpu", input, "silu")


def gelu_tanh_and_mul_cpu(input):
    """sgl-kernel ``gelu_tanh_and_mul_cpu(input) -> Tensor``: the tanh
    approximation of gelu, as silu_and_mul_cpu."""
    return _act_and_mul("gelu_tanh_and_mul_cpu", input, "gelu_tanh")


def gelu_and_mul_cpu(input):
    """sgl-kernel ``gelu_and_mul_cpu(input) -> Tensor``: the erf gelu, as
    silu_and_mul_cpu."""
    return _act_and_mul("gelu_and_mul_cpu", input, "gelu_erf")
