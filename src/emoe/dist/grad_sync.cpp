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
  int owner = 0;                // the rank that keeps the reduced gradients (sharded levels)
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

ShardingLevel parse_sharding(const std::string& text, const std::string& what) {
  if (text == "none") return ShardingLevel::kNone;
  if (text == "optimizer") return ShardingLevel::kOptimizer;
  if (text == "gradients") return ShardingLevel::kGradients;
  if (text == "full") return ShardingLevel::kFull;
  EMOE_THROW(UsageError, "{}: expected none, optimizer, gradients or full, got '{}'", what, text);
}

std::string to_string(ShardingLevel level) {
  switch (level) {
    case ShardingLevel::kOptimizer:
      return "optimizer";
    case ShardingLevel::kGradients:
      return "gradients";
    case ShardingLevel::kFull:
      return "full";
    case ShardingLevel::kNone:
      break;
  }
  return "none";
}

std::vector<int> partition_by_size(const std::vector<int64_t>& numels, int world) {
  int64_t total = 0;
  for (int64_t n : numels) total += n;
  std::vector<int> owner(numels.size(), 0);
  int r = 0;
  int64_t running = 0;
  for (size_t i = 0; i < numels.size(); ++i) {
    owner[i] = r;
    running += numels[i];
    // rank r's run ends once the running total reaches (r + 1) / world of the whole
    while (r < world - 1 && running * world >= static_cast<int64_t>(r + 1) * total) r += 1;
  }
  return owner;
}

GradientSync::GradientSync(Communicator& comm, std::vector<at::Tensor> params, ShardingLevel level,
                           std::vector<int> owners, int64_t bucket_bytes)
    : comm_(comm), params_(std::move(params)), level_(level) {
  std::vector<int64_t> numels;
  for (const auto& p : params_) numels.push_back(p.numel());
  if (!sharded()) {
    owner_.assign(params_.size(), 0);
  } else if (!owners.empty()) {
    EMOE_CHECK(owners.size() == params_.size(), RuntimeError,
               "GradientSync: {} owners for {} parameters", owners.size(), params_.size());
    for (int o : owners)
      EMOE_CHECK(o >= 0 && o < comm_.size(), RuntimeError, "GradientSync: owner {} of {} ranks", o,
                 comm_.size());
    owner_ = std::move(owners);
  } else {
    owner_ = partition_by_size(numels, comm_.size());
  }
  bucket_of_.assign(params_.size(), 0);
  ready_.assign(params_.size(), 0);
  left_to_owner_.assign(params_.size(), 0);
  int64_t bytes = 0;
  for (size_t k = params_.size(); k-- > 0;) {
    const auto& p = params_[k];
    EMOE_CHECK(p.requires_grad(), RuntimeError,
               "GradientSync: parameter {} does not require a gradient", k);
    const int64_t nb = p.numel() * static_cast<int64_t>(p.element_size());
    if (buckets_.empty() || bytes + nb > bucket_bytes || buckets_.back()->owner != owner_[k] ||
        params_[buckets_.back()->members.front()].dtype() != p.dtype() ||
        params_[buckets_.back()->members.front()].device() != p.device()) {
      buckets_.push_back(std::make_unique<Bucket>());
      buckets_.back()->owner = owner_[k];
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

bool GradientSync::owns(size_t k) const {
  return !sharded() || owner_[k] == comm_.rank();
}

int64_t GradientSync::owned_numel() const {
  int64_t n = 0;
  for (size_t k = 0; k < params_.size(); ++k)
    if (owns(k)) n += params_[k].numel();
  return n;
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
  if (!sharded()) {
    b.pending = comm_.all_reduce_sum_async(b.buffer);
    return;
  }
  // the bucket holds the gradients now; the owner gets them back from it in finish()
  for (size_t k : b.members) params_[k].mutable_grad() = at::Tensor();
  if (level_ == ShardingLevel::kOptimizer) {
    b.pending = comm_.all_reduce_sum_async(b.buffer);
    return;
  }
  // gradients: at most two buckets in flight, so that a non-owner holds little beyond its share
  for (auto& other : buckets_)
    if (other.get() != &b && other->pending) {
      settle(*other);
      break;
    }
  b.pending = comm_.reduce_sum_async(b.buffer, b.owner);
}

void GradientSync::settle(Bucket& b) {
  if (!b.pending) return;
  b.pending->wait();
  b.pending.reset();
  if (reduces_to_owner() && b.owner != comm_.rank()) b.buffer = at::Tensor();
}

void GradientSync::finish() {
  if (!armed_) arm();
  while (next_launch_ < buckets_.size()) launch(*buckets_[next_launch_++]);
  armed_ = false;
  torch::NoGradGuard no_grad;
  const double inv = 1.0 / static_cast<double>(comm_.size());
  for (auto& bp : buckets_) {
    auto& b = *bp;
    settle(b);
    if (sharded() && b.owner != comm_.rank()) {
      // another rank's parameters: no gradient here (optimizer: the all-reduced copy goes)
      for (size_t k : b.members) params_[k].mutable_grad() = at::Tensor();
      b.buffer = at::Tensor();
      continue;
    }
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
        p.mutable_grad() = avg;
    }
    b.buffer = at::Tensor();
  }
}

double GradientSync::global_grad_norm_sq() {
  torch::NoGradGuard no_grad;
  double local = 0;
  for (size_t k = 0; k < params_.size(); ++k) {
    const auto& g = params_[k].grad();
    if (!owns(k) || !g.defined()) continue;
    local += g.to(torch::kFloat64).pow(2).sum().item<double>();
  }
  if (!sharded()) return local;
  return comm_.all_reduce_sum(std::vector<double>{local})[0];
}

void GradientSync::leave_to_owners(std::vector<char> by_index) {
  EMOE_CHECK(by_index.size() == params_.size(), RuntimeError,
             "GradientSync: {} flags for {} parameters", by_index.size(), params_.size());
  left_to_owner_ = std::move(by_index);
}

void GradientSync::broadcast_parameters() {
  if (!sharded()) return;
  torch::NoGradGuard no_grad;
  for (auto& bp : buckets_) {
    auto& b = *bp;
    std::vector<size_t> sent;
    int64_t numel = 0;
    for (size_t k : b.members)
      if (!left_to_owner_[k]) sent.push_back(k), numel += params_[k].numel();
    if (sent.empty()) continue;
    at::Tensor buf;
    if (b.owner == comm_.rank()) {
      std::vector<at::Tensor> flat;
      for (size_t k : sent) flat.push_back(params_[k].detach().reshape({-1}));
      buf = torch::cat(flat);
    } else {
      buf = torch::empty({numel}, params_[sent.front()].options().requires_grad(false));
    }
    std::vector<at::Tensor> one = {buf};
    comm_.broadcast(one, b.owner);
    if (b.owner == comm_.rank()) continue;
    int64_t offset = 0;
    for (size_t k : sent) {
      auto& p = params_[k];
      p.detach().copy_(buf.narrow(0, offset, p.numel()).view(p.sizes()));
      offset += p.numel();
    }
  }
}

}  // namespace emoe
