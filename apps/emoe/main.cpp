// emoe command-line tool: parses subcommands and turns library errors into exit codes.
#include <CLI/CLI.hpp>

#include <iostream>

#include "emoe/core/error.h"
#include "emoe/core/logging.h"

int main(int argc, char** argv) {
  CLI::App app{"emoe: Mixture-of-Experts fine-tuning for Hugging Face transformers"};
  app.require_subcommand(1);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  return 0;
}
