// (IA)^3 vectors and MoV mixtures of them: construction and the scaled forward.
#include "emoe/peft/ia3.h"

#include <torch/torch.h>

#include "emoe/core/error.h"
#include "emoe/models/matmul.h"

namespace emoe {

torch::Tensor scale_output_ranges(
    const torch::Tensor& y, const std::vector<ScaledRange>& ranges,
    const std::function<torch::Tensor(const torch::Tensor&, size_t)>& scale) {
  const int64_t out = y.size(-1);
  if (ranges.size() == 1 && ranges[0].offset == 0 && ranges[0].length == out) return scale(y, 0);
  std::vector<torch::Tensor> parts;
  int64_t pos = 0;
  for (size_t i = 0; i < ranges.size(); ++i) {
    const auto& r = ranges[i];
    if (r.offset > pos) parts.push_back(y.narrow(-1, pos, r.offset - pos));
    parts.push_back(scale(y.narrow(-1, r.offset, r.length), i));
    pos = r.offset + r.length;
  }
  if (pos < out) parts.push_back(y.narrow(-1, pos, out - pos));
  return torch::cat(parts, -1);
}

namespace {

void ia3_check_range(const LinearImpl& base, const ScaledRange& r) {
  EMOE_CHECK(r.offset >= 0 && r.length > 0 && r.offset + r.length <= base.options().out, UsageError,
             "(IA)^3 range [{}, {}) is outside the layer's {} outputs", r.offset,
             r.offset + r.length, base.options().out);
}

}  // namespace

Ia3Adapter::Ia3Adapter(const LinearImpl& base, bool feedforward, const ScaledRange& range)
    : feedforward_(feedforward), range_(range) {
  const auto& lo = base.options();
  if (feedforward)
    range_ = ScaledRange{0, lo.in, ""};
  else
    ia3_check_range(base, range_);
  auto shape =
      feedforward ? std::vector<int64_t>{1, lo.in} : std::vector<int64_t>{range_.length, 1};
  ia3_l = register_parameter("ia3_l", torch::ones(shape, base.weight.options()));
}

torch::Tensor Ia3Adapter::adapt(const torch::Tensor& x, LinearImpl& base) {
  if (feedforward_) return base.base_forward(x * ia3_l.view({-1}));
  auto l = ia3_l.view({-1});
  return scale_output_ranges(base.base_forward(x), {range_},
                             [&](const torch::Tensor& a, size_t) { return a * l; });
}

torch::Tensor Ia3Adapter::peft_vector(const LinearImpl& base) const {
  if (feedforward_) return ia3_l;
  const int64_t out = base.options().out;
  if (range_.offset == 0 && range_.length == out) return ia3_l;
  torch::NoGradGuard no_grad;
  auto full = torch::ones({out, 1}, ia3_l.options());
  full.narrow(0, range_.offset, range_.length).copy_(ia3_l);
  return full;
}

MovAdapter::MovAdapter(const LinearImpl& base, bool feedforward, std::vector<ScaledRange> ranges,
                       int64_t experts, at::Generator& gen)
    : feedforward_(feedforward), ranges_(std::move(ranges)), experts_(experts) {
  EMOE_CHECK(experts >= 1, UsageError, "peft.experts: expected >= 1, got {}", experts);
  if (feedforward) ranges_ = {ScaledRange{0, base.options().in, ""}};
  for (const auto& r : ranges_) {
    if (!feedforward) ia3_check_range(base, r);
    const std::string tail = r.suffix.empty() ? "" : "_" + r.suffix;
    const bool per_head = r.head_dim > 0;
    EMOE_CHECK(!per_head || r.length % r.head_dim == 0, UsageError,
               "MoV: the scaled range of {} outputs is not a whole number of heads of {}", r.length,
               r.head_dim);
    const int64_t router_in = per_head ? r.head_dim : r.length;
    auto w = torch::empty({router_in, experts}, torch::kFloat).normal_(0.0, 0.02, gen);
    routers.push_back(register_parameter("mov_router" + tail, w.to(base.weight.options())));
    vectors.push_back(register_parameter("mov_vectors" + tail,
                                         torch::ones({experts, r.length}, base.weight.options())));
  }
}

torch::Tensor MovAdapter::mix(const torch::Tensor& a, size_t i, bool training) {
  auto af = a.to(torch::kFloat);
  const int64_t hd = ranges_[i].head_dim;  // 0 for the feed-forward range
  if (hd > 0) {
    // per head: [..., H, hd] · W_r [hd, E] -> p [..., H, E]; scale[..., h, :] = Σ_e p_e V[e, h, :]
    auto shape = af.sizes().vec();
    const int64_t heads = shape.back() / hd;
    auto ah = af.reshape({-1, heads, hd});
    auto p = torch::softmax(torch::matmul(ah, routers[i].to(torch::kFloat)), -1);
    mass.add(p, training);
    auto v = vectors[i].to(torch::kFloat).view({experts_, heads, hd});
    auto scale = torch::einsum("nhe,ehd->nhd", {p, v});
    return (ah * scale).reshape(shape).to(a.scalar_type());
  }
  auto p = torch::softmax(emoe::linear(af, routers[i].to(torch::kFloat).t(), {}), -1);
  mass.add(p, training);
  auto scale = emoe::linear(p, vectors[i].to(torch::kFloat).t(), {});
  return (af * scale).to(a.scalar_type());
}

torch::Tensor MovAdapter::adapt(const torch::Tensor& x, LinearImpl& base) {
  const bool training = base.is_training();  // the adapter is not itself a child of the model
  if (feedforward_) return base.base_forward(mix(x, 0, training));
  return scale_output_ranges(base.base_forward(x), ranges_,
                             [&](const torch::Tensor& a, size_t i) { return mix(a, i, training); });
}

}  // namespace emoe
