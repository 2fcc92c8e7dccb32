// Weight packing (bf16 and the quantized checkpoints), PackedWeight, gemm.
#include <fmt/format.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>

#include "bind.h"

namespace py = pybind11;

namespace tilejit::python {
namespace {

// Holds the borrowed tensors of one quantized checkpoint description for
// the length of a call.
struct Int4Args {
  std::optional<DlpackTensor> qweight, scales, qzeros, g_idx;
  Int4Weight w;
};

Int4Args int4_args(const py::handle& qweight, const py::handle& scales, const py::handle& qzeros,
                   const py::handle& g_idx, const py::handle& format, const py::handle& group_size,
                   bool gptq_v2, const py::handle& n, const py::handle& k, StorageAs as) {
  Int4Args a;
  a.w.format = parse_enum("format", str_arg(format, "format"), int4_format_table());
  a.w.group_size = int_arg<int64_t>(group_size, "group_size");
  a.w.gptq_v2 = gptq_v2;
  a.w.n = int_arg<int64_t>(n, "n");
  a.w.k = int_arg<int64_t>(k, "k");
  a.qweight.emplace(qweight, "qweight", as);
  a.scales.emplace(scales, "scales", as);
  a.qzeros = optional_tensor(qzeros, "qzeros", as);
  a.g_idx = optional_tensor(g_idx, "g_idx", as);
  a.w.qweight = a.qweight->view();
  a.w.scales = a.scales->view();
  a.w.qzeros = view_of(a.qzeros);
  a.w.g_idx = view_of(a.g_idx);
  return a;
}

// block_n / block_k of an fp8 call (the tensors left empty).
Fp8Weight fp8_blocks(const py::handle& block_n, const py::handle& block_k) {
  Fp8Weight w;
  w.block_n = int_arg<int64_t>(block_n, "block_n");
  w.block_k = int_arg<int64_t>(block_k, "block_k");
  return w;
}

StorageAs fp8_codes(StorageAs as) {
  as.u8_as = DType::f8e4m3;
  return as;
}

// x, out and the optional bias of a gemm or gemm_batched call, exported once
// and alive for the call.
struct GemmTensors {
  GemmTensors(const py::handle& x_arg, const py::handle& out_arg, const py::handle& bias_arg,
              const py::handle& dtype)
      : as{parse_dtype_override(dtype)},
        x(x_arg, "x", as),
        out(out_arg, "out", as),
        bias(optional_tensor(bias_arg, "bias", as)) {}
  StorageAs as;
  DlpackTensor x, out;
  std::optional<DlpackTensor> bias;
};

// The keyword options gemm and gemm_batched share (bias aside: a tensor).
GemmOptions gemm_options(const py::handle& act, const py::handle& act_quant, float act_scale,
                         const py::handle& act_zero_point, const py::handle& int4_route) {
  GemmOptions o;
  o.int4_route = parse_enum("int4_route", str_arg(int4_route, "int4_route"), int4_route_table());
  o.act = parse_enum("act", str_arg(act, "act"), activation_table());
  o.act_quant = parse_enum("act_quant", str_arg(act_quant, "act_quant"), act_quant_table());
  o.act_scale = act_scale;
  o.act_zero_point = int_arg<int>(act_zero_point, "act_zero_point");
  return o;
}

}  // namespace

void bind_gemm(py::module_& m) {
  py::class_<PackedWeight>(m, "PackedWeight", py::dynamic_attr(),
                           "A weight [N, K] packed for this machine's GEMM kernels.")
      .def_property_readonly("n", &PackedWeight::n)
      .def_property_readonly("k", &PackedWeight::k)
      .def_property_readonly("layout", &PackedWeight::layout)
      .def_property_readonly("format",
                             [](const PackedWeight& w) { return weight_format_name(w.format()); })
      .def_property_readonly("dtype", [](const PackedWeight& w) { return dtype_name(w.dtype()); })
      .def_property_readonly("packed_bytes", &PackedWeight::packed_bytes)
      .def("_unpack",
           [](const PackedWeight& w, const py::handle& out, const py::handle& dtype) {
             DlpackTensor o(out, "out", {parse_dtype_override(dtype)});
             GilRelease release;
             w.unpack(o.view());
           })
      .def("_unpack_int8",
           [](const PackedWeight& w, const py::handle& weight, const py::handle& scales) {
             DlpackTensor tw(weight, "weight"), ts(scales, "scales");
             GilRelease release;
             w.unpack(Int8Weight{tw.view(), ts.view()});
           })
      .def("_unpack_fp8",
           [](const PackedWeight& w, const py::handle& weight, const py::handle& scales,
              const py::handle& block_n, const py::handle& block_k) {
             const Fp8Weight blocks = fp8_blocks(block_n, block_k);
             DlpackTensor tw(weight, "weight", fp8_codes({})), ts(scales, "scales");
             GilRelease release;
             w.unpack(Fp8Weight{tw.view(), ts.view(), blocks.block_n, blocks.block_k});
           })
      .def("_unpack_int4",
           [](const PackedWeight& w, const py::handle& qweight, const py::handle& scales,
              const py::handle& qzeros, const py::handle& g_idx, const py::handle& format,
              const py::handle& group_size, bool gptq_v2, const py::handle& n, const py::handle& k,
              const py::handle& dtype) {
             Int4Args a = int4_args(qweight, scales, qzeros, g_idx, format, group_size, gptq_v2, n,
                                    k, {parse_dtype_override(dtype)});
             GilRelease release;
             w.unpack(a.w);
           })
      .def("_unpack_mxfp4",
           [](const PackedWeight& w, const py::handle& blocks, const py::handle& scales,
              const py::handle& k) {
             const int64_t kk = int_arg<int64_t>(k, "k");
             DlpackTensor tb(blocks, "blocks"), ts(scales, "scales");
             GilRelease release;
             w.unpack(Mxfp4Weight{tb.view(), ts.view(), kk});
           })
      .def("_dequantize",
           [](const PackedWeight& w, const py::handle& out, const py::handle& dtype) {
             DlpackTensor o(out, "out", {parse_dtype_override(dtype)});
             GilRelease release;
             w.dequantize(o.view());
           })
      .def_static("__new__", [](const py::args&, const py::kwargs&) { refuse_new("PackedWeight"); })
      .def("__reduce_ex__",
           [](const PackedWeight&, const py::handle&) { refuse_pickle("PackedWeight"); })
      .def("__repr__", [](const PackedWeight& w) {
        if (w.empty()) return std::string("tilejit.PackedWeight(empty)");
        return fmt::format("tilejit.PackedWeight(n={}, k={}, format=\"{}\", layout=\"{}\")", w.n(),
                           w.k(), weight_format_name(w.format()), w.layout());
      });

  m.def("pack_weight", [](const py::handle& w, const py::handle& dtype) {
    if (py::isinstance<PackedWeight>(w)) return pack_weight(w.cast<const PackedWeight&>());
    DlpackTensor t(w, "w", {parse_dtype_override(dtype)});
    GilRelease release;
    return pack_weight(t.view());
  });
  m.def("pack_int8", [](const py::handle& weight, const py::handle& scales) {
    DlpackTensor tw(weight, "weight"), ts(scales, "scales");
    GilRelease release;
    return pack_weight(Int8Weight{tw.view(), ts.view()});
  });
  m.def("pack_fp8", [](const py::handle& weight, const py::handle& scales,
                       const py::handle& block_n, const py::handle& block_k) {
    const Fp8Weight blocks = fp8_blocks(block_n, block_k);
    DlpackTensor tw(weight, "weight", fp8_codes({})), ts(scales, "scales");
    GilRelease release;
    return pack_weight(Fp8Weight{tw.view(), ts.view(), blocks.block_n, blocks.block_k});
  });
  m.def("pack_int4",
        [](const py::handle& qweight, const py::handle& scales, const py::handle& qzeros,
           const py::handle& g_idx, const py::handle& format, const py::handle& group_size,
           bool gptq_v2, const py::handle& n, const py::handle& k, const py::handle& dtype) {
          Int4Args a = int4_args(qweight, scales, qzeros, g_idx, format, group_size, gptq_v2, n, k,
                                 {parse_dtype_override(dtype)});
          GilRelease release;
          return pack_weight(a.w);
        });
  m.def("pack_mxfp4", [](const py::handle& blocks, const py::handle& scales, const py::handle& k) {
    const int64_t kk = int_arg<int64_t>(k, "k");
    DlpackTensor tb(blocks, "blocks"), ts(scales, "scales");
    GilRelease release;
    return pack_weight(Mxfp4Weight{tb.view(), ts.view(), kk});
  });

  // Positional from the Python layer (tilejit.gemm), which owns the keyword
  // defaults: the fewest conversions per call.
  m.def("gemm", [](const py::handle& x, const py::handle& w, const py::handle& out,
                   const py::handle& bias, const py::handle& act, const py::handle& act_quant,
                   float act_scale, const py::handle& act_zero_point, const py::handle& int4_route,
                   const py::handle& dtype) {
    const PackedWeight& pw = packed_weight_arg(w, "w");
    GemmOptions o = gemm_options(act, act_quant, act_scale, act_zero_point, int4_route);
    const GemmTensors t(x, out, bias, dtype);
    o.bias = view_of(t.bias);
    GilRelease release;
    gemm(t.x.view(), pw, t.out.view(), o);
  });

  m.def(
      "gemm_batched",
      [](const py::handle& x, const py::list& w, const py::handle& out, const py::handle& bias,
         const py::handle& act, const py::handle& act_quant, float act_scale,
         const py::handle& act_zero_point, const py::handle& int4_route, const py::handle& dtype) {
        std::vector<PackedWeight> ws;
        for (size_t i = 0; i < w.size(); ++i)
          ws.push_back(packed_weight_arg(w[i], ("w[" + std::to_string(i) + "]").c_str()));
        GemmOptions o = gemm_options(act, act_quant, act_scale, act_zero_point, int4_route);
        const GemmTensors t(x, out, bias, dtype);
        o.bias = view_of(t.bias);
        GilRelease release;
        gemm_batched(t.x.view(), ws, t.out.view(), o);
      });

  // The C++ side of the call-overhead measurement (tests/python/overhead_bench.py):
  // ns per tilejit::gemm call on views converted once, the loop in C++.
  m.def("_time_gemm_ns", [](const py::handle& x, const py::handle& w, const py::handle& out,
                            const py::handle& iters_arg, const py::handle& dtype) {
    const int64_t iters = int_arg<int64_t>(iters_arg, "iters");
    const PackedWeight& pw = packed_weight_arg(w, "w");
    const StorageAs as{parse_dtype_override(dtype)};
    DlpackTensor tx(x, "x", as), ty(out, "out", as);
    GilRelease release;
    gemm(tx.view(), pw, ty.view());  // compiled and warm
    const auto t0 = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < iters; ++i) gemm(tx.view(), pw, ty.view());
    const auto t1 = std::chrono::steady_clock::now();
    return std::chrono::duration<double, std::nano>(t1 - t0).count() / static_cast<double>(iters);
  });
  // (shape, dtype name) of any DLPack tensor: what unpack() allocates.
  m.def("_describe", [](const py::handle& t, const py::handle& dtype) {
    DlpackTensor d(t, "tensor", {parse_dtype_override(dtype)});
    return py::make_tuple(py::tuple(py::cast(d.view().shape)), dtype_name(d.view().dtype));
  });
}

}  // namespace tilejit::python
