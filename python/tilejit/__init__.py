"""tilejit: JIT-compiled CPU kernels for LLM inference, on any DLPack tensor.

Every operator takes torch tensors, numpy arrays or any other object with
``__dlpack__`` zero-copy (strides honoured) and writes into the caller's
output when one is given. With ``out=None`` the output is allocated and
returned as the caller's kind: a torch tensor when the first tensor argument
is one, a numpy array when it is one (bf16 as uint16: numpy has no
bfloat16), else a ``tilejit.Buffer`` (which speaks DLPack). numpy bf16 data
is passed as uint16 arrays with ``dtype="bf16"``; uint8 KV caches and fp8
weights hold e4m3 codes (a KV cache e5m2 codes with ``cache_dtype="f8e5m2"``).
See docs/python.md.

Neither torch nor numpy is imported here: the kind of a tensor is checked
only against modules the caller has already imported.
"""

import sys as _sys


def _refuse_subinterpreter():
    # pybind11 extensions do not support subinterpreters: a first import of
    # _core in one hung in pybind11's PyGILState_Ensure (and one after the
    # main interpreter's shares its state with it unguarded). An ImportError
    # instead.
    try:
        import _xxsubinterpreters as _subs
    except ImportError:
        return
    if _subs.get_current() != _subs.get_main():
        raise ImportError("tilejit cannot be imported in a Python subinterpreter (its pybind11 "
                          "extension supports the main interpreter only)")


_refuse_subinterpreter()

from . import _core  # noqa: E402
from ._core import (  # noqa: E402
    Buffer,
    Error,
    InternalError,
    PackedExperts,
    PackedWeight,
    __version__,
    batch_invariant,
    cache_stats,
    cpu_info,
    load_tuning_db,
    num_threads,
    set_batch_invariant,
    set_num_threads,
)

__all__ = [
    "Buffer", "Error", "InternalError", "PackedExperts", "PackedWeight", "__version__",
    "cache_stats", "cpu_info", "load_tuning_db", "num_threads", "set_num_threads",
    "set_batch_invariant", "batch_invariant",
    "pack_weight", "pack_int8", "pack_fp8", "pack_int4", "pack_mxfp4", "gemm", "gemm_batched",
    "flash_attn_varlen", "decode_attention", "extend_attention", "store_kv", "rope",
    "pack_experts", "pack_experts_int8", "pack_experts_fp8", "pack_experts_int4",
    "pack_experts_mxfp4", "fused_experts", "topk_softmax", "topk_sigmoid", "grouped_topk",
    "rms_norm", "fused_add_rms_norm", "layer_norm", "fused_add_layer_norm", "rms_norm_gated",
    "act_and_mul",
]

# ---- Output allocation ------------------------------------------------------

# tilejit dtype names (dtype_name() in C++) -> torch / numpy dtype attribute
# names. numpy's bf16 is uint16 (the call then passes dtype="bf16"); the
# fp8 codes are bytes in both (torch 1.13 has no float8).
_TORCH_NAMES = {"f32": "float32", "bf16": "bfloat16", "f16": "float16", "i8": "int8",
                "u8": "uint8", "f8e4m3": "uint8", "f8e5m2": "uint8", "i32": "int32",
                "i64": "int64"}
_NUMPY_NAMES = dict(_TORCH_NAMES, bf16="uint16")


def _kind(t):
    """'torch', 'numpy' or None (anything else that speaks DLPack)."""
    torch = _sys.modules.get("torch")
    if torch is not None and isinstance(t, torch.Tensor):
        return "torch"
    np = _sys.modules.get("numpy")
    if np is not None and isinstance(t, np.ndarray):
        return "numpy"
    return None


def _check_dtype_name(arg, dt):
    if dt not in _TORCH_NAMES:
        raise Error(f"{arg}: {dt!r} is not a tilejit dtype with a tensor type; allowed: "
                    + ", ".join(_TORCH_NAMES))


def _empty(kind, shape, dt, arg="out_dtype"):
    """A new tensor of the kind: (what the call writes into, what it returns).
    The two differ for a numpy bf16 / fp8 output only: the call writes
    through a tilejit.Buffer (typed bf16, so the call's dtype override stays
    the caller's and a uint16 input still needs dtype="bf16") and returns
    the numpy uint16 / uint8 array over the same memory."""
    _check_dtype_name(arg, dt)
    if kind == "torch":
        torch = _sys.modules["torch"]
        t = torch.empty(shape, dtype=getattr(torch, _TORCH_NAMES[dt]))
        return t, t
    if kind == "numpy":
        np = _sys.modules["numpy"]
        if dt in ("bf16", "f8e4m3", "f8e5m2"):
            b = Buffer(list(shape), dt)
            return b, np.asarray(b)
        t = np.empty(shape, dtype=_NUMPY_NAMES[dt])
        return t, t
    b = Buffer(list(shape), dt)
    return b, b


