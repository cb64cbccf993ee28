// stderr logger shared by the library and the command-line tool.
#include "emoe/core/logging.h"

#include <spdlog/sinks/stdout_color_sinks.h>

namespace emoe {

void init_logging(int verbosity) {
  static bool done = false;
  if (!done) {
    auto logger = spdlog::stderr_color_mt("emoe");
    logger->set_pattern("[%H:%M:%S] %^%l%$ %v");
    spdlog::set_default_logger(logger);
    done = true;
  }
  spdlog::set_level(verbosity <= 0   ? spdlog::level::warn
                    : verbosity == 1 ? spdlog::level::info
                                     : spdlog::level::debug);
}

}  // namespace emoe
