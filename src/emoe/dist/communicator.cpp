// c10d process group behind Communicator. USE_C10D_GLOO is defined for this file alone
// (CMakeLists.txt), which is why it is compiled outside the unity batches.
#include "emoe/dist/communicator.h"

// Gloo's own headers come with Debian's libtorch (libgloo-dev); a libtorch without them (a CUDA
// machine's PyTorch, say) builds emoe without distributed training, which then says so.
#if __has_include(<gloo/algorithm.h>)
#define EMOE_HAVE_GLOO 1
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#else
#define EMOE_HAVE_GLOO 0
#endif
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <torch/torch.h>
#include <unistd.h>

#include <cstdlib>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "emoe/core/error.h"

namespace emoe {
namespace {

int env_int(const char* name, int fallback, int min_value) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  EMOE_CHECK(end != v && *end == '\0' && x >= min_value && x <= 1 << 20, UsageError,
             "environment variable {}: expected an integer >= {}, got '{}'", name, min_value, v);
  return static_cast<int>(x);
}

#if EMOE_HAVE_GLOO
// The address of this machine's interface that routes to host:port ("" when none does): a UDP
// socket "connected" there sends nothing, but the kernel picks the source address.
std::string local_address_towards(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res) != 0 || !res) return "";
  std::string out;
  const int fd = socket(AF_INET, SOCK_DGRAM, 0);
  if (fd >= 0 && connect(fd, res->ai_addr, res->ai_addrlen) == 0) {
    sockaddr_in local{};
    socklen_t len = sizeof(local);
    char buf[INET_ADDRSTRLEN] = {0};
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0 &&
        inet_ntop(AF_INET, &local.sin_addr, buf, sizeof(buf)) != nullptr)
      out = buf;
  }
  if (fd >= 0) close(fd);
  freeaddrinfo(res);
  return out;
}

// The ranks a failure message points at: Gloo names the peer of a broken connection as
// "[address]:port" ("Read error [10.0.0.2]:8837: Connection reset by peer"); the ranks registered
// at the first such address (this one left out).
std::string lost_ranks(const std::string& msg, const std::vector<std::string>& hosts, int self) {
  std::vector<int> ranks;
  std::string addr;
  for (size_t at = msg.find('['); at != std::string::npos && ranks.empty();
       at = msg.find('[', at + 1)) {
    const auto end = msg.find("]:", at);
    if (end == std::string::npos) break;
    addr = msg.substr(at + 1, end - at - 1);
    for (size_t r = 0; r < hosts.size(); ++r)
      if (!addr.empty() && hosts[r] == addr && static_cast<int>(r) != self)
        ranks.push_back(static_cast<int>(r));
  }
  if (!ranks.empty())
    return fmt::format("; lost: rank{} {} at {}", ranks.size() > 1 ? "s" : "",
                       fmt::join(ranks, ", "), addr);
  // A time-out ("Timed out waiting 10000ms for send operation to complete") names no peer: with
  // one peer it is the one lost; with more, name them all as the candidates.
  std::vector<std::string> peers;
  for (size_t r = 0; r < hosts.size(); ++r)
    if (static_cast<int>(r) != self && !hosts[r].empty())
      peers.push_back(fmt::format("{} at {}", r, hosts[r]));
  if (peers.empty()) return "";
  if (peers.size() == 1) return fmt::format("; lost: rank {}", peers[0]);
  return fmt::format("; lost: one or more of ranks {} (the error names none)",
                     fmt::join(peers, ", "));
}

std::string collective_failure(const DistOptions& o, const std::string& what,
                               const std::exception& e, const std::vector<std::string>& hosts) {
  std::string msg = e.what();
  if (auto nl = msg.find('\n'); nl != std::string::npos) msg.resize(nl);
  return fmt::format(
      "distributed: rank {} of {}: {} failed (another worker died, or none answered within {} "
      "s){}: {}",
      o.rank, o.world_size, what, o.timeout_s, lost_ranks(msg, hosts, o.rank), msg);
}

class GlooPending : public PendingCollective {
 public:
  GlooPending(c10::intrusive_ptr<c10d::Work> work, const DistOptions& o, const char* what,
              const std::vector<std::string>& hosts)
      : work_(std::move(work)), o_(o), what_(what), hosts_(hosts) {}
  void wait() override {
    try {
      work_->wait();
    } catch (const std::exception& e) {
      throw RuntimeError(collective_failure(o_, what_, e, hosts_));
    }
  }

