"""sgl-kernel's attention ops on tilejit's attention kernels:
flash_attn_varlen_func, decode_attention_cpu and extend_attention_cpu over
sglang's token-granular KV cache (a paged cache of block size 1), with the
sgl-kernel schema versions of decode / extend told apart here."""

import torch

import tilejit

from ._common import _bind, _core, _flag, _i32, _int, _is_bool, _keyword_clues, _need, \
    _no_f16, _opt_tensor, _pick_schema, _positional_clue, _real, _shown, _tensor


def _logit_cap(op, v):
    """tilejit's softcap from the call's logit_cap (sglang: layer.logit_cap, a
    float, 0.0 none). Its range is checked here too, not only by the core,
    so that the message names logit_cap (the core's says softcap)."""
    allowed = "0 (off) or a finite int or float > 0"
    cap = _real(op, "logit_cap", v, allowed)
    _need(cap >= 0, f"{op}: logit_cap={_shown(v)}; allowed: {allowed}")
    return cap


def _sinks(op, sinks):
    return None if sinks is None else _tensor("sinks", sinks, op).to(torch.float32).contiguous()


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
        _tensor(name, t, op)
    _flag(op, "causal", causal)
    _no_f16(op, q=q, k=k, v=v)
    cq, ck = _i32("cu_seqlens_q", cu_seqlens_q, op), _i32("cu_seqlens_k", cu_seqlens_k, op)
    window = _int(op, "sliding_window_size", sliding_window_size)
    kw = dict(sm_scale=sm_scale, softcap=_logit_cap(op, logit_cap), window_left=window,
              sinks=_sinks(op, sinks))
    note = "tilejit.flash_attn_varlen's names are sgl-kernel's"
    lq, lk = cq.tolist(), ck.tolist()
    _need(len(lq) == len(lk), f"{op}: cu_seqlens_q has {len(lq)} entries and cu_seqlens_k "
          f"{len(lk)}; allowed: the same (B + 1)")
    spans = [(lq[b], lq[b + 1], lk[b], lk[b + 1]) for b in range(len(lq) - 1)]
    if not causal or all(q1 - q0 == k1 - k0 for q0, q1, k0, k1 in spans):
        return _core(op, note, tilejit.flash_attn_varlen, q, k, v, cq, ck, causal=causal, **kw)
    _need(window < 0, f"{op}: sliding_window_size={window} with "
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


def _paged(op, arg, buf):
    """sglang's token-granular buffer [num_slots, Hkv, D] as a paged cache of
    block size 1: [num_slots, 1, Hkv, D] (a view)."""
    _tensor(arg, buf, op)
    _need(buf.dim() == 3, f"{op}: {arg} has shape {tuple(buf.shape)}; allowed: [num_slots, Hkv, D]")
    return buf.unsqueeze(1)


def _block_table(op, req_to_token, req_pool_indices, seq_lens, least, least_name=None):
    """The block table of block size 1: req_to_token's rows of the batch,
    cut at the longest sequence, as int32.

    Every seq_lens[b] (int32 / int64, before any int32 cast) is checked here
    to lie in least .. req_to_token.shape[1], least an int or, named
    least_name, a tensor of one bound per request: tilejit's own check sees
    only the cut table (at least one column wide), so it named that width,
    which the sglang caller never chose (seq_lens=[0] read "allowed: 1 ..
    max_blocks·block_size = 1")."""
    _tensor("req_to_token", req_to_token, op)
    _tensor("req_pool_indices", req_pool_indices, op)
    _need(req_to_token.dim() == 2, f"{op}: req_to_token has shape "
          f"{tuple(req_to_token.shape)}; allowed: [max_num_reqs, max_context_len]")
    _need(seq_lens.dim() == 1, f"{op}: seq_lens has shape {tuple(seq_lens.shape)}; allowed: "
          "[B] (one length per request)")
    width = req_to_token.shape[1]
    bad = (seq_lens < least) | (seq_lens > width)
    if bool(bad.any()):
        b = int(bad.nonzero()[0])
        lo = least if least_name is None else f"{least_name}[{b}] = {int(least[b])}"
        _need(False, f"{op}: seq_lens[{b}]={int(seq_lens[b])}; allowed: {lo} .. "
              f"req_to_token.shape[1] = {width}")
    longest = int(seq_lens.max()) if seq_lens.numel() else 0
    idx = req_pool_indices.to(torch.int64)
    if idx.numel():
        lo, hi = int(idx.min()), int(idx.max())
        _need(lo >= 0 and hi < req_to_token.shape[0], f"{op}: req_pool_indices has {lo}..{hi}; "
              f"allowed: [0, {req_to_token.shape[0]})")
    return req_to_token[idx, :max(longest, 1)].to(torch.int32)


def _window_left(op, form, arg, value):
    """tilejit's window_left from the call's sliding_window_size: the classic
    (tilejit) form takes sglang's layer convention already (-1 none, w = keys
    j >= i - w); the newer sgl-kernel forms take sglang's
    ``layer.sliding_window_size + 1``, the number of keys including the
    current one, and <= 0 for no window (decode.cpp / extend.cpp)."""
    w = _int(op, arg, value)
    if form == "classic":
        return w
    return w - 1 if w > 0 else -1


def _no_cross(op, a):
    # False itself, not anything falsy (0, None): the one value taken, so a
    # non-bool is refused as the other bool arguments are (_flag), with this
    # message's allowed value (True is refused too).
    v = a.get("is_cross_attn", False)
    _need(_is_bool(v) and not v, f"{op}: is_cross_attn={_shown(v)}; "
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
_DEC_FORMS = {"classic": _DEC_CLASSIC, "new": _DEC_NEW, "scaled": _DEC_SCALED}


def _decode_form(args, kwargs):
    """(version, argument list) of a decode_attention_cpu call: scaled when
    the 4th argument is not a tensor (k_buf_scale) or a keyword only scaled
    has (k_buffer, k_buf_scale, ...); new when the argument after the head is
    a bool (is_cross_attn, where classic has sliding_window_size) or a
    keyword only new and scaled have (is_cross_attn, encoder_lens); classic
    otherwise. A call mixing versions is an Error (:func:`_pick_schema`)."""
    clues = (_positional_clue(args, 3, lambda v: isinstance(v, torch.Tensor), "a Tensor",
                              ("classic", "new"), ("scaled",))
             + _positional_clue(args, len(_DEC_HEAD), _is_bool, "a bool", ("new", "scaled"),
                                ("classic", "scaled"))
             + _keyword_clues(_DEC_FORMS, kwargs))
    form = _pick_schema("decode_attention_cpu", _DEC_FORMS, clues)
    return form, _DEC_FORMS[form]


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

    A call whose arguments fit no one list (an int 14th argument, classic's
    sliding_window_size, with the keyword encoder_lens; a tensor 4th
    argument with k_buf_scale=) is an Error naming the versions each of
    those arguments fits, not bound to one list by guess.

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
    _tensor("query", query, op)
    _tensor("output", a["output"], op)
    _opt_tensor("key", key, op)
    _opt_tensor("value", value, op)
    _no_f16(op, query=query, k_cache=a["k_cache"], v_cache=a["v_cache"], key=key, value=value)
    kc, vc = _paged(op, "k_cache", a["k_cache"]), _paged(op, "v_cache", a["v_cache"])
    # sglang passes the layer's k_scale / v_scale, None for a bf16 cache.
    k_scale = 1.0 if a["k_scale"] is None else a["k_scale"]
    v_scale = 1.0 if a["v_scale"] is None else a["v_scale"]
    seq_lens = a["seq_lens"]
    lens32 = _i32("seq_lens", seq_lens, op)
    # Before store_kv: a bad seq_lens / req_to_token / logit_cap / window / sinks is an Error
    # with the cache untouched. decode_attention counts the new token, so every length is
    # 1 or more.
    bt = _block_table(op, a["req_to_token"], a["req_pool_indices"], seq_lens, 1)
    cap = _logit_cap(op, a["logit_cap"])
    window = _window_left(op, form, "sliding_window_size", a["sliding_window_size"])
    sinks = _sinks(op, a["sinks"])
    note = ("store_kv's slot_mapping is loc, key / value are key / value, k_cache / v_cache "
            "are k_cache / v_cache as [num_slots, 1, Hkv, D]; decode_attention's block_table "
            "is req_to_token[req_pool_indices], query / out are query / output")
    _need((key is None) == (value is None), f"{op}: key is {'None' if key is None else 'given'}"
          f" and value is {'None' if value is None else 'given'}; allowed: both or neither")
    if key is not None:
        _tensor("loc", loc, op)
        if loc.numel():
            lo, hi = int(loc.min()), int(loc.max())
            _need(lo >= 0 and hi < kc.shape[0], f"{op}: loc has {lo}..{hi}; allowed: "
                  f"[0, {kc.shape[0]}) (k_cache's slots; a negative loc is not a skip here)")
        _core(op, note, tilejit.store_kv, key, value, kc, vc, loc, k_scale=k_scale,
              v_scale=v_scale)
    _core(op, note, tilejit.decode_attention, query, kc, vc, bt, lens32,
          out=a["output"], sm_scale=a["sm_scale"], softcap=cap, window_left=window,
          sinks=sinks, k_scale=k_scale, v_scale=v_scale)


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
_EXT_FORMS = {"classic": _EXT_CLASSIC, "new": _EXT_NEW}


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

    A call mixing the two (an int 15th argument with the keyword
    encoder_lens, a bool 15th with custom_mask=) is an Error naming the
    version each of those arguments fits.

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
    # As decode's classic / new (_decode_form), the bool one place later.
    new = _pick_schema(op, _EXT_FORMS, _positional_clue(
        args, len(_EXT_HEAD), _is_bool, "a bool", ("new",), ("classic",))
        + _keyword_clues(_EXT_FORMS, kwargs)) == "new"
    a = _bind(op, _EXT_FORMS["new" if new else "classic"], _ATT_DEFAULTS, args, kwargs)
    _no_cross(op, a)
    custom_mask, tree_mask = a.get("custom_mask"), a["tree_mask"]
    _need(custom_mask is None or tree_mask is None,
          f"{op}: custom_mask and tree_mask both given; allowed: one")
    for name in ("q_extend", "k_extend", "v_extend", "o_extend"):
        _tensor(name, a[name], op)
    _opt_tensor("custom_mask", custom_mask, op)
    _opt_tensor("tree_mask", tree_mask, op)
    cap = _logit_cap(op, a["logit_cap"])
    window = _window_left(op, "new" if new else "classic", "sliding_window_size",
                          a["sliding_window_size"])
    _no_f16(op, q_extend=a["q_extend"], k_extend=a["k_extend"], v_extend=a["v_extend"],
            k_buffer=a["k_buffer"], v_buffer=a["v_buffer"])
    raw_lens, raw_sl = a["extend_seq_lens"], a["seq_lens"]
    lens = _i32("extend_seq_lens", raw_lens, op)
    start = _i32("extend_start_loc", a["extend_start_loc"], op)
    sl = _i32("seq_lens", raw_sl, op)
    # Same shape before they are compared element-wise (a 1-element one would broadcast).
    _need(lens.dim() == 1 and sl.shape == lens.shape, f"{op}: seq_lens has shape "
          f"{tuple(sl.shape)} and extend_seq_lens {tuple(lens.shape)}; allowed: [B] each (one "
          "length per request)")
    neg = raw_lens < 0
    if bool(neg.any()):
        b = int(neg.nonzero()[0])
        _need(False, f"{op}: extend_seq_lens[{b}]={int(raw_lens[b])}; allowed: >= 0")
    indptr = torch.zeros(lens.numel() + 1, dtype=torch.int32)
    torch.cumsum(lens, 0, out=indptr[1:])
    _need(torch.equal(indptr[:-1], start), f"{op}: extend_start_loc={start.tolist()}; allowed: "
          f"the running sum of extend_seq_lens = {indptr[:-1].tolist()}")
    # seq_lens[b] counts the prefix and the new tokens: from extend_seq_lens[b] (prefix 0)
    # to req_to_token.shape[1], checked on the uncast values (an int64 past int32 would wrap).
    bt = _block_table(op, a["req_to_token"], a["req_pool_indices"], raw_sl, raw_lens,
                      "extend_seq_lens")
    prefix = sl - lens
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
    _core(op, note, tilejit.extend_attention, a["q_extend"],
          _paged(op, "k_buffer", a["k_buffer"]), _paged(op, "v_buffer", a["v_buffer"]), indptr,
          bt, prefix, out=a["o_extend"], sm_scale=a["sm_scale"], softcap=cap, window_left=window,
          sinks=_sinks(op, a["sinks"]), k_new=a["k_extend"], v_new=a["v_extend"], tree_mask=tm)
