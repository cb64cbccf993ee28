// emoe command-line tool: parses subcommands and turns library errors into exit codes.
#include <c10/util/Exception.h>
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <iostream>

#include "commands.h"
#include "emoe/core/error.h"
#include "emoe/core/logging.h"
#include "emoe/core/runtime.h"
#include "emoe/moe/kernel_choices.h"

int main(int argc, char** argv) {
  emoe::ensure_runtime_environment(argc, argv);
  CLI::App app{"emoe: Mixture-of-Experts fine-tuning for Hugging Face transformers"};
  app.require_subcommand(1);
  app.fallthrough();  // -v/-q work after the subcommand too
  app.set_version_flag("--version", std::string("emoe ") + EMOE_VERSION);
  int verbosity = 1;
  emoe::init_logging(verbosity);
  app.add_flag_function(
      "-v,--verbose", [&](int64_t n) { verbosity = 1 + static_cast<int>(n); }, "More log output");
  app.add_flag_function(
      "-q,--quiet", [&](int64_t) { verbosity = 0; }, "Warnings and errors only");
  app.parse_complete_callback([&] { emoe::init_logging(verbosity); });
  emoe::cli::register_info(app);
  emoe::cli::register_generate(app);
  emoe::cli::register_forward(app);
  emoe::cli::register_tokenize(app);
  emoe::cli::register_convert(app);
  emoe::cli::register_export(app);
  emoe::cli::register_train(app);
  emoe::cli::register_eval(app);
  emoe::cli::register_sweep(app);
  emoe::cli::register_analyze(app);
  emoe::cli::register_prune(app);
  emoe::cli::register_bench(app);
  emoe::cli::register_pretrain(app);
  emoe::cli::register_demo(app);
  try {
    std::vector<std::string> names;
    bool known = false;
    for (auto* sub : app.get_subcommands([](CLI::App*) { return true; })) {
      names.push_back(sub->get_name());
      known = known || (argc > 1 && sub->check_name(argv[1]));
    }
    if (argc > 1 && argv[1][0] != '-' && !known) {
      std::cerr << "emoe: error: unknown command '" << argv[1]
                << "' (commands: " << fmt::format("{}", fmt::join(names, ", ")) << ")\n";
      return 2;
    }
    emoe::pin_kernel_choices_from_env();  // before any product is timed
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help, --version
    std::cerr << "emoe: error: " << e.what() << " (see emoe " << (argc > 1 ? argv[1] : "")
              << " --help)\n";
    return 2;
  } catch (const emoe::InputError& e) {
    std::cerr << "emoe: error: " << e.what() << "\n";
    return 2;
  } catch (const emoe::RuntimeError& e) {
    std::cerr << "emoe: error: " << e.what() << "\n";
    return 1;
  } catch (const c10::Error& e) {
    std::cerr << "emoe: error: " << e.what_without_backtrace() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "emoe: error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