def _new(like, shape, dt):
    return _empty(_kind(like), shape, dt)


def _run_into(allocated, out_arg, out_dtype, call, *args):
    """call(*args); when this layer allocated the output from out_dtype, the
    core's refusal of that output's dtype (which it names by the core's
    argument, e.g. gemm's y) also names out_dtype, the keyword the caller
    set. The core stays the one home of which output dtypes are allowed."""
    try:
        return call(*args)
    except Error as e:
        if allocated and f"{out_arg}.dtype=" in str(e):
            raise Error(f"{e} (the output was allocated from out_dtype={out_dtype!r})") from None
        raise


def _once(t, arg, dtype=None):
    """What a call passes for tensor argument t when the layer reads t too
    (its shape, to size an output; its shape and dtype, for unpack): t for
    None, a torch tensor or a numpy array; else t exported once (a
    tilejit._core._Exported, read by the call and by _describe), so a
    producer's __dlpack__ runs once per tilejit call. What is not a DLPack
    tensor is named by the export, with the call's message."""
    if t is None or _kind(t) is not None or isinstance(t, _core._Exported):
        return t
    return _core._export(t, arg, dtype)


def _once_entries(w, names, dtype=None):
    """pack_experts_*'s list w with each entry's tensors through _once:
    (a, b) pairs named w[e].<names[0]> / w[e].<names[1]>, or dicts (names:
    the tensor keys) named w[e]['key']. Anything else is left as it is,
    for the core's checks to name."""
    if not isinstance(w, (list, tuple)):
        return w
    r = []
    for e, item in enumerate(w):
        if isinstance(item, dict):
            item = {k: _once(v, f"w[{e}]['{k}']", dtype) if k in names else v
                    for k, v in item.items()}
        elif isinstance(item, (list, tuple)) and len(item) == 2:
            item = (_once(item[0], f"w[{e}].{names[0]}", dtype),
                    _once(item[1], f"w[{e}].{names[1]}", dtype))
        r.append(item)
    return r


_MAX_DIM = _core._MAX_DIM  # Limits::max_dim, 2^31 - 1


def _shape(t, arg, ndim, dtype):
    """(shape, t): the shape of a tensor argument, checked to have ndim dims
    (None: any number) before an output is allocated from it, and what the
    call passes for t (_once)."""
    if _kind(t) is None and not isinstance(t, _core._Exported):
        t = _core._export(t, arg, dtype)  # None too: "q: an object of type 'NoneType' ..."
    s = tuple(t.shape)
    if ndim is not None and len(s) != ndim:
        raise Error(f"{arg}: expected {ndim} dims, got shape {s}")
    for i, d in enumerate(s):
        if not 0 <= d <= _MAX_DIM:
            raise Error(f"{arg}: shape {list(s)} has dim {i} = {d}; allowed: dims from 0 to "
                        f"{_MAX_DIM} (2^31 - 1)")
    return s, t


# ---- GEMM and weight packing -------------------------------------------------

def _describe(t, dtype=None):
    return _core._describe(t, dtype)


def _tag(packed, like, src):
    """Remembers what unpack() needs: the caller's tensor kind and the
    shapes / dtypes of the tensors packed."""
    packed._kind = _kind(like)
    packed._src = src
    return packed


def pack_weight(w, dtype=None):
    """Packs a bf16 weight [N, K] (nn.Linear layout; rows may be strided,
    K stride 1) for gemm(). Packing a PackedWeight returns the same data."""
    if isinstance(w, PackedWeight):
        return w
    w = _once(w, "w", dtype)
    return _tag(_core.pack_weight(w, dtype), w, ("bf16", _describe(w, dtype)))


def pack_int8(weight, scales):
    """int8 W8A8: weight int8 [N, K], scales f32 [N] or [1]."""
    weight, scales = _once(weight, "weight"), _once(scales, "scales")
    packed = _core.pack_int8(weight, scales)  # first: its checks name the arguments
    src = {"weight": _describe(weight), "scales": _describe(scales)}
    return _tag(packed, weight, ("int8", src))


