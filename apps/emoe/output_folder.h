// A command's new output folder: refused when it already holds something, and removed again when
// the command fails before it is complete, so that no half-written model folder is left behind.
#pragma once
#include <string>

namespace emoe::cli {

class NewOutputFolder {
 public:
  // `flag` names the option in messages ("-o"). UsageError when `path` is a file, or a folder
  // that is not empty (new files would mix with old ones).
  NewOutputFolder(std::string path, std::string flag);
  // Not kept: the folder is removed (or emptied again, when it existed empty before).
  ~NewOutputFolder();
  NewOutputFolder(const NewOutputFolder&) = delete;
  NewOutputFolder& operator=(const NewOutputFolder&) = delete;
  // The command completed: the folder stays.
  void keep() { keep_ = true; }

 private:
  std::string path_;
  bool existed_ = false, keep_ = false;
};

}  // namespace emoe::cli
