// Progress bar / progress log lines.
#include "emoe/train/progress.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cstdio>

namespace emoe {

bool Progress::stderr_is_terminal() {
  return isatty(fileno(stderr)) != 0;
}

std::string format_duration(double seconds) {
  auto s = static_cast<int64_t>(seconds + 0.5);
  if (s >= 3600) return fmt::format("{}:{:02d}:{:02d}", s / 3600, (s / 60) % 60, s % 60);
  return fmt::format("{}:{:02d}", s / 60, s % 60);
}

Progress::Progress(int64_t total, std::string label, int64_t log_every)
    : total_(std::max<int64_t>(1, total)),
      log_every_(std::max<int64_t>(1, log_every)),
      label_(std::move(label)),
      tty_(stderr_is_terminal()),
      start_(std::chrono::steady_clock::now()) {}

void Progress::update(int64_t done, const std::string& stats) {
  // The rate is measured from the first update on: the first step's own time is unknown (set-up,
  // a resume), and a rate over the microseconds since it would read millions of it/s.
  if (start_done_ < 0) {
    start_done_ = done;
    start_ = std::chrono::steady_clock::now();
  }
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const bool measured = done > start_done_ && secs > 0;
  const double rate = measured ? static_cast<double>(done - start_done_) / secs : 0;
  const std::string rate_text = measured ? fmt::format("{:.2f}", rate) : "-";
  const std::string eta =
      measured ? format_duration(static_cast<double>(total_ - done) / rate) : "-";
  if (tty_) {
    const int width = 24;
    int filled = static_cast<int>(width * std::min<int64_t>(done, total_) / total_);
    std::string bar(filled, '#');
    bar.resize(width, '.');
    std::fprintf(stderr, "\r%s [%s] %lld/%lld %s %s it/s ETA %s   ", label_.c_str(), bar.c_str(),
                 static_cast<long long>(done), static_cast<long long>(total_), stats.c_str(),
                 rate_text.c_str(), eta.c_str());
    std::fflush(stderr);
  } else if (done == total_ || done - last_logged_ >= log_every_) {
    spdlog::info("{} {}/{} {} {} it/s ETA {}", label_, done, total_, stats, rate_text, eta);
    last_logged_ = done;
  }
}

void Progress::finish() {
  if (tty_) std::fprintf(stderr, "\n");
}

}  // namespace emoe
