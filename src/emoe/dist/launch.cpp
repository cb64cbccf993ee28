#include "emoe/dist/launch.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <iterator>
#include <thread>

#include "emoe/core/error.h"
#include "emoe/core/subprocess.h"

namespace emoe {

std::vector<std::string> own_command_line() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::string> out;
  size_t start = 0;
  for (size_t i = 0; i < all.size(); ++i)
    if (all[i] == '\0') out.push_back(all.substr(start, i - start)), start = i + 1;
  EMOE_CHECK(!out.empty(), RuntimeError,
             "/proc/self/cmdline: cannot read this process's command line");
  return out;
}

int free_tcp_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  EMOE_CHECK(fd >= 0, RuntimeError, "cannot open a socket to find a free port: {}",
             std::strerror(errno));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof(a);
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0;
  ::close(fd);
  EMOE_CHECK(ok, RuntimeError, "cannot find a free TCP port on 127.0.0.1: {}",
             std::strerror(errno));
  return ntohs(a.sin_port);
}

LaunchResult launch_local_workers(const LaunchOptions& o, const std::vector<std::string>& args) {
  EMOE_CHECK(o.nproc >= 1, UsageError, "--nproc: expected >= 1, got {}", o.nproc);
  const int port = o.master_port > 0 ? o.master_port : free_tcp_port();
  const std::string exe = self_executable();
  std::vector<pid_t> pids;
  for (int r = 0; r < o.nproc; ++r) {
    pid_t pid = ::fork();
    EMOE_CHECK(pid >= 0, RuntimeError, "cannot start worker {}: {}", r, std::strerror(errno));
    if (pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // a launcher that dies takes its workers with it
      ::setenv("RANK", std::to_string(r).c_str(), 1);
      ::setenv("LOCAL_RANK", std::to_string(r).c_str(), 1);
      ::setenv("WORLD_SIZE", std::to_string(o.nproc).c_str(), 1);
      ::setenv("LOCAL_WORLD_SIZE", std::to_string(o.nproc).c_str(), 1);
      ::setenv("MASTER_ADDR", o.master_addr.c_str(), 1);
      ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
      ::setenv("EMOE_DIST_TIMEOUT", fmt::format("{}", o.timeout_s).c_str(), 1);
      std::vector<char*> argv;
      argv.push_back(const_cast<char*>(exe.c_str()));
      for (size_t i = 1; i < args.size(); ++i) argv.push_back(const_cast<char*>(args[i].c_str()));
      argv.push_back(nullptr);
      ::execv(exe.c_str(), argv.data());
      std::fprintf(stderr, "emoe: error: cannot run %s: %s\n", exe.c_str(), std::strerror(errno));
      ::_exit(127);
    }
    pids.push_back(pid);
  }
  spdlog::info("started {} workers (rendezvous {}:{}, timeout {} s)", o.nproc, o.master_addr, port,
               o.timeout_s);
  LaunchResult result;
  int running = o.nproc;
  bool stopping = false;
  auto stop_deadline = std::chrono::steady_clock::time_point::max();
  while (running > 0) {
    int status = 0;
    pid_t pid = ::waitpid(-1, &status, stopping ? WNOHANG : 0);
    if (pid == 0) {  // stopping: nobody exited yet
      if (std::chrono::steady_clock::now() > stop_deadline)
        for (pid_t p : pids)
          if (p > 0) ::kill(p, SIGKILL);
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      continue;
    }
    if (pid < 0) {
      if (errno == EINTR) continue;
      break;
    }
    int rank = -1;
    for (int r = 0; r < o.nproc; ++r)
      if (pids[static_cast<size_t>(r)] == pid) rank = r, pids[static_cast<size_t>(r)] = -1;
    if (rank < 0) continue;
    running -= 1;
    const bool failed = !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    if (failed && !stopping) {
      const std::string why = WIFSIGNALED(status)
                                  ? fmt::format("was killed by signal {} ({})", WTERMSIG(status),
                                                strsignal(WTERMSIG(status)))
                                  : fmt::format("exited with code {}", WEXITSTATUS(status));
      result.message = fmt::format(
          "distributed job failed: worker {} of {} (pid {}) {}; the other {} worker(s) "
          "were stopped (the run can continue with --resume)",
          rank, o.nproc, pid, why, running);
      result.code = WIFEXITED(status) ? WEXITSTATUS(status) : 1;
      stopping = true;
      stop_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      for (pid_t p : pids)
        if (p > 0) ::kill(p, SIGTERM);
    }
  }
  return result;
}

}  // namespace emoe