def pack_fp8(weight, scales, block_n=0, block_k=0):
    """fp8 e4m3 W8A16: weight uint8 codes, logically [N, K] (any strides),
    scales f32 [1], [N] or block scales [ceil(N/block_n), ceil(K/block_k)]."""
    weight, scales = _once(weight, "weight"), _once(scales, "scales")
    packed = _core.pack_fp8(weight, scales, block_n, block_k)
    src = {"weight": _describe(weight), "scales": _describe(scales),
           "block_n": block_n, "block_k": block_k}
    return _tag(packed, weight, ("fp8", src))


def pack_int4(qweight, scales, qzeros=None, g_idx=None, format="gptq", group_size=128,
              gptq_v2=False, n=0, k=0, dtype=None):
    """int4 W4A16 (GPTQ or AWQ checkpoints); see docs/quantized.md."""
    qweight, scales = _once(qweight, "qweight", dtype), _once(scales, "scales", dtype)
    qzeros, g_idx = _once(qzeros, "qzeros", dtype), _once(g_idx, "g_idx", dtype)
    packed = _core.pack_int4(qweight, scales, qzeros, g_idx, format, group_size, gptq_v2, n, k,
                             dtype)
    src = {"qweight": _describe(qweight), "scales": _describe(scales, dtype),
           "qzeros": None if qzeros is None else _describe(qzeros),
           "g_idx": None if g_idx is None else _describe(g_idx),
           "format": format, "group_size": group_size, "gptq_v2": gptq_v2, "n": n, "k": k}
    return _tag(packed, qweight, ("int4", src))


def pack_mxfp4(blocks, scales, k=0):
    """MXFP4 W4A16: blocks uint8 [N, K/32, 16] or [N, K/2], scales uint8 [N, ceil(K/32)]."""
    blocks, scales = _once(blocks, "blocks"), _once(scales, "scales")
    packed = _core.pack_mxfp4(blocks, scales, k)
    src = {"blocks": _describe(blocks), "scales": _describe(scales), "k": k}
    return _tag(packed, blocks, ("mxfp4", src))


def _alloc_src(kind, desc):
    """(call, returned) tensors like a recorded (shape, dtype); (None, None) for None."""
    if desc is None:
        return None, None
    shape, dt = desc
    return _empty(kind, shape, dt, "unpack")


def _split(pairs):
    """A structure of (call, returned) pairs -> (the calls, the returned)."""
    if isinstance(pairs, dict):
        return ({k: v[0] for k, v in pairs.items()}, {k: v[1] for k, v in pairs.items()})
    return [p[0] for p in pairs], [p[1] for p in pairs]


def _weight_unpack(self, out=None):
    """bf16: the weight [N, K] back, bit for bit (into out, or a new tensor).
    Quantized: a dict of the checkpoint tensors given to the pack call, bit
    for bit (out: a dict of caller-allocated tensors of those shapes)."""
    fmt, src = getattr(self, "_src", (self.format, None))
    kind = getattr(self, "_kind", None)
    if src is None:
        raise Error(f"unpack: this PackedWeight ({self.format}) was not made by a tilejit "
                    "pack_* call, so the shapes of its tensors are unknown")
    if fmt == "bf16":
        call, ret = _alloc_src(kind, src) if out is None else (out, out)
        self._unpack(call, "bf16")  # uint16 can only be bf16 here
        return ret
    if out is None:
        call, ret = _split({name: _alloc_src(kind, d) for name, d in src.items()
                            if isinstance(d, tuple) or d is None})
    else:
        call = ret = out
    if fmt == "int8":
        self._unpack_int8(call["weight"], call["scales"])
    elif fmt == "fp8":
        self._unpack_fp8(call["weight"], call["scales"], src["block_n"], src["block_k"])
    elif fmt == "int4":
        self._unpack_int4(call["qweight"], call["scales"], call.get("qzeros"),
                          call.get("g_idx"), src["format"], src["group_size"], src["gptq_v2"],
                          src["n"], src["k"], "bf16")
    elif fmt == "mxfp4":
        self._unpack_mxfp4(call["blocks"], call["scales"], src["k"])
    return ret


def _weight_dequantize(self, out=None, out_dtype="f32"):
    """The logical weight [N, K] (dequantized codes, rounded once to f32 or bf16)."""
    if out is None:
        call, ret = _empty(getattr(self, "_kind", None), (self.n, self.k), out_dtype)
    else:
        call = ret = out
    _run_into(out is None, "out", out_dtype, self._dequantize, call, "bf16")
    return ret


