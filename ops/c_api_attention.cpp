// The C API's attention, store_kv and RoPE (include/tilejit/tilejit_c.h).
#include "ops/c_api_support.h"

using namespace tilejit;
using namespace tilejit::c_api;

namespace {

AttentionOptions attention_options(const tilejit_attention_options* opt) {
  AttentionOptions o;
  const auto c =
      options(opt, "opt", "tilejit_attention_options_init", tilejit_attention_options_init);
  if (!c) return o;
  o.causal = c->causal;
  if (c->has_sm_scale) o.sm_scale = c->sm_scale;
  o.window_left = c->window_left;
  o.window_right = c->window_right;
  o.softcap = c->softcap;
  o.sinks = optional_view(c->sinks, "opt.sinks");
  o.alibi_slopes = optional_view(c->alibi_slopes, "opt.alibi_slopes");
  o.kv_scales = kv_scales(c->kv_scales);
  return o;
}

}  // namespace

extern "C" {

void tilejit_attention_options_init(tilejit_attention_options* opt) {
  if (opt == nullptr) return;
  const AttentionOptions d;
  *opt = tilejit_attention_options{};
  opt->struct_size = sizeof *opt;
  opt->causal = d.causal;
  opt->window_left = d.window_left;
  opt->window_right = d.window_right;
  opt->softcap = d.softcap;
  opt->kv_scales.k_scale = d.kv_scales.k_scale;
  opt->kv_scales.v_scale = d.kv_scales.v_scale;
}

void tilejit_extend_options_init(tilejit_extend_options* opt) {
  if (opt == nullptr) return;
  *opt = tilejit_extend_options{};
  opt->struct_size = sizeof *opt;
  opt->deterministic = ExtendOptions{}.deterministic;
}

tilejit_status tilejit_flash_attn_varlen(const tilejit_tensor* q, const tilejit_tensor* k,
                                         const tilejit_tensor* v, const tilejit_tensor* out,
                                         const tilejit_tensor* cu_seqlens_q,
                                         const tilejit_tensor* cu_seqlens_k,
                                         const tilejit_attention_options* opt) {
  return call(__func__, [&] {
    flash_attn_varlen(view(q, "q"), view(k, "k"), view(v, "v"), view(out, "out"),
                      view(cu_seqlens_q, "cu_seqlens_q"), view(cu_seqlens_k, "cu_seqlens_k"),
                      attention_options(opt));
  });
}

void tilejit_decode_options_init(tilejit_decode_options* opt) {
  if (opt == nullptr) return;
  *opt = tilejit_decode_options{};
  opt->struct_size = sizeof *opt;
  opt->deterministic = DecodeOptions{}.deterministic;
}

namespace {
void decode_call(const tilejit_tensor* q, const tilejit_tensor* k_cache,
                 const tilejit_tensor* v_cache, const tilejit_tensor* out,
                 const tilejit_tensor* block_table, const tilejit_tensor* seq_lens,
                 const tilejit_attention_options* opt, const tilejit_decode_options* dec) {
  DecodeOptions d;
  if (const auto c =
          options(dec, "dec", "tilejit_decode_options_init", tilejit_decode_options_init))
    d.deterministic = c->deterministic;
  decode_attention(view(q, "q"), view(k_cache, "k_cache"), view(v_cache, "v_cache"),
                   view(out, "out"), view(block_table, "block_table"), view(seq_lens, "seq_lens"),
                   attention_options(opt), d);
}
}  // namespace

tilejit_status tilejit_decode_attention(const tilejit_tensor* q, const tilejit_tensor* k_cache,
                                        const tilejit_tensor* v_cache, const tilejit_tensor* out,
                                        const tilejit_tensor* block_table,
                                        const tilejit_tensor* seq_lens,
                                        const tilejit_attention_options* opt) {
  return call(__func__,
              [&] { decode_call(q, k_cache, v_cache, out, block_table, seq_lens, opt, nullptr); });
}

tilejit_status tilejit_decode_attention_ex(const tilejit_tensor* q, const tilejit_tensor* k_cache,
                                           const tilejit_tensor* v_cache, const tilejit_tensor* out,
                                           const tilejit_tensor* block_table,
                                           const tilejit_tensor* seq_lens,
                                           const tilejit_attention_options* opt,
                                           const tilejit_decode_options* dec) {
  return call(__func__,
              [&] { decode_call(q, k_cache, v_cache, out, block_table, seq_lens, opt, dec); });
}

tilejit_status tilejit_extend_attention(const tilejit_tensor* q, const tilejit_tensor* k_cache,
                                        const tilejit_tensor* v_cache, const tilejit_tensor* out,
                                        const tilejit_tensor* qo_indptr,
                                        const tilejit_tensor* block_table,
                                        const tilejit_tensor* prefix_lens,
                                        const tilejit_attention_options* opt,
                                        const tilejit_extend_options* ext) {
  return call(__func__, [&] {
    ExtendOptions e;
    if (const auto c =
            options(ext, "ext", "tilejit_extend_options_init", tilejit_extend_options_init)) {
      e.k_new = optional_view(c->k_new, "ext.k_new");
      e.v_new = optional_view(c->v_new, "ext.v_new");
      e.tree_mask = optional_view(c->tree_mask, "ext.tree_mask");
      e.deterministic = c->deterministic;
    }
    extend_attention(view(q, "q"), view(k_cache, "k_cache"), view(v_cache, "v_cache"),
                     view(out, "out"), view(qo_indptr, "qo_indptr"),
                     view(block_table, "block_table"), view(prefix_lens, "prefix_lens"),
                     attention_options(opt), e);
  });
}

tilejit_status tilejit_store_kv(const tilejit_tensor* k, const tilejit_tensor* v,
                                const tilejit_tensor* k_cache, const tilejit_tensor* v_cache,
                                const tilejit_tensor* slot_mapping,
                                const tilejit_kv_cache_scales* scales) {
  return call(__func__, [&] {
    store_kv(view(k, "k"), view(v, "v"), view(k_cache, "k_cache"), view(v_cache, "v_cache"),
             view(slot_mapping, "slot_mapping"),
             scales != nullptr ? kv_scales(*scales) : KvCacheScales{});
  });
}

void tilejit_rope_options_init(tilejit_rope_options* opt) {
  if (opt == nullptr) return;
  const RopeOptions d;
  *opt = tilejit_rope_options{};
  opt->struct_size = sizeof *opt;
  opt->style = static_cast<tilejit_rope_style>(d.style);
  opt->rotary_dim = d.rotary_dim;
  opt->ndim = d.ndim;
  opt->mrope_interleaved = d.mrope_interleaved;
}

tilejit_status tilejit_rope(const tilejit_tensor* q, const tilejit_tensor* k,
                            const tilejit_tensor* positions, const tilejit_tensor* cos_sin_cache,
                            const tilejit_rope_options* opt) {
  return call(__func__, [&] {
    RopeOptions o;
    if (const auto c =
            options(opt, "opt", "tilejit_rope_options_init", tilejit_rope_options_init)) {
      o.style = to_enum<RopeStyle>(c->style);
      o.rotary_dim = c->rotary_dim;
      o.ndim = c->ndim;
      // A section count is a handful (3 for t/h/w); more than a head's
      // frequencies cannot be valid and would only be read for nothing.
      if (c->mrope_section_count < 0 || c->mrope_section_count > Limits::max_head_dim)
        throw CArgError("opt.mrope_section_count = " + std::to_string(c->mrope_section_count) +
                        "; allowed: 0.." + std::to_string(Limits::max_head_dim));
      if (c->mrope_section_count > 0) {
        deref(c->mrope_section, "opt.mrope_section");
        o.mrope_section.assign(c->mrope_section, c->mrope_section + c->mrope_section_count);
      }
      o.mrope_interleaved = c->mrope_interleaved;
    }
    const std::optional<TensorView> kv = optional_view(k, "k");
    rope(view(q, "q"), kv ? &*kv : nullptr, view(positions, "positions"),
         view(cos_sin_cache, "cos_sin_cache"), o);
  });
}

}  // extern "C"
