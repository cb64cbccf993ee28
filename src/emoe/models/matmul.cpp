// oneDNN matrix products with autograd (see matmul.h for why).
#include "emoe/models/matmul.h"

#include <ATen/record_function.h>
#include <fmt/format.h>
#include <torch/torch.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "emoe/core/autocast_compat.h"
#include "emoe/core/bf16_shadow.h"
#include "emoe/core/error.h"
#include "emoe/models/row_kernels.h"

#ifdef EMOE_HAVE_ONEDNN
#include <oneapi/dnnl/dnnl.hpp>
#endif

namespace emoe {

namespace {

// What a oneDNN product applies to its float32 sums before they are rounded and written: nothing,
// or GELU (InferenceGeluEpilogue)
enum class Epilogue { kNone, kGeluErf, kGeluTanh };

// InferenceGeluEpilogue's request for this thread's next autocast_inference_linear, and whether
// that product applied it
thread_local Epilogue requested_epilogue = Epilogue::kNone;
thread_local bool epilogue_applied = false;

std::atomic<int64_t> onednn_products{0};
std::atomic<int64_t> onednn_packed_products{0};  // (of which b was packed first: PackB)
std::atomic<int> pack_b_setting{-1};             // PackB, or -1: from EMOE_PACK_B on first use

#ifdef EMOE_HAVE_ONEDNN
// The CPU's instruction set as oneDNN reads it, once (0 where it cannot say).
unsigned cpu_isa_as_onednn_reads() {
  static const unsigned isa = [] {
    try {
      return static_cast<unsigned>(dnnl::get_effective_cpu_isa());
    } catch (const std::exception&) {
      return 0u;
    }
  }();
  return isa;
}

// The instruction set emoe's oneDNN products may use; 0 where EMOE_GEMM=aten turns them off.
unsigned onednn_isa() {
  static const unsigned isa = [] {
    const char* env = std::getenv("EMOE_GEMM");
    return env != nullptr && std::string(env) == "aten" ? 0u : cpu_isa_as_onednn_reads();
  }();
  return isa;
}

bool has_isa(dnnl::cpu_isa wanted) {
  const auto w = static_cast<unsigned>(wanted);
  return (onednn_isa() & w) == w;
}

bool onednn_isa_ok() {
  return has_isa(dnnl::cpu_isa::avx512_core);
}

// float32 on AVX-512; bfloat16 where the CPU has AVX-512 BF16 (what ATen uses for it too)
bool onednn_dtype_ok(const at::Tensor& t) {
  if (!t.device().is_cpu()) return false;
  if (t.scalar_type() == at::kFloat) return onednn_isa_ok();
  if (t.scalar_type() == at::kBFloat16) return has_isa(dnnl::cpu_isa::avx512_core_bf16);
  return false;
}

dnnl::memory::data_type dnnl_type(const at::Tensor& t) {
  return t.scalar_type() == at::kBFloat16 ? dnnl::memory::data_type::bf16
                                          : dnnl::memory::data_type::f32;
}

dnnl::engine& cpu_engine() {
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

dnnl::memory::desc matrix_desc(const at::Tensor& t) {
  return dnnl::memory::desc(dnnl::memory::dims(t.sizes().begin(), t.sizes().end()), dnnl_type(t),
                            dnnl::memory::dims(t.strides().begin(), t.strides().end()));
}

// A bias [N] broadcast over out's rows (and leading dimensions), as a matmul takes it.
dnnl::memory::desc bias_desc(const at::Tensor& out, const at::Tensor& bias) {
  dnnl::memory::dims bd(static_cast<size_t>(out.dim()), 1), bs(bd.size(), 0);
  bd.back() = out.size(-1);
  for (size_t i = 0; i < bs.size(); ++i) bs[i] = i + 1 == bs.size() ? 1 : out.size(-1);
  return dnnl::memory::desc(bd, dnnl_type(bias), bs);
}

// A product's arguments: a, b, out (and the bias where defined) as oneDNN memories.
std::unordered_map<int, dnnl::memory> product_args(const at::Tensor& out, const at::Tensor& a,
                                                   const at::Tensor& b, const at::Tensor& bias) {
  std::unordered_map<int, dnnl::memory> args = {
      {DNNL_ARG_SRC, dnnl::memory(matrix_desc(a), cpu_engine(), a.data_ptr())},
      {DNNL_ARG_WEIGHTS, dnnl::memory(matrix_desc(b), cpu_engine(), b.data_ptr())},
      {DNNL_ARG_DST, dnnl::memory(matrix_desc(out), cpu_engine(), out.data_ptr())}};
  if (bias.defined())
    args.emplace(DNNL_ARG_BIAS, dnnl::memory(bias_desc(out, bias), cpu_engine(), bias.data_ptr()));
  return args;
}

// A product: oneDNN's primitive and, where its second operand is first copied into the blocked
// layout the primitive reads (PackB, matmul.h), the reorder that copies it there.
struct Product {
  dnnl::matmul prim;
  dnnl::reorder pack;         // empty: b as it is
  dnnl::memory::desc packed;  // (with pack) b's blocked layout
  explicit operator bool() const { return static_cast<bool>(prim); }
};

// The blocked copy of a product's second operand: one buffer per thread, grown to the largest
// copy asked for and kept (a fresh allocation per product page-faults its megabytes each time).
void* pack_scratch(size_t bytes) {
  thread_local at::Tensor buf;
  if (!buf.defined() || static_cast<size_t>(buf.numel()) < bytes) {
    buf = at::Tensor();  // (the old one freed first)
    buf = at::empty({static_cast<int64_t>(bytes)}, at::TensorOptions().dtype(at::kByte));
  }
  return buf.data_ptr();
}

// Runs a product on oneDNN: b copied into its blocked layout first where the product says so.
void execute_product(const Product& p, dnnl::stream& stream,
                     std::unordered_map<int, dnnl::memory> args) {
  if (p.pack) {
    dnnl::memory packed(p.packed, cpu_engine(), pack_scratch(p.packed.get_size()));
    p.pack.execute(stream, args.at(DNNL_ARG_WEIGHTS), packed);
    args[DNNL_ARG_WEIGHTS] = packed;
  }
  p.prim.execute(stream, args);
}

// The packed variant of a 2-D product (PackB): the primitive for make_desc's product of b in the
// layout oneDNN prefers, in implementation `impl` (empty: oneDNN's first that is not a reference
// one, named in *name_out), and the reorder into it; empty where that layout is b's own (nothing to
// gain), past 16 MiB, or not offered. (A 32000-word LM head, 32 MiB in bfloat16, timed alone
// packed faster; in a training step the copy, past the last-level cache, goes to memory and back.)
constexpr size_t kMaxPackedBytes = size_t{16} << 20;
using MakeDesc = std::function<dnnl::matmul::desc(const dnnl::memory::desc&)>;
Product packed_variant(const MakeDesc& make_desc, const dnnl::primitive_attr& attr,
                       const at::Tensor& b, const std::string& impl,
                       std::string* name_out = nullptr) {
  if (b.dim() != 2) return {};
  try {
    const auto b_md = matrix_desc(b);
    // (the operation's descriptor outlives the iteration over its implementations)
    const auto desc =
        make_desc(dnnl::memory::desc(b_md.dims(), b_md.data_type(), dnnl::memory::format_tag::any));
    dnnl::matmul::primitive_desc pd(desc, attr, cpu_engine());
    do {
      const std::string name = pd.impl_info_str();
      if (impl.empty() ? name.find("ref") == std::string::npos : name == impl) {
        const auto packed = pd.weights_desc();
        if (packed == b_md || packed.get_size() > kMaxPackedBytes) return {};
        Product p;
        p.prim = dnnl::matmul(pd);
        p.pack =
            dnnl::reorder(dnnl::reorder::primitive_desc(cpu_engine(), b_md, cpu_engine(), packed));
        p.packed = packed;
        if (name_out) *name_out = name;
        return p;
      }
    } while (pd.next_impl());
  } catch (const dnnl::error&) {
  }
  return {};
}

constexpr const char* kPackedSuffix = " (B packed)";

// Primitives by shape, strides and options (creating one JIT-compiles its kernels); an empty
// one where oneDNN had no kernel, so that a failed creation is not retried on every call.
struct PrimitiveCache {
  std::mutex mutex;
  std::unordered_map<std::string, Product> map;
};

PrimitiveCache& primitive_cache() {
  static PrimitiveCache cache;
  return cache;
}

// (a pinned implementation choice replaced one that cached primitives were made with)
void drop_cached_primitives() {
  auto& cache = primitive_cache();
  std::lock_guard<std::mutex> lock(cache.mutex);
  cache.map.clear();
}

void append_key(std::string& key, at::IntArrayRef v) {
  for (auto x : v) {
    key += std::to_string(x);
    key += ',';
  }
  key += ';';
}

// A 2-D matrix's descriptor with its sizes and leading dimension left to execution time: one
// primitive serves every shape of this layout.
dnnl::memory::desc runtime_matrix_desc(const at::Tensor& t) {
  const auto rt = DNNL_RUNTIME_DIM_VAL;
  const bool row_major = t.stride(1) == 1;
  return dnnl::memory::desc({rt, rt}, dnnl_type(t),
                            row_major ? dnnl::memory::dims{rt, 1} : dnnl::memory::dims{1, rt});
}

bool runtime_shapes_ok(const at::Tensor& out, const at::Tensor& a, const at::Tensor& b) {
  return a.dim() == 2 && (a.stride(1) == 1 || a.stride(0) == 1) &&
         (b.stride(1) == 1 || b.stride(0) == 1) && out.stride(1) == 1;
}

Float32Gemm float32_gemm();

// --- oneDNN's implementation of a product, by measurement ------------------------------------
// oneDNN offers several implementations of one product and takes the first that applies: for
// bfloat16 on AVX-512 BF16 its brgemm kernels. Those lag its gemm-based ones ("gemm:jit") on
// some layouts: measured on a 2-core AMD EPYC (Zen 4), a weight's gradient g^T x (g read
// transposed) 2048 x 768 x 2304 at 629 GFLOP/s against 770, the 32000-word LM head's weight
// gradient summed into float32 600 against 746, while the forward products are closer or the
// other way round. So each product past 16M multiply-adds is timed once in every implementation
// but the reference one (on a scratch output; the default kept unless another takes under 90 % of
// its time: a close call stays with the default, so that runs repeat their choices and their
// rounding), and the choice holds for its class: dtypes, layouts, bias, accumulation and each size
// rounded up to a power of two (a batch of another length reuses it: only the primitive is new).
// EMOE_GEMM=onednn keeps oneDNN's first implementation everywhere (no timing).
// (products below it, in both choices: the default, unmeasured)
constexpr double kMeasureMacs = 16.0 * 1024 * 1024;
constexpr double kImplMargin = 0.90;    // another implementation must take < 90 % of the default's
constexpr double kPackedMargin = 0.97;  // b packed: < 97 % of the same implementation's time
constexpr int64_t kPackMinRows = 1024;  // b packed only for products of at least these many rows

struct ImplChoices {
  std::mutex mutex;
  std::unordered_map<std::string, std::string> by_class;  // class -> implementation name
  std::vector<std::string> log;                           // "class: name (GFLOP/s ...)"
};

ImplChoices& impl_choices() {
  static ImplChoices c;
  return c;
}

int64_t round_up_pow2(int64_t x) {
  int64_t p = 1;
  while (p < x) p <<= 1;
  return p;
}

std::string layout_code(const at::Tensor& t) {
  const auto n = t.dim();
  return t.stride(n - 1) == 1 ? "r" : t.stride(n - 2) == 1 ? "c" : "s";
}

// The class of a product for the implementation choice (see above).
std::string impl_class(const at::Tensor& out, const at::Tensor& a, const at::Tensor& b,
                       const at::Tensor& bias, bool accumulate, Epilogue epilogue) {
  std::string key = c10::toString(a.scalar_type());
  key += "->";
  key += c10::toString(out.scalar_type());
  key += ' ';
  for (int64_t d = 0; d + 2 < a.dim(); ++d) key += std::to_string(round_up_pow2(a.size(d))) + "x";
  key += std::to_string(round_up_pow2(a.size(-2))) + "x" +
         std::to_string(round_up_pow2(a.size(-1))) + "x" +
         std::to_string(round_up_pow2(b.size(-1)));
  key += " " + layout_code(a) + layout_code(b) + layout_code(out);
  if (bias.defined()) key += " +bias";
  if (accumulate) key += " +=";
  if (epilogue == Epilogue::kGeluErf) key += " +gelu";
  if (epilogue == Epilogue::kGeluTanh) key += " +gelu_tanh";
  return key;
}

double product_macs(const at::Tensor& a, const at::Tensor& b) {
  double macs = static_cast<double>(b.size(-1));
  for (int64_t d = 0; d < a.dim(); ++d) macs *= static_cast<double>(a.size(d));
  return macs;
}

// The product for pd's: the class's implementation where one was chosen, else (for a product
// large enough to matter) the fastest measured, else oneDNN's first; each 2-D product also
// packed (PackB: b copied into the layout oneDNN prefers, make_desc's product of it).
Product choose_implementation(dnnl::matmul::primitive_desc pd, const MakeDesc& make_desc,
                              const dnnl::primitive_attr& attr, const at::Tensor& out,
                              const at::Tensor& a, const at::Tensor& b, const at::Tensor& bias,
                              bool accumulate, Epilogue epilogue) {
  const auto packing = pack_b();
  auto plain = [](const dnnl::matmul::primitive_desc& d) {
    Product p;
    p.prim = dnnl::matmul(d);
    return p;
  };
  if (packing == PackB::kAlways) {
    auto p = packed_variant(make_desc, attr, b, "");
    if (p) return p;
  }
  if (float32_gemm() != Float32Gemm::kMeasured || product_macs(a, b) < kMeasureMacs)
    return plain(pd);
  const std::string cls = impl_class(out, a, b, bias, accumulate, epilogue);
  auto& c = impl_choices();
  std::string chosen;
  {
    std::lock_guard<std::mutex> lock(c.mutex);
    auto it = c.by_class.find(cls);
    if (it != c.by_class.end()) chosen = it->second;
  }
  if (!chosen.empty()) {
    const auto suffix = chosen.rfind(kPackedSuffix);
    if (suffix != std::string::npos &&
        suffix + std::string(kPackedSuffix).size() == chosen.size()) {
      if (packing != PackB::kNever) {
        auto p = packed_variant(make_desc, attr, b, chosen.substr(0, suffix));
        if (p) return p;
      }
      chosen =
          chosen.substr(0, suffix);  // (not packed here: the same implementation on b as it is)
    }
    // oneDNN's first kept as a descriptor (no kernels compiled) for a shape that lacks the choice
    dnnl_primitive_desc_t first_c = nullptr;
    dnnl::error::wrap_c_api(dnnl_primitive_desc_clone(&first_c, pd.get()),
                            "could not clone a matmul primitive descriptor");
    const dnnl::matmul::primitive_desc first(first_c);
    do {
      if (pd.impl_info_str() == chosen) return plain(pd);
    } while (pd.next_impl());
    return plain(first);
  }
  // every implementation but the reference one, timed on a zeroed scratch output (a sum
  // post-op then adds to zeros, not to whatever memory held)
  std::vector<std::pair<std::string, Product>> candidates;
  Product first;  // oneDNN's own choice, whatever it is (kept where nothing else is offered)
  do {
    const std::string name = pd.impl_info_str();
    if (name.find("ref") == std::string::npos)
      candidates.emplace_back(name, plain(pd));
    else if (!first && candidates.empty())
      first = plain(pd);
  } while (pd.next_impl());
  const size_t unpacked = candidates.size();
  // (packed: only for products of many rows, where one pass over b is a small part of the work;
  // the chunked LM loss's 512-row products timed packed faster alone but not in a step)
  if (packing != PackB::kNever && a.dim() == 2 && a.size(0) >= kPackMinRows) {
    std::string name;
    auto p = packed_variant(make_desc, attr, b, "", &name);
    if (p) candidates.emplace_back(name + kPackedSuffix, p);
  }
  if (candidates.empty()) return first;
  auto remember = [&](size_t i, const std::string& line) {
    std::lock_guard<std::mutex> lock(c.mutex);
    c.by_class.emplace(cls, candidates[i].first);
    if (!line.empty() && c.log.size() < 256) c.log.push_back(line);
    return candidates[i].second;
  };
  if (candidates.size() == 1) return remember(0, "");
  auto scratch = at::empty_strided(out.sizes(), out.strides(), out.options()).zero_();
  thread_local dnnl::stream stream(cpu_engine());
  const auto args = product_args(scratch, a, b, bias);
  // each once untimed (caches, page faults), then three rounds of each in turn, the best of each
  // kept (a slow moment of a noisy machine then costs one sample, not one implementation)
  std::vector<double> seconds(candidates.size(), 1e30);
  for (int round = -1; round < 3; ++round)
    for (size_t i = 0; i < candidates.size(); ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      execute_product(candidates[i].second, stream, args);
      stream.wait();
      const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (round >= 0) seconds[i] = std::min(seconds[i], t);
    }
  size_t pick = 0;
  for (size_t i = 1; i < unpacked; ++i)
    if (seconds[i] < kImplMargin * seconds[0] && seconds[i] < seconds[pick]) pick = i;
  if (candidates.size() > unpacked) {
    // packed: the same implementation gives the same sums (tested), so a smaller margin; another
    // implementation must beat the default's as above
    const size_t p = unpacked;
    const bool same = unpacked > 0 && candidates[p].first == candidates[pick].first + kPackedSuffix;
    const double bar =
        same ? kPackedMargin * seconds[pick] : std::min(seconds[pick], kImplMargin * seconds[0]);
    if (seconds[p] < bar) pick = p;
  }
  // "(default; ...)" where oneDNN's first won, "(over <default>; ...)" where another did
  std::string line = cls + ": " + candidates[pick].first +
                     (pick == 0 ? " (default; " : " (over " + candidates[0].first + "; ");
  const double gflop = 2e-9 * product_macs(a, b);
  for (size_t i = 0; i < candidates.size(); ++i)
    line += (i ? ", " : "") + candidates[i].first + " " +
            std::to_string(static_cast<int>(gflop / seconds[i])) + " GFLOP/s";
  line += ")";
  return remember(pick, line);
}

// Runs out = a @ b (+ bias | + out) through oneDNN; false when oneDNN has no kernel for these
// strides (the caller then falls back). shapes_vary: 2-D products whose sizes change from call
// to call (an expert's rows) share one primitive with the sizes given at execution time —
// creating a primitive per shape costs ~0.4 ms, more than such a product itself.
bool onednn_matmul(const at::Tensor& out, const at::Tensor& a, const at::Tensor& b,
                   const at::Tensor& bias, bool accumulate, bool shapes_vary,
                   Epilogue epilogue = Epilogue::kNone) {
  const bool runtime = shapes_vary && runtime_shapes_ok(out, a, b);
  std::string key;
  key.reserve(160);
  key += a.scalar_type() == at::kBFloat16 ? "bf16;" : "f32;";
  if (out.scalar_type() != a.scalar_type()) key += "out-f32;";  // bfloat16 products summed in f32
  if (bias.defined()) key += bias.scalar_type() == at::kBFloat16 ? "bb;" : "bf;";
  if (runtime) {
    key += "rt;";
    key += a.stride(1) == 1 ? 'r' : 'c';
    key += b.stride(1) == 1 ? 'r' : 'c';
  } else {
    append_key(key, a.sizes());
    append_key(key, a.strides());
    append_key(key, b.sizes());
    append_key(key, b.strides());
    append_key(key, out.strides());
  }
  key += bias.defined() ? 'b' : '-';
  key += accumulate ? 'a' : '-';
  key += epilogue == Epilogue::kGeluErf ? 'g' : epilogue == Epilogue::kGeluTanh ? 't' : '-';
  key += float32_gemm() == Float32Gemm::kMeasured ? 'm' : 'd';  // (choose_implementation)
  key += static_cast<char>('0' + static_cast<int>(pack_b()));
  auto& cache = primitive_cache();
  Product prim;
  {
    std::lock_guard<std::mutex> lock(cache.mutex);
    auto it = cache.map.find(key);
    if (it != cache.map.end()) {
      if (!it->second) return false;  // oneDNN had no kernel for this key: not asked again
      prim = it->second;
    }
  }
  dnnl::memory::desc bias_md_create;
  if (bias.defined())
    bias_md_create = runtime ? dnnl::memory::desc({1, DNNL_RUNTIME_DIM_VAL}, dnnl_type(bias),
                                                  dnnl::memory::dims{DNNL_RUNTIME_DIM_VAL, 1})
                             : bias_desc(out, bias);
  if (!prim) {
    try {
      dnnl::primitive_attr attr;
      if (accumulate || epilogue != Epilogue::kNone) {
        dnnl::post_ops ops;
        if (accumulate) ops.append_sum(1.0f);
        if (epilogue != Epilogue::kNone)
          ops.append_eltwise(1.0f,
                             epilogue == Epilogue::kGeluErf ? dnnl::algorithm::eltwise_gelu_erf
                                                            : dnnl::algorithm::eltwise_gelu_tanh,
                             0.0f, 0.0f);
        attr.set_post_ops(ops);
      }
      auto md = runtime ? runtime_matrix_desc : matrix_desc;
      const MakeDesc make_desc = [&](const dnnl::memory::desc& b_md) {
        return bias.defined() ? dnnl::matmul::desc(md(a), b_md, bias_md_create, md(out))
                              : dnnl::matmul::desc(md(a), b_md, md(out));
      };
      const auto desc = make_desc(md(b));
      dnnl::matmul::primitive_desc pd(desc, attr, cpu_engine());
      // (runtime shapes: one primitive for many sizes; oneDNN's first implementation)
      if (runtime)
        prim.prim = dnnl::matmul(pd);
      else
        prim = choose_implementation(pd, make_desc, attr, out, a, b, bias, accumulate, epilogue);
    } catch (const dnnl::error&) {
      prim = Product();  // remembered as "no kernel" (an empty primitive)
    }
    std::lock_guard<std::mutex> lock(cache.mutex);
    if (cache.map.size() >= 4096) cache.map.clear();  // shapes that keep changing: start over
    cache.map.emplace(key, prim);
    if (!prim) return false;
  }
  thread_local dnnl::stream stream(cpu_engine());
  execute_product(prim, stream, product_args(out, a, b, bias));
  stream.wait();
  onednn_products.fetch_add(1, std::memory_order_relaxed);
  if (prim.pack) onednn_packed_products.fetch_add(1, std::memory_order_relaxed);
  return true;
}

#endif

// --- float32: oneDNN or ATen, measured per shape -------------------------------------------
// Which library is faster for a float32 product depends on the CPU and the shape: on an AMD EPYC
// (Zen 4) Debian's OpenBLAS runs its AVX2 kernels and oneDNN is ~1.8x faster; on an Intel Xeon
// with AMX OpenBLAS's AVX-512 kernels reach 360 GFLOP/s where oneDNN takes 2048 x 768 x 3072 at
// 150. So each 2-D float32 product large enough to matter is timed once in both (twice each,
// the best kept) and later products of that shape use the faster; ATen must win by 15 % (a close
// call stays with oneDNN, so that runs repeat their choices and their rounding).
std::atomic<int> float32_gemm_setting{-1};  // Float32Gemm, or -1: from EMOE_GEMM on first use

Float32Gemm float32_gemm() {
  int v = float32_gemm_setting.load();
  if (v < 0) {
    const char* env = std::getenv("EMOE_GEMM");
    const std::string e = env ? env : "";
    v = static_cast<int>(e == "aten"     ? Float32Gemm::kAten
                         : e == "onednn" ? Float32Gemm::kOneDnn
                                         : Float32Gemm::kMeasured);
    float32_gemm_setting.store(v);
  }
  return static_cast<Float32Gemm>(v);
}

std::atomic<int> bf16_gemm_setting{-1};  // Bf16Gemm, or -1: from EMOE_BF16_GEMM on first use

struct GemmChoices {
  std::mutex mutex;
  std::unordered_map<std::string, bool> aten;  // by shape and layout: ATen measured faster
  int64_t measured = 0, chose_aten = 0;
};

GemmChoices& gemm_choices() {
  static GemmChoices c;
  return c;
}

#ifdef EMOE_HAVE_ONEDNN
void fallback_gemm_out(const at::Tensor& out, const at::Tensor& a, const at::Tensor& b,
                       const at::Tensor& bias, bool accumulate);

// True when this float32 product should go to ATen; measures the shape on first sight (when the
// call does not accumulate: a measured product overwrites `out`, and leaves the winner's result).
bool prefer_aten(const at::Tensor& out, const at::Tensor& a, const at::Tensor& b,
                 const at::Tensor& bias, bool accumulate) {
  const auto setting = float32_gemm();
  if (setting != Float32Gemm::kMeasured) return setting == Float32Gemm::kAten;
  if (a.dim() != 2 || product_macs(a, b) < kMeasureMacs) return false;
  std::string key;
  key.reserve(96);
  append_key(key, a.sizes());
  append_key(key, a.strides());
  append_key(key, b.strides());
  append_key(key, out.strides());
  key += bias.defined() ? 'b' : '-';
  auto& c = gemm_choices();
  {
    std::lock_guard<std::mutex> lock(c.mutex);
    auto it = c.aten.find(key);
    if (it != c.aten.end()) return it->second;
  }
  if (accumulate) return false;
  auto timed = [](const std::function<bool()>& f) {
    const auto t0 = std::chrono::steady_clock::now();
    const bool ok = f();
    return ok ? std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() : -1.0;
  };
  auto one = [&] { return onednn_matmul(out, a, b, bias, false, false); };
  auto aten = [&] {
    fallback_gemm_out(out, a, b, bias, false);
    return true;
  };
  if (!one()) return false;  // (creates the primitive) no oneDNN kernel: nothing to compare
  double t_one = timed(one), t_aten = timed(aten);
  t_one = std::min(t_one, timed(one));
  t_aten = std::min(t_aten, timed(aten));
  const bool use_aten = t_aten < 0.85 * t_one;
  if (!use_aten) one();  // the winner's result in out
  std::lock_guard<std::mutex> lock(c.mutex);
  if (c.aten.size() >= 4096) c.aten.clear();
  c.aten.emplace(key, use_aten);
  ++c.measured;
  if (use_aten) ++c.chose_aten;
  return use_aten;
}

// Each matrix of t is row- or column-major (what oneDNN takes without a copy).
bool plain_matrices(const at::Tensor& t) {
  const auto n = t.dim();
  return t.stride(n - 1) == 1 || t.stride(n - 2) == 1 || t.size(n - 1) == 1 || t.size(n - 2) == 1;
}
#endif

// ATen's products (OpenBLAS on CPU; any dtype and device), writing into out.
void fallback_gemm_out(const at::Tensor& out, const at::Tensor& a, const at::Tensor& b,
                       const at::Tensor& bias, bool accumulate) {
  if (out.scalar_type() != a.scalar_type()) {  // bfloat16 inputs, float32 out: rounded once
    auto r = at::matmul(a, b);
    if (bias.defined()) r.add_(bias);
    accumulate ? out.add_(r) : out.copy_(r);
    return;
  }
  if (a.dim() == 2) {
    auto o = out;  // the *_out functions take a non-const reference
    if (accumulate)
      o.addmm_(a, b);
    else if (bias.defined())
      at::addmm_out(o, bias, a, b);
    else
      at::mm_out(o, a, b);
    return;
  }
  auto r = at::matmul(a, b);
  if (bias.defined()) r.add_(bias);
  if (accumulate)
    out.add_(r);
  else
    out.copy_(r);
}

class LinearFn : public torch::autograd::Function<LinearFn> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& weight, const torch::Tensor& bias_or_empty) {
    RECORD_FUNCTION("emoe::linear", std::vector<c10::IValue>());
    const int64_t in = weight.size(1), out_features = weight.size(0);
    auto x2 = x.reshape({-1, in});
    const at::Tensor bias = bias_or_empty.numel() > 0 ? bias_or_empty : at::Tensor();
    auto y = at::empty({x2.size(0), out_features}, x.options());
    gemm_out(y, x2, weight.t(), bias);
    // x is needed for the weight's gradient, the weight for x's
    ctx->save_for_backward(
        {weight.requires_grad() ? x2 : at::Tensor(), x.requires_grad() ? weight : at::Tensor()});
    ctx->saved_data["shape"] = x.sizes().vec();
    ctx->saved_data["bias"] = bias.defined();
    ctx->saved_data["w_column_major"] = weight.stride(0) == 1 && weight.size(0) > 1;
    auto shape = x.sizes().vec();
    shape.back() = out_features;
    return y.view(shape);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const auto& x2 = saved[0];
    const auto& weight = saved[1];
    const auto g2 = grads[0].reshape({-1, grads[0].size(-1)});
    at::Tensor gx, gw, gb;
    if (ctx->needs_input_grad(0)) {
      gx = at::empty({g2.size(0), weight.size(1)}, g2.options());
      gemm_out(gx, g2, weight);
      gx = gx.view(ctx->saved_data["shape"].toIntVector());
    }
    if (ctx->needs_input_grad(1)) {
      // in the parameter's own layout (a transposed view stays transposed), so that autograd
      // keeps it as the gradient without a copy
      const int64_t out_features = g2.size(1), in = x2.size(1);
      gw = ctx->saved_data["w_column_major"].toBool()
               ? at::empty({in, out_features}, g2.options()).t()
               : at::empty({out_features, in}, g2.options());
      gemm_out(gw, g2.t(), x2);
    }
    if (ctx->needs_input_grad(2) && ctx->saved_data["bias"].toBool()) gb = g2.sum(0);
    return {gx, gw, gb};
  }
};

// The gradients of a bf16 product's float32 weight [out, in] (in its own layout: a transposed
// view stays transposed, so that autograd keeps it without a copy) and bias, from g2 = d y and
// x2 (both bfloat16, 2-D): bfloat16 operands summed straight into float32
at::Tensor float32_weight_grad(const at::Tensor& g2, const at::Tensor& x2, bool column_major) {
  const int64_t out_features = g2.size(1), in = x2.size(1);
  const auto f32 = g2.options().dtype(at::kFloat);
  auto gw =
      column_major ? at::empty({in, out_features}, f32).t() : at::empty({out_features, in}, f32);
  gemm_out(gw, g2.t(), x2);
  return gw;
}

at::Tensor float32_bias_grad(const at::Tensor& g2) {
  return column_sum_applies(g2) ? column_sum(g2) : at::sum(g2, {0}, false, at::kFloat);
}

// x W^T + b under CPU bf16 autocast for a float32 weight that wants its gradient: the products
// in bfloat16 as autocast's linear computes them (x, W and b rounded to bfloat16, the output
// bfloat16), but the weight's and bias's gradients summed straight into float32 — autocast's
// linear rounds them to bfloat16 and then copies them back to float32 (ToCopyBackward), a pass
// over every weight per step for a less accurate gradient.
class AutocastLinearFn : public torch::autograd::Function<AutocastLinearFn> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& weight, const torch::Tensor& bias_or_empty) {
    RECORD_FUNCTION("emoe::autocast_linear", std::vector<c10::IValue>());
    c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::DispatchKey::AutocastCPU);
    const int64_t in = weight.size(1), out_features = weight.size(0);
    const auto x2 = x.reshape({-1, in}).to(at::kBFloat16);
    // strides kept: a transposed view stays one; the optimiser's copy where it is current
    const auto wb = bf16_cast(weight);
    const at::Tensor bias =
        bias_or_empty.numel() > 0 ? bias_or_empty.to(at::kBFloat16) : at::Tensor();
    auto y = at::empty({x2.size(0), out_features}, x2.options());
    gemm_out(y, x2, wb.t(), bias);
    ctx->save_for_backward(
        {weight.requires_grad() ? x2 : at::Tensor(), x.requires_grad() ? wb : at::Tensor()});
    ctx->saved_data["shape"] = x.sizes().vec();
    ctx->saved_data["x_dtype"] = static_cast<int64_t>(x.scalar_type());
    ctx->saved_data["bias"] = bias.defined();
    ctx->saved_data["w_column_major"] = weight.stride(0) == 1 && weight.size(0) > 1;
    auto shape = x.sizes().vec();
    shape.back() = out_features;
    return y.view(shape);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::DispatchKey::AutocastCPU);
    auto saved = ctx->get_saved_variables();
    const auto& x2 = saved[0];
    const auto& wb = saved[1];
    auto g2 = grads[0].reshape({-1, grads[0].size(-1)}).to(at::kBFloat16);
    at::Tensor gx, gw, gb;
    if (ctx->needs_input_grad(0)) {
      gx = at::empty({g2.size(0), wb.size(1)}, g2.options());
      gemm_out(gx, g2, wb);
      gx = gx.view(ctx->saved_data["shape"].toIntVector())
               .to(static_cast<at::ScalarType>(ctx->saved_data["x_dtype"].toInt()));
    }
    if (ctx->needs_input_grad(1))
      gw = float32_weight_grad(g2, x2, ctx->saved_data["w_column_major"].toBool());
    if (ctx->needs_input_grad(2) && ctx->saved_data["bias"].toBool()) gb = float32_bias_grad(g2);
    return {gx, gw, gb};
  }
};

