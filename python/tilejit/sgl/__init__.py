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
- A bad argument raises ``tilejit.Error`` starting with the op's name, naming
  the argument, the value and what is allowed (sgl-kernel raises
  RuntimeError from TORCH_CHECK). Errors raised inside the tilejit core carry
  the op's name and a note mapping the core's argument names to sgl-kernel's
  (e.g. ``slot_mapping`` is ``loc``). Bool arguments (``is_neox``,
  ``inplace``, ``is_vnni``, ``renormalize``, ``causal``, ...) take a Python
  bool only, as sglang passes them: not a str, an int or None. Number
  arguments (``logit_cap``, ``alpha``, ``limit``, ``routed_scaling_factor``)
  take a finite int or float, integer ones (``sliding_window_size``,
  ``num_fused_shared_experts``, ``num_expert_group``, ``topk_group``,
  ``mrope_section``'s entries) an int: not a str, a bool or a tensor, and a
  float is not cut to an int (``num_token_non_padded`` also takes sglang's
  0-d integer tensor). The routers take float32 / bf16 logits only.
- torch.float16 is refused everywhere (a ``tilejit.Error``; sgl-kernel takes
  f16 for most ops): convert to bf16 yourself; nothing converts silently
  (``per_token_quant_int8_cpu``, torch code, widens f16 to f32 exactly).
- The quantized linear ops (``int8_scaled_mm_with_quant``,
  ``int8_scaled_mm_cpu``, ``fp8_scaled_mm_cpu``) take ``out_dtype``
  torch.float32 as well as torch.bfloat16 (sgl-kernel: mat1's dtype only)
  and a bf16 bias as well as f32.
- Several sgl-kernel schema versions are accepted, told apart by the
  positional types (see :func:`fused_experts_cpu`,
  :func:`decode_attention_cpu`, :func:`extend_attention_cpu`).
- ``flash_attn_varlen_func``'s causal mask is top-left aligned, as
  sgl-kernel's CPU kernel (flash_attn.cpp), not FlashAttention's bottom-right.

The modules, one per op family (the public names are all here):
``linear`` (weight_packed_linear, bmm_cpu, the int8 / fp8 scaled mm ops),
``packed_weight`` (convert_weight_packed, PackedWeight), ``moe``
(fused_experts_cpu), ``routing`` (the top-k routers), ``rope``,
``attention``, ``norm`` (the RMS, Gemma, gated and layer norms and the
act-and-mul activations);
``_common`` holds the argument checks they share.
"""

# tilejit.sgl.Error was importable when this was one module: it is tilejit.Error.
from tilejit import Error  # noqa: F401

from .attention import decode_attention_cpu, extend_attention_cpu, flash_attn_varlen_func
from .linear import bmm_cpu, fp8_scaled_mm_cpu, int8_scaled_mm_cpu, \
    int8_scaled_mm_with_quant, per_token_quant_int8_cpu, weight_packed_linear
from .moe import fused_experts_cpu
from .norm import fused_add_layernorm_cpu, fused_add_rmsnorm_cpu, fused_qk_gemma_rmsnorm_cpu, \
    fused_rmsnorm_gated_cpu, gelu_and_mul_cpu, gelu_tanh_and_mul_cpu, gemma3_rmsnorm_cpu, \
    gemma_fused_add_rmsnorm_cpu, gemma_rmsnorm_cpu, l2norm_cpu, layernorm_cpu, rmsnorm_cpu, \
    silu_and_mul_cpu
from .packed_weight import PackedWeight, convert_weight_packed
from .rope import apply_multidimensional_rope_cpu, multimodal_rotary_embedding_cpu, \
    rotary_embedding_cpu
from .routing import biased_grouped_topk_cpu, grouped_topk_cpu, topk_sigmoid_cpu, \
    topk_softmax_cpu

__all__ = [
    "PackedWeight", "convert_weight_packed", "weight_packed_linear", "bmm_cpu",
    "int8_scaled_mm_with_quant",
    "int8_scaled_mm_cpu", "per_token_quant_int8_cpu", "fp8_scaled_mm_cpu", "fused_experts_cpu",
    "topk_softmax_cpu", "topk_sigmoid_cpu", "grouped_topk_cpu", "biased_grouped_topk_cpu",
    "rotary_embedding_cpu", "multimodal_rotary_embedding_cpu", "apply_multidimensional_rope_cpu",
    "flash_attn_varlen_func", "decode_attention_cpu", "extend_attention_cpu",
    "rmsnorm_cpu", "l2norm_cpu", "fused_add_rmsnorm_cpu", "silu_and_mul_cpu",
    "gelu_tanh_and_mul_cpu", "gelu_and_mul_cpu", "gemma_rmsnorm_cpu", "gemma3_rmsnorm_cpu",
    "gemma_fused_add_rmsnorm_cpu", "fused_qk_gemma_rmsnorm_cpu", "layernorm_cpu",
    "fused_add_layernorm_cpu", "fused_rmsnorm_gated_cpu",
]
