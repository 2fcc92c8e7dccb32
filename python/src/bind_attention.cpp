// flash_attn_varlen, decode_attention, extend_attention, store_kv.
#include <fmt/format.h>
#include <pybind11/pybind11.h>

#include <optional>
#include <string>
#include <string_view>

#include "bind.h"

namespace py = pybind11;

namespace tilejit::python {
namespace {

// The keyword arguments every attention call shares, with the tensors they
// borrow.
struct AttentionArgs {
  std::optional<DlpackTensor> sinks, alibi, k_head_scales, v_head_scales;
  AttentionOptions opt;
};

void scale_args(AttentionArgs& a, float k_scale, float v_scale, const py::handle& k_head_scales,
                const py::handle& v_head_scales, StorageAs as) {
  a.opt.kv_scales.k_scale = k_scale;
  a.opt.kv_scales.v_scale = v_scale;
  a.k_head_scales = optional_tensor(k_head_scales, "k_head_scales", as);
  a.v_head_scales = optional_tensor(v_head_scales, "v_head_scales", as);
  a.opt.kv_scales.k_head_scales = view_of(a.k_head_scales);
  a.opt.kv_scales.v_head_scales = view_of(a.v_head_scales);
}

void attention_args(AttentionArgs& a, bool causal, const py::handle& sm_scale,
                    const py::handle& window_left, const py::handle& window_right, float softcap,
                    const py::handle& sinks, const py::handle& alibi_slopes, StorageAs as) {
  a.opt.causal = causal;
  if (!sm_scale.is_none()) {
    try {
      a.opt.sm_scale = sm_scale.cast<float>();
    } catch (const py::cast_error&) {
      throw Error("sm_scale: expected None or a float, got " +
                  py::repr(sm_scale).cast<std::string>());
    }
  }
  a.opt.window_left = int_arg<int>(window_left, "window_left");
  a.opt.window_right = int_arg<int>(window_right, "window_right");
  a.opt.softcap = softcap;
  a.sinks = optional_tensor(sinks, "sinks", as);
  a.alibi = optional_tensor(alibi_slopes, "alibi_slopes", as);
  a.opt.sinks = view_of(a.sinks);
  a.opt.alibi_slopes = view_of(a.alibi);
}

// The fp8 codes a uint8 KV cache may hold, by their cache_dtype names.
const EnumTable<DType>& fp8_cache_table() {
  static const EnumTable<DType> t = {{dtype_name(DType::f8e4m3), DType::f8e4m3},
                                     {dtype_name(DType::f8e5m2), DType::f8e5m2}};
  return t;
}

// The error for a refused cache_dtype, shown as `value`. One text for a bad
// string and a value of another type: each built its own list before (the
// string's, parse_enum's, read "allowed: f8e4m3, f8e5m2", without None).
[[noreturn]] void refuse_cache_dtype(const std::string& value) {
  std::string allowed = "None";
  for (const auto& [name, dtype] : fp8_cache_table()) allowed += fmt::format(", \"{}\"", name);
  throw Error(
      fmt::format("cache_dtype: {} is not allowed; allowed: {} (the codes a uint8 KV cache holds)",
                  value, allowed));
}

// The cache_dtype keyword of decode, extend and store_kv: what a uint8 KV
// cache's codes are (torch 1.13 and DLPack 0.6 have no float8). None: e4m3
// codes, as before the keyword.
std::optional<DType> parse_cache_dtype(const py::handle& cache_dtype) {
  if (cache_dtype.is_none()) return std::nullopt;
  if (!py::isinstance<py::str>(cache_dtype))
    refuse_cache_dtype(py::repr(cache_dtype).cast<std::string>());
  const std::string_view name = str_arg(cache_dtype, "cache_dtype");
  for (const auto& [known, dtype] : fp8_cache_table())
    if (known == name) return dtype;
  // Quoted as parse_enum quotes a refused keyword string.
  refuse_cache_dtype(fmt::format("\"{}\"", name));
}

// A KV cache argument: uint8 storage holds e4m3 codes, or the codes
// cache_dtype names.
StorageAs cache_storage(StorageAs as, std::optional<DType> cache_dtype) {
  as.u8_as = cache_dtype.value_or(DType::f8e4m3);
  return as;
}

// A cache converted with cache_storage: cache_dtype names the codes of a
// uint8 cache only (a bf16 cache has its own dtype).
DlpackTensor cache_tensor(const py::handle& obj, const char* arg, StorageAs as,
                          std::optional<DType> cache_dtype) {
  DlpackTensor t(obj, arg, cache_storage(as, cache_dtype));
  if (cache_dtype && t.view().dtype != *cache_dtype)
    throw Error(fmt::format(
        "{}: cache_dtype=\"{}\" with a {} cache; allowed: cache_dtype=None for a cache of its "
        "own dtype (cache_dtype names the codes of a uint8 cache)",
        arg, dtype_name(*cache_dtype), dtype_name(t.view().dtype)));
  return t;
}

// What decode and extend take alike: the options and kv scales, then q and
// the two caches, converted in that order (the first bad argument is the one
// an Error names).
struct PagedCall {
  StorageAs as;
  AttentionArgs a;
  std::optional<DlpackTensor> q, k_cache, v_cache;

