// Process-wide run settings shared by every command: threads, device and compute dtype.
#pragma once
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <string>

namespace emoe {

// Keeps freed large blocks in the heap for reuse (no page faults on every training step).
// Called by configure_threads.
void tune_allocator();

// Sets ATen's intra-op threads; n <= 0 means one per hardware core. Returns the count in use.
int configure_threads(int n);

// "cpu", "cuda", "cuda:1" -> a device; throws UsageError naming the flag otherwise, or
// RuntimeError when CUDA is requested but this libtorch has none.
c10::Device parse_device(const std::string& text);

// "float32"/"fp32", "bfloat16"/"bf16", "float16"/"fp16" -> a floating dtype.
c10::ScalarType parse_dtype(const std::string& text);
std::string dtype_name(c10::ScalarType t);

// Path of the shared data folder (../shared from the repository root, or $EMOE_SHARED).
std::string shared_dir();

}  // namespace emoe
