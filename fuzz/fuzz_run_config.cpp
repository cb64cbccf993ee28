// Fuzzes the YAML run configuration of `emoe train`: the input is the file, read with
// load_run_config (YAML -> JSON, typed fields, validation). A config that loads is written back
// resolved and read again, as every run does with its run.json.
#include <cstdint>
#include <string>

#include "emoe/core/error.h"
#include "emoe/train/run_config.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path =
      emoe_fuzz::put("run.yaml", std::string(reinterpret_cast<const char*>(data), size));
  try {
    emoe::RunConfig c = emoe::load_run_config(path);
    auto j = c.to_json();
    auto c2 = emoe::RunConfig::from_json(j, "resolved");
    if (c2.to_json() != j) __builtin_trap();
    (void)c.uses_moe();
    (void)c.peft_method();
  } catch (const emoe::InputError&) {
  } catch (const emoe::RuntimeError&) {
  }
  return 0;
}
