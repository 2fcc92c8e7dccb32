// The process-wide ORC LLJIT: host detection, the optimise + codegen pipeline
// of compile_module(), and linking objects into per-kernel JITDylibs.
#include "codegen/llvm/llvm_jit.h"

#include <llvm/ADT/SmallVector.h>
#include <llvm/CodeGen/SelectionDAGNodes.h>
#include <llvm/ExecutionEngine/Orc/JITTargetMachineBuilder.h>
#include <llvm/ExecutionEngine/Orc/LLJIT.h>
#include <llvm/IR/LegacyPassManager.h>
#include <llvm/IR/Verifier.h>
#include <llvm/Object/ELFObjectFile.h>
#include <llvm/Object/ObjectFile.h>
#include <llvm/Passes/PassBuilder.h>
#include <llvm/Support/MemoryBuffer.h>
#include <llvm/Support/TargetSelect.h>
#include <llvm/Support/raw_ostream.h>
#include <llvm/Target/TargetMachine.h>
#include <llvm/TargetParser/X86TargetParser.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <mutex>
#include <new>
#include <set>
#include <shared_mutex>
#include <thread>
#include <type_traits>

#include <sys/mman.h>

#include "codegen/llvm/jit_memory.h"
#include "codegen/llvm/module_context.h"
#include "runtime/env_text.h"
#include "runtime/thread_pool.h"

