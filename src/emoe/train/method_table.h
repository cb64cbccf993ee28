// The fine-tuning methods of `emoe train` in one table: what each converts its FFN layers with,
// which adapters it adds, what trains, and its one-line description. The run config, the
// field reference, the memory report, `emoe bench` and the tests all read it.
#pragma once
#include <string>
#include <vector>

#include "emoe/peft/peft.h"

namespace emoe {

struct MethodInfo {
  std::string name;  // the `method:` value
  // the MoE conversion (MoeConfig::for_method_name: emoe, emoe-learn, emoe-learn-init, gmoe,
  // moefication); "" converts no FFN layer
  std::string moe;
  PeftMethod peft = PeftMethod::kNone;
  // Under a PEFT method, what trains besides the adapters and the task head when
  // train.trainable is "all" (the authors' search_glue_no_trainer_peft.py flags): "" nothing
  // (EMoE+LoRA: --tune_gates_only with the parameter-free avg-k gate), "gates" (EMoE-learn+LoRA:
  // --tune_gates_only), "moe-layers" (GMoE+LoRA: --tune_moe_layers_only, the converted layers
  // whole). Without a PEFT method every parameter trains.
  std::string also_trains;
  std::string description;

  bool uses_moe() const { return !moe.empty(); }
  // EMoE's split experts (avg-k or learned gate): the ones that recompose to the dense FFN
  bool is_emoe() const { return moe.rfind("emoe", 0) == 0; }
};

// Every method, in the order the documentation lists them.
const std::vector<MethodInfo>& method_table();
std::vector<std::string> method_names();
// The row of `name`; InputError "<where>: expected one of <names>, got '<name>'" otherwise.
const MethodInfo& method_info(const std::string& name, const std::string& where = "method");
// nullptr when `name` is no method
const MethodInfo* find_method(const std::string& name);

}  // namespace emoe