// x W_iᵀ + b_i for two or three weights of one input under CPU bf16 autocast (fused_linear in
// training: BERT's, Llama's and T5's query, key and value): x rounded to bfloat16 once, each
// product into an output of its own, and x's gradient summed by the products in float32. The
// float32 concatenation of the weights that AutocastLinearFn took (a copy and a rounding of it
// every step, besides the optimiser's bfloat16 copies) and the split of one output (whose
// gradient was a concatenation) are not made: BERT-base and Llama-style bf16 steps 0.95-0.98x
// the time with them on the AMX Xeon (alternated in one process).
// Absent weights and biases are empty tensors.
class AutocastLinearGroupFn : public torch::autograd::Function<AutocastLinearGroupFn> {
 public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                const torch::Tensor& x, const torch::Tensor& w0,
                                                const torch::Tensor& b0, const torch::Tensor& w1,
                                                const torch::Tensor& b1, const torch::Tensor& w2,
                                                const torch::Tensor& b2) {
    RECORD_FUNCTION("emoe::autocast_linear", std::vector<c10::IValue>());
    c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::DispatchKey::AutocastCPU);
    const std::array<const torch::Tensor*, 3> ws = {&w0, &w1, &w2}, bs = {&b0, &b1, &b2};
    const int64_t in = w0.size(1);
    const auto x2 = x.reshape({-1, in}).to(at::kBFloat16);
    bool any_weight_grad = false;
    std::vector<at::Tensor> saved, outputs;
    std::vector<int64_t> biased, column_major;
    for (size_t i = 0; i < ws.size() && ws[i]->numel() > 0; ++i) {
      const auto& w = *ws[i];
      const auto wb = bf16_cast(w);
      const at::Tensor bias = bs[i]->numel() > 0 ? bs[i]->to(at::kBFloat16) : at::Tensor();
      auto y = at::empty({x2.size(0), w.size(0)}, x2.options());
      gemm_out(y, x2, wb.t(), bias);
      auto shape = x.sizes().vec();
      shape.back() = w.size(0);
      outputs.push_back(y.view(shape));
      saved.push_back(x.requires_grad() ? wb : at::Tensor());
      biased.push_back(bias.defined());
      column_major.push_back(w.stride(0) == 1 && w.size(0) > 1);
      any_weight_grad = any_weight_grad || w.requires_grad() || bs[i]->requires_grad();
    }
    saved.push_back(any_weight_grad ? x2 : at::Tensor());
    ctx->save_for_backward(saved);
    ctx->saved_data["shape"] = x.sizes().vec();
    ctx->saved_data["x_dtype"] = static_cast<int64_t>(x.scalar_type());
    ctx->saved_data["biased"] = biased;
    ctx->saved_data["column_major"] = column_major;
    return outputs;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::DispatchKey::AutocastCPU);
    auto saved = ctx->get_saved_variables();
    const auto biased = ctx->saved_data["biased"].toIntVector();
    const auto column_major = ctx->saved_data["column_major"].toIntVector();
    const size_t n = biased.size();
    const auto& x2 = saved[n];
    torch::autograd::variable_list out(7);  // x, then (weight, bias) per product
    at::Tensor gx;                          // float32 sums over the products
    for (size_t i = 0; i < n; ++i) {
      if (!grads[i].defined()) continue;
      const auto g2 = grads[i].reshape({-1, grads[i].size(-1)}).to(at::kBFloat16);
      if (ctx->needs_input_grad(0)) {
        const auto& wb = saved[i];
        const bool first = !gx.defined();
        if (first) gx = at::empty({g2.size(0), wb.size(1)}, g2.options().dtype(at::kFloat));
        gemm_out(gx, g2, wb, at::Tensor(), /*accumulate=*/!first);
      }
      if (ctx->needs_input_grad(1 + 2 * i))
        out[1 + 2 * i] = float32_weight_grad(g2, x2, column_major[i] != 0);
      if (ctx->needs_input_grad(2 + 2 * i) && biased[i]) out[2 + 2 * i] = float32_bias_grad(g2);
    }
    if (gx.defined())
      out[0] = gx.view(ctx->saved_data["shape"].toIntVector())
                   .to(static_cast<at::ScalarType>(ctx->saved_data["x_dtype"].toInt()));
    return out;
  }
};

