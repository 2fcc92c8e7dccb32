// Expert packing (bf16 and the quantized checkpoints), PackedExperts,
// fused_experts and the routers.
#include <fmt/format.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>
#include <vector>

#include "bind.h"

namespace py = pybind11;

namespace tilejit::python {
namespace {

// The borrowed tensors of a list of per-expert checkpoint descriptions.
struct ExpertTensors {
  std::vector<DlpackTensor> held;
  // By value: a later add may move the held tensors.
  TensorView add(const py::handle& obj, const std::string& arg, StorageAs as = {}) {
    held.emplace_back(obj, arg.c_str(), as);
    return held.back().view();
  }
  std::optional<TensorView> add_optional(const py::handle& obj, const std::string& arg,
                                         StorageAs as = {}) {
    if (obj.is_none()) return std::nullopt;
    return add(obj, arg, as);
  }
};

py::sequence list_arg(const py::handle& obj, const char* arg) {
  if (!py::isinstance<py::sequence>(obj) || py::isinstance<py::str>(obj))
    throw Error(fmt::format("{}: expected a list with one entry per expert, got {}", arg,
                            py::repr(obj).cast<std::string>()));
  return py::reinterpret_borrow<py::sequence>(obj);
}

// Entry e of a list of (a, b) pairs.
std::pair<py::object, py::object> pair_at(const py::sequence& list, size_t e, const char* arg,
                                          const char* first, const char* second) {
  py::object item = list[e];
  if (!py::isinstance<py::sequence>(item) || py::len(item) != 2)
    throw Error(fmt::format("{}[{}]: expected a ({}, {}) pair, got {}", arg, e, first, second,
                            py::repr(item).cast<std::string>()));
  py::sequence s = py::reinterpret_borrow<py::sequence>(item);
  return {s[0], s[1]};
}

// pack_weight's per-expert descriptions; `as` for the fp8 codes.
std::vector<Int8Weight> int8_list(const py::handle& obj, ExpertTensors& t) {
  py::sequence list = list_arg(obj, "w");
  std::vector<Int8Weight> r;
  for (size_t e = 0; e < py::len(list); ++e) {
    auto [w, s] = pair_at(list, e, "w", "weight", "scales");
    const std::string p = fmt::format("w[{}].", e);
    r.push_back({t.add(w, p + "weight"), t.add(s, p + "scales")});
  }
  return r;
}

std::vector<Fp8Weight> fp8_list(const py::handle& obj, const py::handle& block_n_arg,
                                const py::handle& block_k_arg, ExpertTensors& t) {
  const int64_t block_n = int_arg<int64_t>(block_n_arg, "block_n");
  const int64_t block_k = int_arg<int64_t>(block_k_arg, "block_k");
  py::sequence list = list_arg(obj, "w");
  std::vector<Fp8Weight> r;
  for (size_t e = 0; e < py::len(list); ++e) {
    auto [w, s] = pair_at(list, e, "w", "weight", "scales");
    const std::string p = fmt::format("w[{}].", e);
    StorageAs codes;
    codes.u8_as = DType::f8e4m3;
    r.push_back({t.add(w, p + "weight", codes), t.add(s, p + "scales"), block_n, block_k});
  }
  return r;
}

std::vector<Int4Weight> int4_list(const py::handle& obj, const py::handle& format,
                                  const py::handle& group_size_arg, bool gptq_v2, StorageAs as,
                                  ExpertTensors& t) {
  const Int4Format f = parse_enum("format", str_arg(format, "format"), int4_format_table());
  const int64_t group_size = int_arg<int64_t>(group_size_arg, "group_size");
  py::sequence list = list_arg(obj, "w");
  std::vector<Int4Weight> r;
  for (size_t e = 0; e < py::len(list); ++e) {
    const DictArg d(list[e], fmt::format("w[{}]", e),
                    {"qweight", "scales", "qzeros", "g_idx", "n", "k"}, {"qweight", "scales"},
                    "a dict with qweight, scales and optional qzeros, g_idx, n, k");
    Int4Weight w;
    w.format = f;
    w.qweight = t.add(d.get("qweight"), d.name("qweight"), as);
    w.scales = t.add(d.get("scales"), d.name("scales"), as);
    w.qzeros = t.add_optional(d.get("qzeros"), d.name("qzeros"), as);
    w.g_idx = t.add_optional(d.get("g_idx"), d.name("g_idx"), as);
    w.group_size = group_size;
    w.gptq_v2 = gptq_v2;
    w.n = d.int_field<int64_t>("n", 0);
    w.k = d.int_field<int64_t>("k", 0);
    r.push_back(std::move(w));
  }
  return r;
}

std::vector<Mxfp4Weight> mxfp4_list(const py::handle& obj, const py::handle& k_arg,
                                    ExpertTensors& t) {
  const int64_t k = int_arg<int64_t>(k_arg, "k");
  py::sequence list = list_arg(obj, "w");
  std::vector<Mxfp4Weight> r;
  for (size_t e = 0; e < py::len(list); ++e) {
    auto [b, s] = pair_at(list, e, "w", "blocks", "scales");
    const std::string p = fmt::format("w[{}].", e);
    r.push_back({t.add(b, p + "blocks"), t.add(s, p + "scales"), k});
  }
  return r;
}

ExpertProj proj_arg(const py::handle& proj) {
  return parse_enum("proj", str_arg(proj, "proj"), expert_proj_table());
}
GluRows rows_arg(const py::handle& rows) {
  return parse_enum("glu_rows", str_arg(rows, "glu_rows"), glu_rows_table());
}

const PackedExperts* optional_experts(const py::handle& obj, const char* arg) {
  if (obj.is_none()) return nullptr;
  return &packed_experts_arg(obj, arg);
}

template <class Router>
void route(const py::handle& logits, const py::handle& weights, const py::handle& ids,
           const py::handle& dtype, Router&& run) {
  const StorageAs as{parse_dtype_override(dtype)};
  DlpackTensor tl(logits, "logits", as), tw(weights, "topk_weights", as), ti(ids, "topk_ids", as);
  GilRelease release;
  run(tl.view(), tw.view(), ti.view());
}

}  // namespace

void bind_moe(py::module_& m) {
  py::class_<PackedExperts>(m, "PackedExperts", py::dynamic_attr(),
                            "Expert weights [E, ...] packed for this machine's MoE kernels.")
      .def_property_readonly("num_experts", &PackedExperts::num_experts)
      .def_property_readonly("n", &PackedExperts::n)
      .def_property_readonly("k", &PackedExperts::k)
      .def_property_readonly("layout", &PackedExperts::layout)
      .def_property_readonly(
          "proj", [](const PackedExperts& w) { return enum_name(w.proj(), expert_proj_table()); })
      .def_property_readonly("format",
                             [](const PackedExperts& w) { return weight_format_name(w.format()); })
      .def_property_readonly("packed_bytes", &PackedExperts::packed_bytes)
      .def("_unpack",
           [](const PackedExperts& w, const py::handle& out) {
             StorageAs as;
             as.u16_is_bf16 = true;  // bf16 experts only: uint16 can only be bf16 here
             DlpackTensor o(out, "out", as);
             GilRelease release;
             w.unpack(o.view());
           })
      .def("_unpack_int8",
           [](const PackedExperts& w, const py::handle& out) {
             ExpertTensors t;
             std::vector<Int8Weight> v = int8_list(out, t);
             GilRelease release;
             w.unpack(v);
           })
      .def("_unpack_fp8",
           [](const PackedExperts& w, const py::handle& out, const py::handle& block_n,
              const py::handle& block_k) {
             ExpertTensors t;
             std::vector<Fp8Weight> v = fp8_list(out, block_n, block_k, t);
             GilRelease release;
             w.unpack(v);
           })
      .def("_unpack_int4",
           [](const PackedExperts& w, const py::handle& out, const py::handle& format,
              const py::handle& group_size, bool gptq_v2, const py::handle& dtype) {
             ExpertTensors t;
             std::vector<Int4Weight> v =
                 int4_list(out, format, group_size, gptq_v2, {parse_dtype_override(dtype)}, t);
             GilRelease release;
             w.unpack(v);
           })
      .def("_unpack_mxfp4",
           [](const PackedExperts& w, const py::handle& out, const py::handle& k) {
             ExpertTensors t;
             std::vector<Mxfp4Weight> v = mxfp4_list(out, k, t);
             GilRelease release;
             w.unpack(v);
           })
      .def("_dequantize",
           [](const PackedExperts& w, const py::handle& out, const py::handle& dtype) {
             DlpackTensor o(out, "out", {parse_dtype_override(dtype)});
             GilRelease release;
             w.dequantize(o.view());
           })
      .def_static("__new__",
                  [](const py::args&, const py::kwargs&) { refuse_new("PackedExperts"); })
      .def("__reduce_ex__",
           [](const PackedExperts&, const py::handle&) { refuse_pickle("PackedExperts"); })
      .def("__repr__", [](const PackedExperts& w) {
        if (w.empty()) return std::string("tilejit.PackedExperts(empty)");
        return fmt::format(
            "tilejit.PackedExperts(num_experts={}, proj=\"{}\", n={}, k={}, format=\"{}\", "
            "layout=\"{}\")",
            w.num_experts(), enum_name(w.proj(), expert_proj_table()), w.n(), w.k(),
            weight_format_name(w.format()), w.layout());
      });

  m.def("pack_experts", [](const py::handle& w, const py::handle& proj, const py::handle& rows,
                           const py::handle& dtype) {
    const ExpertProj p = proj_arg(proj);
    if (py::isinstance<PackedExperts>(w)) return pack_experts(w.cast<const PackedExperts&>(), p);
    const GluRows r = rows_arg(rows);
    DlpackTensor t(w, "w", {parse_dtype_override(dtype)});
    GilRelease release;
    return pack_experts(t.view(), p, r);
  });
  m.def("pack_experts_int8",
        [](const py::handle& w, const py::handle& proj, const py::handle& rows) {
          const ExpertProj p = proj_arg(proj);
          const GluRows r = rows_arg(rows);
          ExpertTensors t;
          std::vector<Int8Weight> v = int8_list(w, t);
          GilRelease release;
          return pack_experts(v, p, r);
        });
  m.def("pack_experts_fp8",
        [](const py::handle& w, const py::handle& block_n, const py::handle& block_k,
           const py::handle& proj, const py::handle& rows) {
          const ExpertProj p = proj_arg(proj);
          const GluRows r = rows_arg(rows);
          ExpertTensors t;
          std::vector<Fp8Weight> v = fp8_list(w, block_n, block_k, t);
          GilRelease release;
          return pack_experts(v, p, r);
        });
  m.def("pack_experts_int4",
        [](const py::handle& w, const py::handle& format, const py::handle& group_size,
           bool gptq_v2, const py::handle& proj, const py::handle& rows, const py::handle& dtype) {
          const ExpertProj p = proj_arg(proj);
          const GluRows r = rows_arg(rows);
          ExpertTensors t;
          std::vector<Int4Weight> v =
              int4_list(w, format, group_size, gptq_v2, {parse_dtype_override(dtype)}, t);
          GilRelease release;
          return pack_experts(v, p, r);
        });
  m.def("pack_experts_mxfp4", [](const py::handle& w, const py::handle& k, const py::handle& proj,
                                 const py::handle& rows) {
    const ExpertProj p = proj_arg(proj);
    const GluRows r = rows_arg(rows);
    ExpertTensors t;
    std::vector<Mxfp4Weight> v = mxfp4_list(w, k, t);
    GilRelease release;
    return pack_experts(v, p, r);
  });

  m.def("fused_experts",
        [](const py::handle& hidden, const py::handle& w13, const py::handle& w2,
           const py::handle& topk_weights, const py::handle& topk_ids, const py::handle& out,
           const py::handle& act, bool clamped_swiglu, float swiglu_alpha, float swiglu_limit,
           const py::handle& b13, const py::handle& b2, float routed_scaling_factor,
           const py::handle& shared_w13, const py::handle& shared_w2, const py::handle& act_quant,
           const py::handle& dtype, float act_scale13, float act_scale2,
           const py::handle& act_zero_point13, const py::handle& act_zero_point2,
           const py::handle& int4_route, const py::handle& shared_weights) {
          const PackedExperts& pw13 = packed_experts_arg(w13, "w13");
          const PackedExperts& pw2 = packed_experts_arg(w2, "w2");
          MoeOptions o;
          o.act = parse_enum("act", str_arg(act, "act"), activation_table());
          o.clamped_swiglu = clamped_swiglu;
          o.swiglu_alpha = swiglu_alpha;
          o.swiglu_limit = swiglu_limit;
          o.routed_scaling_factor = routed_scaling_factor;
          o.shared_w13 = optional_experts(shared_w13, "shared_w13");
          o.shared_w2 = optional_experts(shared_w2, "shared_w2");
          o.act_quant = parse_enum("act_quant", str_arg(act_quant, "act_quant"), act_quant_table());
          o.act_scale13 = act_scale13;
          o.act_scale2 = act_scale2;
          o.act_zero_point13 = int_arg<int>(act_zero_point13, "act_zero_point13");
          o.act_zero_point2 = int_arg<int>(act_zero_point2, "act_zero_point2");
          o.int4_route =
              parse_enum("int4_route", str_arg(int4_route, "int4_route"), int4_route_table());
          const StorageAs as{parse_dtype_override(dtype)};
          DlpackTensor th(hidden, "hidden", as), tw(topk_weights, "topk_weights", as),
              ti(topk_ids, "topk_ids", as), to(out, "out", as);
          std::optional<DlpackTensor> tb13 = optional_tensor(b13, "b13", as),
                                      tb2 = optional_tensor(b2, "b2", as),
                                      tsw = optional_tensor(shared_weights, "shared_weights", as);
          o.b13 = view_of(tb13);
          o.b2 = view_of(tb2);
          o.shared_weights = view_of(tsw);
          GilRelease release;
          fused_experts(th.view(), pw13, pw2, tw.view(), ti.view(), to.view(), o);
        });

  m.def("topk_softmax", [](const py::handle& logits, const py::handle& w, const py::handle& ids,
                           bool renormalize, const py::handle& dtype) {
    route(logits, w, ids, dtype,
          [&](const TensorView& l, const TensorView& tw, const TensorView& ti) {
            topk_softmax(l, tw, ti, renormalize);
          });
  });
  m.def("topk_sigmoid", [](const py::handle& logits, const py::handle& w, const py::handle& ids,
                           bool renormalize, const py::handle& dtype) {
    route(logits, w, ids, dtype,
          [&](const TensorView& l, const TensorView& tw, const TensorView& ti) {
            topk_sigmoid(l, tw, ti, renormalize);
          });
  });
  m.def("grouped_topk",
        [](const py::handle& logits, const py::handle& w, const py::handle& ids,
           const py::handle& score, const py::handle& num_expert_group,
           const py::handle& topk_group, bool renormalize, float routed_scaling_factor,
           const py::handle& correction_bias, const py::handle& dtype) {
          GroupedTopkOptions o;
          o.score = parse_enum("score", str_arg(score, "score"), router_score_table());
          o.num_expert_group = int_arg<int>(num_expert_group, "num_expert_group");
          o.topk_group = int_arg<int>(topk_group, "topk_group");
          o.renormalize = renormalize;
          o.routed_scaling_factor = routed_scaling_factor;
          std::optional<DlpackTensor> tb =
              optional_tensor(correction_bias, "correction_bias", {parse_dtype_override(dtype)});
          o.correction_bias = view_of(tb);
          route(logits, w, ids, dtype,
                [&](const TensorView& l, const TensorView& tw, const TensorView& ti) {
                  grouped_topk(l, tw, ti, o);
                });
        });
}

}  // namespace tilejit::python
