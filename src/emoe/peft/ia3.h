// (IA)^3 and MoV: learned rescaling of a Linear's output columns, or of its input.
#pragma once
#include <ATen/core/Generator.h>

#include <functional>
#include <string>
#include <vector>

#include "emoe/models/linear.h"
#include "emoe/models/routed.h"
#include "emoe/peft/router_mass.h"

namespace emoe {

// Output columns [offset, offset + length) that form one scaled activation. GPT-2's fused c_attn
// has two (k and v); other layers one covering the whole output. `suffix` names the range's MoV
// parameters ("k" -> mov_router_k); empty for a single range. `head_dim` > 0 says the range is
// attention heads of that width (keys, values): MoV then routes each head on its own.
struct ScaledRange {
  int64_t offset = 0;
  int64_t length = 0;
  std::string suffix;
  int64_t head_dim = 0;
};

// y with each range's columns replaced by scale(piece, range index); other columns are copied
// unchanged (bit for bit).
torch::Tensor scale_output_ranges(
    const torch::Tensor& y, const std::vector<ScaledRange>& ranges,
    const std::function<torch::Tensor(const torch::Tensor&, size_t)>& scale);

// (IA)^3: one learned vector, initialised to ones, named `ia3_l` as PEFT does. Output scaling
// (keys, values): y = base(x) ⊙ l on the columns of one range, l stored [length, 1] (PEFT's
// [out, 1] when the range is the whole output). Feed-forward scaling (the FFN output
// projection): y = base(x ⊙ l), l stored [1, in] — the FFN intermediate after its activation.
class Ia3Adapter : public LinearAdapter {
 public:
  // Output scaling of `range`, or input scaling when `feedforward` (range ignored).
  Ia3Adapter(const LinearImpl& base, bool feedforward, const ScaledRange& range);
  torch::Tensor adapt(const torch::Tensor& x, LinearImpl& base) override;
  std::string kind() const override { return "(IA)^3"; }

  bool feedforward() const { return feedforward_; }
  const ScaledRange& range() const { return range_; }
  // The vector in PEFT's layout over the whole layer: [out, 1] with ones outside the scaled
  // columns, or [1, in].
  torch::Tensor peft_vector(const LinearImpl& base) const;

  torch::Tensor ia3_l;

 private:
  bool feedforward_;
  ScaledRange range_;
};

// MoV: a soft mixture of E (IA)^3 vectors per scaled activation a: p = softmax(a W_r),
// scale = Σ_e p_e v_e, output a ⊙ scale. W_r (no bias) ~ N(0, 0.02²) and the vectors = ones; the
// router sees the activation it scales and runs in float32. Parameters: mov_router[_suffix],
// mov_vectors[_suffix] per range. The FFN intermediate is one activation: W_r [dim, E], vectors
// [E, dim]. Keys and values are routed per head, as the reference's MoVAttention: one router
// W_r [head_dim, E] shared by the heads gives each head of each token its own p; every head has
// its own E vectors, stored [E, heads * head_dim] (the reference's [heads, E, head_dim] with the
// first two axes swapped, so that row e is expert e's (IA)^3 vector over the whole range).
class MovAdapter : public LinearAdapter, public Routed {
 public:
  // Output scaling of each range, or input scaling when `feedforward` (ranges ignored).
  MovAdapter(const LinearImpl& base, bool feedforward, std::vector<ScaledRange> ranges,
             int64_t experts, at::Generator& gen);
  torch::Tensor adapt(const torch::Tensor& x, LinearImpl& base) override;
  std::string kind() const override { return "MoV"; }
  Routed* routed() override { return this; }

  // Routed: a soft mixture without an auxiliary loss
  int64_t num_experts() const override { return experts_; }
  int64_t top_k() const override { return 0; }
  std::string usage_kind() const override { return "router mass"; }
  at::Tensor take_usage(bool training) override { return mass.take(training, experts_); }
  at::Tensor aux_loss() const override { return {}; }
  void replace_aux_loss(const at::Tensor& /*loss*/) override {}  // (it has none)

  bool feedforward() const { return feedforward_; }
  const std::vector<ScaledRange>& ranges() const { return ranges_; }
  int64_t experts() const { return experts_; }

  std::vector<torch::Tensor> routers;  // per range [dim, E], or [head_dim, E] per head
  std::vector<torch::Tensor> vectors;  // per range [E, dim]
  RouterMass mass;                     // router probability mass over all ranges

 private:
  torch::Tensor mix(const torch::Tensor& a, size_t i, bool training);
  bool feedforward_;
  std::vector<ScaledRange> ranges_;
  int64_t experts_;
};

}  // namespace emoe