// a @ b over the leading (batch) dimensions, on gemm_out, and its gradients for g = d out
at::Tensor batched_product(const at::Tensor& a, const at::Tensor& b) {
  auto shape = a.sizes().vec();
  shape.back() = b.size(-1);
  auto out = at::empty(shape, a.options());
  gemm_out(out, a, b);
  return out;
}

std::pair<at::Tensor, at::Tensor> batched_product_grads(const at::Tensor& a, const at::Tensor& b,
                                                        const at::Tensor& g, bool need_a,
                                                        bool need_b) {
  at::Tensor ga, gb;
  if (need_a) {
    auto shape = g.sizes().vec();
    shape.back() = b.size(-2);
    ga = at::empty(shape, g.options());
    gemm_out(ga, g, b.transpose(-2, -1));
  }
  if (need_b) {
    auto shape = a.sizes().vec();
    shape[shape.size() - 2] = a.size(-1);
    shape.back() = g.size(-1);
    gb = at::empty(shape, g.options());
    gemm_out(gb, a.transpose(-2, -1), g);
  }
  return {ga, gb};
}

class MatmulFn : public torch::autograd::Function<MatmulFn> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& a,
                               const torch::Tensor& b) {
    RECORD_FUNCTION("emoe::matmul", std::vector<c10::IValue>());
    ctx->save_for_backward(
        {b.requires_grad() ? a : at::Tensor(), a.requires_grad() ? b : at::Tensor()});
    return batched_product(a, b);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto saved = ctx->get_saved_variables();
    auto [ga, gb] = batched_product_grads(saved[0], saved[1], grads[0], ctx->needs_input_grad(0),
                                          ctx->needs_input_grad(1));
    return {ga, gb};
  }
};

