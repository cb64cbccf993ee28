// Typed errors: library code throws these with context; only main() turns them into exit codes.
#pragma once
#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace emoe {

// Exit code 2: the user gave us something wrong (a file, a field, a flag).
class InputError : public std::runtime_error {
 public:
  explicit InputError(const std::string& what) : std::runtime_error(what) {}
};

// Exit code 2 as well, but about the command line itself.
class UsageError : public InputError {
 public:
  explicit UsageError(const std::string& what) : InputError(what) {}
};

// Exit code 1: the environment failed us (disk full, I/O error, device missing).
class RuntimeError : public std::runtime_error {
 public:
  explicit RuntimeError(const std::string& what) : std::runtime_error(what) {}
};

}  // namespace emoe

// EMOE_CHECK(cond, InputError, "{}: field '{}': expected {}, got {}", file, field, a, b)
#define EMOE_CHECK(cond, ErrorType, ...)                            \
  do {                                                              \
    if (!(cond)) throw ::emoe::ErrorType(fmt::format(__VA_ARGS__)); \
  } while (0)

#define EMOE_THROW(ErrorType, ...) throw ::emoe::ErrorType(fmt::format(__VA_ARGS__))