 private:
  c10::intrusive_ptr<c10d::Work> work_;
  DistOptions o_;
  const char* what_;
  std::vector<std::string> hosts_;
};
#else
[[noreturn]] void no_process_group() {
  EMOE_THROW(RuntimeError, "distributed: no process group in this build");
}
#endif

}  // namespace

DistOptions DistOptions::from_env() {
  DistOptions o;
  o.world_size = env_int("WORLD_SIZE", 1, 1);
  o.rank = env_int("RANK", 0, 0);
  o.local_rank = env_int("LOCAL_RANK", o.rank, 0);
  o.local_world_size = env_int("LOCAL_WORLD_SIZE", o.world_size, 1);
  o.master_port = env_int("MASTER_PORT", 29500, 1);
  if (const char* a = std::getenv("MASTER_ADDR"); a != nullptr && *a != '\0') o.master_addr = a;
  if (const char* t = std::getenv("EMOE_DIST_TIMEOUT"); t != nullptr && *t != '\0') {
    char* end = nullptr;
    o.timeout_s = std::strtod(t, &end);
    EMOE_CHECK(end != t && *end == '\0' && o.timeout_s > 0, UsageError,
               "environment variable EMOE_DIST_TIMEOUT: expected seconds > 0, got '{}'", t);
  }
  EMOE_CHECK(o.rank < o.world_size, UsageError,
             "environment variable RANK: expected < WORLD_SIZE {}, got {}", o.world_size, o.rank);
  EMOE_CHECK(o.master_port <= 65535, UsageError,
             "environment variable MASTER_PORT: expected <= 65535, got {}", o.master_port);
  return o;
}

#if EMOE_HAVE_GLOO
struct Communicator::Impl {
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> group;
  std::vector<std::string> hosts;  // each rank's address, as it registered at the rendezvous
};

Communicator::Communicator(const DistOptions& options)
    : options_(options), impl_(std::make_unique<Impl>()) {
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(options.timeout_s * 1000));
  try {
    c10d::TCPStoreOptions so;
    so.port = static_cast<uint16_t>(options.master_port);
    so.isServer = options.rank == 0;
    so.numWorkers = static_cast<size_t>(options.world_size);
    so.waitWorkers = true;
    so.timeout = timeout;
    impl_->store = c10::make_intrusive<c10d::TCPStore>(options.master_addr, so);
    auto go = c10d::ProcessGroupGloo::Options::create();
    go->timeout = timeout;
    // The interface Gloo listens on: $GLOO_SOCKET_IFNAME as torchrun has it; else the one that
    // routes to rank 0 (on one machine, loopback; on several, each host's own address there).
    std::string local = local_address_towards(options.master_addr, options.master_port);
    if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME"); ifname != nullptr && *ifname)
      go->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(ifname));
    else
      go->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(
          local.empty() ? options.master_addr : local));
    // every rank's address, so that a broken connection names the rank it lost
    impl_->store->set("emoe/host/" + std::to_string(options.rank),
                      std::vector<uint8_t>(local.begin(), local.end()));
    for (int r = 0; r < options.world_size; ++r) {
      auto v = impl_->store->get("emoe/host/" + std::to_string(r));
      impl_->hosts.emplace_back(v.begin(), v.end());
    }
    impl_->group = c10::make_intrusive<c10d::ProcessGroupGloo>(impl_->store, options.rank,
                                                               options.world_size, go);
  } catch (const std::exception& e) {
    std::string msg = e.what();
    if (auto nl = msg.find('\n'); nl != std::string::npos) msg.resize(nl);
    EMOE_THROW(RuntimeError,
               "distributed: rank {} of {}: rendezvous at {}:{} failed within {} s: {}",
               options.rank, options.world_size, options.master_addr, options.master_port,
               options.timeout_s, msg);
  }
}

Communicator::~Communicator() = default;