#ifdef EMOE_HAVE_ONEDNN
// a @ b under CPU bf16 autocast: the product in bfloat16 as autocast's matmul (inputs rounded to
// bfloat16, a bfloat16 output, the gradients computed in bfloat16 and returned in the inputs'
// dtypes), on oneDNN over the heads' strided views as they are: autocast's matmul copies
// attention's [B, H, T, d] views into contiguous batches first (reshape), and again backwards.
class AutocastMatmulFn : public torch::autograd::Function<AutocastMatmulFn> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& a,
                               const torch::Tensor& b) {
    RECORD_FUNCTION("emoe::autocast_matmul", std::vector<c10::IValue>());
    c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::DispatchKey::AutocastCPU);
    const auto a16 = a.to(at::kBFloat16), b16 = b.to(at::kBFloat16);
    ctx->save_for_backward(
        {b.requires_grad() ? a16 : at::Tensor(), a.requires_grad() ? b16 : at::Tensor()});
    ctx->saved_data["a_dtype"] = static_cast<int64_t>(a.scalar_type());
    ctx->saved_data["b_dtype"] = static_cast<int64_t>(b.scalar_type());
    return batched_product(a16, b16);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::DispatchKey::AutocastCPU);
    auto saved = ctx->get_saved_variables();
    auto [ga, gb] = batched_product_grads(saved[0], saved[1], grads[0].to(at::kBFloat16),
                                          ctx->needs_input_grad(0), ctx->needs_input_grad(1));
    auto dtype = [&](const char* key) {
      return static_cast<at::ScalarType>(ctx->saved_data[key].toInt());
    };
    return {ga.defined() ? ga.to(dtype("a_dtype")) : ga,
            gb.defined() ? gb.to(dtype("b_dtype")) : gb};
  }
};

