// Progress display: a one-line bar with loss, lr, it/s and ETA on a terminal; log lines otherwise.
#pragma once
#include <chrono>
#include <cstdint>
#include <string>

namespace emoe {

class Progress {
 public:
  // total: steps expected; label: e.g. "train"; log_every: steps between plain log lines.
  Progress(int64_t total, std::string label, int64_t log_every);
  // `done` steps finished; `stats` like "loss 0.531 lr 4.2e-05".
  void update(int64_t done, const std::string& stats);
  void finish();
  static bool stderr_is_terminal();

 private:
  int64_t total_, log_every_, start_done_ = -1, last_logged_ = -1;
  std::string label_;
  bool tty_;
  std::chrono::steady_clock::time_point start_;
};

// "1:02:03" / "4:05"
std::string format_duration(double seconds);

}  // namespace emoe
