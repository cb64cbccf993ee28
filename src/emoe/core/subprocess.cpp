// Child processes for benchmarks.
#include "emoe/core/subprocess.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>

#include "emoe/core/error.h"

namespace emoe {

std::string self_executable() {
  char buf[4096];
  const ssize_t len = readlink("/proc/self/exe", buf, sizeof buf - 1);
  EMOE_CHECK(len > 0, RuntimeError, "cannot find this program's path (/proc/self/exe)");
  buf[len] = '\0';
  return buf;
}

std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

nlohmann::json run_and_read_json_line(const std::string& command, const std::string& tag,
                                      const std::string& what) {
  FILE* p = popen(command.c_str(), "r");
  EMOE_CHECK(p != nullptr, RuntimeError, "{}: cannot start a measuring process", what);
  std::string output;
  char buf[4096];
  while (fgets(buf, sizeof buf, p)) output += buf;
  const int status = pclose(p);
  const auto pos = output.find(tag);
  EMOE_CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0 && pos != std::string::npos,
             RuntimeError, "{} failed (exit {}): {}", what,
             WIFEXITED(status) ? WEXITSTATUS(status) : -1, output);
  const auto start = pos + tag.size();
  return nlohmann::json::parse(output.substr(start, output.find('\n', start) - start));
}

}  // namespace emoe
