// `emoe train --nproc N`: starts N local workers (this program, same arguments) with the
// torchrun variables set, and supervises them: when one exits with an error or is killed, the
// others are stopped and the job fails with a message naming the rank.
#pragma once
#include <string>
#include <vector>

namespace emoe {

struct LaunchOptions {
  int nproc = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;     // 0: a free port on this machine
  double timeout_s = 300;  // passed on as EMOE_DIST_TIMEOUT
};

struct LaunchResult {
  int code =
      0;  // 0 when every worker succeeded; else the first failing worker's code (1 for a signal)
  std::string message;  // which worker failed and how
};
// `args` is the full command line (args[0] is replaced by this program's path).
LaunchResult launch_local_workers(const LaunchOptions& options,
                                  const std::vector<std::string>& args);

// This process's command line (/proc/self/cmdline).
std::vector<std::string> own_command_line();

// A TCP port that was free on 127.0.0.1 a moment ago.
int free_tcp_port();

}  // namespace emoe
