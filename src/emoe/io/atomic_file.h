// Crash-safe file writing: write to a temporary sibling, fsync, then rename over the target.
#pragma once
#include <functional>
#include <ostream>
#include <string>

namespace emoe {

// Calls write(out) on a temporary file next to `path`, then renames it onto `path`.
// On any failure the temporary file is removed and `path` is left untouched.
void write_file_atomic(const std::string& path, const std::function<void(std::ostream&)>& write);
void write_text_atomic(const std::string& path, const std::string& text);

}  // namespace emoe