namespace tilejit::codegen::llvm_backend {
namespace {

namespace orc = llvm::orc;

[[noreturn]] void fail(const std::string& what, llvm::Error err) {
  throw Error("LLVM JIT: " + what + ": " + llvm::toString(std::move(err)));
}

template <class T>
T take(llvm::Expected<T> v, const std::string& what) {
  if (!v) fail(what, v.takeError());
  if constexpr (std::is_reference_v<T>)
    return *v;
  else
    return std::move(*v);
}

struct Jit {
  std::unique_ptr<orc::LLJIT> lljit;
  orc::JITTargetMachineBuilder jtmb;  // the host; copied per compile
  HostTarget host;
};

HostTarget describe_host(const orc::JITTargetMachineBuilder& b) {
  HostTarget h;
  h.triple = b.getTargetTriple().str();
  h.cpu = b.getCPU();
  h.features = b.getFeatures().getString();
  for (const std::string& f : b.getFeatures().getFeatures()) {
    if (f.empty() || f[0] != '+') continue;
    const std::string name = f.substr(1);
    if (name == "avx2") h.avx2 = true;
    if (name == "fma") h.fma = true;
    if (name == "f16c") h.f16c = true;
    if (name == "avx512f") h.avx512f = true;
    if (name == "avx512bw") h.avx512bw = true;
    if (name == "avx512bf16") h.avx512bf16 = true;
    if (name == "avx" || name == "avx2") h.vector_bits = std::max(h.vector_bits, 256);
  }
  if (h.avx512f) {
    h.vector_bits = 512;
    h.vector_regs = 32;
  }
  return h;
}

// TILEJIT_LLVM_CPU=<cpu> (e.g. x86-64-v3): compile for that CPU's features
// instead of all the host's, to run the portable code paths (AVX2 without
// AVX-512) on a bigger machine. It must be a subset of the host, or kernels
// would stop with SIGILL: anything else is an Error.
void apply_cpu_override(orc::JITTargetMachineBuilder& b) {
  const char* env = std::getenv("TILEJIT_LLVM_CPU");
  if (env == nullptr || *env == '\0') return;
  const std::string cpu = env;
  if (llvm::X86::parseArchX86(cpu, /*Only64Bit=*/true) == llvm::X86::CK_None)
    throw Error("TILEJIT_LLVM_CPU='" + runtime::shown_env_value(env) +
                "' is not an x86-64 CPU name LLVM knows (e.g. x86-64-v3)");
  std::set<std::string> host;
  for (const std::string& f : b.getFeatures().getFeatures())
    if (!f.empty() && f[0] == '+') host.insert(f);
  // The CPU's own features plus everything they imply (avx512bw implies
  // avx512f, avx2 implies avx, ...): the list for the TargetMachine and for
  // HostTarget's flags.
  llvm::SmallVector<llvm::StringRef, 64> own;
  llvm::X86::getFeaturesForCPU(cpu, own, /*NeedPlus=*/false);
  llvm::StringMap<bool> implied;
  for (llvm::StringRef f : own) {
    implied[f] = true;  // updateImpliedFeatures sets only what f implies
    llvm::X86::updateImpliedFeatures(f, true, implied);
  }
  // Only instruction-set extensions the code generator may use are compared:
  // the host list lacks some that do not change code (x87, rdpru, ...).
  auto checked = [](llvm::StringRef f) {
    for (const char* p :
         {"avx", "amx", "fma", "f16c", "sse", "ssse3", "bmi", "evex", "gfni", "vaes", "vpclmulqdq"})
      if (f.starts_with(p)) return true;
    return false;
  };
  std::vector<std::string> names;
  for (const auto& e : implied)
    if (e.getValue()) names.push_back(e.getKey().str());
  std::sort(names.begin(), names.end());
  std::string features;
  for (const std::string& f : names) {
    if (checked(f) && !host.count("+" + f))
      throw Error("TILEJIT_LLVM_CPU=" + cpu + " needs " + f + ", which this host (" + b.getCPU() +
                  ") lacks");
    features += (features.empty() ? "+" : ",+") + f;
  }
  b.setCPU(cpu);
  b.setFeatures(features);
}

// LLVM's own statics (e.g. its table of extended value types) are destroyed
// at exit, and a host thread still compiling then crashed inside LLVM. Every
// compile and link holds this gate shared; an exit handler takes it
// exclusively and never lets go: the compiles in flight finish, and a thread
// asking for a new one while the process exits waits for the exit instead of
// crashing it. Exit handlers run last-registered first, so the handler is
// registered when the library loads, when the JIT is made and after each
// compile (after the statics that compile made, hence before their
// destructors); only the first one to run closes the gate. A static LLVM
// first makes in a compile still in flight at exit is younger than every
// registration: the one the first compiles made (SelectionDAG's interned
// value types) is made with the JIT instead (InternedValueTypes below).
std::shared_mutex& exit_gate() {
  static std::shared_mutex& gate = *new std::shared_mutex;  // immortal
  return gate;
}
std::atomic<bool> g_exiting{false};
std::atomic<bool> g_fork_waiting{false};  // a fork handler wants the gate
thread_local int t_llvm_depth = 0;        // this thread holds the gate (exit() from inside LLVM)
void close_exit_gate() {
  if (g_exiting.exchange(true)) return;
  // This thread runs the exit handlers: its own later calls (a handler or
  // static destructor registered before the gate) get an Error from the
  // gate and run their tasks inline, never parked (the process hung there).
  runtime::mark_exiting_thread();
  if (t_llvm_depth > 0) return;  // no self-deadlock
  exit_gate().lock();            // never unlocked
}
// The gate, held shared, for one compile or link. The flag is checked first:
// glibc's rwlock prefers readers, so threads compiling back to back would
// starve the exit handler's exclusive lock (the process hung at exit).
// Reentrant: a thread already inside (jit() from a compile) does not lock again.
class LlvmGate {
 public:
  LlvmGate() {
    if (t_llvm_depth == 0) {
      if (g_exiting.load() && runtime::on_exiting_thread())
        throw Error(
            "LLVM JIT: the process is exiting (this call came from an exit handler or a static "
            "destructor): no kernel is compiled any more (LLVM's own statics are being "
            "destroyed); kernels made before still run");
      while (g_exiting.load()) std::this_thread::sleep_for(std::chrono::hours(1));  // until _exit
      // A fork waiting for the gate goes first, for the same reason: with two
      // threads compiling back to back, fork() waited 17-48 s.
      while (g_fork_waiting.load()) std::this_thread::sleep_for(std::chrono::microseconds(200));
      lock_ = std::shared_lock<std::shared_mutex>(exit_gate());
    }
    ++t_llvm_depth;
  }
  ~LlvmGate() { --t_llvm_depth; }
  LlvmGate(const LlvmGate&) = delete;
  LlvmGate& operator=(const LlvmGate&) = delete;