bool autocast_matmul_applies(const at::Tensor& a, const at::Tensor& b) {
  auto ok = [](const at::Tensor& t) {
    return t.defined() && t.device().is_cpu() &&
           (t.scalar_type() == at::kFloat || t.scalar_type() == at::kBFloat16);
  };
  return emoe::autocast_enabled(at::kCPU) && emoe::autocast_dtype(at::kCPU) == at::kBFloat16 &&
         ok(a) && ok(b) && a.dim() >= 3 && a.dim() == b.dim() && a.size(-1) == b.size(-2) &&
         a.sizes().slice(0, a.dim() - 2) == b.sizes().slice(0, b.dim() - 2) &&
         bf16_products_on_gemm_out();
}

#endif

bool all_float_cpu(std::initializer_list<const at::Tensor*> ts) {
  for (const auto* t : ts)
    if (t->defined() && (t->scalar_type() != at::kFloat || !t->device().is_cpu())) return false;
  return true;
}

}  // namespace

bool onednn_matmul_enabled(const at::Tensor& t) {
#ifdef EMOE_HAVE_ONEDNN
  return t.defined() && t.device().is_cpu() && t.scalar_type() == at::kFloat &&
         !emoe::autocast_enabled(at::kCPU) && onednn_isa_ok();
#else
  (void)t;
  return false;
#endif
}

