// `emoe demo [--model DIR --task T --data DIR]`: the comparison of dense, LoRA and EMoE
// fine-tuning, end to end, with its table, figures and report.
#include <iostream>

#include "commands.h"
#include "emoe/core/error.h"
#include "emoe/train/demo.h"

namespace emoe::cli {
namespace {

struct DemoArgs {
  DemoOptions o;
  RunFlags run;
};

void run_demo_cmd(DemoArgs& a) {
  a.o.device = a.run.device;
  a.o.dtype = a.run.dtype;
  a.o.threads = a.run.threads;
  apply_run_flags(a.run);
  auto r = run_demo(a.o);
  std::cout << "\n" << r.table << "\n";
  for (const auto& f : r.figures) std::cout << "figure: " << f << "\n";
  std::cout << "report: " << r.report << "\n";
  std::cout << fmt::format("demo finished in {:.0f} s\n", r.seconds);
}

}  // namespace

void register_demo(CLI::App& app) {
  auto a = std::make_shared<DemoArgs>();
  a->o.data_dir = "../shared/data";
  auto* cmd = app.add_subcommand("demo",
                                 "Pretrain a small BERT on made-up reviews, fine-tune dense, LoRA "
                                 "and EMoE, compare in and out of domain");
  cmd->add_option("-o,--output", a->o.output, "Output folder (table, report, figures, runs)")
      ->capture_default_str();
  add_list_option(cmd, "--methods", a->o.methods, "Methods to compare (default full,lora,emoe)");
  cmd->add_option("--seed", a->o.seed, "Seed of the data, pretraining and fine-tuning")
      ->capture_default_str()
      ->check(non_negative_integer());
  cmd->add_flag("--quick", a->o.quick, "A much smaller configuration (seconds; for tests)");
  cmd->add_option("--model", a->o.model,
                  "Your Hugging Face model folder instead of the built-in one");
  cmd->add_option("--task", a->o.task, "GLUE task for --model (e.g. sst2)");
  cmd->add_option("--data", a->o.data_dir, "Data folder for --task (GLUE layout)")
      ->capture_default_str();
  cmd->add_option("--max-train-examples", a->o.max_train_examples, "Training subset for --task")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 40));
  cmd->add_option("--pretrain-steps", a->o.pretrain_steps,
                  "Masked-LM steps of the built-in model (default 600)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 30));
  add_run_flags(cmd, a->run);
  cmd->callback([a] { run_demo_cmd(*a); });
}

}  // namespace emoe::cli
