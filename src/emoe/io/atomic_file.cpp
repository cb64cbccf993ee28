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
#include <vector>

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

namespace {

std::string random_suffix() {
  std::random_device rd;
  return std::to_string(rd() % 1000000);
}

void fsync_folder(const fs::path& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

}  // namespace

void write_folder_atomic(const std::string& dir,
                         const std::function<void(const std::string& staging)>& write,
                         const std::function<bool(const std::string& name)>& replaced) {
  fs::path target = fs::absolute(dir).lexically_normal();
  if (target.filename().empty()) target = target.parent_path();  // "out/"
  const fs::path parent = target.parent_path();
  std::error_code ec;
  fs::create_directories(parent, ec);
  EMOE_CHECK(!ec, RuntimeError, "{}: cannot create directory: {}", parent.string(), ec.message());
  EMOE_CHECK(!fs::exists(target) || fs::is_directory(target), InputError,
             "{}: exists and is not a folder", dir);
  const std::string name = target.filename().string();
  // a sibling, so that the renames below stay on one file system
  const fs::path staging = parent / ("." + name + ".tmp" + random_suffix());
  fs::create_directory(staging, ec);
  EMOE_CHECK(!ec, RuntimeError, "{}: cannot create a staging folder: {}", staging.string(),
             ec.message());
  const auto remove_staging = [&] {
    std::error_code ignored;
    fs::remove_all(staging, ignored);
  };
  std::vector<std::string> carried_folders;  // moved over after the exchange
  try {
    write(staging.string());
    if (fs::is_directory(target)) {
      // the old folder stays complete until the exchange: its files are hard-linked, not moved
      for (const auto& e : fs::directory_iterator(target)) {
        const std::string f = e.path().filename().string();
        if (replaced(f) || fs::exists(fs::symlink_status(staging / f))) continue;
        if (fs::is_directory(e.symlink_status())) {
          carried_folders.push_back(f);
          continue;
        }
        fs::create_hard_link(e.path(), staging / f, ec);
        if (ec) {
          ec.clear();
          fs::copy(e.path(), staging / f, fs::copy_options::copy_symlinks, ec);
        }
        EMOE_CHECK(!ec, RuntimeError, "{}: cannot carry over into the new folder: {}",
                   e.path().string(), ec.message());
      }
    }
    fsync_folder(staging);
  } catch (...) {
    remove_staging();
    throw;
  }
  if (!fs::exists(target)) {
    fs::rename(staging, target, ec);
    if (ec) {
      remove_staging();
      EMOE_THROW(RuntimeError, "{}: cannot move the new folder into place: {}", dir, ec.message());
    }
    fsync_folder(parent);
    return;
  }
  fs::path old;
  if (::renameat2(AT_FDCWD, staging.c_str(), AT_FDCWD, target.c_str(), RENAME_EXCHANGE) == 0) {
    old = staging;  // the exchange left the old folder under the staging name
  } else {
    // a file system without RENAME_EXCHANGE: two renames, the old folder kept until the second
    old = parent / ("." + name + ".old" + random_suffix());
    fs::rename(target, old, ec);
    if (ec) {
      remove_staging();
      EMOE_THROW(RuntimeError, "{}: cannot move the old folder aside: {}", dir, ec.message());
    }
    fs::rename(staging, target, ec);
    if (ec) {
      std::error_code ignored;
      fs::rename(old, target, ignored);
      remove_staging();
      EMOE_THROW(RuntimeError, "{}: cannot move the new folder into place: {}", dir, ec.message());
    }
  }
  for (const auto& f : carried_folders) {
    fs::rename(old / f, target / f, ec);
    EMOE_CHECK(!ec, RuntimeError, "{}: cannot carry the folder {} over (left in {}): {}", dir, f,
               old.string(), ec.message());
  }
  fs::remove_all(old, ec);
  fsync_folder(parent);
}

}  // namespace emoe
