// cpu_info, cache_stats and the thread count.
#include <pybind11/pybind11.h>

#include "bind.h"

namespace py = pybind11;

namespace tilejit::python {

void bind_info(py::module_& m) {
  m.def(
      "cpu_info",
      [] {
        CpuInfo c = cpu_info();
        py::dict d;
        d["vendor"] = c.vendor;
        d["avx512f"] = c.avx512f;
        d["avx512bw"] = c.avx512bw;
        d["avx512vl"] = c.avx512vl;
        d["avx512_bf16"] = c.avx512_bf16;
        d["avx512_fp16"] = c.avx512_fp16;
        d["amx_tile"] = c.amx_tile;
        d["amx_bf16"] = c.amx_bf16;
        d["amx_int8"] = c.amx_int8;
        d["amx_permitted"] = c.amx_permitted;
        d["amx_emulated"] = c.amx_emulated;
        d["max_isa"] = isa_name(c.max_isa);
        d["avx2"] = c.avx2;
        d["fma"] = c.fma;
        d["llvm_backend"] = c.llvm_backend;
        d["isa"] = isa_name(c.isa);
        d["num_threads"] = c.num_threads;
        return d;
      },
      "The CPU's features, the best ISA path it allows (max_isa) and the active one (isa).");
  m.def(
      "cache_stats",
      [] {
        CacheStats s = cache_stats();
        py::dict d;
        d["hits"] = s.hits;
        d["misses"] = s.misses;
        d["compiles"] = s.compiles;
        d["compile_seconds"] = s.compile_seconds;
        d["kernels"] = s.kernels;
        d["disk_loads"] = s.disk_loads;
        d["disk_stores"] = s.disk_stores;
        d["disk_evictions"] = s.disk_evictions;
        d["disk_dir"] = s.disk_dir;
        d["tuned_plans"] = s.tuned_plans;
        return d;
      },
      "The kernel cache's counters (in memory, and TILEJIT_CACHE_DIR's when set).");
  m.def(
      "load_tuning_db",
      [](const std::string& path) {
        GilRelease release;
        load_tuning_db(path);
      },
      py::arg("path"),
      "Loads a tuning database written by `tilejit tune` in place of TILEJIT_TUNING_DB's.");
  m.def(
      "set_num_threads",
      [](const py::handle& n) {
        const int threads = int_arg<int>(n, "n");
        GilRelease release;
        set_num_threads(threads);
      },
      py::arg("n"),
      "Threads used by operator calls (default TILEJIT_NUM_THREADS, else the CPUs the "
      "process may run on).");
  m.def("num_threads", [] { return num_threads(); });
  m.def(
      "set_batch_invariant",
      [](const py::handle& on) {
        if (!py::isinstance<py::bool_>(on))
          throw Error("set_batch_invariant: on=" + std::string(py::str(py::repr(on))) + " (a " +
                      std::string(py::str(py::type::handle_of(on).attr("__name__"))) +
                      "); allowed: a Python bool, True or False");
        set_batch_invariant(on.cast<bool>());
      },
      py::arg("on"),
      "Batch-invariant mode for deterministic serving: each row of gemm / fused_experts (any "
      "weight format) and each sequence of decode / extend attention independent of the rest "
      "of the batch and of the thread count (default TILEJIT_BATCH_INVARIANT).");
  m.def("batch_invariant", [] { return batch_invariant(); });
}

}  // namespace tilejit::python
