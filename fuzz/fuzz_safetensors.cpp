// Fuzzes the safetensors reader: the input is the file. It is opened through CheckpointReader (a
// model folder holding model.safetensors), and every tensor it lists is copied out, as stored and
// converted to float32. Our typed errors (InputError, RuntimeError) are the expected outcome of a
// bad file; anything else escaping, a crash, or an allocation beyond the file's size is a finding.
#include <cstdint>
#include <string>

#include "emoe/core/error.h"
#include "emoe/io/safetensors.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  emoe_fuzz::put("model.safetensors", std::string(reinterpret_cast<const char*>(data), size));
  try {
    emoe::CheckpointReader ckpt(emoe_fuzz::folder());
    int n = 0;
    for (const auto& name : ckpt.names()) {
      const auto& e = ckpt.entry(name);
      (void)e.numel();
      auto t = ckpt.load(name);
      auto f = ckpt.load(name, c10::kFloat);
      if (t.numel() != e.numel() || f.numel() != e.numel()) __builtin_trap();
      if (++n == 64) break;
    }
  } catch (const emoe::InputError&) {
  } catch (const emoe::RuntimeError&) {
  }
  return 0;
}