 private:
  std::shared_lock<std::shared_mutex> lock_;
};
void register_exit_gate() {
  std::atexit(close_exit_gate);
}
// Also once when the library loads: before any compile has registered it,
// the handler still runs ahead of the destructors of LLVM's own globals
// (made when libLLVM loaded, before this library).
const bool g_exit_gate_at_load = (register_exit_gate(), true);
bool g_fork_locked = false;  // the forking thread holds the gate exclusively

Jit* create_jit() {
  // Each returns true on failure (no target for the host compiled into LLVM).
  if (llvm::InitializeNativeTarget() || llvm::InitializeNativeTargetAsmPrinter() ||
      llvm::InitializeNativeTargetAsmParser())
    throw Error("LLVM JIT: this LLVM build has no code generator for the host");
  auto jtmb = take(orc::JITTargetMachineBuilder::detectHost(), "detecting the host target");
  apply_cpu_override(jtmb);
  // Position-independent, small code model: objects can be linked anywhere and
  // cached on disk; constants are RIP-relative.
  jtmb.setRelocationModel(llvm::Reloc::PIC_);
  jtmb.setCodeModel(llvm::CodeModel::Small);
  auto lljit =
      take(orc::LLJITBuilder()
               .setJITTargetMachineBuilder(jtmb)
               .setObjectLinkingLayerCreator(
                   [](orc::ExecutionSession& es,
                      const llvm::Triple&) -> llvm::Expected<std::unique_ptr<orc::ObjectLayer>> {
                     return make_kernel_linking_layer(es);
                   })
               .create(),
           "creating the LLJIT");
  auto* j = new Jit{std::move(lljit), jtmb, {}};
  j->host = describe_host(j->jtmb);
  return j;
}

// The statics of SDNode::getValueTypeList (the interned value types every
// SelectionDAG node points into), made now rather than by the first
// instruction selection: a compile in flight at exit read the freed set
// (a crash in EVT::isExtendedVector) when those statics were younger than
// every exit handler (the process's first compiles). Made before the exit
// handler is registered, they are destroyed after it has closed the gate.
struct InternedValueTypes : llvm::SDNode {
  static void make() {
    (void)getSDVTList(llvm::EVT(llvm::MVT::i32));
    // An extended type too (i17: the interned set's path). Its context is
    // leaked, so the set's entry never names a freed type.
    static llvm::LLVMContext& ctx = *new llvm::LLVMContext;
    (void)getSDVTList(llvm::EVT::getIntegerVT(ctx, 17));
  }
};

// LLVM cannot fail an allocation and go on: its own allocators report "LLVM
// ERROR: out of memory" and abort, and a std::bad_alloc from operator new
// unwinds through frames built without exceptions, skipping their cleanups
// (under `ulimit -v`, a decode kernel's compile ended in that abort, or in
// "free(): invalid pointer", at 4 of 8 limits between 202 and 210 MB). So
// work inside LLVM starts only when a mapping of this size could be made
// now, which a limit on the address space (RLIMIT_AS) or strict overcommit
// would refuse; it is never touched, so it costs no memory. The largest
// compile, MLA decode (D 576), needed 48 MB of address space (the `ulimit -v`
// at which it first succeeded, above the one at which the program's own
// tensors failed); the D 128 decode kernel 12 MB.
constexpr size_t kCompileHeadroomBytes = size_t{64} << 20;
// A link: its working memory, and a new reservation of kernel memory
// (jit_memory.h) when the current ones are full.
constexpr size_t kLinkHeadroomBytes = (size_t{16} << 20) + kKernelReservationBytes;

// Work inside LLVM in flight holds a claim on the headroom until it ends, so
// two at once must find room for both: a gemm's first call compiled two
// M-tail kernels on the caller and a pool worker, each check passed alone,
// and the second compile ran out ("LLVM ERROR: out of memory", or a double
// free unwinding through LLVM; 1 in 40-120 runs near the limit).
class HeadroomClaim {
 public:
  HeadroomClaim(size_t bytes, const std::string& what) : bytes_(bytes) {
    const std::lock_guard<std::mutex> lk(mu());
    const size_t want = claimed() + bytes;
    void* p = mmap(nullptr, want, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
      throw Error("LLVM JIT: out of memory: " + what + " needs " + std::to_string(bytes >> 20) +
                  " MiB of address space free (" + std::to_string(want >> 20) +
                  " MiB with the LLVM work in flight), which this process cannot map now (LLVM "
                  "cannot recover from a failed allocation, so it is not started)");
    munmap(p, want);
    claimed() += bytes;
  }
  ~HeadroomClaim() {
    const std::lock_guard<std::mutex> lk(mu());
    claimed() -= bytes_;
  }
  HeadroomClaim(const HeadroomClaim&) = delete;
  HeadroomClaim& operator=(const HeadroomClaim&) = delete;

 private:
  // Immortal: a compile may end after static destruction began.
  static std::mutex& mu() {
    static std::mutex& m = *new std::mutex;
    return m;
  }
  static size_t& claimed() {
    static size_t& c = *new size_t(0);
    return c;
  }
  size_t bytes_;
};

// The host the JIT was made for, once it is made (immutable from then on):
// reading it needs no gate, so a cache lookup of a kernel made before exit
// (its key names the host) still works in an exit handler.
std::atomic<const HostTarget*> g_host{nullptr};

// Leaked on purpose: kernels held by static caches may be destroyed after any
// static JIT would be, and unlinking them needs the JIT.
Jit& jit() {
  static Jit* j = [] {  // a throw leaves it unset: the next call retries
    const HeadroomClaim claim(kCompileHeadroomBytes, "making the LLVM JIT");
    Jit* made = create_jit();
    InternedValueTypes::make();
    register_exit_gate();  // after the statics the target, LLJIT and SelectionDAG made
    g_host.store(&made->host, std::memory_order_release);
    return made;
  }();
  return *j;
}

llvm::CodeGenOptLevel codegen_level(OptLevel o) {
  switch (o) {
    case OptLevel::O0:
      return llvm::CodeGenOptLevel::None;
    case OptLevel::O1:
      return llvm::CodeGenOptLevel::Less;
    case OptLevel::kernel:
    case OptLevel::O2:
      return llvm::CodeGenOptLevel::Default;
    case OptLevel::O3:
      return llvm::CodeGenOptLevel::Aggressive;
  }
  return llvm::CodeGenOptLevel::Default;
}

// The IR passes of OptLevel::kernel. The emitters already write vector code
// with explicit register blocking and loops; what is left to do is folding
// (constant splats, bitcasts, address arithmetic), CSE, hoisting loop-invariant
// loads and CFG cleanup. The O2 pipeline adds inlining, loop rotation and
// unrolling, vectorizers, GVN, ... for the same machine code speed (measured)
// at twice the compile time. (InstCombine must not verify its fixpoint: that
// check reports a fatal error.)
constexpr const char* kKernelPipeline =
    "function(sroa<modify-cfg>,early-cse<memssa>,instcombine<no-verify-fixpoint>,"
    "simplifycfg,loop-mssa(licm),instcombine<no-verify-fixpoint>,simplifycfg)";

void optimize(llvm::Module& m, llvm::TargetMachine& tm, OptLevel o) {
  if (o == OptLevel::O0) return;
  // Declared in this order so that they are destroyed in the reverse one (the
  // proxies registered below point from later managers to earlier ones).
  llvm::LoopAnalysisManager lam;
  llvm::FunctionAnalysisManager fam;
  llvm::CGSCCAnalysisManager cgam;
  llvm::ModuleAnalysisManager mam;
  llvm::PassBuilder pb(&tm);
  pb.registerModuleAnalyses(mam);
  pb.registerCGSCCAnalyses(cgam);
  pb.registerFunctionAnalyses(fam);
  pb.registerLoopAnalyses(lam);
  pb.crossRegisterProxies(lam, fam, cgam, mam);
  llvm::ModulePassManager mpm;
  switch (o) {
    case OptLevel::kernel:
      if (llvm::Error e = pb.parsePassPipeline(mpm, kKernelPipeline))
        fail("building the kernel pass pipeline", std::move(e));
      break;
    case OptLevel::O1:
      mpm = pb.buildPerModuleDefaultPipeline(llvm::OptimizationLevel::O1);
      break;
    case OptLevel::O2:
      mpm = pb.buildPerModuleDefaultPipeline(llvm::OptimizationLevel::O2);
      break;
    default:
      mpm = pb.buildPerModuleDefaultPipeline(llvm::OptimizationLevel::O3);
      break;
  }
  mpm.run(m, mam);
}

std::vector<uint8_t> emit_object(llvm::Module& m, llvm::TargetMachine& tm) {
  llvm::SmallVector<char, 0> buf;
  llvm::raw_svector_ostream os(buf);
  llvm::legacy::PassManager pm;
  if (tm.addPassesToEmitFile(pm, os, nullptr, llvm::CodeGenFileType::ObjectFile))
    throw Error("LLVM JIT: the host TargetMachine cannot emit object files");
  pm.run(m);
  return std::vector<uint8_t>(buf.begin(), buf.end());
}

void remove_dylib(orc::JITDylib* jd) {
  // Called from destructors: an error here can only be dropped (the code
  // stays mapped, which is harmless).
  llvm::consumeError(jit().lljit->getExecutionSession().removeJITDylib(*jd));
}

double micros_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

const HostTarget& host_target() {
  if (const HostTarget* h = g_host.load(std::memory_order_acquire)) return *h;
  const LlvmGate gate;  // the JIT may be made here: a fork must not split that
  return jit().host;
}

void before_fork() {
  if (g_exiting.load() || t_llvm_depth > 0) return;
  g_fork_waiting.store(true);
  exit_gate().lock();  // the compiles in flight finish; none starts
  g_fork_locked = true;
}

void after_fork(bool child) {
  if (!g_fork_locked) return;
  g_fork_locked = false;
  g_fork_waiting.store(false);
  if (!child) return exit_gate().unlock();
  // glibc's rwlock records its writer's thread id, which the child's thread
  // does not have: unlocking it there corrupted it (the child's next compile
  // hung). The child has no other thread: a fresh gate in its place.
  new (&exit_gate()) std::shared_mutex;
}

void require_vector_host(const char* who) {
  const HostTarget& h = host_target();
  // Below AVX2 + FMA, llvm.fma and 16-lane integer code would lower to libm
  // calls and long scalar sequences: not a target these kernels are for.
  if (!h.avx2 || !h.fma)
    throw Error(std::string(who) + ": the LLVM kernels need AVX2 and FMA, which the target CPU " +
                h.cpu + " lacks");
}

llvm::Function* ModuleContext::define_kernel(const std::string& name) const {
  auto* ptr = llvm::PointerType::getUnqual(ctx);
  auto* fty = llvm::FunctionType::get(llvm::Type::getVoidTy(ctx), {ptr}, false);
  auto* f = llvm::Function::Create(fty, llvm::Function::ExternalLinkage, name, module);
  f->addFnAttr(llvm::Attribute::NoUnwind);
  f->addFnAttr("target-cpu", host.cpu);
  f->addFnAttr("target-features", host.features);
  f->addFnAttr("no-builtins");
  f->addFnAttr("frame-pointer", "none");
  if (host.avx512f) {
    // Without these the x86 backend may split 512-bit vectors into ymm halves
    // (some CPUs prefer 256-bit code by default).
    f->addFnAttr("prefer-vector-width", "512");
    f->addFnAttr("min-legal-vector-width", "512");
  }
  f->getArg(0)->setName("args");
  f->addParamAttr(0, llvm::Attribute::NoCapture);
  f->addParamAttr(0, llvm::Attribute::ReadOnly);
  return f;
}

namespace {
// Bytes of the function `symbol` in an ELF object (its st_size), or 0. The
// perf map needs the function's own extent: the object also holds constant
// pools and other sections placed elsewhere.
size_t function_size(const std::vector<uint8_t>& object_file, const std::string& symbol) {
  auto obj = llvm::object::ObjectFile::createObjectFile(llvm::MemoryBufferRef(
      llvm::StringRef(reinterpret_cast<const char*>(object_file.data()), object_file.size()),
      symbol));
  if (!obj) {
    llvm::consumeError(obj.takeError());
    return 0;
  }
  const auto* elf = llvm::dyn_cast<llvm::object::ELFObjectFileBase>(obj->get());
  if (elf == nullptr) return 0;
  for (const llvm::object::ELFSymbolRef& sym : elf->symbols()) {
    auto name = sym.getName();
    if (!name) {
      llvm::consumeError(name.takeError());
      continue;
    }
    // The FILE symbol carries the module's name, which is the function's too.
    auto type = sym.getType();
    if (!type) {
      llvm::consumeError(type.takeError());
      continue;
    }
    if (*name == symbol && *type == llvm::object::SymbolRef::ST_Function)
      return static_cast<size_t>(sym.getSize());
  }
  return 0;
}
}  // namespace

namespace {
// load_object_file with the exit gate held by the caller.
LlvmKernel link_object_file(const std::string& symbol, std::vector<uint8_t> object_file) {
  const auto t0 = std::chrono::steady_clock::now();
  Jit& j = jit();
  // One JITDylib per kernel: symbols never collide (the same kernel may be
  // linked twice, e.g. from a disk cache), and removing it frees the code.
  static std::atomic<uint64_t> counter{0};
  orc::JITDylib& jd =
      take(j.lljit->createJITDylib("tilejit." + std::to_string(counter++) + "." + symbol),
           "creating a JITDylib for " + symbol);
  std::shared_ptr<void> keepalive(&jd,
                                  [](void* p) { remove_dylib(static_cast<orc::JITDylib*>(p)); });
  auto buf = llvm::MemoryBuffer::getMemBufferCopy(
      llvm::StringRef(reinterpret_cast<const char*>(object_file.data()), object_file.size()),
      symbol);
  if (llvm::Error e = j.lljit->addObjectFile(jd, std::move(buf)))
    fail("adding the object of " + symbol, std::move(e));
  const orc::ExecutorAddr addr = take(j.lljit->lookup(jd, symbol), "linking " + symbol);
  LlvmKernel k;
  k.name = symbol;
  k.entry = addr.toPtr<void*>();
  k.keepalive = std::move(keepalive);
  k.code_size = function_size(object_file, symbol);
  k.object_file = std::move(object_file);
  k.compile_us = micros_since(t0);
  register_exit_gate();
  return k;
}
}  // namespace

LlvmKernel load_object_file(const std::string& symbol, std::vector<uint8_t> object_file) {
  const LlvmGate gate;
  const HeadroomClaim claim(kLinkHeadroomBytes, "linking " + symbol);
  return link_object_file(symbol, std::move(object_file));
}

LlvmKernel compile_module(const std::string& symbol,
                          const std::function<void(ModuleContext&)>& emit, OptLevel opt) {
  // Held to the end, past the destruction of the context, module and machine.
  const LlvmGate gate;
  const HeadroomClaim claim(kCompileHeadroomBytes, "compiling " + symbol);
  const auto t0 = std::chrono::steady_clock::now();
  Jit& j = jit();
  // A TargetMachine per compile: codegen mutates it, so threads must not share one.
  orc::JITTargetMachineBuilder b = j.jtmb;
  b.setCodeGenOptLevel(codegen_level(opt));
  std::unique_ptr<llvm::TargetMachine> tm =
      take(b.createTargetMachine(), "creating the host TargetMachine");

  // Per compile: a context is not thread-safe, separate ones are independent.
  llvm::LLVMContext ctx;
  llvm::Module m(symbol, ctx);
  m.setDataLayout(tm->createDataLayout());
  m.setTargetTriple(tm->getTargetTriple().str());
  ModuleContext mc{ctx, m, j.host};
  emit(mc);

  llvm::Function* f = m.getFunction(symbol);
  if (f == nullptr || f->isDeclaration())
    throw Error("LLVM JIT: the module for " + symbol + " does not define a function of that name");
  std::string problems;
  llvm::raw_string_ostream os(problems);
  if (llvm::verifyModule(m, &os))
    throw Error("LLVM JIT: invalid IR for " + symbol + ": " + os.str());

  optimize(m, *tm, opt);
  std::vector<uint8_t> object = emit_object(m, *tm);
  LlvmKernel k = link_object_file(symbol, std::move(object));
  k.compile_us = micros_since(t0);
  return k;
}

}  // namespace tilejit::codegen::llvm_backend
