// Tutel parity (SPEC §3.2): the routed FFN against routing computed by hand on a small batch —
// padded positions routed and counted toward capacity, capacity overflow dropped in priority
// order, b2 / k per kept assignment — in masked and dispatched execution; and the avg-k gate
// held as a copy of the keys (routing losses send no gradient to W1).
#include <algorithm>
#include <numeric>

#include "emoe/models/activation.h"
#include "emoe/models/loader.h"
#include "emoe/moe/convert.h"
#include "emoe/moe/gates.h"
#include "emoe/moe/routed_ffn.h"
#include "support/test_support.h"

namespace {

constexpr int64_t kTutelExperts = 4, kTutelTopK = 2;

emoe::MoeConfig tutel_config(emoe::Execution exec) {
  auto cfg = emoe::MoeConfig::for_method(emoe::MoeMethod::kEmoe);
  cfg.experts = kTutelExperts;
  cfg.topk = kTutelTopK;
  cfg.layers = {0};
  cfg.execution = exec;
  cfg.enable_tutel_parity();
  cfg.capacity_factor = 0.5;  // capacity k * int(0.5 * ceil(6 / 4)) = 2 per expert: overflow
  return cfg;
}

struct HandRouting {
  torch::Tensor out;  // [n, d]
  int64_t dropped = 0;
};

// Tutel's routing written out token by token: softmax of x · avg-k keys, top-k, slots filled
// choice by choice, tokens by descending top probability, every position routed; each kept
// (token, expert) adds W2_e act(W1_e x + b1_e) + b2 / k.
HandRouting tutel_by_hand(const torch::Tensor& x, const emoe::FfnView& v, int64_t capacity) {
  const int64_t n = x.size(0), e = kTutelExperts, s = v.d_ff() / e;
  auto keys = v.w_in.reshape({e, s, -1}).mean(1);
  auto probs = x.matmul(keys.t()).softmax(-1);
  auto top = probs.topk(kTutelTopK, -1);
  auto experts = std::get<1>(top);
  std::vector<int64_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  auto best = std::get<0>(top).select(1, 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return best[a].item<float>() > best[b].item<float>();
  });
  std::vector<int64_t> filled(e, 0);
  HandRouting h;
  h.out = torch::zeros({n, x.size(1)});
  for (int64_t j = 0; j < kTutelTopK; ++j)
    for (int64_t t : order) {
      const int64_t ex = experts[t][j].item<int64_t>();
      if (filled[ex]++ >= capacity) {
        ++h.dropped;
        continue;
      }
      auto rows = torch::indexing::Slice(ex * s, (ex + 1) * s);
      auto pre = x[t].matmul(v.w_in.index({rows}).t()) + v.b_in.index({rows});
      auto y =
          emoe::activate(pre, v.act).matmul(v.w_out.index({torch::indexing::Slice(), rows}).t());
      h.out[t] += y + v.b_out / static_cast<double>(kTutelTopK);
    }
  return h;
}

}  // namespace

TEST(TutelParity, RoutingMatchesTheHandComputedBatch) {
  for (auto exec : {emoe::Execution::kMasked, emoe::Execution::kDispatched}) {
    auto model = emoe::test::tiny_bert_classifier();
    emoe::convert_to_moe(*model, tutel_config(exec));
    model->eval();
    auto* slot = model->ffn_slots()[0];
    auto* plug = emoe::moe_plugs(*model)[0];
    torch::NoGradGuard g;
    // tokens near one direction all want the same experts: capacity must drop some
    torch::manual_seed(3);
    auto x = torch::randn({1, 16}).expand({6, 16}) + 0.3 * torch::randn({6, 16});
    auto mask = torch::tensor({{1, 1, 1, 1, 0, 0}});  // two padded positions
    auto got = plug->run(x.unsqueeze(0), mask, *slot).squeeze(0);
    auto want = tutel_by_hand(x, slot->ffn_view(), kTutelTopK * 1);
    EXPECT_GT(want.dropped, 0) << "the batch must overflow capacity";
    EXPECT_TRUE(torch::allclose(got, want.out, 1e-5, 1e-5))
        << "execution " << emoe::to_string(exec) << "\n"
        << got << "\n"
        << want.out;
    // the padded positions were routed and counted: 12 assignments less the dropped ones
    EXPECT_EQ(plug->take_usage(false).sum().item<int64_t>(), 6 * kTutelTopK - want.dropped);
  }
}

TEST(TutelParity, WithoutTutelPaddingGetsTheBiasOnlyAndB2IsAddedOnce) {
  auto model = emoe::test::tiny_bert_classifier();
  auto cfg = emoe::MoeConfig::for_method(emoe::MoeMethod::kEmoe);
  cfg.experts = kTutelExperts;
  cfg.topk = kTutelExperts;  // k = N: the dense FFN on real tokens
  cfg.layers = {0};
  emoe::convert_to_moe(*model, cfg);
  model->eval();
  auto* slot = model->ffn_slots()[0];
  torch::NoGradGuard g;
  auto x = torch::randn({1, 4, 16});
  auto got = emoe::moe_plugs(*model)[0]->run(x, torch::tensor({{1, 1, 1, 0}}), *slot).squeeze(0);
  auto dense = slot->dense_ffn(x.squeeze(0));
  EXPECT_TRUE(torch::allclose(got.narrow(0, 0, 3), dense.narrow(0, 0, 3), 1e-5, 1e-5));
  EXPECT_TRUE(torch::allclose(got[3], slot->ffn_view().b_out, 1e-6, 1e-6));
}

TEST(TutelParity, TheGateIsACopyOfTheKeysForTheAuxiliaryLoss) {
  for (bool tutel : {false, true}) {
    auto model = emoe::test::tiny_bert_classifier();
    auto cfg = emoe::MoeConfig::for_method(emoe::MoeMethod::kEmoe);
    cfg.experts = kTutelExperts;
    cfg.topk = kTutelTopK;
    cfg.layers = {0};
    if (tutel) cfg.enable_tutel_parity();
    cfg.balance = emoe::BalanceLoss::kImportanceLoad;
    convert_to_moe(*model, cfg);
    model->train();
    auto* slot = model->ffn_slots()[0];
    auto* plug = emoe::moe_plugs(*model)[0];
    auto x = torch::randn({1, 5, 16}, torch::requires_grad());
    plug->run(x, torch::Tensor(), *slot);
    auto aux = plug->aux_loss();
    ASSERT_TRUE(aux.defined());
    const auto w_in = slot->ffn_view().w_in;
    auto grads = torch::autograd::grad({aux}, {w_in, x}, {}, false, false, /*allow_unused=*/true);
    const bool keys_get_gradient = grads[0].defined() && grads[0].abs().sum().item<double>() > 0;
    EXPECT_EQ(keys_get_gradient, !tutel) << (tutel ? "tutel" : "default");
    EXPECT_GT(grads[1].abs().sum().item<double>(), 0) << "the tokens still get the gradient";
  }
}
