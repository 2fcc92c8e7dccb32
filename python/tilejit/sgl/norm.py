"""sgl-kernel's norm and gated-activation ops on tilejit.rms_norm,
fused_add_rms_norm and act_and_mul: rmsnorm_cpu, l2norm_cpu,
fused_add_rmsnorm_cpu, silu_and_mul_cpu, gelu_tanh_and_mul_cpu,
gelu_and_mul_cpu. Shapes sgl-kernel refuses run here: any rank from 1 to 4
([..., hidden]), any strides on the leading dims (padded rows, a per-head
view of a fused qkv output; the last dim contiguous), a weight of another
dtype than the input (f32 with bf16 input)."""

import tilejit

from ._common import _core, _no_f16, _real, _tensor

_NORM_NOTE = "tilejit's x is input"


def _eps(op, eps):
    # A float or int, finite; > 0 is the core's rule (its Error says so).
    return _real(op, "eps", eps)


def rmsnorm_cpu(input, weight, eps):
    """sgl-kernel ``rmsnorm_cpu(input, weight, eps) -> Tensor``: each row
    times 1 / sqrt(mean(row^2) + eps) times weight, in a new tensor of
    input's dtype. The squares are summed in double and eps must be > 0
    (sgl-kernel: f32 sums, any eps)."""
    op = "rmsnorm_cpu"
    _tensor("input", input, op)
    _tensor("weight", weight, op)
    _no_f16(op, input=input, weight=weight)
    return _core(op, _NORM_NOTE, tilejit.rms_norm, input, weight, eps=_eps(op, eps))


def l2norm_cpu(input, eps):
    """sgl-kernel ``l2norm_cpu(input, eps) -> Tensor`` (Llama-4's q / k
    norm): rmsnorm_cpu without a weight."""
    op = "l2norm_cpu"
    _tensor("input", input, op)
    _no_f16(op, input=input)
    return _core(op, _NORM_NOTE, tilejit.rms_norm, input, None, eps=_eps(op, eps))


def fused_add_rmsnorm_cpu(input, residual, weight, eps):
    """sgl-kernel ``fused_add_rmsnorm_cpu(input, residual, weight, eps) ->
    ()``: residual += input, then input = rmsnorm(residual), both in place.
    Difference: the residual as stored (rounded to its dtype) is what is
    normalised, as the model's reference computes it; sgl-kernel normalises
    the f32 sum before rounding (within one bf16 rounding of each other).
    residual may be f32 with bf16 input (sgl-kernel: the same dtype)."""
    op = "fused_add_rmsnorm_cpu"
    _tensor("input", input, op)
    _tensor("residual", residual, op)
    _tensor("weight", weight, op)
    _no_f16(op, input=input, residual=residual, weight=weight)
    _core(op, _NORM_NOTE, tilejit.fused_add_rms_norm, input, residual, weight, out=input,
          eps=_eps(op, eps))


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
