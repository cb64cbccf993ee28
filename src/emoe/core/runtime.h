// Process-wide run settings shared by every command: threads, device and compute dtype.
#pragma once
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <string>

namespace emoe {

// ATen's OpenMP threads and OpenBLAS's own threads share the cores; with libgomp's default
// (spinning) wait policy they steal each other's time (measured: a training step 1.9x slower,
// a dispatched MoE FFN 2.7x). libgomp reads OMP_WAIT_POLICY only when it is loaded, before
// main(), so when it is unset this sets it to PASSIVE and re-executes the program once.
// Call first thing in main(); returns normally when nothing needed doing.
// (OPENBLAS_CORETYPE is left as the environment has it: see docs/performance/history.md.)
void ensure_runtime_environment(int argc, char** argv);

// Keeps freed large blocks in the heap for reuse (no page faults on every training step): CPU
// tensors come from malloc, which is never trimmed. Called by configure_threads.
void tune_allocator();
// The most bytes CPU tensors held at once since the start (or reset_cpu_tensor_peak()), as
// counted by the allocator tune_allocator installs (0 before it is installed).
int64_t cpu_tensor_peak_bytes();
void reset_cpu_tensor_peak();

// Sets ATen's intra-op threads; n <= 0 means one per hardware core. Returns the count in use.
int configure_threads(int n);

// "cpu", "cuda", "cuda:N"; errors name `what` (the flag or the config key): UsageError for
// another name, RuntimeError when this libtorch has no usable CUDA device.
c10::Device parse_device(const std::string& text, const std::string& what = "--device");

// "float32"/"fp32", "bfloat16"/"bf16", "float16"/"fp16" -> a floating dtype.
c10::ScalarType parse_dtype(const std::string& text);
std::string dtype_name(c10::ScalarType t);

// Path of the shared data folder (../shared from the repository root, or $EMOE_SHARED).
std::string shared_dir();

}  // namespace emoe