Float32Gemm set_float32_gemm(Float32Gemm choice) {
  const auto prev = float32_gemm();
  float32_gemm_setting.store(static_cast<int>(choice));
  return prev;
}

Bf16Gemm bf16_gemm() {
  int v = bf16_gemm_setting.load();
  if (v < 0) {
    const char* env = std::getenv("EMOE_BF16_GEMM");
    const std::string e = env ? env : "";
    EMOE_CHECK(e.empty() || e == "auto" || e == "float32" || e == "native", UsageError,
               "EMOE_BF16_GEMM: expected float32, native or auto, got '{}'", e);
    auto fallback = Bf16Gemm::kNative;
#ifdef EMOE_HAVE_ONEDNN
    // the CPU as oneDNN reads it, whatever EMOE_GEMM says (ATen's bfloat16 products are scalar
    // exactly where there is no AVX-512)
    const auto core = static_cast<unsigned>(dnnl::cpu_isa::avx512_core);
    if ((cpu_isa_as_onednn_reads() & core) != core) fallback = Bf16Gemm::kFloat32;
#endif
    v = static_cast<int>(e == "float32"  ? Bf16Gemm::kFloat32
                         : e == "native" ? Bf16Gemm::kNative
                                         : fallback);
    bf16_gemm_setting.store(v);
  }
  return static_cast<Bf16Gemm>(v);
}

PackB pack_b() {
  int v = pack_b_setting.load();
  if (v < 0) {
    const char* env = std::getenv("EMOE_PACK_B");
    const std::string e = env ? env : "";
    EMOE_CHECK(e.empty() || e == "measured" || e == "always" || e == "never", UsageError,
               "EMOE_PACK_B: expected measured, always or never, got '{}'", e);
    v = static_cast<int>(e == "always"  ? PackB::kAlways
                         : e == "never" ? PackB::kNever
                                        : PackB::kMeasured);
    pack_b_setting.store(v);
  }
  return static_cast<PackB>(v);
}

PackB set_pack_b(PackB choice) {
  const auto prev = pack_b();
  pack_b_setting.store(static_cast<int>(choice));
  return prev;
}

Bf16Gemm set_bf16_gemm(Bf16Gemm choice) {
  const auto prev = bf16_gemm();
  bf16_gemm_setting.store(static_cast<int>(choice));
  return prev;
}

bool bf16_products_on_gemm_out() {
#ifdef EMOE_HAVE_ONEDNN
  if (has_isa(dnnl::cpu_isa::avx512_core_bf16)) return true;
#endif
  return bf16_gemm() == Bf16Gemm::kFloat32;
}

std::vector<std::string> onednn_implementation_choices() {
#ifdef EMOE_HAVE_ONEDNN
  auto& c = impl_choices();
  std::lock_guard<std::mutex> lock(c.mutex);
  return c.log;
#else
  return {};
#endif
}

GemmChoiceSet gemm_choices_made() {
  GemmChoiceSet set;
#ifdef EMOE_HAVE_ONEDNN
  {
    auto& c = impl_choices();
    std::lock_guard<std::mutex> lock(c.mutex);
    set.onednn_implementations.insert(c.by_class.begin(), c.by_class.end());
  }
#endif
  auto& g = gemm_choices();
  std::lock_guard<std::mutex> lock(g.mutex);
  for (const auto& [key, aten] : g.aten) set.float32_library[key] = aten ? "aten" : "onednn";
  return set;
}

