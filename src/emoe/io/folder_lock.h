// An exclusive lock on a folder that one process writes (a run folder): a second writer is told
// who holds it instead of mixing its files with the first one's.
#pragma once
#include <string>

namespace emoe {

class FolderLock {
 public:
  // Locks the folder itself (flock on the directory, released by the kernel when the holder
  // dies; nothing is written, so a refused command leaves the folder as it was). UsageError
  // naming the holder (its pid, when it recorded one) when another process holds it.
  explicit FolderLock(const std::string& dir);
  ~FolderLock();
  FolderLock(const FolderLock&) = delete;
  FolderLock& operator=(const FolderLock&) = delete;

  // Writes this process's pid to DIR/.emoe.lock for a second writer's message (call once the
  // command writes to the folder anyway).
  void record_pid() const;

 private:
  std::string dir_;
  int fd_ = -1;
};

}  // namespace emoe
