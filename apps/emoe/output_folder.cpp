// The output folder of `pretrain` and `convert`: new or empty before, complete or gone after.
#include "output_folder.h"

#include <filesystem>

#include "emoe/core/error.h"

namespace emoe::cli {
namespace fs = std::filesystem;

NewOutputFolder::NewOutputFolder(std::string path, std::string flag) : path_(std::move(path)) {
  EMOE_CHECK(!path_.empty(), UsageError, "{}: expected a folder, got an empty path", flag);
  std::error_code ec;
  const auto st = fs::status(path_, ec);
  existed_ = fs::exists(st);
  if (!existed_) return;
  EMOE_CHECK(fs::is_directory(st), UsageError, "{} {}: exists and is not a folder", flag, path_);
  EMOE_CHECK(fs::is_empty(path_, ec) && !ec, UsageError,
             "{} {}: the folder already exists and is not empty (its files would mix with the new "
             "ones); give a new or empty folder",
             flag, path_);
}

NewOutputFolder::~NewOutputFolder() {
  if (keep_) return;
  std::error_code ec;
  if (!existed_) {
    fs::remove_all(path_, ec);
    return;
  }
  // it was empty before: empty it again
  for (fs::directory_iterator it(path_, ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code rm;
    fs::remove_all(it->path(), rm);
  }
}

}  // namespace emoe::cli