std::string pin_gemm_choices(const GemmChoiceSet& set) {
  for (const auto& [key, lib] : set.float32_library)
    if (lib != "aten" && lib != "onednn")
      return fmt::format("float32 library of '{}': expected aten or onednn, got '{}'", key, lib);
#ifdef EMOE_HAVE_ONEDNN
  bool changed = false;
  {
    auto& c = impl_choices();
    std::lock_guard<std::mutex> lock(c.mutex);
    for (const auto& [cls, name] : set.onednn_implementations) {
      auto it = c.by_class.find(cls);
      if (it != c.by_class.end() && it->second == name) continue;  // (no new line)
      changed = changed || it != c.by_class.end();
      c.by_class.insert_or_assign(cls, name);
      if (c.log.size() < 256) c.log.push_back(cls + ": " + name + " (pinned)");
    }
  }
  // a class this process had chosen otherwise: its cached primitives hold the old choice
  if (changed) drop_cached_primitives();
#endif
  auto& g = gemm_choices();
  std::lock_guard<std::mutex> lock(g.mutex);
  for (const auto& [key, lib] : set.float32_library) g.aten.insert_or_assign(key, lib == "aten");
  return "";
}

void forget_gemm_choices() {
#ifdef EMOE_HAVE_ONEDNN
  {
    auto& c = impl_choices();
    std::lock_guard<std::mutex> lock(c.mutex);
    c.by_class.clear();
    c.log.clear();
  }
  drop_cached_primitives();
#endif
  auto& g = gemm_choices();
  std::lock_guard<std::mutex> lock(g.mutex);
  g.aten.clear();
  g.measured = g.chose_aten = 0;
}

std::pair<int64_t, int64_t> float32_gemm_measurements() {
  auto& c = gemm_choices();
  std::lock_guard<std::mutex> lock(c.mutex);
  return {c.measured, c.chose_aten};
}

int64_t onednn_primitives_cached() {
#ifdef EMOE_HAVE_ONEDNN
  auto& cache = primitive_cache();
  std::lock_guard<std::mutex> lock(cache.mutex);
  return static_cast<int64_t>(cache.map.size());
#else
  return 0;
#endif
}

int64_t onednn_product_count() {
  return onednn_products.load();
}

int64_t onednn_packed_product_count() {
  return onednn_packed_products.load();
}

std::string matmul_backend_name() {
#ifdef EMOE_HAVE_ONEDNN
  if (onednn_isa_ok()) {
    std::string name = has_isa(dnnl::cpu_isa::avx512_core_amx) ? "onednn (avx512_core, bf16 on amx)"
                       : has_isa(dnnl::cpu_isa::avx512_core_bf16) ? "onednn (avx512_core, bf16)"
                                                                  : "onednn (avx512_core)";
    if (float32_gemm() == Float32Gemm::kMeasured)
      name +=
          "; float32 products of a 2-D shape past 16M multiply-adds: oneDNN or ATen "
          "(OpenBLAS), whichever measured faster for that shape; oneDNN's implementation of "
          "each product class past 16M multiply-adds (brgemm or gemm-based, and of a 2-D "
          "one, brgemm on its second operand packed into oneDNN's blocked layout first): the "
          "fastest measured";
    else if (float32_gemm() == Float32Gemm::kAten)
      name = "aten (OpenBLAS; EMOE_GEMM=aten)";
    if (float32_gemm() != Float32Gemm::kAten && pack_b() != PackB::kMeasured)
      name += pack_b() == PackB::kAlways ? "; second operands packed: always (EMOE_PACK_B)"
                                         : "; second operands packed: never (EMOE_PACK_B)";
    return name;
  }
#endif
  return "aten (OpenBLAS)";
}

void gemm_out(const at::Tensor& out, const at::Tensor& a, const at::Tensor& b,
              const at::Tensor& bias, bool accumulate, bool shapes_vary) {
  TORCH_CHECK(a.dim() >= 2 && a.dim() == b.dim() && a.dim() == out.dim(),
              "gemm_out: expected matrices of equal rank");
  TORCH_CHECK(!(accumulate && bias.defined()), "gemm_out: accumulate takes no bias");
  if (out.numel() == 0) return;
  if (a.size(-1) == 0) {  // an empty sum
    if (!accumulate) bias.defined() ? (void)out.copy_(bias.expand_as(out)) : (void)out.zero_();
    return;
  }
  // A column-major output (the gradient of a weight kept as [in, out], GPT-2's Conv1D, or a
  // transposed view of one): oneDNN has no fast kernel writing those strides (a 768 x 3072
  // weight gradient took 31 s instead of 30 ms), so the transposed product is written instead,
  // outᵀ = bᵀ aᵀ, into the same memory, now row-major.
  if (!bias.defined() && out.size(-1) > 1 && out.size(-2) > 1 && out.stride(-2) == 1 &&
      out.stride(-1) >= out.size(-2)) {
    gemm_out(out.transpose(-2, -1), b.transpose(-2, -1), a.transpose(-2, -1), at::Tensor(),
             accumulate, shapes_vary);
    return;
  }
  // bfloat16 computed in float32 (Bf16Gemm::kFloat32): the operands widened, the product's
  // float32 sums rounded once into a bfloat16 out, as oneDNN's bfloat16 products round theirs
  if (bf16_gemm() == Bf16Gemm::kFloat32 && a.device().is_cpu() &&
      (a.scalar_type() == at::kBFloat16 || b.scalar_type() == at::kBFloat16 ||
       out.scalar_type() == at::kBFloat16)) {
    auto wide = [](const at::Tensor& t) {
      return t.defined() && t.scalar_type() == at::kBFloat16 ? t.to(at::kFloat) : t;
    };
    const auto a32 = wide(a), b32 = wide(b), bias32 = wide(bias);
    if (out.scalar_type() == at::kFloat) {
      gemm_out(out, a32, b32, bias32, accumulate, shapes_vary);
      return;
    }
    auto o32 =
        accumulate ? out.to(at::kFloat) : at::empty(out.sizes(), out.options().dtype(at::kFloat));
    gemm_out(o32, a32, b32, bias32, accumulate, shapes_vary);
    out.copy_(o32);
    return;
  }
#ifdef EMOE_HAVE_ONEDNN
  // the inputs' own dtype (no autocast applies to a product asked for directly), one for all
  // (or bfloat16 inputs summed into a float32 out: oneDNN keeps the float32 sums)
  const bool same_dtype =
      b.scalar_type() == a.scalar_type() &&
      (out.scalar_type() == a.scalar_type() ||
       (a.scalar_type() == at::kBFloat16 && out.scalar_type() == at::kFloat && !bias.defined())) &&
      (!bias.defined() || bias.scalar_type() == a.scalar_type() ||
       bias.scalar_type() == at::kFloat);
  if (same_dtype && onednn_dtype_ok(a) && b.device().is_cpu() && out.device().is_cpu() &&
      plain_matrices(out) &&
      !(a.scalar_type() == at::kFloat && !shapes_vary &&
        prefer_aten(out, a, b, bias.defined() ? bias.contiguous() : bias, accumulate))) {
    const auto pa = plain_matrices(a) ? a : a.contiguous();
    const auto pb = plain_matrices(b) ? b : b.contiguous();
    const auto pbias = bias.defined() ? bias.contiguous() : bias;
    if (shapes_vary && onednn_matmul(out, pa, pb, pbias, accumulate, true)) return;
    if (onednn_matmul(out, pa, pb, pbias, accumulate, false)) return;
    // no kernel for these strides between matrices: dense copies
    if (onednn_matmul(out, pa.contiguous(), pb.contiguous(), pbias, accumulate, false)) return;
  }
#endif
  fallback_gemm_out(out, a, b, bias, accumulate);
}

