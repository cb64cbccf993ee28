// `emoe export MOE_DIR --dense -o OUT`: recompose a converted model into the plain architecture.
#include <iostream>

#include "commands.h"
#include "emoe/core/error.h"
#include "emoe/io/safetensors.h"
#include "emoe/methods/model_folder.h"
#include "emoe/moe/convert.h"
#include "output_folder.h"

namespace emoe::cli {
namespace {

struct ExportArgs {
  std::string moe_dir, out, max_shard_size;
  bool dense = false;
};

void run_export(const ExportArgs& a) {
  EMOE_CHECK(a.dense, UsageError,
             "export: pass --dense (recomposition to the original architecture)");
  const uint64_t max_shard =
      a.max_shard_size.empty() ? 0 : parse_byte_size(a.max_shard_size, "--max-shard-size");
  NewOutputFolder out(a.out, "-o");  // new or empty; removed again if the export fails
  MoeState state;
  PeftConfig peft;
  auto model = load_any_model(a.moe_dir, {}, &state, &peft);
  EMOE_CHECK(!state.empty() || peft.method != PeftMethod::kNone, UsageError,
             "{}: no moe.json or peft.json: the model is already dense", a.moe_dir);
  std::vector<std::string> done;
  if (!state.empty()) {
    done.push_back(fmt::format("layers {} recomposed from {} (neurons in original order)",
                               fmt::join(state.config.layers, ","),
                               to_string(state.config.method)));
    recompose_dense(*model, state);
  }
  if (peft.method == PeftMethod::kLora) {
    merge_lora(*model);
    peft = PeftConfig();
    done.push_back("LoRA merged into the weights");
  }
  model->to(stored_float_dtype(a.moe_dir));  // computed in float32, stored as the source was
  save_any_model(*model, state, peft, a.out, a.moe_dir, max_shard);
  out.keep();
  if (peft.method != PeftMethod::kNone)
    done.push_back(fmt::format("{} adapters kept (peft.json): they have no dense form",
                               to_string(peft.method)));
  std::cout << fmt::format("{} -> {}: {}; {}\n", a.moe_dir, a.out,
                           model->config_json()["architectures"][0].get<std::string>(),
                           fmt::join(done, "; "));
}

}  // namespace

void register_export(CLI::App& app) {
  auto a = std::make_shared<ExportArgs>();
  auto* cmd = app.add_subcommand(
      "export", "Export a converted model as a standard dense Hugging Face checkpoint");
  cmd->add_option("MOE_DIR", a->moe_dir, "Converted model folder (with moe.json)")->required();
  cmd->add_flag("--dense", a->dense, "Recompose into the original dense architecture")->required();
  cmd->add_option("-o,--output", a->out, "Output folder")->required();
  cmd->add_option("--max-shard-size", a->max_shard_size,
                  "Split the weights into Hugging Face shards of at most this size (500MB, 2GB, "
                  "or bytes) with model.safetensors.index.json");
  cmd->callback([a] { run_export(*a); });
}

}  // namespace emoe::cli
