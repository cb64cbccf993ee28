#include "emoe/dist/param_shards.h"

#include <c10/core/Allocator.h>
#include <c10/core/StorageImpl.h>
#include <torch/torch.h>

#include <utility>

#include "emoe/core/bf16_shadow.h"
#include "emoe/core/error.h"
#include "emoe/dist/communicator.h"

namespace emoe {

namespace {

int64_t storage_bytes(const at::Tensor& p) {
  return p.numel() * static_cast<int64_t>(p.element_size());
}

// The parameter keeps its TensorImpl and StorageImpl; only the memory under them goes or comes,
// so every tensor sharing the storage (autograd's saved copies of the parameter) follows.
void free_storage(const at::Tensor& p) {
  auto* s = p.storage().unsafeGetStorageImpl();
  s->set_data_ptr_noswap(at::DataPtr(nullptr, p.device()));
  s->set_nbytes(0);
}

void allocate_storage(const at::Tensor& p) {
  auto* s = p.storage().unsafeGetStorageImpl();
  const auto bytes = static_cast<size_t>(storage_bytes(p));
  s->set_data_ptr_noswap(c10::GetAllocator(p.device().type())->allocate(bytes));
  s->set_nbytes(bytes);
}

bool has_storage(const at::Tensor& p) {
  return p.storage().nbytes() > 0 || p.numel() == 0;
}

// The parameter's memory as a flat tensor outside autograd (its own version counter: writing it
// does not look like an in-place change to the tensors saved for backward).
at::Tensor flat_data(const at::Tensor& p) {
  return p.variable_data().view({-1});
}

}  // namespace

ParameterShards::ParameterShards(Communicator& comm, std::vector<std::vector<Member>> blocks)
    : comm_(comm), blocks_(std::move(blocks)), gathered_(blocks_.size(), 1) {
  for (size_t b = 0; b < blocks_.size(); ++b)
    for (const auto& m : blocks_[b]) {
      const auto& p = m.param;
      EMOE_CHECK(p.is_contiguous() && p.storage_offset() == 0 &&
                     static_cast<int64_t>(p.storage().nbytes()) == storage_bytes(p),
                 RuntimeError,
                 "sharding full: a parameter of block {} ({}) is a view into a larger storage; "
                 "it cannot be sharded on its own",
                 b, fmt::join(p.sizes(), "x"));
      EMOE_CHECK(m.owner >= 0 && m.owner < comm_.size(), RuntimeError,
                 "sharding full: owner {} of a parameter of block {} is not a rank of {}", m.owner,
                 b, comm_.size());
    }
  for (size_t b = 0; b < blocks_.size(); ++b) release(b);
}

ParameterShards::~ParameterShards() = default;

void ParameterShards::gather(size_t block, bool keep) {
  torch::NoGradGuard no_grad;
  const int me = comm_.rank();
  auto& members = blocks_[block];
  // one broadcast per (owner, dtype) run, in the order of the parameters: the same on every rank
  std::vector<char> done(members.size(), 0);
  for (size_t i = 0; i < members.size(); ++i) {
    if (done[i]) continue;
    const int owner = members[i].owner;
    const auto dtype = members[i].param.scalar_type();
    std::vector<size_t> group;
    int64_t numel = 0;
    for (size_t j = i; j < members.size(); ++j)
      if (!done[j] && members[j].owner == owner && members[j].param.scalar_type() == dtype) {
        group.push_back(j);
        done[j] = 1;
        numel += members[j].param.numel();
      }
    const auto& first = members[i].param;
    at::Tensor buf;
    if (owner == me) {
      std::vector<at::Tensor> parts;
      for (size_t j : group) parts.push_back(flat_data(members[j].param));
      buf = torch::cat(parts);
    } else {
      buf = torch::empty({numel}, first.options().requires_grad(false));
    }
    std::vector<at::Tensor> one = {buf};
    comm_.broadcast(one, owner);
    if (owner == me || !keep) continue;
    int64_t offset = 0;
    for (size_t j : group) {
      const auto& p = members[j].param;
      if (!has_storage(p)) allocate_storage(p);
      flat_data(p).copy_(buf.narrow(0, offset, p.numel()));
      drop_bf16_shadows({p});  // (written without moving p's version: no copy may outlive it)
      offset += p.numel();
    }
  }
  gathers_ += 1;
}

void ParameterShards::release(size_t block) {
  const int me = comm_.rank();
  for (const auto& m : blocks_[block])
    if (m.owner != me && has_storage(m.param)) free_storage(m.param);
  gathered_[block] = 0;
}

void ParameterShards::before_forward(size_t block) {
  if (detached_ || pinned_ > 0) return;
  EMOE_CHECK(block < blocks_.size(), RuntimeError,
             "sharding full: block {} of a model with {} blocks", block, blocks_.size());
  if (!gathered_[block]) {
    gather(block, true);
    gathered_[block] = 1;
  }
}

void ParameterShards::after_forward(size_t block, const at::Tensor& out) {
  if (detached_ || pinned_ > 0) return;
  release(block);
  // autograd differentiates through this block later: bring its weights back first
  if (at::GradMode::is_enabled() && out.requires_grad())
    out.register_hook([this, block](const at::Tensor&) { on_backward(block); });
}

// The gradient of the block's output is complete, so the backward of every later block has run:
// only this block's weights are needed now.
void ParameterShards::on_backward(size_t block) {
  if (detached_ || pinned_ > 0) return;
  for (size_t b = 0; b < blocks_.size(); ++b)
    if (b != block && gathered_[b]) release(b);
  if (!gathered_[block]) {
    gather(block, true);
    gathered_[block] = 1;
  }
}

void ParameterShards::gather_all(int keep) {
  if (detached_) return;
  if (pinned_ > 0) {
    EMOE_CHECK(pinned_for_ == -1 || pinned_for_ == keep, RuntimeError,
               "sharding full: the weights are gathered on rank {} only, not where asked ({})",
               pinned_for_, keep);
    pinned_ += 1;
    return;
  }
  const bool keep_here = keep < 0 || keep == comm_.rank();
  for (size_t b = 0; b < blocks_.size(); ++b) {
    if (gathered_[b]) {
      if (!keep_here) release(b);
      continue;
    }
    gather(b, keep_here);
  }
  std::fill(gathered_.begin(), gathered_.end(), keep_here ? 1 : 0);
  pinned_ = 1;
  pinned_for_ = keep;
}

void ParameterShards::release_all() {
  if (detached_) return;
  if (pinned_ > 0) pinned_ -= 1;
  if (pinned_ > 0) return;
  pinned_for_ = -1;
  for (size_t b = 0; b < blocks_.size(); ++b) release(b);
}

void ParameterShards::detach_all() {
  detached_ = true;
}

int64_t ParameterShards::held_numel() const {
  int64_t n = 0;
  for (const auto& members : blocks_)
    for (const auto& m : members)
      if (has_storage(m.param)) n += m.param.numel();
  return n;
}

int64_t ParameterShards::sharded_numel() const {
  int64_t n = 0;
  for (const auto& members : blocks_)
    for (const auto& m : members) n += m.param.numel();
  return n;
}

int64_t ParameterShards::owned_numel() const {
  int64_t n = 0;
  for (const auto& members : blocks_)
    for (const auto& m : members)
      if (m.owner == comm_.rank()) n += m.param.numel();
  return n;
}

}  // namespace emoe
