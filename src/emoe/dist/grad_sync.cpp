#include "emoe/dist/grad_sync.h"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/torch.h>

#include <functional>

#include "emoe/core/error.h"
#include "emoe/dist/communicator.h"

namespace emoe {

struct GradientSync::Bucket {
  std::vector<size_t> members;  // parameter indices
  std::vector<int64_t> offsets;
  int64_t numel = 0;
  size_t ready = 0;
  at::Tensor buffer;  // [numel + members] : gradients, then one "defined here" flag per member
  std::unique_ptr<PendingCollective> pending;
};

namespace {

class ReadyHook : public torch::autograd::FunctionPostHook {
 public:
  explicit ReadyHook(std::function<void()> fn) : fn_(std::move(fn)) {}
  torch::autograd::variable_list operator()(
      const torch::autograd::variable_list& outputs,
      const torch::autograd::variable_list& /*inputs*/) override {
    fn_();
    return outputs;
  }

 private:
  std::function<void()> fn_;
};

}  // namespace

GradientSync::GradientSync(Communicator& comm, std::vector<at::Tensor> params, int64_t bucket_bytes)
    : comm_(comm), params_(std::move(params)) {
  bucket_of_.assign(params_.size(), 0);
  ready_.assign(params_.size(), 0);
  int64_t bytes = 0;
  for (size_t k = params_.size(); k-- > 0;) {
    const auto& p = params_[k];
    EMOE_CHECK(p.requires_grad(), RuntimeError,
               "GradientSync: parameter {} does not require a gradient", k);
    const int64_t nb = p.numel() * static_cast<int64_t>(p.element_size());
    if (buckets_.empty() || bytes + nb > bucket_bytes ||
        params_[buckets_.back()->members.front()].dtype() != p.dtype() ||
        params_[buckets_.back()->members.front()].device() != p.device()) {
      buckets_.push_back(std::make_unique<Bucket>());
      bytes = 0;
    }
    auto& b = *buckets_.back();
    b.members.push_back(k);
    b.offsets.push_back(b.numel);
    b.numel += p.numel();
    bytes += nb;
    bucket_of_[k] = buckets_.size() - 1;
  }
  for (size_t k = 0; k < params_.size(); ++k) {
    auto acc = torch::autograd::impl::grad_accumulator(params_[k]);
    EMOE_CHECK(acc != nullptr, RuntimeError, "GradientSync: parameter {} is not a leaf", k);
    acc->add_post_hook(std::make_unique<ReadyHook>([this, k] { on_ready(k); }));
    accumulators_.push_back(acc);
  }
}

GradientSync::~GradientSync() = default;

int64_t GradientSync::buckets() const {
  return static_cast<int64_t>(buckets_.size());
}

void GradientSync::arm() {
  for (auto& b : buckets_) b->ready = 0, b->pending.reset();
  std::fill(ready_.begin(), ready_.end(), 0);
  next_launch_ = 0;
  armed_ = true;
}

void GradientSync::on_ready(size_t k) {
  if (!armed_ || ready_[k]) return;
  ready_[k] = 1;
  auto& b = *buckets_[bucket_of_[k]];
  b.ready += 1;
  // launch in bucket order only, so that every rank issues the same sequence of collectives
  while (next_launch_ < buckets_.size() &&
         buckets_[next_launch_]->ready == buckets_[next_launch_]->members.size()) {
    launch(*buckets_[next_launch_]);
    next_launch_ += 1;
    started_in_backward_ += 1;
  }
}

void GradientSync::launch(Bucket& b) {
  const auto& first = params_[b.members.front()];
  const int64_t m = static_cast<int64_t>(b.members.size());
  b.buffer = torch::zeros({b.numel + m}, first.options().requires_grad(false));
  for (size_t i = 0; i < b.members.size(); ++i) {
    const auto& g = params_[b.members[i]].grad();
    if (!g.defined()) continue;
    b.buffer.narrow(0, b.offsets[i], g.numel()).copy_(g.reshape({-1}));
    b.buffer[b.numel + static_cast<int64_t>(i)].fill_(1.0);
  }
  b.pending = comm_.all_reduce_sum_async(b.buffer);
}

void GradientSync::finish() {
  if (!armed_) arm();
  while (next_launch_ < buckets_.size()) launch(*buckets_[next_launch_++]);
  armed_ = false;
  torch::NoGradGuard no_grad;
  const double inv = 1.0 / static_cast<double>(comm_.size());
  for (auto& bp : buckets_) {
    auto& b = *bp;
    b.pending->wait();
    b.pending.reset();
    auto flags =
        b.buffer.narrow(0, b.numel, static_cast<int64_t>(b.members.size())).to(torch::kCPU);
    for (size_t i = 0; i < b.members.size(); ++i) {
      auto& p = params_[b.members[i]];
      if (flags[static_cast<int64_t>(i)].item<double>() == 0) {
        p.mutable_grad() = at::Tensor();
        continue;
      }
      auto avg = b.buffer.narrow(0, b.offsets[i], p.numel()).view(p.sizes()).mul(inv);
      if (p.grad().defined())
        p.mutable_grad().copy_(avg);
      else
        p.mutable_grad() = avg.clone();
    }
    b.buffer = at::Tensor();
  }
}

}  // namespace emoe
