// Mixed-precision scopes over ATen's autocast.
#include "emoe/train/precision.h"

#include "emoe/core/autocast_compat.h"
#include "emoe/core/error.h"

namespace emoe {

Precision parse_precision(const std::string& text) {
  if (text == "fp32" || text == "float32") return Precision::kFp32;
  if (text == "bf16" || text == "bf16-mixed" || text == "bfloat16") return Precision::kBf16Mixed;
  EMOE_THROW(UsageError, "precision: expected fp32 or bf16-mixed, got '{}'", text);
}

std::string to_string(Precision p) {
  return p == Precision::kFp32 ? "fp32" : "bf16-mixed";
}

PrecisionScope::PrecisionScope(Precision p, const c10::Device& device) {
  if (p == Precision::kFp32) return;
  active_ = true;
  cuda_ = device.is_cuda();
  if (cuda_) {
    previous_ = emoe::autocast_enabled(at::kCUDA);
    emoe::set_autocast_dtype(at::kCUDA, at::kBFloat16);
    emoe::set_autocast_enabled(at::kCUDA, true);
  } else {
    previous_ = emoe::autocast_enabled(at::kCPU);
    emoe::set_autocast_dtype(at::kCPU, at::kBFloat16);
    emoe::set_autocast_enabled(at::kCPU, true);
  }
  at::autocast::increment_nesting();
}

PrecisionScope::~PrecisionScope() {
  if (!active_) return;
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  if (cuda_)
    emoe::set_autocast_enabled(at::kCUDA, previous_);
  else
    emoe::set_autocast_enabled(at::kCPU, previous_);
}

}  // namespace emoe
