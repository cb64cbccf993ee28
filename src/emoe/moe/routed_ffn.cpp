// MoE FFN plugs: routing of real tokens, masked and dispatched expert computation, GMoE experts.
#include "emoe/moe/routed_ffn.h"

#include <torch/torch.h>

#include "emoe/core/autocast_compat.h"
#include "emoe/core/error.h"
#include "emoe/models/dropout.h"
#include "emoe/models/matmul.h"
#include "emoe/models/recompute.h"
#include "emoe/moe/expert_ffn.h"
#include "emoe/moe/segment_linear.h"

namespace emoe {

void RoutedFfnImpl::set_gate(std::shared_ptr<GateImpl> gate) {
  gate_ = std::move(gate);
  register_module("gate", gate_);
}

torch::Tensor RoutedFfnImpl::take_usage(bool training) {
  auto& c = training ? train_counts_ : eval_counts_;
  auto out = c.defined() ? c : torch::zeros({cfg_.experts}, torch::kLong);
  c = torch::Tensor();
  return out;
}

torch::Tensor RoutedFfnImpl::run(const torch::Tensor& x, const torch::Tensor& token_mask,
                                 FfnSlot& slot) {
  if (dense_override_) {
    aux_loss_ = torch::Tensor();  // no routing this forward: no stale balance loss either
    return slot.dense_ffn(x);
  }
  const auto sizes = x.sizes().vec();
  const int64_t d = x.size(-1);
  auto flat = x.reshape({-1, d});
  torch::Tensor idx;  // rows of real tokens, when some are padding
  // tutel routes every position it is given: padding takes expert capacity like a real token
  if (token_mask.defined() && !cfg_.tutel) {
    auto m = token_mask.reshape({-1}).to(flat.device()) != 0;
    if (!m.all().item<bool>()) idx = m.nonzero().squeeze(1);
  }
  auto xr = idx.defined() ? flat.index_select(0, idx) : flat;
  auto logits = gate_->logits(xr, slot);
  const MoeConfig* cfg = &cfg_;
  MoeConfig pruned;
  if (allowed_.defined()) {
    logits = logits.masked_fill(allowed_.to(logits.device()).logical_not().unsqueeze(0),
                                -std::numeric_limits<float>::infinity());
    // with fewer experts left than k, every remaining expert is selected
    const int64_t left = allowed_.sum().item<int64_t>();
    if (left < cfg_.topk) {
      pruned = cfg_;
      pruned.topk = std::max<int64_t>(1, left);
      cfg = &pruned;
    }
  }
  auto r = route_tokens(logits, *cfg, is_training());
  aux_loss_ = r.aux_loss;
  if (!recomputing()) {  // (a checkpointed block's second run: counted the first time)
    torch::NoGradGuard g;
    auto counts = expert_counts(r, cfg_.experts);
    auto& acc = is_training() ? train_counts_ : eval_counts_;
    acc = acc.defined() ? acc + counts : counts;
  }
  auto y = compute(xr, r, slot);
  if (!idx.defined()) return y.view(sizes);
  // Padding tokens skip the FFN: they get the output bias only.
  auto b_out = slot.ffn_view().b_out;
  auto out = b_out.defined() ? b_out.to(y.scalar_type()).expand({flat.size(0), d}).clone()
                             : torch::zeros({flat.size(0), d}, y.options());
  out = out.index_copy(0, idx, y);
  return out.view(sizes);
}

torch::Tensor ffn_math(const torch::Tensor& x, const torch::Tensor& w_in, const torch::Tensor& b_in,
                       const torch::Tensor& w_up, const torch::Tensor& w_out,
                       const torch::Tensor& b_out, Activation act, double preact_dropout,
                       bool training) {
  auto pre = emoe::linear(x, w_in, b_in);
  if (preact_dropout > 0) pre = emoe::dropout(pre, preact_dropout, training);
  auto h =
      w_up.defined() ? activate_gated(pre, emoe::linear(x, w_up, {}), act) : activate(pre, act);
  return emoe::linear(h, w_out, b_out);
}

// --- EMoE / EMoE-learn / MoEfication -----------------------------------------------------------

ExpertFfnImpl::ExpertFfnImpl(const MoeConfig& cfg, FfnSlot& slot)
    : RoutedFfnImpl(cfg, slot.layer_index()) {
  check_expert_count(slot.ffn_view().d_ff(), cfg.experts, "experts");
  set_gate(make_gate(cfg, slot));
}

torch::Tensor ExpertFfnImpl::compute(const torch::Tensor& x, const Routing& r, FfnSlot& slot) {
  auto y = cfg_.execution == Execution::kMasked ? compute_masked(x, r, slot)
                                                : compute_dispatched(x, r, slot);
  // tutel: each expert holds b2 / k and its output (bias included) is scaled by the combine
  // weight, so a token gets b2 times (sum of its kept weights) / k instead of b2 once; an
  // assignment dropped by capacity brings no bias
  const auto b_out = slot.ffn_view().b_out;
  if (cfg_.tutel && b_out.defined()) {
    const double k = static_cast<double>(r.experts.size(1));
    auto share = r.weights.sum(1, true).to(y.scalar_type()) / k;
    y = y + (share - 1) * b_out.to(y.scalar_type());
  }
  return y;
}

std::string ExpertFfnImpl::bypasses_linear(bool input_side) const {
  (void)input_side;  // masked execution runs both sides through the layer's Linear modules
  if (cfg_.execution == Execution::kDispatched)
    return "dispatched execution computes the FFN from raw weights";
  return "";
}

torch::Tensor ExpertFfnImpl::compute_masked(const torch::Tensor& x, const Routing& r,
                                            FfnSlot& slot) {
  const int64_t n = x.size(0), e = cfg_.experts;
  torch::Tensor h;
  if (cfg_.preact_dropout > 0 && is_training()) {
    // through the layer's own Linear modules, so adapters on them still apply
    auto [pre, up] = slot.ffn_preactivation(x);
    pre = emoe::dropout(pre, cfg_.preact_dropout, true);
    h = up.defined() ? activate_gated(pre, up, slot.ffn_view().act)
                     : activate(pre, slot.ffn_view().act);
  } else {
    h = slot.ffn_hidden(x);
  }
  const int64_t d_ff = h.size(-1);
  auto mask =
      torch::zeros({n, e}, h.options()).scatter_add(1, r.experts, r.weights.to(h.scalar_type()));
  h = (h.view({n, e, d_ff / e}) * mask.unsqueeze(-1)).view({n, d_ff});
  return slot.ffn_output(h);
}

torch::Tensor ExpertFfnImpl::compute_dispatched(const torch::Tensor& x, const Routing& r,
                                                FfnSlot& slot) {
  auto v = slot.ffn_view();
  const int64_t n = x.size(0), d = x.size(1), e = cfg_.experts, k = r.experts.size(1);
  // Kept (token, choice) pairs sorted by expert: expert j owns one contiguous segment, so every
  // expert is one GEMM over exactly its tokens (no padding to a common capacity).
  auto flat_e = r.experts.reshape({-1});
  auto flat_w = r.weights.reshape({-1});
  auto flat_t = torch::arange(n, flat_e.options()).repeat_interleave(k);
  if (cfg_.capacity_factor > 0) {
    auto kept = (flat_w != 0).nonzero().squeeze(1);
    flat_e = flat_e.index_select(0, kept);
    flat_w = flat_w.index_select(0, kept);
    flat_t = flat_t.index_select(0, kept);
  }
  torch::Tensor order;
  std::vector<int64_t> counts(static_cast<size_t>(e), 0);
  if (flat_e.device().is_cpu() && flat_e.scalar_type() == torch::kLong) {
    // a counting sort (stable: tokens ascending within an expert), ~50x faster than a sort
    auto fe = flat_e.contiguous();
    const int64_t m = fe.numel(), *ep = fe.data_ptr<int64_t>();
    for (int64_t i = 0; i < m; ++i) ++counts[static_cast<size_t>(ep[i])];
    std::vector<int64_t> next(static_cast<size_t>(e), 0);
    for (int64_t j = 1; j < e; ++j) next[j] = next[j - 1] + counts[j - 1];
    order = torch::empty({m}, fe.options());
    int64_t* op = order.data_ptr<int64_t>();
    for (int64_t i = 0; i < m; ++i) op[next[static_cast<size_t>(ep[i])]++] = i;
  } else {
    order = flat_e.argsort();
    auto counts_t = torch::zeros({e}, flat_e.options())
                        .index_add_(0, flat_e, torch::ones_like(flat_e))
                        .to(torch::kCPU);  // the one host sync: segment sizes
    std::copy(counts_t.data_ptr<int64_t>(), counts_t.data_ptr<int64_t>() + e, counts.begin());
  }
  auto tokens = flat_t.index_select(0, order);
  // EMoE's pure mask has unit weights: skip the multiply
  auto weights = cfg_.weighted ? flat_w.index_select(0, order).to(x.scalar_type()).unsqueeze(1)
                               : torch::Tensor();
  // One autograd function over groups of experts in small buffers (expert_ffn.h): no n·k x d
  // copies of the inputs or outputs. Under autocast the experts compute in its dtype (inputs and
  // weights cast once inside, their gradients returned in their own dtypes, autocast off inside)
  // and the output is summed in x's dtype. Only
  // pre-activation dropout needs the composed path below.
  if (!(cfg_.preact_dropout > 0 && is_training())) {
    const bool cuda = x.device().is_cuda();
    const bool autocast =
        cuda ? emoe::autocast_enabled(at::kCUDA) : emoe::autocast_enabled(at::kCPU);
    const auto compute =
        autocast ? (cuda ? emoe::autocast_dtype(at::kCUDA) : emoe::autocast_dtype(at::kCPU))
                 : x.scalar_type();
    c10::impl::ExcludeDispatchKeyGuard no_autocast(
        c10::DispatchKeySet({c10::DispatchKey::AutocastCPU, c10::DispatchKey::AutocastCUDA}));
    auto out = dispatched_expert_ffn(
        x, tokens, counts, weights.defined() ? weights.squeeze(1) : torch::Tensor(), v.w_in, v.b_in,
        v.w_up, v.w_out, v.act, int64_t{16} << 20, x.scalar_type(), compute);
    if (v.b_out.defined()) out = out + v.b_out.to(out.scalar_type());
    return out;
  }
  // Otherwise rows gathered in expert order; each expert is one GEMM over its segment against its
  // block of the shared weights (segment_linear: no weight slices stacked or copied). The
  // activation, dropout and gating run once over all segments.
  auto xs = x.index_select(0, tokens);                       // [M, d]
  auto pre = segment_linear(xs, v.w_in, v.b_in, counts, 0);  // [M, s]
  if (cfg_.preact_dropout > 0) pre = emoe::dropout(pre, cfg_.preact_dropout, is_training());
  auto h = v.gated()
               ? activate_gated(pre, segment_linear(xs, v.w_up, torch::Tensor(), counts, 0), v.act)
               : activate(pre, v.act);
  auto y = segment_linear(h, v.w_out, torch::Tensor(), counts, 1);  // [M, d]
  if (weights.defined()) y = y * weights;
  // (under autocast y may be bfloat16: it is accumulated in the output's float32)
  auto out = torch::zeros({n, d}, x.options()).index_add(0, tokens, y.to(x.scalar_type()));
  if (v.b_out.defined()) out = out + v.b_out;
  return out;
}

// --- GMoE ---------------------------------------------------------------------------------------

UpcycledFfnImpl::UpcycledFfnImpl(const MoeConfig& cfg, FfnSlot& slot)
    : RoutedFfnImpl(cfg, slot.layer_index()) {
  EMOE_CHECK(cfg.experts >= 1, UsageError, "gmoe: expected >= 1 experts");
  auto v = slot.ffn_view();
  const int64_t c = cfg.experts - 1;
  torch::NoGradGuard g;
  auto copies = [&](const torch::Tensor& t) {
    auto shape = t.sizes().vec();
    shape.insert(shape.begin(), c);
    return t.detach().unsqueeze(0).expand(shape).clone().contiguous();
  };
  w_in = register_parameter("w_in", copies(v.w_in));
  if (v.b_in.defined()) b_in = register_parameter("b_in", copies(v.b_in));
  if (v.w_up.defined()) w_up = register_parameter("w_up", copies(v.w_up));
  w_out = register_parameter("w_out", copies(v.w_out));
  if (v.b_out.defined()) b_out = register_parameter("b_out", copies(v.b_out));
  set_gate(make_gate(cfg, slot));
}

torch::Tensor UpcycledFfnImpl::expert_forward(int64_t e, const torch::Tensor& x, FfnSlot& slot) {
  if (e == 0) return slot.dense_ffn(x);
  auto opt = [&](const torch::Tensor& t) { return t.defined() ? t[e - 1] : torch::Tensor(); };
  auto v = slot.ffn_view();
  return ffn_math(x, w_in[e - 1], opt(b_in), opt(w_up), w_out[e - 1], opt(b_out), v.act,
                  cfg_.preact_dropout, is_training());
}

torch::Tensor UpcycledFfnImpl::compute(const torch::Tensor& x, const Routing& r, FfnSlot& slot) {
  const int64_t n = x.size(0), e = cfg_.experts;
  auto out = torch::zeros({n, x.size(1)}, x.options());
  if (cfg_.execution == Execution::kMasked) {
    // every expert on every token, weighted by the (mostly zero) dense combine matrix
    auto mask =
        torch::zeros({n, e}, x.options()).scatter_add(1, r.experts, r.weights.to(x.scalar_type()));
    for (int64_t j = 0; j < e; ++j)
      out = out + expert_forward(j, x, slot) * mask.select(1, j).unsqueeze(1);
    return out;
  }
  const int64_t k = r.experts.size(1);
  auto flat_e = r.experts.reshape({-1});
  auto flat_w = r.weights.reshape({-1});
  auto flat_t = torch::arange(n, r.experts.options()).repeat_interleave(k);
  for (int64_t j = 0; j < e; ++j) {
    auto sel = torch::logical_and(flat_e == j, flat_w != 0).nonzero().squeeze(1);
    if (sel.numel() == 0) continue;
    auto tok = flat_t.index_select(0, sel);
    auto w = flat_w.index_select(0, sel).to(x.scalar_type()).unsqueeze(1);
    out = out.index_add(
        0, tok, (expert_forward(j, x.index_select(0, tok), slot) * w).to(out.scalar_type()));
  }
  return out;
}

}  // namespace emoe
