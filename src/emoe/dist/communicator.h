// Data-parallel communication on PyTorch's c10d: a TCPStore rendezvous and a Gloo process group
// (CPU tensors; CUDA tensors go through Gloo's CUDA path where the build has one). The c10d
// headers stay in communicator.cpp.
#pragma once
#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace emoe {

// Where this process sits in the job. Read from the torchrun variables (RANK, WORLD_SIZE,
// LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT) and EMOE_DIST_TIMEOUT (seconds).
struct DistOptions {
  int rank = 0, world_size = 1, local_rank = 0, local_world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  double timeout_s = 300;  // a collective (or the rendezvous) waiting longer fails the job
  bool enabled() const { return world_size > 1; }
  // UsageError naming the variable when one is malformed or inconsistent (RANK >= WORLD_SIZE).
  static DistOptions from_env();
};

// One collective in flight; wait() blocks until it is done (RuntimeError when it failed).
class PendingCollective {
 public:
  virtual ~PendingCollective() = default;
  virtual void wait() = 0;
};

class Communicator {
 public:
  // Joins the job: rank 0 serves the store at master_addr:master_port, the others connect.
  explicit Communicator(const DistOptions& options);
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return options_.rank; }
  int size() const { return options_.world_size; }
  const DistOptions& options() const { return options_; }

  // Sum over ranks, in place (contiguous tensors of one dtype and device).
  std::unique_ptr<PendingCollective> all_reduce_sum_async(at::Tensor& t);
  void all_reduce_sum(at::Tensor& t);
  // Sum over ranks into rank `root`'s tensor (the others' contents are unspecified afterwards).
  std::unique_ptr<PendingCollective> reduce_sum_async(at::Tensor& t, int root);
  std::vector<double> all_reduce_sum(const std::vector<double>& values);
  // Rank `root`'s tensors into every rank's, in place.
  void broadcast(std::vector<at::Tensor>& tensors, int root = 0);
  // Every rank's vector (lengths may differ), in rank order.
  std::vector<std::vector<double>> all_gather(const std::vector<double>& values);
  void barrier();

 private:
  struct Impl;
  DistOptions options_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace emoe
