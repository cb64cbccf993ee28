// flock on a directory, with the holder's pid in DIR/.emoe.lock for the second writer's message.
#include "emoe/io/folder_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <string>

#include "emoe/core/error.h"
#include "emoe/io/atomic_file.h"

namespace emoe {

FolderLock::FolderLock(const std::string& dir) : dir_(dir) {
  fd_ = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  EMOE_CHECK(fd_ >= 0, RuntimeError, "{}: cannot open the folder to lock it: {}", dir,
             std::strerror(errno));
  if (::flock(fd_, LOCK_EX | LOCK_NB) == 0) return;
  const int err = errno;
  ::close(fd_);
  fd_ = -1;
  EMOE_CHECK(err == EWOULDBLOCK, RuntimeError, "{}: cannot lock: {}", dir, std::strerror(err));
  std::string pid;
  std::ifstream(dir + "/.emoe.lock") >> pid;
  EMOE_THROW(UsageError,
             "{}: another emoe process{} is writing to this folder; wait for it to finish or "
             "choose another output",
             dir, pid.empty() ? "" : " (pid " + pid + ")");
}

FolderLock::~FolderLock() {
  if (fd_ >= 0) ::close(fd_);
}

void FolderLock::record_pid() const {
  write_text_atomic(dir_ + "/.emoe.lock", std::to_string(::getpid()) + "\n");
}

}  // namespace emoe
