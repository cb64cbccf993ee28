// MoEfication's router: trained to predict each expert's positive activation (the reference's).
#pragma once
#include <ATen/core/Tensor.h>

#include "emoe/moe/routed_ffn.h"

namespace emoe {

// The reference's (thunlp/MoEfication, MLPCenter): 30 epochs of batches of 512 over the first
// 90 % of the sample tokens, Adam lr 0.01, the router of the epoch that covers most activation
// on the last 10 % kept.
struct RouterTrainOptions {
  int64_t epochs = 30;
  int64_t batch = 512;
  double lr = 0.01;
  uint64_t seed = 0;
};

// Expert scores [n, E] the router learns: relu(x̂ k_i) summed over each expert's neurons, with
// x̂ = x / |x| and k_i the keys (rows of w_in [d_ff, d], already in expert order; no bias). The
// reference divides a batch's scores by their maximum for the BCE targets.
at::Tensor moefication_expert_scores(const at::Tensor& inputs, const at::Tensor& w_in,
                                     int64_t experts);

struct RouterTrainResult {
  double loss = 0;         // the last batch's BCE
  double coverage = 0;     // held-out share of the activation mass in the predicted top 20 %
  int64_t best_epoch = 0;  // 1-based; the router of this epoch is kept
  int64_t held_out = 0;    // tokens held out
};

// Trains the plug's MLP gate on the sample tokens (inputs [n, d]) as the reference does and keeps
// the best epoch's router by held-out coverage.
RouterTrainResult train_moefication_router(ExpertFfnImpl& plug, FfnSlot& slot,
                                           const at::Tensor& inputs,
                                           const RouterTrainOptions& options);

}  // namespace emoe
