"""convert_weight_packed and the PackedWeight it returns. One home for both
users of a packed weight, the linear ops (linear.py) and fused_experts_cpu
(moe.py): the object keeps every packing of the weight, one per format,
packed again when a call's scales differ."""

import torch

import tilejit

from ._common import _need, _tensor


class PackedWeight:
    """What :func:`convert_weight_packed` returns: the weight packed for
    tilejit's kernels. 2-D bf16 weights [N, K] are packed at once (a
    ``tilejit.PackedWeight``); 3-D expert weights [E, rows, cols] are packed
    at the first ``fused_experts_cpu`` call that uses them, because only the
    call says whether a tensor is w1 (gate_up) or w2 (down), and for int8 /
    fp8 weights which scales go with it; 2-D int8 / fp8 weights likewise at
    the first ``int8_scaled_mm_with_quant`` / ``int8_scaled_mm_cpu`` /
    ``fp8_scaled_mm_cpu`` call (the scales are the call's ``scales2``). ``weight`` keeps the original
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

    def batched(self):
        """A 3-D bf16 weight [B, N, K] as B ``tilejit.PackedWeight`` (bmm_cpu's
        mat2), packed at the first call and kept."""
        p = self._packed.get("batched")
        if p is None:
            _need(len(self.shape) == 3 and self.dtype == torch.bfloat16,
                  f"bmm_cpu: mat2 is a packed {self.dtype} weight of shape {tuple(self.shape)}; "
                  "allowed: a 3-D torch.bfloat16 weight [B, N, K]")
            p = [tilejit.pack_weight(self.weight[b]) for b in range(self.shape[0])]
            self._packed["batched"] = p
        return p

    def experts(self, key, scale, make):
        """The experts packed for key (format, projection, block): see
        :meth:`packed`."""
        return self.packed(key, scale, make)

    def packed(self, key, scale, make):
        """The weight packed for key (format, projection / block), packed
        again when the call's scales differ from those of the last packing.
        sgl-kernel reads the scales at every call, so a cache keyed by the
        scale tensor's identity was wrong: a freed tensor's id comes back for
        another tensor, and the same tensor may be changed in place. The
        scales are compared bit for bit (NaN included); one packing per key
        is kept, so new scales replace the old packing instead of adding one.
        Used by fused_experts_cpu (3-D weights) and by the quantized linear
        ops (2-D int8 / fp8 weights)."""
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
    packed at first use by :func:`fused_experts_cpu`, 2-D int8 / fp8 weights
    at first use by :func:`int8_scaled_mm_with_quant` /
    :func:`int8_scaled_mm_cpu` / :func:`fp8_scaled_mm_cpu` with the call's
    scales2 (packed again when a later call's scales2 holds other values).
    """
    _tensor("weight", weight, "convert_weight_packed")
    _need(weight.dim() in (2, 3), f"convert_weight_packed: weight has {weight.dim()} dims "
          f"(shape {tuple(weight.shape)}); allowed: 2 ([N, K]) or 3 ([E, rows, cols])")
    return PackedWeight(weight)
