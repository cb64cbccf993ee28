// Logging to stderr through spdlog; stdout stays free for machine-readable results.
#pragma once
#include <spdlog/spdlog.h>

namespace emoe {

// Sets up the stderr logger once; verbosity: 0 warn, 1 info (default), 2 debug.
void init_logging(int verbosity = 1);

}  // namespace emoe
