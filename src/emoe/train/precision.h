// Mixed precision: matrix multiplies in bfloat16 under ATen's autocast, weights, optimiser state,
// norms, softmax and losses in float32 (CPU and CUDA).
#pragma once
#include <c10/core/Device.h>

#include <string>

namespace emoe {

enum class Precision { kFp32, kBf16Mixed };
// "fp32"/"float32" -> kFp32; "bf16"/"bf16-mixed" -> kBf16Mixed; UsageError otherwise.
Precision parse_precision(const std::string& text);
std::string to_string(Precision p);

// Enables autocast for `device` while alive (kFp32: does nothing). Nested scopes are allowed;
// the cache of bfloat16 weight copies is dropped when the outermost one ends, so that each
// step sees the weights the optimiser just wrote.
class PrecisionScope {
 public:
  PrecisionScope(Precision p, const c10::Device& device);
  ~PrecisionScope();
  PrecisionScope(const PrecisionScope&) = delete;
  PrecisionScope& operator=(const PrecisionScope&) = delete;

 private:
  bool active_ = false, cuda_ = false, previous_ = false;
};

}  // namespace emoe
