// Threads, device and dtype parsing for every command that runs a model.
#include "emoe/core/runtime.h"

#include <ATen/Parallel.h>
#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>
#include <malloc.h>
#include <torch/cuda.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <thread>
#include <vector>

#include "emoe/core/error.h"
#include "emoe/core/torch_compat.h"

namespace emoe {

void ensure_runtime_environment(int argc, char** argv) {
  if (std::getenv("OMP_WAIT_POLICY") != nullptr) return;
  ::setenv("OMP_WAIT_POLICY", "PASSIVE", 1);
  std::vector<char*> args(argv, argv + argc);
  args.push_back(nullptr);
  ::execv("/proc/self/exe", args.data());
  // execv failed (no /proc?): carry on with the spinning policy
}

namespace {

// libtorch's CPU tensors, from plain malloc instead of c10's posix_memalign. glibc 2.36 does not
// reuse a freed posix_memalign block for a later request of the same size (the request asks for
// size + alignment + a chunk header, more than the freed block holds), so the heap grows by every
// such block: measured, re-allocating and zeroing a 25 MiB buffer took 72 ms and 6,400 page
// faults each time through posix_memalign, 0.5 ms and none through malloc. In a training loop the
// heap reaches a steady state after two steps either way (no page faults afterwards, the same
// step time), but with malloc it gets there with less: BERT-base full fine-tuning's peak RSS
// 3,701 -> 3,167 MiB in fp32 and 2,957 -> 2,670 MiB in bf16. The block is over-allocated by 64
// bytes and aligned to 64 inside; the malloc pointer sits in the 8 bytes before the data and the
// block's size in the 8 before that, so the data pointer alone frees it (what
// raw_allocate/raw_deallocate need) and the bytes held are counted (cpu_tensor_peak_bytes).
std::atomic<int64_t> g_tensor_bytes{0}, g_tensor_peak{0};

class HeapCpuAllocator final : public c10::Allocator {
 public:
  static constexpr size_t kAlign = 64, kHeader = 2 * sizeof(void*);
  c10::DataPtr allocate(size_t n) EMOE_ALLOCATOR_ALLOCATE_CONST override {
    if (n == 0)
      return {nullptr, nullptr, &HeapCpuAllocator::release, c10::Device(c10::DeviceType::CPU)};
    void* base = n > SIZE_MAX - kAlign - kHeader ? nullptr : std::malloc(n + kAlign + kHeader);
    TORCH_CHECK(base != nullptr, "CPU allocator: not enough memory: you tried to allocate ", n,
                " bytes.");
    auto addr =
        (reinterpret_cast<uintptr_t>(base) + kHeader + kAlign - 1) & ~(uintptr_t{kAlign} - 1);
    void* data = reinterpret_cast<void*>(addr);
    static_cast<void**>(data)[-1] = base;
    static_cast<size_t*>(data)[-2] = n;
    const int64_t now = g_tensor_bytes.fetch_add(static_cast<int64_t>(n)) + static_cast<int64_t>(n);
    int64_t peak = g_tensor_peak.load(std::memory_order_relaxed);
    while (now > peak && !g_tensor_peak.compare_exchange_weak(peak, now)) {
    }
    return {data, data, &HeapCpuAllocator::release, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &HeapCpuAllocator::release; }
#if EMOE_ALLOCATOR_HAS_COPY_DATA
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
#endif

 private:
  static void release(void* data) {
    if (data == nullptr) return;
    g_tensor_bytes.fetch_sub(static_cast<int64_t>(static_cast<size_t*>(data)[-2]));
    std::free(static_cast<void**>(data)[-1]);
  }
};

}  // namespace

int64_t cpu_tensor_peak_bytes() {
  return g_tensor_peak.load();
}

void reset_cpu_tensor_peak() {
  g_tensor_peak.store(g_tensor_bytes.load());
}

void tune_allocator() {
  // Training allocates and frees the same large activation buffers every step. glibc returns
  // blocks above 128 KiB to the kernel at once, so each step would pay fresh page faults for
  // every buffer (page faults cost ~12 us each on this machine). Keep freed memory in the heap
  // instead, and never trim it: a BERT-base step at batch 16 x 128 frees more than 1 GiB of
  // activations at once, more than a 1 GiB trim threshold would keep. Tensors come from malloc
  // (HeapCpuAllocator above), which reuses what was freed.
  static bool done = false;
  if (done) return;
  mallopt(M_MMAP_THRESHOLD, 1 << 30);
  mallopt(M_TRIM_THRESHOLD, -1);  // -1: no trimming (mallopt(3))
  static HeapCpuAllocator heap_allocator;
  c10::SetCPUAllocator(&heap_allocator, /*priority=*/50);
  done = true;
}

int configure_threads(int n) {
  tune_allocator();
  if (n <= 0) {
    unsigned hc = std::thread::hardware_concurrency();
    n = hc == 0 ? 1 : static_cast<int>(hc);
  }
  at::set_num_threads(n);
  return at::get_num_threads();
}

c10::Device parse_device(const std::string& text, const std::string& what) {
  // "cuda:N" with N digits only (c10::Device would take "cuda:1x" apart from the CUDA check)
  const bool cuda_syntax =
      text == "cuda" || (text.rfind("cuda:", 0) == 0 && text.size() > 5 && text.size() < 10 &&
                         text.find_first_not_of("0123456789", 5) == std::string::npos);
  if (text == "cpu") return c10::Device(c10::kCPU);
  EMOE_CHECK(cuda_syntax, UsageError, "{}: expected cpu, cuda or cuda:N, got '{}'", what, text);
  if (!torch::cuda::is_available())
    EMOE_THROW(RuntimeError, "{} {}: this build of libtorch has no usable CUDA device (use cpu)",
               what, text);
  return c10::Device(text);
}

c10::ScalarType parse_dtype(const std::string& text) {
  if (text == "float32" || text == "fp32" || text == "f32") return c10::kFloat;
  if (text == "bfloat16" || text == "bf16") return c10::kBFloat16;
  if (text == "float16" || text == "fp16" || text == "f16") return c10::kHalf;
  EMOE_THROW(UsageError, "--dtype: expected float32, bfloat16 or float16, got '{}'", text);
}

std::string dtype_name(c10::ScalarType t) {
  switch (t) {
    case c10::kFloat:
      return "float32";
    case c10::kBFloat16:
      return "bfloat16";
    case c10::kHalf:
      return "float16";
    case c10::kDouble:
      return "float64";
    case c10::kLong:
      return "int64";
    case c10::kInt:
      return "int32";
    default:
      return c10::toString(t);
  }
}

std::string shared_dir() {
  if (const char* env = std::getenv("EMOE_SHARED"); env && *env) return env;
#ifdef EMOE_SOURCE_DIR
  return std::string(EMOE_SOURCE_DIR) + "/../shared";
#else
  return "../shared";
#endif
}

}  // namespace emoe