PackedWeight.unpack = _weight_unpack
PackedWeight.dequantize = _weight_dequantize
# Immutable shared bytes: a copy is the same object.
PackedWeight.__copy__ = lambda self: self
PackedWeight.__deepcopy__ = lambda self, memo: self


def gemm(x, w, out=None, bias=None, act="none", act_quant="dynamic_sym", act_scale=0.0,
         act_zero_point=128, out_dtype="bf16", dtype=None, int4_route="automatic"):
    """out[M, N] = act(x[M, K] @ w.T + bias); x bf16 (K stride 1), out bf16
    or f32 (out_dtype when allocated), bias [N] f32 or bf16. int4 weights:
    int4_route "w4a16" (bf16 x), "w4a8" (x quantized per act_quant) or
    "automatic" (W4A8 on the llvm path from 4 rows on)."""
    allocated = out is None and isinstance(w, PackedWeight)
    if allocated:
        (m, _), x = _shape(x, "x", 2, dtype)
        out, ret = _new(x, (m, w.n), out_dtype)
    else:
        ret = out
    _run_into(allocated, "y", out_dtype, _core.gemm, x, w, out, bias, act, act_quant, act_scale,
              act_zero_point, int4_route, dtype)
    return ret


def gemm_batched(x, w, out=None, bias=None, act="none", act_quant="dynamic_sym", act_scale=0.0,
                 act_zero_point=128, out_dtype="bf16", dtype=None, int4_route="automatic"):
    """out[b] = act(x[b] @ w[b].T + bias) for each of B entries (sgl-kernel's
    bmm_cpu; DeepSeek's absorbed MLA): x [B, M, K] bf16 (any strides, K
    stride 1: a head-major view of [M, B, K] works), w a list of B
    PackedWeight of one shape [N, K], out [B, M, N] bf16 or f32; one pass
    over the thread pool for bf16 weights. The options are gemm's."""
    allocated = out is None
    if allocated:
        (b, m, _), x = _shape(x, "x", 3, dtype)
        if len(w) != b or b == 0:
            raise Error(f"gemm_batched: w holds {len(w)} weights; allowed: one per batch entry "
                        f"of x, B = {b} >= 1 (with out given, B = 0 is a no-op)")
        out, ret = _new(x, (b, m, w[0].n), out_dtype)
    else:
        ret = out
    _run_into(allocated, "y", out_dtype, _core.gemm_batched, x, list(w), out, bias, act,
              act_quant, act_scale, act_zero_point, int4_route, dtype)
    return ret


# ---- Attention ----------------------------------------------------------------
# Shared keywords: causal, sm_scale (None: 1/sqrt(D)), window_left /
# window_right (-1: unbounded), softcap (0: off), sinks and alibi_slopes
# ([Hq] f32). fp8 caches (uint8 e4m3 codes, or e5m2 codes with
# cache_dtype="f8e5m2"): k_scale / v_scale per tensor or k_head_scales /
# v_head_scales [Hkv] f32. See docs/attention.md.

def flash_attn_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, out=None, causal=False, sm_scale=None,
                      window_left=-1, window_right=-1, softcap=0.0, sinks=None, alibi_slopes=None,
                      dtype=None):
    """Prefill over sequences packed along T: q [Tq, Hq, D], k [Tk, Hkv, D],
    v [Tk, Hkv, Dv] bf16, cu_seqlens_* int32 [B+1]; out [Tq, Hq, Dv] bf16."""
    if out is None:
        (t, h, _), q = _shape(q, "q", 3, dtype)
        (_, _, dv), v = _shape(v, "v", 3, dtype)
        out, ret = _new(q, (t, h, dv), "bf16")
    else:
        ret = out
    _core.flash_attn_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, out, causal, sm_scale,
                            window_left, window_right, softcap, sinks, alibi_slopes, dtype)
    return ret


