// MoEfication's router: trained to predict each expert's share of positive activation.
#pragma once
#include <ATen/core/Tensor.h>

#include "emoe/moe/routed_ffn.h"

namespace emoe {

struct RouterTrainOptions {
  int64_t steps = 300;
  int64_t batch = 256;
  double lr = 0.01;
  uint64_t seed = 0;
};

// Targets [n, E]: expert e's share of the token's positive activation mass (|h| for gated FFNs).
at::Tensor expert_activation_share(const at::Tensor& hidden, int64_t experts, bool gated);

// Trains the plug's MLP gate with BCE on (inputs, targets), Adam. Returns the final loss.
double train_moefication_router(ExpertFfnImpl& plug, FfnSlot& slot, const at::Tensor& inputs,
                                const at::Tensor& targets, const RouterTrainOptions& options);

}  // namespace emoe