bool autocast_linear_applies(const at::Tensor& x, const at::Tensor& weight,
                             const at::Tensor& bias) {
#ifdef EMOE_HAVE_ONEDNN
  return emoe::autocast_enabled(at::kCPU) && emoe::autocast_dtype(at::kCPU) == at::kBFloat16 &&
         at::GradMode::is_enabled() && weight.defined() && weight.requires_grad() &&
         weight.dim() == 2 && weight.scalar_type() == at::kFloat && weight.device().is_cpu() &&
         x.device().is_cpu() &&
         (x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16) &&
         (!bias.defined() || (bias.scalar_type() == at::kFloat && bias.device().is_cpu())) &&
         bf16_products_on_gemm_out();
#else
  (void)x, (void)weight, (void)bias;
  return false;
#endif
}

namespace {

// x W^T + b for a bfloat16 weight [out, in], x and the bias rounded to bfloat16 (no autograd; the
// callers check the shapes): on gemm_out, or with an epilogue straight on oneDNN — undefined
// where oneDNN has no kernel for it (the caller then computes the plain product and the
// activation apart)
at::Tensor bf16_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                       Epilogue epilogue = Epilogue::kNone) {
  const int64_t in = weight.size(1), out_features = weight.size(0);
  const auto x2 = x.reshape({-1, in}).to(at::kBFloat16);
  const auto wt = weight.t();
  const auto b = bias.defined() ? bias.to(at::kBFloat16) : at::Tensor();
  auto y = at::empty({x2.size(0), out_features}, x2.options());
  if (epilogue == Epilogue::kNone) {
    gemm_out(y, x2, wt, b);
  } else {
#ifdef EMOE_HAVE_ONEDNN
    if (!plain_matrices(x2) || !plain_matrices(wt) ||
        !onednn_matmul(y, x2, wt, b.defined() ? b.contiguous() : b, false, false, epilogue))
      return at::Tensor();
#else
    return at::Tensor();
#endif
  }
  auto shape = x.sizes().vec();
  shape.back() = out_features;
  return y.view(shape);
}

}  // namespace

at::Tensor autocast_inference_linear(const at::Tensor& x, const at::Tensor& weight,
                                     const at::Tensor& bias) {
#ifdef EMOE_HAVE_ONEDNN
  const bool grad = at::GradMode::is_enabled() && (x.requires_grad() || weight.requires_grad() ||
                                                   (bias.defined() && bias.requires_grad()));
  if (grad || !emoe::autocast_enabled(at::kCPU) ||
      emoe::autocast_dtype(at::kCPU) != at::kBFloat16 || !weight.defined() || weight.dim() != 2 ||
      weight.scalar_type() != at::kBFloat16 || !weight.device().is_cpu() || !x.defined() ||
      x.dim() < 1 || !x.device().is_cpu() || x.size(-1) != weight.size(1) || x.numel() == 0 ||
      (x.scalar_type() != at::kFloat && x.scalar_type() != at::kBFloat16) ||
      (bias.defined() &&
       (!bias.device().is_cpu() || bias.dim() != 1 || bias.size(0) != weight.size(0) ||
        (bias.scalar_type() != at::kFloat && bias.scalar_type() != at::kBFloat16))) ||
      !bf16_products_on_gemm_out())
    return at::Tensor();
  RECORD_FUNCTION("emoe::autocast_inference_linear", std::vector<c10::IValue>());
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::DispatchKey::AutocastCPU);
  if (requested_epilogue != Epilogue::kNone) {
    const auto epilogue = requested_epilogue;
    requested_epilogue = Epilogue::kNone;  // (the request is for one product)
    auto y = bf16_linear(x, weight, bias, epilogue);
    if (y.defined()) {
      epilogue_applied = true;
      return y;
    }
  }
  return bf16_linear(x, weight, bias);
#else
  (void)x, (void)weight, (void)bias;
  return at::Tensor();
#endif
}

at::Tensor linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  if (autocast_linear_applies(x, weight, bias))
    return AutocastLinearFn::apply(x, weight,
                                   bias.defined() ? bias : at::empty({0}, weight.options()));
  // without gradients, with bfloat16 products computed in float32 (Bf16Gemm::kFloat32): under
  // CPU bf16 autocast a float32 weight rounded to bfloat16 as autocast's linear would; bfloat16
  // x, weight (and bias) as they are; both on gemm_out (ATen's bfloat16 products are scalar there)
  if (bf16_gemm() == Bf16Gemm::kFloat32 && weight.defined() && weight.dim() == 2 &&
      weight.device().is_cpu() && x.defined() && x.device().is_cpu() &&
      !(at::GradMode::is_enabled() && (x.requires_grad() || weight.requires_grad() ||
                                       (bias.defined() && bias.requires_grad())))) {
    if (weight.scalar_type() == at::kFloat && emoe::autocast_enabled(at::kCPU) &&
        emoe::autocast_dtype(at::kCPU) == at::kBFloat16) {
      auto y = autocast_inference_linear(x, weight.to(at::kBFloat16), bias);
      if (y.defined()) return y;
    }
    if (!emoe::autocast_enabled(at::kCPU) && x.scalar_type() == at::kBFloat16 &&
        weight.scalar_type() == at::kBFloat16 && x.dim() >= 1 && x.numel() > 0 &&
        x.size(-1) == weight.size(1) &&
        (!bias.defined() || (bias.scalar_type() == at::kBFloat16 && bias.dim() == 1)))
      return bf16_linear(x, weight, bias);
  }
  if (!onednn_matmul_enabled(x) || !all_float_cpu({&weight, &bias}))
    return torch::linear(x, weight, bias);
  return LinearFn::apply(x, weight, bias.defined() ? bias : at::empty({0}, weight.options()));
}

std::vector<at::Tensor> autocast_linear_group(const at::Tensor& x,
                                              const std::vector<at::Tensor>& weights,
                                              const std::vector<at::Tensor>& biases) {
  TORCH_CHECK(weights.size() >= 2 && weights.size() <= 3 &&
                  (biases.empty() || biases.size() == weights.size()),
              "autocast_linear_group: two or three weights, and a bias for each or none");
  const auto none = at::empty({0}, weights[0].options());
  auto w = [&](size_t i) { return i < weights.size() ? weights[i] : none; };
  auto b = [&](size_t i) { return i < biases.size() ? biases[i] : none; };
  auto outs = AutocastLinearGroupFn::apply(x, w(0), b(0), w(1), b(1), w(2), b(2));
  outs.resize(weights.size());
  return outs;
}

at::Tensor matmul(const at::Tensor& a, const at::Tensor& b) {
#ifdef EMOE_HAVE_ONEDNN
  if (autocast_matmul_applies(a, b)) return AutocastMatmulFn::apply(a, b);
#endif
  const bool shapes_ok = a.dim() >= 2 && a.dim() == b.dim() &&
                         a.sizes().slice(0, a.dim() - 2) == b.sizes().slice(0, b.dim() - 2);
  // bfloat16 operands (no autocast) with bfloat16 products computed in float32 (Bf16Gemm)
  if (shapes_ok && bf16_gemm() == Bf16Gemm::kFloat32 && a.scalar_type() == at::kBFloat16 &&
      b.scalar_type() == at::kBFloat16 && a.device().is_cpu() && b.device().is_cpu() &&
      !emoe::autocast_enabled(at::kCPU))
    return MatmulFn::apply(a, b);
  if (!onednn_matmul_enabled(a) || !all_float_cpu({&b}) || !shapes_ok) return torch::matmul(a, b);
  return MatmulFn::apply(a, b);
}

InferenceGeluEpilogue::InferenceGeluEpilogue(bool tanh) {
  requested_epilogue = tanh ? Epilogue::kGeluTanh : Epilogue::kGeluErf;
  epilogue_applied = false;
}

InferenceGeluEpilogue::~InferenceGeluEpilogue() {
  requested_epilogue = Epilogue::kNone;
  epilogue_applied = false;
}

bool InferenceGeluEpilogue::applied() const {
  return epilogue_applied;
}

}  // namespace emoe
