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

// Writes a whole folder at once: write(staging) fills a fresh hidden sibling folder, which then
// takes `dir`'s place (an atomic exchange where the file system has one, else two renames), so
// a reader sees the old folder or the new one, never a mix. Files of an existing `dir` that the
// new folder lacks are carried over unless replaced(name) says the new save owns that name (its
// stale weights, say); the old folder is removed. On any failure the staging folder is removed
// and `dir` is left as it was.
void write_folder_atomic(const std::string& dir,
                         const std::function<void(const std::string& staging)>& write,
                         const std::function<bool(const std::string& name)>& replaced);

}  // namespace emoe
