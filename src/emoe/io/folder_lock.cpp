// flock-based folder lock with the holder's pid in the lock file.
#include "emoe/io/folder_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "emoe/core/error.h"

namespace emoe {

FolderLock::FolderLock(const std::string& dir) {
  const std::string path = dir + "/.emoe.lock";
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  EMOE_CHECK(fd_ >= 0, RuntimeError, "{}: cannot open the folder's lock file: {}", path,
             std::strerror(errno));
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    char buf[32] = {0};
    const auto n = ::pread(fd_, buf, sizeof(buf) - 1, 0);
    ::close(fd_);
    fd_ = -1;
    const std::string holder = n > 0 ? std::string(buf, static_cast<size_t>(n)) : "unknown";
    EMOE_CHECK(err != EWOULDBLOCK, UsageError,
               "{}: another emoe process (pid {}) is writing to this folder; wait for it to "
               "finish or choose another output",
               dir, holder.substr(0, holder.find('\n')));
    EMOE_THROW(RuntimeError, "{}: cannot lock: {}", path, std::strerror(err));
  }
  const std::string pid = std::to_string(::getpid()) + "\n";
  if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, pid.data(), pid.size(), 0) < 0) {
    // the pid only helps the message of a second writer: the lock itself holds
  }
}

FolderLock::~FolderLock() {
  if (fd_ >= 0) ::close(fd_);
}

}  // namespace emoe
