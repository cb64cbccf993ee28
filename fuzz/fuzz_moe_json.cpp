// Fuzzes moe.json, the MoE state a converted model folder carries (read by load_any_model and by
// pruning runs): the input is the file. A state that parses is validated against a 12-layer model
// with d_ff 3072 (as attach_moe does with the model's sizes) and written back and read again.
#include <torch/torch.h>

#include <cstdint>
#include <string>

#include "emoe/core/error.h"
#include "emoe/io/hf_config.h"
#include "emoe/moe/convert.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path =
      emoe_fuzz::put("moe.json", std::string(reinterpret_cast<const char*>(data), size));
  try {
    emoe::MoeState st = emoe::moe_state_from_json(emoe::JsonFields::from_file(path));
    auto again =
        emoe::moe_state_from_json(emoe::JsonFields(emoe::moe_state_to_json(st), "written"));
    if (again.config.to_json() != st.config.to_json()) __builtin_trap();
    st.config.validate(12, 3072);
  } catch (const emoe::InputError&) {
  } catch (const emoe::RuntimeError&) {
  }
  return 0;
}
