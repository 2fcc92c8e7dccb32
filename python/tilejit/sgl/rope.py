"""sgl-kernel's RoPE ops on tilejit.rope: rotary_embedding_cpu,
multimodal_rotary_embedding_cpu (M-RoPE), apply_multidimensional_rope_cpu
(2-D vision RoPE). The rotation is in place where sgl-kernel's is, so
those inputs are viewed as [T, H, D], never copied."""

import operator

import torch

import tilejit

from ._common import _core, _flag, _is_int, _need, _no_f16, _tensor


def _in_place_view(op, arg, x, shape):
    """x.view(shape), or a tilejit.Error naming arg where its strides do not
    allow one: the rotation is in place, so a copy would not be written back."""
    try:
        return x.view(shape)
    except RuntimeError:
        _need(False, f"{op}: {arg} has shape {tuple(x.shape)} and strides {x.stride()}, which "
              f"cannot be viewed as {tuple(shape)} (rotated in place: no copy); allowed: tokens "
              "one row stride apart, each head's elements contiguous")


def _heads(op, arg, x, head_size):
    """x as a [T, H, D] view (no copy): 2-D [T, H*D], 3-D [T, H, D] or 4-D
    [B, S, H, D]. Every message starts with op, as the other tilejit.sgl
    ops' do (these checks run before any of the op's own)."""
    _tensor(arg, x, op)
    # An int: a float would pass the modulo below and fail in view() as a TypeError.
    _need(_is_int(head_size) and head_size > 0, f"{op}: head_size={head_size!r}; allowed: "
          "an int > 0")
    if x.dim() == 2:
        _need(x.shape[1] % head_size == 0, f"{op}: {arg} has shape {tuple(x.shape)}; allowed: "
              f"[T, H * head_size] with head_size={head_size}")
        return _in_place_view(op, arg, x, (x.shape[0], x.shape[1] // head_size, head_size))
    if x.dim() == 4:
        return _in_place_view(op, arg, x, (-1, x.shape[2], x.shape[3]))
    _need(x.dim() == 3, f"{op}: {arg} has {x.dim()} dims (shape {tuple(x.shape)}); allowed: "
          "2, 3, 4")
    return x


def _cache(op, cos_sin_cache):
    """cos_sin_cache, checked 2-D: its shape[1] is the rotary dim (a 1-D cache
    would be an IndexError there, not a tilejit.Error)."""
    _tensor("cos_sin_cache", cos_sin_cache, op)
    _need(cos_sin_cache.dim() == 2, f"{op}: cos_sin_cache has shape "
          f"{tuple(cos_sin_cache.shape)}; allowed: [max_position, rotary_dim]")
    return cos_sin_cache


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
    op = "rotary_embedding_cpu"
    q = _heads(op, "query", query, head_size)
    k = _heads(op, "key", key, head_size)
    _tensor("positions", positions, op)
    _cache(op, cos_sin_cache)
    _flag(op, "is_neox", is_neox)
    _no_f16(op, query=query, key=key, cos_sin_cache=cos_sin_cache)
    if query.dim() == 3:
        q, k = q.clone(), k.clone()
    _core(op, _ROPE_NOTE, tilejit.rope, q, k, positions.reshape(-1),
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
    op = "multimodal_rotary_embedding_cpu"
    q = _heads(op, "query", query, head_size)
    k = _heads(op, "key", key, head_size)
    _tensor("positions", positions, op)
    _cache(op, cos_sin_cache)
    _flag(op, "mrope_interleaved", mrope_interleaved)
    _flag(op, "is_neox", is_neox)
    _no_f16(op, query=query, key=key, cos_sin_cache=cos_sin_cache)
    style = "neox" if is_neox else "gptj"
    rd = cos_sin_cache.shape[1]
    if positions.dim() == 1:
        _core(op, _ROPE_NOTE, tilejit.rope, q, k, positions, cos_sin_cache, style=style,
              rotary_dim=rd)
    else:
        _need(mrope_section is not None, f"{op}: positions has shape "
              f"{tuple(positions.shape)} and mrope_section=None; allowed: a section list "
              "with 2-D positions")
        # A list of ints (sglang's rope_scaling["mrope_section"]), each an int itself:
        # int() cut 2.5 to 2 and read "2" as 2, True as 1.
        try:
            sections = list(mrope_section)
        except TypeError:  # not iterable (an int)
            sections = None
        _need(sections is not None and all(map(_is_int, sections)),
              f"{op}: mrope_section={mrope_section!r}; allowed: a list of ints (frequency "
              "counts per position row)")
        sections = [operator.index(s) for s in sections]
        _core(op, _ROPE_NOTE, tilejit.rope, q, k, positions, cos_sin_cache, style=style,
              rotary_dim=rd, mrope_section=sections, mrope_interleaved=mrope_interleaved)
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
    op = "apply_multidimensional_rope_cpu"
    q = _tensor("query", query, op)
    k = _tensor("key", key, op)
    _no_f16(op, query=query, key=key)
    _need(q.dim() == 3 and k.dim() == 3, f"{op}: query {tuple(q.shape)}, key "
          f"{tuple(k.shape)}; allowed: [T, H, D] each")
    t, _, d = q.shape
    _need(d % 4 == 0, f"{op}: head_dim={d}; allowed: a multiple of 4 (two chunks of even "
          "width)")
    for name, x in (("cos", cos), ("sin", sin)):
        _tensor(name, x, op)
        _need(tuple(x.shape) == (t, d), f"{op}: {name} has shape {tuple(x.shape)}; allowed: "
              f"[T, D] = [{t}, {d}]")
    c, h = d // 2, d // 4
    # One cache row per (chunk, token): cos of the chunk's first half, then sin.
    cs = torch.empty((2, t, c), dtype=torch.float32)
    for ch in range(2):
        for half, src, name in ((0, cos, "cos"), (1, sin, "sin")):
            part = src[:, ch * c:(ch + 1) * c]
            _need(torch.equal(part[:, :h], part[:, h:]),
                  f"{op}: {name}[:, {ch * c}:{(ch + 1) * c}] does not repeat its first half "
                  f"({h} values) in its second; allowed: the cat(freqs, freqs) tables of a "
                  "rotary embedding")
            cs[ch, :, half * h:(half + 1) * h] = part[:, :h]
    pos = torch.arange(2 * t, dtype=torch.int32).view(2, t)
    # Through _core: the core's checks (key's shape against query's) carry the op's name too.
    _core(op, "tilejit.rope's q / k are query / key; its cos_sin_cache is built here from cos "
          "/ sin", tilejit.rope, q, k, pos, cs.view(2 * t, c), style="neox", rotary_dim=d, ndim=2)
    return query, key