  PagedCall(const py::handle& q_obj, const py::handle& k_cache_obj, const py::handle& v_cache_obj,
            bool causal, const py::handle& sm_scale, const py::handle& window_left,
            const py::handle& window_right, float softcap, const py::handle& sinks,
            const py::handle& alibi_slopes, float k_scale, float v_scale,
            const py::handle& k_head_scales, const py::handle& v_head_scales,
            const py::handle& cache_dtype_obj, const py::handle& dtype)
      : as{parse_dtype_override(dtype)} {
    const std::optional<DType> cache_dtype = parse_cache_dtype(cache_dtype_obj);
    attention_args(a, causal, sm_scale, window_left, window_right, softcap, sinks, alibi_slopes,
                   as);
    scale_args(a, k_scale, v_scale, k_head_scales, v_head_scales, as);
    q.emplace(q_obj, "q", as);
    k_cache.emplace(cache_tensor(k_cache_obj, "k_cache", as, cache_dtype));
    v_cache.emplace(cache_tensor(v_cache_obj, "v_cache", as, cache_dtype));
  }
};

}  // namespace

void bind_attention(py::module_& m) {
  m.def("flash_attn_varlen", [](const py::handle& q, const py::handle& k, const py::handle& v,
                                const py::handle& cu_seqlens_q, const py::handle& cu_seqlens_k,
                                const py::handle& out, bool causal, const py::handle& sm_scale,
                                const py::handle& window_left, const py::handle& window_right,
                                float softcap, const py::handle& sinks,
                                const py::handle& alibi_slopes, const py::handle& dtype) {
    const StorageAs as{parse_dtype_override(dtype)};
    AttentionArgs a;
    attention_args(a, causal, sm_scale, window_left, window_right, softcap, sinks, alibi_slopes,
                   as);
    DlpackTensor tq(q, "q", as), tk(k, "k", as), tv(v, "v", as), to(out, "out", as),
        tcq(cu_seqlens_q, "cu_seqlens_q", as), tck(cu_seqlens_k, "cu_seqlens_k", as);
    GilRelease release;
    flash_attn_varlen(tq.view(), tk.view(), tv.view(), to.view(), tcq.view(), tck.view(), a.opt);
  });

  m.def("decode_attention",
        [](const py::handle& q, const py::handle& k_cache, const py::handle& v_cache,
           const py::handle& block_table, const py::handle& seq_lens, const py::handle& out,
           bool causal, const py::handle& sm_scale, const py::handle& window_left,
           const py::handle& window_right, float softcap, const py::handle& sinks,
           const py::handle& alibi_slopes, float k_scale, float v_scale,
           const py::handle& k_head_scales, const py::handle& v_head_scales, bool deterministic,
           const py::handle& cache_dtype, const py::handle& dtype) {
          const PagedCall c(q, k_cache, v_cache, causal, sm_scale, window_left, window_right,
                            softcap, sinks, alibi_slopes, k_scale, v_scale, k_head_scales,
                            v_head_scales, cache_dtype, dtype);
          DlpackTensor tbt(block_table, "block_table", c.as), tsl(seq_lens, "seq_lens", c.as),
              to(out, "out", c.as);
          DecodeOptions dec;
          dec.deterministic = deterministic;
          GilRelease release;
          decode_attention(c.q->view(), c.k_cache->view(), c.v_cache->view(), to.view(), tbt.view(),
                           tsl.view(), c.a.opt, dec);
        });

  m.def(
      "extend_attention",
      [](const py::handle& q, const py::handle& k_cache, const py::handle& v_cache,
         const py::handle& qo_indptr, const py::handle& block_table, const py::handle& prefix_lens,
         const py::handle& out, bool causal, const py::handle& sm_scale,
         const py::handle& window_left, const py::handle& window_right, float softcap,
         const py::handle& sinks, const py::handle& alibi_slopes, float k_scale, float v_scale,
         const py::handle& k_head_scales, const py::handle& v_head_scales, const py::handle& k_new,
         const py::handle& v_new, const py::handle& tree_mask, bool deterministic,
         const py::handle& cache_dtype, const py::handle& dtype) {
        const PagedCall c(q, k_cache, v_cache, causal, sm_scale, window_left, window_right, softcap,
                          sinks, alibi_slopes, k_scale, v_scale, k_head_scales, v_head_scales,
                          cache_dtype, dtype);
        const StorageAs as = c.as;
        DlpackTensor tqo(qo_indptr, "qo_indptr", as), tbt(block_table, "block_table", as),
            tpl(prefix_lens, "prefix_lens", as), to(out, "out", as);
        std::optional<DlpackTensor> tkn = optional_tensor(k_new, "k_new", as),
                                    tvn = optional_tensor(v_new, "v_new", as),
                                    ttm = optional_tensor(tree_mask, "tree_mask", as);
        ExtendOptions ext;
        ext.k_new = view_of(tkn);
        ext.v_new = view_of(tvn);
        ext.tree_mask = view_of(ttm);
        ext.deterministic = deterministic;
        GilRelease release;
        extend_attention(c.q->view(), c.k_cache->view(), c.v_cache->view(), to.view(), tqo.view(),
                         tbt.view(), tpl.view(), c.a.opt, ext);
      });

  m.def("store_kv",
        [](const py::handle& k, const py::handle& v, const py::handle& k_cache,
           const py::handle& v_cache, const py::handle& slot_mapping, float k_scale, float v_scale,
           const py::handle& k_head_scales, const py::handle& v_head_scales,
           const py::handle& cache_dtype_obj, const py::handle& dtype) {
          const StorageAs as{parse_dtype_override(dtype)};
          const std::optional<DType> cache_dtype = parse_cache_dtype(cache_dtype_obj);
          AttentionArgs a;
          scale_args(a, k_scale, v_scale, k_head_scales, v_head_scales, as);
          DlpackTensor tk(k, "k", as), tv(v, "v", as),
              tkc = cache_tensor(k_cache, "k_cache", as, cache_dtype),
              tvc = cache_tensor(v_cache, "v_cache", as, cache_dtype),
              tsm(slot_mapping, "slot_mapping", as);
          GilRelease release;
          store_kv(tk.view(), tv.view(), tkc.view(), tvc.view(), tsm.view(), a.opt.kv_scales);
        });
}

}  // namespace tilejit::python
