// AdamW parameter groups and learning-rate schedules.
#include "emoe/train/optim.h"

#include <torch/torch.h>

#include <cmath>

#include "emoe/core/error.h"

namespace emoe {

namespace {

bool optim_no_decay(const std::string& name) {
  auto ends = [&](const std::string& s) {
    return name.size() >= s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0;
  };
  return ends("bias") || name.find("LayerNorm") != std::string::npos ||
         name.find("norm.weight") != std::string::npos || name.find("ln_") != std::string::npos ||
         name.find("layernorm") != std::string::npos;
}

bool optim_is_router(const std::string& name) {
  return name.find(".moe.gate.") != std::string::npos || name.find("router") != std::string::npos;
}

}  // namespace

Optimizer::Optimizer(PretrainedModelImpl& model, const TrainOptions& o) {
  struct Bucket {
    std::string name;
    double lr, decay;
    std::vector<torch::Tensor> params;
    std::vector<std::string> names;
  };
  std::vector<Bucket> buckets;
  auto bucket = [&](const std::string& name, double lr, double decay) -> Bucket& {
    for (auto& b : buckets)
      if (b.name == name) return b;
    buckets.push_back({name, lr, decay, {}, {}});
    return buckets.back();
  };
  for (const auto& p : model.named_parameters()) {
    if (!p.value().requires_grad()) continue;
    const auto& k = p.key();
    std::string kind = "body";
    double lr = o.lr;
    if (model.is_head_key(k)) {
      kind = "head";
      if (o.head_lr > 0) lr = o.head_lr;
    } else if (optim_is_router(k)) {
      kind = "router";
      if (o.router_lr > 0) lr = o.router_lr;
    }
    const bool nd = optim_no_decay(k) || o.weight_decay == 0;
    auto& b = bucket(nd ? kind + "/no_decay" : kind, lr, nd ? 0.0 : o.weight_decay);
    b.params.push_back(p.value());
    b.names.push_back(k);
  }
  EMOE_CHECK(!buckets.empty(), UsageError, "nothing to train: every parameter is frozen");
  std::vector<torch::optim::OptimizerParamGroup> groups;
  for (auto& b : buckets) {
    auto opts = std::make_unique<torch::optim::AdamWOptions>(b.lr);
    opts->betas({o.adam_beta1, o.adam_beta2}).eps(o.adam_eps).weight_decay(b.decay);
    groups.emplace_back(b.params, std::move(opts));
    int64_t n = 0;
    for (auto& t : b.params) n += t.numel();
    groups_.push_back({b.name, b.lr, n});
    names_.insert(names_.end(), b.names.begin(), b.names.end());
  }
  adamw_ = std::make_unique<torch::optim::AdamW>(groups, torch::optim::AdamWOptions(o.lr));
}

void Optimizer::set_lr_factor(double factor) {
  auto& pg = adamw_->param_groups();
  for (size_t i = 0; i < pg.size(); ++i)
    static_cast<torch::optim::AdamWOptions&>(pg[i].options()).lr(groups_[i].base_lr * factor);
}

double Optimizer::current_lr() const {
  return static_cast<const torch::optim::AdamWOptions&>(adamw_->param_groups()[0].options()).lr();
}

std::vector<torch::Tensor> Optimizer::parameters() const {
  std::vector<torch::Tensor> out;
  for (const auto& g : adamw_->param_groups())
    for (const auto& p : g.params()) out.push_back(p);
  return out;
}

std::vector<std::string> Optimizer::parameter_names() const { return names_; }

double schedule_factor(const std::string& kind, int64_t step, int64_t total, int64_t warmup) {
  // Hugging Face's schedules (get_linear/cosine_schedule_with_warmup) at 0-based `step`.
  if (step < warmup) return static_cast<double>(step) / static_cast<double>(std::max<int64_t>(1, warmup));
  if (kind == "constant") return 1.0;
  const double span = static_cast<double>(std::max<int64_t>(1, total - warmup));
  const double progress = static_cast<double>(step - warmup) / span;
  if (kind == "cosine") return std::max(0.0, 0.5 * (1.0 + std::cos(M_PI * progress)));
  return std::max(0.0, 1.0 - progress);  // linear
}

}  // namespace emoe
