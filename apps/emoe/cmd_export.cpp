// `emoe export MOE_DIR --dense -o OUT`: recompose a converted model into the plain architecture.
#include <iostream>

#include "commands.h"
#include "emoe/core/error.h"
#include "emoe/moe/convert.h"

namespace emoe::cli {
namespace {

struct ExportArgs {
  std::string moe_dir, out;
  bool dense = false;
};

void run_export(const ExportArgs& a) {
  EMOE_CHECK(a.dense, UsageError, "export: pass --dense (recomposition to the original architecture)");
  MoeState state;
  auto model = load_any_model(a.moe_dir, {}, &state);
  EMOE_CHECK(!state.empty(), UsageError, "{}: no moe.json: the model is already dense", a.moe_dir);
  const auto method = state.config.method;
  const auto layers = state.config.layers;
  recompose_dense(*model, state);
  save_moe_model(*model, state, a.out, a.moe_dir);
  std::cout << fmt::format("{} -> {}: dense {} (layers {} recomposed from {}, neurons in original order)\n",
                           a.moe_dir, a.out, model->config_json()["architectures"][0].get<std::string>(),
                           fmt::join(layers, ","), to_string(method));
}

}  // namespace

void register_export(CLI::App& app) {
  auto a = std::make_shared<ExportArgs>();
  auto* cmd = app.add_subcommand("export", "Export a converted model as a standard dense Hugging Face checkpoint");
  cmd->add_option("MOE_DIR", a->moe_dir, "Converted model folder (with moe.json)")->required();
  cmd->add_flag("--dense", a->dense, "Recompose into the original dense architecture")->required();
  cmd->add_option("-o,--output", a->out, "Output folder")->required();
  cmd->callback([a] { run_export(*a); });
}

}  // namespace emoe::cli