std::unique_ptr<PendingCollective> Communicator::all_reduce_sum_async(at::Tensor& t) {
  std::vector<at::Tensor> ts = {t};
  try {
    return std::make_unique<GlooPending>(impl_->group->allreduce(ts), options_, "all-reduce",
                                         impl_->hosts);
  } catch (const std::exception& e) {
    throw RuntimeError(collective_failure(options_, "all-reduce", e, impl_->hosts));
  }
}

std::unique_ptr<PendingCollective> Communicator::reduce_sum_async(at::Tensor& t, int root) {
  std::vector<at::Tensor> ts = {t};
  c10d::ReduceOptions ro;
  ro.rootRank = root;
  try {
    return std::make_unique<GlooPending>(impl_->group->reduce(ts, ro), options_, "reduce",
                                         impl_->hosts);
  } catch (const std::exception& e) {
    throw RuntimeError(collective_failure(options_, "reduce", e, impl_->hosts));
  }
}

void Communicator::all_reduce_sum(at::Tensor& t) {
  all_reduce_sum_async(t)->wait();
}

std::vector<double> Communicator::all_reduce_sum(const std::vector<double>& values) {
  auto t = torch::tensor(values, torch::kFloat64);
  all_reduce_sum(t);
  return std::vector<double>(t.data_ptr<double>(), t.data_ptr<double>() + t.numel());
}

void Communicator::broadcast(std::vector<at::Tensor>& tensors, int root) {
  if (tensors.empty()) return;
  c10d::BroadcastOptions bo;
  bo.rootRank = root;
  try {
    // one tensor per call: Gloo's broadcast wants tensors of one dtype and device per call
    for (auto& t : tensors) {
      std::vector<at::Tensor> one = {t};
      impl_->group->broadcast(one, bo)->wait();
    }
  } catch (const std::exception& e) {
    throw RuntimeError(collective_failure(options_, "broadcast", e, impl_->hosts));
  }
}

std::vector<std::vector<double>> Communicator::all_gather(const std::vector<double>& values) {
  const int n = size();
  std::vector<double> len(static_cast<size_t>(n), 0.0);
  len[static_cast<size_t>(rank())] = static_cast<double>(values.size());
  len = all_reduce_sum(len);
  int64_t longest = 0;
  for (double l : len) longest = std::max<int64_t>(longest, static_cast<int64_t>(l));
  // each rank writes its values into its own row of a zero matrix; a sum gathers them
  auto m = torch::zeros({n, std::max<int64_t>(1, longest)}, torch::kFloat64);
  if (!values.empty())
    m[rank()]
        .narrow(0, 0, static_cast<int64_t>(values.size()))
        .copy_(torch::tensor(values, torch::kFloat64));
  all_reduce_sum(m);
  std::vector<std::vector<double>> out(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    auto row = m[r];
    const double* p = row.data_ptr<double>();
    out[static_cast<size_t>(r)].assign(p, p + static_cast<int64_t>(len[static_cast<size_t>(r)]));
  }
  return out;
}

void Communicator::barrier() {
  try {
    impl_->group->barrier()->wait();
  } catch (const std::exception& e) {
    throw RuntimeError(collective_failure(options_, "barrier", e, impl_->hosts));
  }
}

#else  // no Gloo: a Communicator is never made, so no collective is ever asked for

struct Communicator::Impl {};

Communicator::Communicator(const DistOptions& options) : options_(options) {
  EMOE_THROW(UsageError,
             "distributed training (WORLD_SIZE {}): this emoe was built against a libtorch without "
             "Gloo's headers, so it has no process group; build it against Debian's libtorch "
             "(scripts/setup.sh) to train on several processes",
             options.world_size);
}
Communicator::~Communicator() = default;
std::unique_ptr<PendingCollective> Communicator::all_reduce_sum_async(at::Tensor&) {
  no_process_group();
}
void Communicator::all_reduce_sum(at::Tensor&) {
  no_process_group();
}
std::unique_ptr<PendingCollective> Communicator::reduce_sum_async(at::Tensor&, int) {
  no_process_group();
}
std::vector<double> Communicator::all_reduce_sum(const std::vector<double>&) {
  no_process_group();
}
void Communicator::broadcast(std::vector<at::Tensor>&, int) {
  no_process_group();
}
std::vector<std::vector<double>> Communicator::all_gather(const std::vector<double>&) {
  no_process_group();
}
void Communicator::barrier() {
  no_process_group();
}

#endif

}  // namespace emoe
