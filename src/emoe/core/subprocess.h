// Measuring in a child process: benchmarks run each configuration in a fresh copy of the
// program (so that peak memory is its own) and read back one tagged JSON line.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

namespace emoe {

// Absolute path of the running program (/proc/self/exe); RuntimeError when unreadable.
std::string self_executable();

// Single-quotes `s` for /bin/sh.
std::string shell_quote(const std::string& s);

// Runs `command` through the shell and returns the JSON that follows `tag` on its standard
// output; RuntimeError naming `what`, with the output, when it fails or prints no such line.
nlohmann::json run_and_read_json_line(const std::string& command, const std::string& tag,
                                      const std::string& what);

}  // namespace emoe