def decode_attention(q, k_cache, v_cache, block_table, seq_lens, out=None, causal=False,
                     sm_scale=None, window_left=-1, window_right=-1, softcap=0.0, sinks=None,
                     alibi_slopes=None, k_scale=1.0, v_scale=1.0, k_head_scales=None,
                     v_head_scales=None, deterministic=False, cache_dtype=None, dtype=None):
    """One new token per sequence over a paged cache: q [B, Hq, D]; caches
    [num_blocks, block_size, Hkv, D / Dv]; block_table int32 [B, max_blocks];
    seq_lens int32 [B]; out [B, Hq, Dv] bf16. deterministic: each sequence's
    output independent of the thread count and of the rest of the batch
    (no split-KV). cache_dtype: what uint8 caches hold, "f8e4m3" (None) or
    "f8e5m2" codes."""
    if out is None:
        (b, h, _), q = _shape(q, "q", 3, dtype)
        (_, _, _, dv), v_cache = _shape(v_cache, "v_cache", 4, dtype)
        out, ret = _new(q, (b, h, dv), "bf16")
    else:
        ret = out
    _core.decode_attention(q, k_cache, v_cache, block_table, seq_lens, out, causal, sm_scale,
                           window_left, window_right, softcap, sinks, alibi_slopes, k_scale,
                           v_scale, k_head_scales, v_head_scales, deterministic, cache_dtype,
                           dtype)
    return ret


def extend_attention(q, k_cache, v_cache, qo_indptr, block_table, prefix_lens, out=None,
                     causal=False, sm_scale=None, window_left=-1, window_right=-1, softcap=0.0,
                     sinks=None, alibi_slopes=None, k_scale=1.0, v_scale=1.0, k_head_scales=None,
                     v_head_scales=None, k_new=None, v_new=None, tree_mask=None,
                     deterministic=False, cache_dtype=None, dtype=None):
    """sglang's extend: new tokens q [T, Hq, D] (qo_indptr int32 [B+1]) over
    their prefix in the paged cache (prefix_lens int32 [B]) and causally over
    each other (k_new / v_new [T, Hkv, D / Dv], or the cache when both are
    None; tree_mask uint8 replaces the causal rule); out [T, Hq, Dv] bf16.
    Causal among the new tokens is implied: causal has no effect here.
    cache_dtype: as decode_attention's."""
    if out is None:
        (t, h, _), q = _shape(q, "q", 3, dtype)
        (_, _, _, dv), v_cache = _shape(v_cache, "v_cache", 4, dtype)
        out, ret = _new(q, (t, h, dv), "bf16")
    else:
        ret = out
    _core.extend_attention(q, k_cache, v_cache, qo_indptr, block_table, prefix_lens, out, causal,
                           sm_scale, window_left, window_right, softcap, sinks, alibi_slopes,
                           k_scale, v_scale, k_head_scales, v_head_scales, k_new, v_new,
                           tree_mask, deterministic, cache_dtype, dtype)
    return ret


def store_kv(k, v, k_cache, v_cache, slot_mapping, k_scale=1.0, v_scale=1.0, k_head_scales=None,
             v_head_scales=None, cache_dtype=None, dtype=None):
    """Writes k [T, Hkv, D], v [T, Hkv, Dv] into the paged caches at
    slot_mapping (int32 / int64 [T], block * block_size + offset; < 0 skips).
    uint8 caches receive fp8 codes of x / scale: e4m3 (cache_dtype None or
    "f8e4m3") or e5m2 (cache_dtype="f8e5m2")."""
    _core.store_kv(k, v, k_cache, v_cache, slot_mapping, k_scale, v_scale, k_head_scales,
                   v_head_scales, cache_dtype, dtype)


# ---- RoPE ---------------------------------------------------------------------

def rope(q, k, positions, cos_sin_cache, style="neox", rotary_dim=0, ndim=1, mrope_section=None,
         dtype=None, mrope_interleaved=False):
    """In place on q [T, Hq, D] and k [T, Hk, D] (k may be None); returns
    (q, k). cos_sin_cache [max_position, W]: cos then sin per row; positions
    int32 / int64 [T] or [streams, T]. mrope_interleaved=True (Qwen3-VL):
    the 3 sections dealt out round-robin. See docs/rope.md."""
    _core.rope(q, k, positions, cos_sin_cache, style, rotary_dim, ndim, mrope_section, dtype,
               mrope_interleaved)
    return q, k


# ---- Row-wise layer ops ---------------------------------------------------------

