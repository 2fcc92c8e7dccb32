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
  what is allowed (sgl-kernel raises RuntimeError from TORCH_CHECK). Errors
  raised inside the tilejit core carry the op's name and a note mapping the
  core's argument names to sgl-kernel's (e.g. ``slot_mapping`` is ``loc``).
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
"""

import operator

import torch

import tilejit
from tilejit import Error

__all__ = [
    "PackedWeight", "convert_weight_packed", "weight_packed_linear", "int8_scaled_mm_with_quant",
    "int8_scaled_mm_cpu", "per_token_quant_int8_cpu", "fp8_scaled_mm_cpu", "fused_experts_cpu",
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


def _opt_tensor(arg, t):
    return None if t is None else _tensor(arg, t)


def _no_f16(op, **tensors):
    """A tilejit.Error for any float16 tensor among tensors (sgl-kernel takes
    f16; tilejit's kernels are bf16 and nothing is converted silently)."""
    for arg, t in tensors.items():
        if isinstance(t, torch.Tensor) and t.dtype == torch.float16:
            raise Error(f"{op}: {arg}.dtype=torch.float16 is refused (sgl-kernel takes it; "
                        "tilejit's kernels are bf16); allowed: torch.bfloat16 (convert with "
                        ".to(torch.bfloat16))")


def _core(op, note, fn, *args, **kwargs):
    """fn(*args, **kwargs); a tilejit.Error from the tilejit core comes back
    with the sgl op's name and a note mapping the core's argument names to
    sgl-kernel's."""
    try:
        return fn(*args, **kwargs)
    except Error as e:
        raise Error(f"{op}: {e} ({note})") from None


_MISSING = object()


def _bind(op, names, defaults, args, kwargs):
    """sgl-kernel's argument list names (of one schema version) bound to args
    and kwargs as Python would, with tilejit.Errors naming the op; defaults
    maps the optional names to their values. Returns a dict."""
    _need(len(args) <= len(names), f"{op}: {len(args)} positional arguments after the "
          f"fixed ones; allowed: at most {len(names)} ({', '.join(names)})")
    out = dict(zip(names, args))
    for k, v in kwargs.items():
        _need(k in names, f"{op}: unexpected keyword argument {k!r} for this schema "
              f"({', '.join(names)})")
        _need(k not in out, f"{op}: {k} given both by position and by keyword")
        out[k] = v
    for k in names:
        if k not in out:
            _need(k in defaults, f"{op}: missing argument {k}")
            out[k] = defaults[k]
    return out


def _is_bool(v):
    return isinstance(v, bool)


def _is_int(v):
    """An integer that is not a bool (IntEnum included)."""
    if isinstance(v, bool) or isinstance(v, torch.Tensor):
        return False
    try:
        operator.index(v)
        return True
    except TypeError:
        return False


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
    (sgl-kernel: N % 32 == 0); mat1 must be bf16 (sgl-kernel also takes f16:
    f16 is a tilejit.Error here, not converted).
    """
    _tensor("mat1", mat1)
    _opt_tensor("bias", bias)
    _no_f16("weight_packed_linear", mat1=mat1, mat2=getattr(mat2, "weight", mat2))
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
    _core("weight_packed_linear", "tilejit.gemm's x is mat1, w is mat2", tilejit.gemm, x, w,
          out=out, bias=bias)
    return out.reshape(*lead, w.n) if mat1.dim() != 2 else out


# ---- Quantized linear (W8A8 int8, fp8 W8A16) -----------------------------------

# torch 1.13 has no float8: fp8 weights are uint8 e4m3 codes; a newer torch's
# float8_e4m3fn tensor is read as its codes (a view, no copy).
_F8E4M3 = getattr(torch, "float8_e4m3fn", None)
_OUT_DTYPES = {torch.bfloat16: "bf16", torch.float32: "f32"}


def _fp8_codes(t):
    return t.view(torch.uint8) if _F8E4M3 is not None and t.dtype == _F8E4M3 else t


def _out_dtype(op, v):
    ok = isinstance(v, torch.dtype) and v in _OUT_DTYPES
    _need(ok, f"{op}: out_dtype={v!r}; allowed: torch.bfloat16, torch.float32")
    return v


def _mat1(op, mat1, dtypes=(torch.bfloat16,)):
    """mat1 as a 2-D [M, K] tensor with K stride 1 (leading dims flattened),
    and the leading shape to give the output back."""
    _tensor("mat1", mat1)
    _no_f16(op, mat1=mat1)
    _need(mat1.dtype in dtypes, f"{op}: mat1.dtype={mat1.dtype}; allowed: "
          + ", ".join(str(d) for d in dtypes))
    _need(mat1.dim() >= 2, f"{op}: mat1 has shape {tuple(mat1.shape)}; allowed: [M, K] "
          "(more leading dims are flattened)")
    x = mat1.reshape(-1, mat1.shape[-1]) if mat1.dim() != 2 else mat1
    if x.shape[-1] > 0 and x.stride(-1) != 1:
        x = x.contiguous()
    return x, mat1.shape[:-1]


def _weight2d(op, mat2, is_vnni, dtype, k, what):
    """(holder or None, the weight tensor [N, K]) of a quantized linear call,
    checked: dtype, 2-D, K equal to mat1's."""
    holder = mat2 if isinstance(mat2, PackedWeight) else None
    _need(holder is not None or isinstance(mat2, torch.Tensor), f"{op}: mat2 is a "
          f"{type(mat2).__name__}; allowed: what tilejit.sgl.convert_weight_packed returned, "
          f"or a {what} [N, K] torch.Tensor")
    t = holder.weight if holder is not None else mat2
    codes = _fp8_codes(t) if dtype == torch.uint8 else t
    _need(codes.dtype == dtype and codes.dim() == 2, f"{op}: mat2 is a {t.dtype} tensor of shape "
          f"{tuple(t.shape)}; allowed: {what} [N, K]")
    if holder is None and is_vnni and dtype == torch.int8 and codes.shape[1] == k + 4:
        raise Error(f"{op}: mat2 has shape {tuple(t.shape)} with is_vnni=True: sgl-kernel's own "
                    "VNNI-packed int8 weight [N, K + 4], which tilejit cannot read; allowed: "
                    "the int8 weight [N, K] itself, or tilejit.sgl.convert_weight_packed(weight)")
    _need(codes.shape[1] == k, f"{op}: mat2 has shape {tuple(t.shape)} and mat1 has K={k}; "
          "allowed: mat2 [N, K] with mat1's K")
    return holder, codes


def _f32_scales(op, arg, s, shape, what):
    _tensor(arg, s)
    _need(s.dtype == torch.float32, f"{op}: {arg}.dtype={s.dtype}; allowed: torch.float32")
    ok = s.numel() == shape[0] if len(shape) == 1 else tuple(s.shape) == shape
    _need(ok, f"{op}: {arg} has shape {tuple(s.shape)}; allowed: {what}")
    return s


def _int8_packed(op, mat2, is_vnni, scales2, k):
    """The int8 weight packed with scales2 [N] (cached on a PackedWeight
    while scales2's values stay the same)."""
    holder, t = _weight2d(op, mat2, is_vnni, torch.int8, k, "an int8 weight")
    n = t.shape[0]
    s = _f32_scales(op, "scales2", scales2, (n,), f"{n} elements ([N] or [N, 1]: one scale "
                    "per output channel)").reshape(-1).contiguous()

    def make(w):
        return _core(op, "tilejit.pack_int8's weight is mat2, scales is scales2",
                     tilejit.pack_int8, w, s)
    return n, make(t) if holder is None else holder.packed(("int8",), s, make)


def _bias(op, bias, n):
    _opt_tensor("bias", bias)
    if bias is None:
        return None
    _no_f16(op, bias=bias)
    _need(bias.dtype in (torch.float32, torch.bfloat16) and tuple(bias.shape) == (n,),
          f"{op}: bias is a {bias.dtype} tensor of shape {tuple(bias.shape)}; allowed: "
          f"torch.float32 or torch.bfloat16 [{n}]")
    return bias


def int8_scaled_mm_with_quant(mat1, mat2, scales2, bias=None, out_dtype=torch.bfloat16,
                              is_vnni=True):
    """sgl-kernel ``int8_scaled_mm_with_quant(mat1, mat2, scales2, bias,
    out_dtype, is_vnni) -> Tensor``, the W8A8 linear of sglang's CPU backend
    (w8a8_int8.py): mat1 bf16 [M, K] quantized per token inside (symmetric,
    dynamic: s_x = max|x| / 127 per row, s8 codes), times the int8 weight
    mat2 [N, K] with per-output-channel scales ``scales2`` f32 (N elements,
    [N] or sglang's [N, 1]): ``y = (q_x . q_w^T) * s_x * s_w + bias``, a new
    [M, N] tensor of out_dtype. Runs ``tilejit.gemm(mat1, pack_int8(mat2,
    scales2), act_quant="dynamic_sym")`` (exact int32 sums).

    mat2: what :func:`convert_weight_packed` returned (packed at the first
    call with its scales2 and kept while scales2's values are the same; new
    values, also written in place, pack it again) or a plain int8 [N, K]
    tensor, packed on every call (a full pass over the weight: slow; keep a
    convert_weight_packed weight). Differences: out_dtype torch.bfloat16 or
    torch.float32 (sgl-kernel: only mat1's dtype; anything else is an
    Error); bias f32 or bf16 [N] (sgl-kernel: f32); mat1 bf16 only (f16, which
    sgl-kernel takes, is an Error), more leading dims flattened; any N and K
    <= 65536 (sgl-kernel: N % 32 == 0 for its VNNI packing); ``is_vnni`` only
    says whether a plain mat2 is packed: sgl-kernel's own VNNI int8 tensor
    ([N, K + 4]) cannot be read (an Error). The activation codes are
    tilejit's rule (docs/quantized.md: ``rne(x / s_x)`` in f32; sgl-kernel
    multiplies by ``127 / amax``, so a code at a rounding tie may differ by
    one; rows with max|x| < 1e-7, which sgl-kernel quantizes with the step
    1e-7 / 127, get their own finer step here). A row holding NaN or Inf
    gives a NaN row.
    """
    op = "int8_scaled_mm_with_quant"
    x, lead = _mat1(op, mat1)
    dt = _out_dtype(op, out_dtype)
    n, w = _int8_packed(op, mat2, is_vnni, scales2, x.shape[1])
    b = _bias(op, bias, n)
    out = torch.empty((x.shape[0], n), dtype=dt)
    _core(op, "tilejit.gemm's x is mat1, w is mat2 packed with scales2, bias is bias",
          tilejit.gemm, x, w, out=out, bias=b, act_quant="dynamic_sym")
    return out.reshape(*lead, n) if len(lead) != 1 else out


def int8_scaled_mm_cpu(mat1, mat2, scales1, scales2, bias=None, out_dtype=torch.bfloat16,
                       is_vnni=True):
    """sgl-kernel ``int8_scaled_mm_cpu(mat1, mat2, scales1, scales2, bias,
    out_dtype, is_vnni) -> Tensor``: W8A8 on activations already quantized,
    e.g. by :func:`per_token_quant_int8_cpu`: mat1 uint8 [M, K] holding
    ``q + 128`` (sgl-kernel's codes), scales1 f32 (M elements), mat2 int8
    [N, K] with scales2 f32 (N elements): ``y = (q_x . q_w^T) * scales1[m] *
    scales2[n] + bias``.

    tilejit's gemm quantizes bf16 activations itself, so the codes go in as
    bf16 integers (``q`` in [-128, 127] is exact in bf16) with
    ``act_quant="fixed"``, ``act_scale=1``, zero point 128: the kernel
    recovers the same codes and sums them exactly in int32; its f32 output
    ``float(acc) * scales2`` is then scaled by scales1 and given the bias in
    torch (f32), and rounded to out_dtype. The result differs from
    sgl-kernel's by f32 roundings only. Cost over sgl-kernel: a bf16 copy of
    mat1 [M, K] and an f32 [M, N] pass in torch. Extras: mat1 may also be
    int8 holding ``q`` itself (sgl-kernel: uint8 only); more leading dims are
    flattened. mat2, out_dtype, bias, is_vnni: as
    :func:`int8_scaled_mm_with_quant`.
    """
    op = "int8_scaled_mm_cpu"
    _tensor("mat1", mat1)
    _need(mat1.dtype in (torch.uint8, torch.int8), f"{op}: mat1.dtype={mat1.dtype}; allowed: "
          "torch.uint8 (codes q + 128, as per_token_quant_int8_cpu returns) or torch.int8 (q)")
    _need(mat1.dim() >= 2, f"{op}: mat1 has shape {tuple(mat1.shape)}; allowed: [M, K]")
    lead = mat1.shape[:-1]
    q = mat1.reshape(-1, mat1.shape[-1])
    m, k = q.shape
    dt = _out_dtype(op, out_dtype)
    s1 = _f32_scales(op, "scales1", scales1, (m,), f"{m} elements ([M] or [M, 1]: one scale "
                     "per row of mat1)").reshape(m, 1)
    n, w = _int8_packed(op, mat2, is_vnni, scales2, k)
    b = _bias(op, bias, n)
    x = (q.to(torch.int16) - 128 if q.dtype == torch.uint8 else q).to(torch.bfloat16)
    acc = torch.empty((m, n), dtype=torch.float32)
    _core(op, "tilejit.gemm's x is mat1's codes as bf16 (act_quant='fixed', act_scale=1, zero "
          "point 128), w is mat2 packed with scales2", tilejit.gemm, x, w, out=acc,
          act_quant="fixed", act_scale=1.0, act_zero_point=128)
    acc.mul_(s1)
    if b is not None:
        acc.add_(b.to(torch.float32))
    out = acc if dt == torch.float32 else acc.to(dt)
    return out.reshape(*lead, n) if len(lead) != 1 else out


def per_token_quant_int8_cpu(A):
    """sgl-kernel ``per_token_quant_int8_cpu(A) -> (Aq, As)``: per row
    ``amax = max(max|A|, 1e-7)``, ``As = amax / 127``, ``Aq = rne(A * (127 /
    amax)) + 128`` as uint8 [M, K] (sgl-kernel's u8 codes: q + 128), As f32
    [M]; all in f32 as sgl-kernel's AVX-512 bf16 path (vec.h
    quantize_row_int8, round to nearest even; its scalar path rounds ties
    away from zero). Not a JIT kernel: torch element-wise ops. A: bf16 or
    f16 [M, K] (both widened to f32 exactly; f16 is taken here, as
    sgl-kernel does). Feed the pair to :func:`int8_scaled_mm_cpu`; or call
    :func:`int8_scaled_mm_with_quant` on A directly (one tilejit kernel).
    A NaN gives an unspecified code (as in sgl-kernel)."""
    op = "per_token_quant_int8_cpu"
    _tensor("A", A)
    _need(A.dtype in (torch.bfloat16, torch.float16), f"{op}: A.dtype={A.dtype}; allowed: "
          "torch.bfloat16, torch.float16")
    _need(A.dim() == 2, f"{op}: A has shape {tuple(A.shape)}; allowed: [M, K]")
    a = A.to(torch.float32)
    amax = a.abs().amax(dim=1) if a.shape[1] else torch.zeros(a.shape[0])
    amax = torch.clamp(amax, min=1e-7)
    scale = amax / 127
    inv = torch.full_like(amax, 127.0) / amax
    q = torch.round(a * inv[:, None]).clamp_(-128, 127)
    return (q + 128).to(torch.uint8), scale


def fp8_scaled_mm_cpu(mat1, mat2, scales2, block_size, bias=None, out_dtype=torch.bfloat16,
                      is_vnni=True):
    """sgl-kernel ``fp8_scaled_mm_cpu(mat1, mat2, scales2, block_size, bias,
    out_dtype, is_vnni) -> Tensor``, the block-fp8 W8A16 linear of sglang's
    CPU backend (fp8.py): ``y = mat1 @ dequant(mat2)^T + bias`` with mat1
    bf16 [M, K], mat2 fp8 e4m3 [N, K] and block scales ``scales2`` f32
    [ceil(N / bn), ceil(K / bk)], ``block_size = [bn, bk]``:
    ``dequant(w)[n, k] = e4m3(w[n, k]) * scales2[n // bn, k // bk]``. Runs
    ``tilejit.gemm(mat1, pack_fp8(mat2, scales2, bn, bk))`` (the weight
    dequantized to bf16 in the kernel, f32 sums).

    mat2: e4m3 codes as uint8 (torch 1.13 has no float8; a
    torch.float8_e4m3fn tensor of a newer torch is read as its codes), or
    what :func:`convert_weight_packed` returned (packed at the first call and
    kept while scales2's values and block_size are the same; new values,
    also written in place, pack it again), or a plain tensor packed on every
    call (slow). Differences: any block size (bn >= 1, bk even >= 2;
    sgl-kernel: bn a multiple of 32, bk = 128) with partial last blocks, any
    N and K; out_dtype torch.bfloat16 or torch.float32 (sgl-kernel: only
    mat1's dtype); bias f32 or bf16 [N] (sgl-kernel: f32); mat1 bf16 only
    (f16 is an Error), more leading dims flattened; ``is_vnni`` only says
    whether a plain mat2 is packed (sgl-kernel's own packed fp8 tensor is not
    read as such). A NaN code (0x7f / 0xff) in mat2 is an Error when packing.
    """
    op = "fp8_scaled_mm_cpu"
    x, lead = _mat1(op, mat1)
    dt = _out_dtype(op, out_dtype)
    ok = isinstance(block_size, (list, tuple, torch.Size)) and len(block_size) == 2 and \
        all(_is_int(v) and operator.index(v) > 0 for v in block_size)
    _need(ok, f"{op}: block_size={block_size!r}; allowed: two positive ints [block_n, block_k]")
    bn, bk = (operator.index(v) for v in block_size)
    holder, t = _weight2d(op, mat2, is_vnni, torch.uint8, x.shape[1], "an fp8 e4m3 weight "
                          "(uint8 codes)")
    n, k = t.shape
    shape = (-(-n // bn), -(-k // bk))
    s = _f32_scales(op, "scales2", scales2, shape, f"[ceil(N / block_n), ceil(K / block_k)] = "
                    f"{list(shape)} for N={n}, K={k}, block_size=[{bn}, {bk}]").contiguous()

    def make(w):
        return _core(op, "tilejit.pack_fp8's weight is mat2, scales is scales2, block_n / "
                     "block_k are block_size", tilejit.pack_fp8, _fp8_codes(w), s, bn, bk)
    w = make(t) if holder is None else holder.packed(("fp8", bn, bk), s, make)
    b = _bias(op, bias, n)
    out = torch.empty((x.shape[0], n), dtype=dt)
    _core(op, "tilejit.gemm's x is mat1, w is mat2 packed with scales2, bias is bias",
          tilejit.gemm, x, w, out=out, bias=b)
    return out.reshape(*lead, n) if len(lead) != 1 else out


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
    _tensor("hidden_states", hidden_states)
    _tensor("topk_weights", topk_weights)
    for name in ("w1_scale", "w2_scale", "w1_zero", "w2_zero", "w1_bias", "w2_bias"):
        _opt_tensor(name, a.get(name))
    int4_route = None
    if "moe_comp_method" in a:
        m = a["moe_comp_method"]
        _need(_is_int(m), f"{op}: moe_comp_method={m!r}; allowed: an int 0-4 "
              "(sglang's CPUQuantMethod)")
        m = operator.index(m)
        _need(m in _MOE_METHODS, f"{op}: moe_comp_method={m}; allowed: " +
              ", ".join(f"{k} ({v})" for k, v in _MOE_METHODS.items()))
        use_int8, use_fp8 = m == 1, m == 2
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
        use_int8, use_fp8 = bool(a["use_int8_w8a8"]), bool(a["use_fp8_w8a16"])
        a1_scale, a2_scale = a["a1_scale"], a["a2_scale"]
    act = a.get("activation")
    _need(act in _MOE_ACTS, f"{op}: activation={act!r}; allowed: None, " +
          ", ".join(repr(k) for k in _MOE_ACTS if k is not None))
    alpha, limit = a.get("alpha"), a.get("limit")
    clamped = alpha is not None or limit is not None
    _need(not clamped or _MOE_ACTS[act] == "silu", f"{op}: alpha / limit (the clamped "
          f"SwiGLU) with activation={act!r}; allowed: activation None or 'silu' with them")
    _need(not (use_int8 and use_fp8),
          f"{op}: use_int8_w8a8 and use_fp8_w8a16 both set; allowed: one")
    aq = _static_act_scales(a1_scale, a2_scale, use_int8)
    _no_f16(op, hidden_states=hidden_states)
    _need(hidden_states.dtype == torch.bfloat16,
          f"{op}: hidden_states.dtype={hidden_states.dtype}; allowed: torch.bfloat16")
    bs = a["block_size"]
    w13 = _expert_pack(w1, "gate_up", "w1", use_int8, use_fp8, a["w1_scale"], bs)
    w2p = _expert_pack(w2, "down", "w2", use_int8, use_fp8, a["w2_scale"], bs)
    ids = _i32("topk_ids", topk_ids)
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
        kw.update(clamped_swiglu=True, swiglu_alpha=1.702 if alpha is None else float(alpha),
                  swiglu_limit=7.0 if limit is None else float(limit))
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
    best experts in them. ``routed_scaling_factor`` must be None or 1.0 (an
    Error otherwise, as sgl-kernel's topk.cpp TORCH_CHECK: it is never
    applied to the weights); ``num_fused_shared_experts`` must be 0.
    num_token_non_padded: tokens from that index on get id -1 (sglang's
    rule; sgl-kernel refuses the argument). Any E, group count and k
    (sgl-kernel: fixed sizes)."""
    _need(routed_scaling_factor is None or float(routed_scaling_factor) == 1.0,
          f"grouped_topk_cpu: routed_scaling_factor={routed_scaling_factor!r}; allowed: None "
          "or 1.0 (as sgl-kernel: the weights are not scaled by this op)")
    return _grouped("softmax", hidden_states, gating_output, None, topk, renormalize,
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


_ROPE_NOTE = "tilejit.rope's q / k are query / key as [T, H, head_size] views"


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
    _tensor("positions", positions)
    _tensor("cos_sin_cache", cos_sin_cache)
    _no_f16("rotary_embedding_cpu", query=query, key=key, cos_sin_cache=cos_sin_cache)
    if query.dim() == 3:
        q, k = q.clone(), k.clone()
    _core("rotary_embedding_cpu", _ROPE_NOTE, tilejit.rope, q, k, positions.reshape(-1),
          cos_sin_cache, style="neox" if is_neox else "gptj", rotary_dim=cos_sin_cache.shape[1])
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
    _tensor("positions", positions)
    _tensor("cos_sin_cache", cos_sin_cache)
    _no_f16("multimodal_rotary_embedding_cpu", query=query, key=key,
            cos_sin_cache=cos_sin_cache)
    style = "neox" if is_neox else "gptj"
    rd = cos_sin_cache.shape[1]
    if positions.dim() == 1:
        _core("multimodal_rotary_embedding_cpu", _ROPE_NOTE, tilejit.rope, q, k, positions,
              cos_sin_cache, style=style, rotary_dim=rd)
    else:
        _need(mrope_section is not None, "multimodal_rotary_embedding_cpu: positions has shape "
              f"{tuple(positions.shape)} and mrope_section=None; allowed: a section list "
              "with 2-D positions")
        _core("multimodal_rotary_embedding_cpu", _ROPE_NOTE, tilejit.rope, q, k, positions,
              cos_sin_cache, style=style, rotary_dim=rd,
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
    return None if sinks is None else _tensor("sinks", sinks).to(torch.float32).contiguous()


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q=None,
                           max_seqlen_k=None, causal=False, sm_scale=None, logit_cap=0.0,
                           sliding_window_size=-1, sinks=None):
    """sgl-kernel ``flash_attn_varlen_func(q, k, v, cu_seqlens_q,
    cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal)``:
    q [Tq, Hq, D], k [Tk, Hkv, D], v [Tk, Hkv, Dv] bf16, cu_seqlens int32
    [B+1]; returns out [Tq, Hq, Dv] bf16.

    Causal is top-left aligned, as sgl-kernel's CPU kernel (flash_attn.cpp:
    query i of a sequence sees keys j <= i; with more queries than keys,
    queries i >= Tk see all Tk keys), not FlashAttention's bottom-right.
    Batches where every sequence has Tq == Tk (the two agree) are one
    tilejit.flash_attn_varlen call; otherwise each sequence is called on its
    own (keys cut to the first Tq, or the queries past Tk run without the
    mask). max_seqlen_q / max_seqlen_k have no meaning here (ignored).
    Extras (not in sgl-kernel, which fixes the scale to 1/sqrt(D)):
    sm_scale, logit_cap (softcap), sliding_window_size (window left, keys
    j >= i - w; not with causal Tq != Tk batches), sinks [Hq]. Any even head
    size up to 576 (sgl-kernel: a fixed list); float16 is an Error."""
    op = "flash_attn_varlen_func"
    for name, t in (("q", q), ("k", k), ("v", v)):
        _tensor(name, t)
    _no_f16(op, q=q, k=k, v=v)
    cq, ck = _i32("cu_seqlens_q", cu_seqlens_q), _i32("cu_seqlens_k", cu_seqlens_k)
    kw = dict(sm_scale=sm_scale, softcap=float(logit_cap), window_left=int(sliding_window_size),
              sinks=_sinks(sinks))
    note = "tilejit.flash_attn_varlen's names are sgl-kernel's"
    lq, lk = cq.tolist(), ck.tolist()
    _need(len(lq) == len(lk), f"{op}: cu_seqlens_q has {len(lq)} entries and cu_seqlens_k "
          f"{len(lk)}; allowed: the same (B + 1)")
    spans = [(lq[b], lq[b + 1], lk[b], lk[b + 1]) for b in range(len(lq) - 1)]
    if not causal or all(q1 - q0 == k1 - k0 for q0, q1, k0, k1 in spans):
        return _core(op, note, tilejit.flash_attn_varlen, q, k, v, cq, ck, causal=causal, **kw)
    _need(int(sliding_window_size) < 0, f"{op}: sliding_window_size={sliding_window_size} with "
          "causal=True and a sequence whose query and key counts differ; allowed: -1 there "
          "(the window of the top-left rule is not implemented)")
    out = torch.empty((q.shape[0], q.shape[1], v.shape[2]), dtype=q.dtype)

    def run(qs, ks, vs, is_causal, dst):
        n, m = qs.shape[0], ks.shape[0]
        if n == 0:
            return
        if m == 0:  # no keys: nothing to attend to
            dst.zero_()
            return
        cu = torch.tensor([0, n], dtype=torch.int32)
        cu_k = torch.tensor([0, m], dtype=torch.int32)
        dst.copy_(_core(op, note, tilejit.flash_attn_varlen, qs, ks, vs, cu, cu_k,
                        causal=is_causal, **kw))

    for q0, q1, k0, k1 in spans:
        n, m = q1 - q0, k1 - k0
        if n <= m:  # top-left: query i sees keys 0..i of the first n keys
            run(q[q0:q1], k[k0:k0 + n], v[k0:k0 + n], True, out[q0:q1])
        else:       # the first m queries causal over the m keys, the rest see all m
            run(q[q0:q0 + m], k[k0:k1], v[k0:k1], True, out[q0:q0 + m])
            run(q[q0 + m:q1], k[k0:k1], v[k0:k1], False, out[q0 + m:q1])
    return out


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


def _window_left(form, arg, value):
    """tilejit's window_left from the call's sliding_window_size: the classic
    (tilejit) form takes sglang's layer convention already (-1 none, w = keys
    j >= i - w); the newer sgl-kernel forms take sglang's
    ``layer.sliding_window_size + 1``, the number of keys including the
    current one, and <= 0 for no window (decode.cpp / extend.cpp)."""
    _need(_is_int(value), f"{arg}={value!r}; allowed: an int")
    w = operator.index(value)
    if form == "classic":
        return w
    return w - 1 if w > 0 else -1


def _no_cross(op, a):
    _need(not a.get("is_cross_attn"), f"{op}: is_cross_attn={a.get('is_cross_attn')!r}; "
          "allowed: False (cross-attention is not supported by tilejit.sgl)")
    _need(a.get("encoder_lens") is None, f"{op}: encoder_lens given; allowed: None "
          "(encoder-decoder attention is not supported by tilejit.sgl)")


_DEC_HEAD = ("query", "k_cache", "v_cache", "output", "key", "value", "loc", "attn_logits",
             "req_to_token", "req_pool_indices", "seq_lens", "sm_scale", "logit_cap")
_DEC_CLASSIC = _DEC_HEAD + ("sliding_window_size", "sinks", "k_scale", "v_scale")
_DEC_NEW = _DEC_HEAD + ("is_cross_attn", "sliding_window_size", "encoder_lens", "sinks",
                        "k_scale", "v_scale")
_DEC_SCALED = ("query", "k_buffer", "v_buffer", "k_buf_scale", "v_buf_scale", "output", "key",
               "value", "loc", "attn_logits", "req_to_token", "req_pool_indices", "seq_lens",
               "sm_scale", "logit_cap", "is_cross_attn", "sliding_window_size", "encoder_lens",
               "sinks")
_ATT_DEFAULTS = dict(logit_cap=0.0, sliding_window_size=-1, sinks=None, k_scale=1.0,
                     v_scale=1.0, is_cross_attn=False, encoder_lens=None, custom_mask=None,
                     tree_mask=None, key=None, value=None, loc=None, attn_logits=None,
                     max_len_extend=None)
_NEW_KW = ("is_cross_attn", "encoder_lens")


def _decode_form(args, kwargs):
    if "k_buf_scale" in kwargs or "k_buffer" in kwargs or (
            len(args) > 3 and not isinstance(args[3], torch.Tensor)):
        return "scaled", _DEC_SCALED
    if any(k in kwargs for k in _NEW_KW) or (len(args) > 13 and _is_bool(args[13])):
        return "new", _DEC_NEW
    return "classic", _DEC_CLASSIC


def decode_attention_cpu(*args, **kwargs):
    """sgl-kernel ``decode_attention_cpu``: writes the new tokens' key /
    value [B, Hkv, D / Dv] into k_cache / v_cache [num_slots, Hkv, D / Dv]
    at slots ``loc`` [B], then attends each query [B, Hq, D] to its
    sequence's keys ``req_to_token[req_pool_indices[b], :seq_lens[b]]``
    (seq_lens counts the new token) into output [B, Hq, Dv] bf16.

    Three argument lists, told apart by positional types:

    - classic (sgl-kernel's 13-arg schema, plus tilejit extras):
      ``query, k_cache, v_cache, output, key, value, loc, attn_logits,
      req_to_token, req_pool_indices, seq_lens, sm_scale, logit_cap
      [, sliding_window_size, sinks, k_scale, v_scale]``; here
      ``sliding_window_size`` is sglang's layer value (window left: -1 none,
      w >= 0 keeps keys j >= seq_len - 1 - w).
    - new (sglang's intel_amx_backend; a bool 14th argument, or the
      keywords is_cross_attn / encoder_lens): ``..., sm_scale, logit_cap,
      is_cross_attn, sliding_window_size, encoder_lens, sinks``; here
      ``sliding_window_size`` is what sglang passes,
      ``layer.sliding_window_size + 1``: the number of keys kept including
      the new one, <= 0 for no window (decode.cpp).
    - scaled (a float 4th argument, or the keywords k_buf_scale /
      k_buffer): ``query, k_buffer, v_buffer, k_buf_scale, v_buf_scale,
      output, key, value, loc, attn_logits, req_to_token, req_pool_indices,
      seq_lens, sm_scale, logit_cap, is_cross_attn, sliding_window_size,
      encoder_lens, sinks``, the window as in "new", the buffer scales as
      k_scale / v_scale.

    ``key`` / ``value`` None (with loc None): nothing is stored (newer
    sgl-kernel). ``loc`` must be in [0, num_slots): a negative slot is an
    Error (tilejit's store_kv would skip it silently, vLLM's padding rule;
    sgl-kernel would write out of bounds). is_cross_attn=True or
    encoder_lens: Error (cross-attention is not supported).
    Scores ``logit_cap * tanh(q.k * sm_scale / logit_cap)`` when
    logit_cap > 0; ``sinks`` [Hq] (GPT-OSS) joins the softmax denominator.
    fp8 caches: uint8 e4m3 codes with ``k_scale`` / ``v_scale`` (None is 1).
    ``attn_logits`` (sgl-kernel's split-KV scratch) has no meaning here and is
    not touched. Any even head size up to 576 (tilejit::Limits), any GQA
    ratio; float16 is an Error (sgl-kernel takes it)."""
    op = "decode_attention_cpu"
    form, names = _decode_form(args, kwargs)
    a = _bind(op, names, _ATT_DEFAULTS, args, kwargs)
    if form == "scaled":
        a["k_cache"], a["v_cache"] = a["k_buffer"], a["v_buffer"]
        a["k_scale"], a["v_scale"] = a["k_buf_scale"], a["v_buf_scale"]
    _no_cross(op, a)
    query, key, value, loc = a["query"], a["key"], a["value"], a["loc"]
    _tensor("query", query)
    _tensor("output", a["output"])
    _opt_tensor("key", key)
    _opt_tensor("value", value)
    _no_f16(op, query=query, k_cache=a["k_cache"], v_cache=a["v_cache"], key=key, value=value)
    kc, vc = _paged("k_cache", a["k_cache"]), _paged("v_cache", a["v_cache"])
    # sglang passes the layer's k_scale / v_scale, None for a bf16 cache.
    k_scale = 1.0 if a["k_scale"] is None else a["k_scale"]
    v_scale = 1.0 if a["v_scale"] is None else a["v_scale"]
    seq_lens = _tensor("seq_lens", a["seq_lens"])
    note = ("store_kv's slot_mapping is loc, key / value are key / value, k_cache / v_cache "
            "are k_cache / v_cache as [num_slots, 1, Hkv, D]; decode_attention's block_table "
            "is req_to_token[req_pool_indices], query / out are query / output")
    _need((key is None) == (value is None), f"{op}: key is {'None' if key is None else 'given'}"
          f" and value is {'None' if value is None else 'given'}; allowed: both or neither")
    if key is not None:
        _tensor("loc", loc)
        if loc.numel():
            lo, hi = int(loc.min()), int(loc.max())
            _need(lo >= 0 and hi < kc.shape[0], f"{op}: loc has {lo}..{hi}; allowed: "
                  f"[0, {kc.shape[0]}) (k_cache's slots; a negative loc is not a skip here)")
        _core(op, note, tilejit.store_kv, key, value, kc, vc, loc, k_scale=k_scale,
              v_scale=v_scale)
    bt = _block_table(a["req_to_token"], a["req_pool_indices"], seq_lens)
    _core(op, note, tilejit.decode_attention, query, kc, vc, bt, _i32("seq_lens", seq_lens),
          out=a["output"], sm_scale=a["sm_scale"], softcap=float(a["logit_cap"]),
          window_left=_window_left(form, "sliding_window_size", a["sliding_window_size"]),
          sinks=_sinks(a["sinks"]), k_scale=k_scale, v_scale=v_scale)


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


_EXT_HEAD = ("q_extend", "k_extend", "v_extend", "o_extend", "k_buffer", "v_buffer",
             "req_to_token", "req_pool_indices", "seq_lens", "extend_seq_lens",
             "extend_start_loc", "max_len_extend", "sm_scale", "logit_cap")
_EXT_CLASSIC = _EXT_HEAD + ("sliding_window_size", "sinks", "custom_mask", "tree_mask")
_EXT_NEW = _EXT_HEAD + ("is_cross_attn", "sliding_window_size", "encoder_lens", "sinks",
                        "tree_mask")


def extend_attention_cpu(*args, **kwargs):
    """sgl-kernel ``extend_attention_cpu``: request b's new tokens
    q_extend[extend_start_loc[b] : + extend_seq_lens[b]] (positions
    prefix_len + i, prefix_len = seq_lens[b] - extend_seq_lens[b]) attend to
    the prefix keys in k_buffer / v_buffer [num_slots, Hkv, D / Dv] at
    ``req_to_token[req_pool_indices[b], :prefix_len]`` and causally to the
    new tokens' own k_extend / v_extend; into o_extend [T, Hq, Dv] bf16.

    Two argument lists after ``q_extend, k_extend, v_extend, o_extend,
    k_buffer, v_buffer, req_to_token, req_pool_indices, seq_lens,
    extend_seq_lens, extend_start_loc, max_len_extend, sm_scale,
    logit_cap``:

    - classic (sgl-kernel's 14-arg schema plus tilejit extras):
      ``[sliding_window_size, sinks, custom_mask, tree_mask]``, the window
      in sglang's layer convention (window left, -1 none).
    - new (sglang's intel_amx_backend; a bool 15th argument, or the
      keywords is_cross_attn / encoder_lens): ``is_cross_attn,
      sliding_window_size, encoder_lens, sinks[, tree_mask]``, the window
      as sglang passes it (``layer.sliding_window_size + 1``: keys kept
      including the query's own, <= 0 none; extend.cpp).

    extend_start_loc must be the running sum of extend_seq_lens (an Error
    otherwise). ``max_len_extend`` has no meaning here (ignored).
    ``custom_mask`` (speculative decoding, sglang's layout: per request
    [n_b, seq_len_b] row-major, flattened) replaces the causal rule among
    the new tokens; its prefix columns must all be set. ``tree_mask``
    instead takes the new-token layout (bool or uint8 [sum_b n_b^2], new
    token i against new token j per request: sgl-kernel's QLEN_ONLY layout
    when every n_b is the same); not both. is_cross_attn=True, encoder_lens
    or k_extend None: Error (cross-attention is not supported). logit_cap
    and sinks as in :func:`decode_attention_cpu`; float16 is an Error."""
    op = "extend_attention_cpu"
    new = any(k in kwargs for k in _NEW_KW) or (len(args) > 14 and _is_bool(args[14]))
    a = _bind(op, _EXT_NEW if new else _EXT_CLASSIC, _ATT_DEFAULTS, args, kwargs)
    _no_cross(op, a)
    custom_mask, tree_mask = a.get("custom_mask"), a["tree_mask"]
    _need(custom_mask is None or tree_mask is None,
          f"{op}: custom_mask and tree_mask both given; allowed: one")
    for name in ("q_extend", "k_extend", "v_extend", "o_extend"):
        _tensor(name, a[name])
    _opt_tensor("custom_mask", custom_mask)
    _opt_tensor("tree_mask", tree_mask)
    _no_f16(op, q_extend=a["q_extend"], k_extend=a["k_extend"], v_extend=a["v_extend"],
            k_buffer=a["k_buffer"], v_buffer=a["v_buffer"])
    lens = _i32("extend_seq_lens", a["extend_seq_lens"])
    start = _i32("extend_start_loc", a["extend_start_loc"])
    sl = _i32("seq_lens", a["seq_lens"])
    indptr = torch.zeros(lens.numel() + 1, dtype=torch.int32)
    torch.cumsum(lens, 0, out=indptr[1:])
    _need(torch.equal(indptr[:-1], start), f"extend_start_loc={start.tolist()}; allowed: the "
          f"running sum of extend_seq_lens = {indptr[:-1].tolist()}")
    prefix = sl - lens
    _need(bool((prefix >= 0).all()), f"seq_lens={sl.tolist()} < extend_seq_lens="
          f"{lens.tolist()}; allowed: seq_lens >= extend_seq_lens")
    bt = _block_table(a["req_to_token"], a["req_pool_indices"], sl)
    if custom_mask is not None:
        tm = _extend_tree_mask(custom_mask, lens, sl)
    elif tree_mask is not None and tree_mask.dtype == torch.bool:
        tm = tree_mask.to(torch.uint8)
    else:
        tm = tree_mask
    note = ("tilejit.extend_attention's k_new / v_new are k_extend / v_extend, k_cache / "
            "v_cache are k_buffer / v_buffer as [num_slots, 1, Hkv, D], block_table is "
            "req_to_token[req_pool_indices], qo_indptr the running sum of extend_seq_lens, "
            "out is o_extend")
    _core(op, note, tilejit.extend_attention, a["q_extend"], _paged("k_buffer", a["k_buffer"]),
          _paged("v_buffer", a["v_buffer"]), indptr, bt, prefix, out=a["o_extend"],
          sm_scale=a["sm_scale"], softcap=float(a["logit_cap"]),
          window_left=_window_left("new" if new else "classic", "sliding_window_size",
                                   a["sliding_window_size"]),
          sinks=_sinks(a["sinks"]), k_new=a["k_extend"], v_new=a["v_extend"], tree_mask=tm)
