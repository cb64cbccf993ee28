// An exclusive lock on a folder that one process writes (a run folder): a second writer is told
// who holds it instead of mixing its files with the first one's.
#pragma once
#include <string>

namespace emoe {

class FolderLock {
 public:
  // Takes the lock file `dir`/.emoe.lock (flock, released by the kernel when the holder dies);
  // UsageError naming the holder's pid when another process holds it.
  explicit FolderLock(const std::string& dir);
  ~FolderLock();
  FolderLock(const FolderLock&) = delete;
  FolderLock& operator=(const FolderLock&) = delete;

 private:
  int fd_ = -1;
};

}  // namespace emoe