def _like(x, arg, out_dtype, dtype, halve=False):
    """(out to write, out to return, x as passed, out's dtype): a new tensor
    of x's kind and shape (halve: its last dim halved, act_and_mul's
    gate | up -> out), of out_dtype or else x's dtype."""
    shape, x = _shape(x, arg, None, dtype)
    dt = out_dtype if out_dtype is not None else _describe(x, dtype)[1]
    if halve:
        if not shape or shape[-1] % 2:
            raise Error(f"act_and_mul: {arg} has shape {list(shape)}; allowed: [..., 2*d] "
                        "(gate and up)")
        shape = shape[:-1] + (shape[-1] // 2,)
    out, ret = _new(x, shape, dt)
    return out, ret, x, dt


def _rows_into(x, out, out_dtype, dtype, call, halve=False):
    """call(x, out) for a row-wise op whose out is x's shape (halve: its last
    dim halved), allocated of out_dtype (default: x's dtype) when None;
    returns out."""
    allocated = out is None
    if allocated:
        out, ret, x, out_dtype = _like(x, "x", out_dtype, dtype, halve=halve)
    elif out_dtype is not None:
        raise Error(f"out_dtype={out_dtype!r} with out given; allowed: out_dtype=None (it "
                    "sizes an allocated output only: out's own dtype is the output's)")
    else:
        ret = out
    _run_into(allocated, "out", out_dtype, call, x, out)
    return ret


def rms_norm(x, weight=None, out=None, eps=1e-6, weight_plus_one=False, out_dtype=None,
             dtype=None):
    """out = x * rstd(x) * weight (or (1 + weight): Gemma), rstd =
    1 / sqrt(mean(x^2) + eps) per row of x [..., h] (f32 or bf16); weight
    [h] or None. out may be x (in place); allocated of out_dtype (default:
    x's dtype) when None. See docs/rowwise.md."""
    return _rows_into(x, out, out_dtype, dtype,
                      lambda x, out: _core.rms_norm(x, weight, out, eps, weight_plus_one, dtype))


def fused_add_rms_norm(x, residual, weight=None, out=None, eps=1e-6, weight_plus_one=False,
                       dtype=None):
    """residual = x + residual (in place, rounded to residual's dtype); out =
    rms_norm(residual). out defaults to x (in place, sglang's form); returns
    (out, residual). See docs/rowwise.md."""
    if out is None:
        out = x
    _core.fused_add_rms_norm(x, residual, weight, out, eps, weight_plus_one, dtype)
    return out, residual


def layer_norm(x, weight=None, bias=None, out=None, eps=1e-6, weight_plus_one=False,
               out_dtype=None, dtype=None):
    """out = (x - mean) * rstd * weight + bias, rstd = 1 / sqrt(var + eps)
    (the population variance) per row of x [..., h] (f32 or bf16); weight
    and bias [h] or None. out may be x (in place); allocated of out_dtype
    (default: x's dtype) when None. See docs/rowwise.md."""
    return _rows_into(x, out, out_dtype, dtype, lambda x, out: _core.layer_norm(
        x, weight, bias, out, eps, weight_plus_one, dtype))


def fused_add_layer_norm(x, residual, weight=None, bias=None, out=None, eps=1e-6,
                         weight_plus_one=False, dtype=None):
    """residual = x + residual (in place, rounded to residual's dtype); out =
    layer_norm(residual). out defaults to x (in place); returns (out,
    residual). See docs/rowwise.md."""
    if out is None:
        out = x
    _core.fused_add_layer_norm(x, residual, weight, bias, out, eps, weight_plus_one, dtype)
    return out, residual


def rms_norm_gated(x, gate, weight=None, out=None, eps=1e-6, act="silu", norm_before_gate=True,
                   weight_plus_one=False, out_dtype=None, dtype=None):
    """The gated RMSNorm (FLA's RMSNormGated): out = rms_norm(x) * weight *
    act(gate) (norm_before_gate, Qwen3-Next), or rms_norm(x * act(gate)) *
    weight (Mamba-2); weight_plus_one: (1 + weight). x, gate [..., h];
    allocated of out_dtype (default: x's dtype) when None. See
    docs/rowwise.md."""
    return _rows_into(x, out, out_dtype, dtype, lambda x, out: _core.rms_norm_gated(
        x, gate, weight, out, eps, weight_plus_one, act, norm_before_gate, dtype))


def act_and_mul(x, out=None, act="silu", clamped_swiglu=False, swiglu_alpha=1.702,
                swiglu_limit=7.0, rows="halves", out_dtype=None, dtype=None):
    """out[..., d] = act(gate) * up, x [..., 2d] holding the d gate values
    then the d up values (rows="halves"), or (gate, up) pairs
    ("interleaved"); clamped_swiglu: GPT-OSS's. Allocated of out_dtype
    (default: x's dtype) when None. See docs/rowwise.md."""
    return _rows_into(x, out, out_dtype, dtype, lambda x, out: _core.act_and_mul(
        x, out, act, clamped_swiglu, swiglu_alpha, swiglu_limit, rows, dtype), halve=True)


# ---- Mixture of experts ---------------------------------------------------------

def pack_experts(w, proj="gate_up", glu_rows="halves", dtype=None):
    """bf16 experts: w [E, 2I, H] (gate_up: the I gate rows then the I up
    rows, or interleaved) or [E, H, I] (down). A PackedExperts passes
    through (proj must match)."""
    if isinstance(w, PackedExperts):
        return _core.pack_experts(w, proj, glu_rows, dtype)
    w = _once(w, "w", dtype)
    return _tag(_core.pack_experts(w, proj, glu_rows, dtype), w, ("bf16", _describe(w, dtype)))


def _first(w, key):
    try:
        e = w[0]
        return e[key]
    except (IndexError, KeyError, TypeError):
        return None


def pack_experts_int8(w, proj="gate_up", glu_rows="halves"):
    """w: one (weight int8, scales f32) pair per expert."""
    w = _once_entries(w, ("weight", "scales"))
    packed = _core.pack_experts_int8(w, proj, glu_rows)  # first: its checks name the entries
    src = [(_describe(a), _describe(b)) for a, b in w]
    return _tag(packed, _first(w, 0), ("int8", src))


def pack_experts_fp8(w, block_n=0, block_k=0, proj="gate_up", glu_rows="halves"):
    """w: one (weight uint8 e4m3 codes, scales f32) pair per expert."""
    w = _once_entries(w, ("weight", "scales"))
    packed = _core.pack_experts_fp8(w, block_n, block_k, proj, glu_rows)
    src = [(_describe(a), _describe(b)) for a, b in w]
    return _tag(packed, _first(w, 0), ("fp8", {"list": src, "block_n": block_n,
                                                "block_k": block_k}))


_INT4_KEYS = ("qweight", "scales", "qzeros", "g_idx")


def pack_experts_int4(w, format="gptq", group_size=128, gptq_v2=False, proj="gate_up",
                      glu_rows="halves", dtype=None):
    """w: one dict per expert with qweight, scales and optional qzeros,
    g_idx, n, k (pack_int4's arguments)."""
    w = _once_entries(w, _INT4_KEYS, dtype)
    packed = _core.pack_experts_int4(w, format, group_size, gptq_v2, proj, glu_rows, dtype)
    src = [{key: _describe(d[key], dtype) for key in _INT4_KEYS if d.get(key) is not None}
           for d in w]
    extra = [{key: d[key] for key in ("n", "k") if key in d} for d in w]
    return _tag(packed, _first(w, "qweight"),
                ("int4", {"list": src, "extra": extra, "format": format,
                          "group_size": group_size, "gptq_v2": gptq_v2}))


def pack_experts_mxfp4(w, k=0, proj="gate_up", glu_rows="halves"):
    """w: one (blocks uint8, scales uint8) pair per expert (GPT-OSS: gate_up
    with glu_rows="interleaved")."""
    w = _once_entries(w, ("blocks", "scales"))
    packed = _core.pack_experts_mxfp4(w, k, proj, glu_rows)
    src = [(_describe(a), _describe(b)) for a, b in w]
    return _tag(packed, _first(w, 0), ("mxfp4", {"list": src, "k": k}))


def _experts_unpack(self, out=None):
    """bf16: the [E, 2I, H] / [E, H, I] tensor back. Quantized: the list of
    per-expert checkpoint tensors (pairs, or dicts for int4), bit for bit."""
    fmt, src = getattr(self, "_src", (self.format, None))
    kind = getattr(self, "_kind", None)
    if src is None:
        raise Error("unpack: these PackedExperts were not made by a tilejit pack_experts* call, "
                    "so the shapes of their tensors are unknown")
    if fmt == "bf16":
        call, ret = _alloc_src(kind, src) if out is None else (out, out)
        self._unpack(call)
        return ret
    if fmt == "int4":
        if out is None:
            calls, rets = [], []
            for e, x in zip(src["list"], src["extra"]):
                c, r = _split({key: _alloc_src(kind, d) for key, d in e.items()})
                calls.append(dict(c, **x))
                rets.append(dict(r, **x))
        else:
            calls = rets = out
        self._unpack_int4(calls, src["format"], src["group_size"], src["gptq_v2"], "bf16")
        return rets
    pairs = src if fmt == "int8" else src["list"]
    if out is None:
        both = [(_alloc_src(kind, a), _alloc_src(kind, b)) for a, b in pairs]
        calls = [(a[0], b[0]) for a, b in both]
        rets = [(a[1], b[1]) for a, b in both]
    else:
        calls = rets = out
    if fmt == "int8":
        self._unpack_int8(calls)
    elif fmt == "fp8":
        self._unpack_fp8(calls, src["block_n"], src["block_k"])
    else:
        self._unpack_mxfp4(calls, src["k"])
    return rets


def _experts_dequantize(self, out=None, out_dtype="f32"):
    """The logical weights [E, 2I, H] (gate_up) or [E, H, I] (down), f32 or bf16."""
    if out is None:
        rows = 2 * self.n if self.proj == "gate_up" else self.n
        call, ret = _empty(getattr(self, "_kind", None), (self.num_experts, rows, self.k),
                           out_dtype)
    else:
        call = ret = out
    _run_into(out is None, "out", out_dtype, self._dequantize, call, "bf16")
    return ret


PackedExperts.unpack = _experts_unpack
PackedExperts.dequantize = _experts_dequantize
PackedExperts.__copy__ = lambda self: self
PackedExperts.__deepcopy__ = lambda self, memo: self


def fused_experts(hidden, w13, w2, topk_weights, topk_ids, out=None, act="silu",
                  clamped_swiglu=False, swiglu_alpha=1.702, swiglu_limit=7.0, b13=None, b2=None,
                  routed_scaling_factor=1.0, shared_w13=None, shared_w2=None,
                  act_quant="dynamic_sym", out_dtype="bf16", dtype=None, act_scale13=0.0,
                  act_scale2=0.0, act_zero_point13=128, act_zero_point2=128,
                  int4_route="automatic", shared_weights=None):
    """out[T, H] = rsf * sum_j topk_weights[t, j] * expert_j(hidden[t]) +
    s[t] * shared(hidden[t]), s = shared_weights (f32 or bf16 [T], e.g. Qwen2-MoE's
    sigmoid(shared_expert_gate(hidden)); absent: 1); hidden bf16 [T, H], topk_weights f32 or
    bf16 [T, k], topk_ids int32 or int64 [T, k]. int8 experts with act_quant="fixed": static
    per-tensor scales / zero points of w13's and w2's inputs (act_scale13,
    act_zero_point13; act_scale2, act_zero_point2). int4 experts:
    int4_route "w4a16" (bf16 inputs), "w4a8" (inputs quantized per
    act_quant) or "automatic" (per expert by the rows routed to it, as
    gemm's rule takes M). See docs/moe.md."""
    allocated = out is None
    if allocated:
        shape, hidden = _shape(hidden, "hidden", 2, dtype)
        out, ret = _new(hidden, shape, out_dtype)
    else:
        ret = out
    _run_into(allocated, "out", out_dtype, _core.fused_experts, hidden, w13, w2, topk_weights,
              topk_ids, out, act, clamped_swiglu, swiglu_alpha, swiglu_limit, b13, b2,
              routed_scaling_factor, shared_w13, shared_w2, act_quant, dtype, act_scale13,
              act_scale2, act_zero_point13, act_zero_point2, int4_route, shared_weights)
    return ret


def topk_softmax(logits, topk_weights, topk_ids, renormalize=True, dtype=None):
    """softmax over the E experts of logits [T, E], then the k best
    (k = topk_weights.shape[1]) into topk_weights f32 / topk_ids int32 [T, k]."""
    _core.topk_softmax(logits, topk_weights, topk_ids, renormalize, dtype)
    return topk_weights, topk_ids


def topk_sigmoid(logits, topk_weights, topk_ids, renormalize=True, dtype=None):
    """sigmoid per expert, then the k best (as topk_softmax)."""
    _core.topk_sigmoid(logits, topk_weights, topk_ids, renormalize, dtype)
    return topk_weights, topk_ids


def grouped_topk(logits, topk_weights, topk_ids, score="sigmoid", num_expert_group=1,
                 topk_group=1, renormalize=True, routed_scaling_factor=1.0, correction_bias=None,
                 dtype=None):
    """DeepSeek's grouped top-k (correction_bias [E] f32: DeepSeek-V3)."""
    _core.grouped_topk(logits, topk_weights, topk_ids, score, num_expert_group, topk_group,
                       renormalize, routed_scaling_factor, correction_bias, dtype)
    return topk_weights, topk_ids
