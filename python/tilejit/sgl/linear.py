"""sgl-kernel's linear ops on tilejit.gemm: weight_packed_linear (bf16),
bmm_cpu (tilejit.gemm_batched),
the W8A8 int8 ops (int8_scaled_mm_with_quant, int8_scaled_mm_cpu,
per_token_quant_int8_cpu) and the block-fp8 W8A16 op (fp8_scaled_mm_cpu)."""

import operator

import torch

import tilejit
from tilejit import Error

from ._common import _core, _flag, _is_int, _need, _no_f16, _opt_tensor, _tensor
from .packed_weight import PackedWeight


def _flatten_rows(mat1):
    """mat1 as a 2-D [M, K] tensor with K stride 1 (leading dims flattened,
    as sgl-kernel's linear ops do), and the leading shape, for
    :func:`_unflatten_rows` to give the output."""
    x = mat1.reshape(-1, mat1.shape[-1]) if mat1.dim() != 2 else mat1
    if x.shape[-1] > 0 and x.stride(-1) != 1:
        x = x.contiguous()
    return x, mat1.shape[:-1]


def _unflatten_rows(out, lead):
    """out [M, N] as [*lead, N]: the output has mat1's leading dims."""
    return out.reshape(*lead, out.shape[-1]) if len(lead) != 1 else out


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
    op = "weight_packed_linear"
    _tensor("mat1", mat1, op)
    _opt_tensor("bias", bias, op)
    _flag(op, "is_vnni", is_vnni)
    _no_f16(op, mat1=mat1, mat2=getattr(mat2, "weight", mat2))
    _need(mat1.dtype == torch.bfloat16, f"{op}: mat1.dtype={mat1.dtype}; allowed: torch.bfloat16")
    if isinstance(mat2, PackedWeight):
        w = mat2.linear()
    elif isinstance(mat2, tilejit.PackedWeight):
        w = mat2
    else:
        _tensor("mat2", mat2, op)
        w = tilejit.pack_weight(mat2)
    x, lead = _flatten_rows(mat1)
    out = torch.empty((x.shape[0], w.n), dtype=torch.bfloat16)
    _core(op, "tilejit.gemm's x is mat1, w is mat2", tilejit.gemm, x, w, out=out, bias=bias)
    return _unflatten_rows(out, lead)


# torch 1.13 has no float8: fp8 weights are uint8 e4m3 codes; a newer torch's
# float8_e4m3fn tensor is read as its codes (a view, no copy).
_F8E4M3 = getattr(torch, "float8_e4m3fn", None)
_OUT_DTYPES = {torch.bfloat16: "bf16", torch.float32: "f32"}


def bmm_cpu(out, mat1, mat2, is_vnni=True, scale=None):
    """sgl-kernel ``bmm_cpu(out, mat1, mat2, is_vnni, scale)``: ``out[b] =
    mat1[b] @ mat2[b].T`` for each of B entries, written into ``out`` (the
    absorbed MLA of sglang's DeepSeek path: per head, ``q_nope`` times
    ``w_kc``, the attention output times ``w_vc``).

    mat1: bf16 [B, M, K], any strides with K stride 1 (``q.transpose(0, 1)``
    as sglang passes it); mat2: what :func:`convert_weight_packed` returned for
    a bf16 [B, N, K] weight (packed once, at the first call), or
    (``is_vnni=False``) a plain bf16 [B, N, K] tensor, packed for this call
    only; out: bf16 [B, M, N], any strides with N stride 1, written in place.
    One ``tilejit.gemm_batched`` call (one pass over the thread pool).
    Differences: ``scale`` (sgl-kernel's fp8 w_kc / w_vc) is refused: pass
    bf16 weights; any N and K (sgl-kernel: multiples of its block sizes);
    f16 is a tilejit.Error.
    """
    op = "bmm_cpu"
    for arg, t in (("out", out), ("mat1", mat1)):
        _tensor(arg, t, op)
    _flag(op, "is_vnni", is_vnni)
    _no_f16(op, out=out, mat1=mat1, mat2=getattr(mat2, "weight", mat2))
    _need(scale is None, f"{op}: scale is given (sgl-kernel's fp8 mat2); allowed: None, with a "
          "bf16 mat2 (dequantize fp8 w_kc / w_vc to bf16 once at load)")
    _need(mat1.dtype == torch.bfloat16 and out.dtype == torch.bfloat16,
          f"{op}: mat1.dtype={mat1.dtype}, out.dtype={out.dtype}; allowed: torch.bfloat16")
    _need(mat1.dim() == 3, f"{op}: mat1 has shape {tuple(mat1.shape)}; allowed: [B, M, K]")
    if isinstance(mat2, PackedWeight):
        w = mat2.batched()
    else:
        _tensor("mat2", mat2, op)
        _need(mat2.dim() == 3 and mat2.dtype == torch.bfloat16,
              f"{op}: mat2 has shape {tuple(mat2.shape)} and dtype {mat2.dtype}; allowed: "
              "bf16 [B, N, K], or convert_weight_packed of one")
        w = [tilejit.pack_weight(mat2[b]) for b in range(mat2.shape[0])]
    _core(op, "tilejit.gemm_batched's x is mat1, w is mat2, y is out", tilejit.gemm_batched,
          mat1, w, out=out)
    return out


def _fp8_codes(t):
    return t.view(torch.uint8) if _F8E4M3 is not None and t.dtype == _F8E4M3 else t


def _out_dtype(op, v):
    ok = isinstance(v, torch.dtype) and v in _OUT_DTYPES
    _need(ok, f"{op}: out_dtype={v!r}; allowed: torch.bfloat16, torch.float32")
    return v


def _mat1(op, mat1, dtypes=(torch.bfloat16,)):
    """mat1 checked (a tensor, dtype, 2 dims or more) and flattened by
    :func:`_flatten_rows`: (x [M, K], leading shape)."""
    _tensor("mat1", mat1, op)
    _no_f16(op, mat1=mat1)
    _need(mat1.dtype in dtypes, f"{op}: mat1.dtype={mat1.dtype}; allowed: "
          + ", ".join(str(d) for d in dtypes))
    _need(mat1.dim() >= 2, f"{op}: mat1 has shape {tuple(mat1.shape)}; allowed: [M, K] "
          "(more leading dims are flattened)")
    return _flatten_rows(mat1)


def _weight2d(op, mat2, is_vnni, dtype, k, what):
    """(holder or None, the weight tensor [N, K]) of a quantized linear call,
    checked: is_vnni a bool (each quantized op passes its own here), dtype,
    2-D, K equal to mat1's."""
    _flag(op, "is_vnni", is_vnni)
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
    _tensor(arg, s, op)
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
    _opt_tensor("bias", bias, op)
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
    return _unflatten_rows(out, lead)


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
    _tensor("mat1", mat1, op)
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
    return _unflatten_rows(out, lead)


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
    _tensor("A", A, op)
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
    return _unflatten_rows(out, lead)
