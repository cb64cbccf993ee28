// Atomic writes: nothing half-written is ever visible under the final name.
#include "emoe/io/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "emoe/core/error.h"

namespace emoe {
namespace fs = std::filesystem;

void write_file_atomic(const std::string& path, const std::function<void(std::ostream&)>& write) {
  fs::path target(path);
  std::random_device rd;
  std::string tmp = (target.parent_path() /
                     ("." + target.filename().string() + ".tmp" + std::to_string(rd() % 1000000)))
                        .string();
  try {
    {
      std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
      EMOE_CHECK(out.good(), RuntimeError, "{}: cannot open for writing: {}", tmp,
                 std::strerror(errno));
      write(out);
      out.flush();
      EMOE_CHECK(out.good(), RuntimeError, "{}: write failed (disk full?): {}", path,
                 std::strerror(errno));
    }
    int fd = ::open(tmp.c_str(), O_RDONLY);
    if (fd >= 0) {
      int rc = ::fsync(fd);
      ::close(fd);
      EMOE_CHECK(rc == 0, RuntimeError, "{}: fsync failed: {}", path, std::strerror(errno));
    }
    std::error_code ec;
    fs::rename(tmp, target, ec);
    EMOE_CHECK(!ec, RuntimeError, "{}: rename from temporary file failed: {}", path, ec.message());
  } catch (...) {
    std::error_code ec;
    fs::remove(tmp, ec);
    throw;
  }
}

void write_text_atomic(const std::string& path, const std::string& text) {
  write_file_atomic(path, [&](std::ostream& out) { out << text; });
}

}  // namespace emoe
