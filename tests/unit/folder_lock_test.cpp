// The run-folder lock (io/folder_lock.h), across two processes.
#include "emoe/io/folder_lock.h"

#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>

#include "emoe/core/error.h"
#include "support/test_support.h"

// One writer per folder: a second process is refused with the holder's pid; the lock goes with
// its holder (also when the holder dies: the kernel drops a flock with the process). Taking it
// writes nothing into the folder.
TEST(FolderLock, ASecondProcessIsRefusedWithTheHoldersPid) {
  emoe::test::TempDir tmp;
  auto try_in_child = [&] {
    const pid_t pid = fork();
    if (pid == 0) {
      try {
        emoe::FolderLock second(tmp.path());
      } catch (const emoe::UsageError& e) {
        const std::string msg = e.what();
        _exit(msg.find("another emoe process (pid " + std::to_string(getppid())) !=
                      std::string::npos
                  ? 2
                  : 3);
      } catch (...) {
        _exit(4);
      }
      _exit(0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  };
  {
    emoe::FolderLock first(tmp.path());
    first.record_pid();
    EXPECT_EQ(try_in_child(), 2) << "the second writer must be refused, naming the first's pid";
  }
  {
    emoe::test::TempDir empty;
    const auto before = std::filesystem::last_write_time(empty.path());
    emoe::FolderLock lock(empty.path());
    EXPECT_EQ(std::filesystem::last_write_time(empty.path()), before);
    EXPECT_TRUE(std::filesystem::is_empty(empty.path()));
  }
  EXPECT_EQ(try_in_child(), 0) << "released with its holder";
}
