// Dispatched experts in one autograd function (see expert_ffn.h).
#include "emoe/moe/expert_ffn.h"

#include <ATen/record_function.h>
#include <torch/torch.h>

#include <algorithm>
#include <atomic>

#include "emoe/core/error.h"
#include "emoe/models/matmul.h"
#include "emoe/moe/expert_kernels.h"

namespace emoe {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

void activation_out(at::Tensor& out, const at::Tensor& pre, Activation act) {
  switch (act) {
    case Activation::kGeluErf:
      at::gelu_out(out, pre, "none");
      return;
    case Activation::kGeluTanh:
      at::gelu_out(out, pre, "tanh");
      return;
    case Activation::kSilu:
      at::silu_out(out, pre);
      return;
    case Activation::kRelu:
      at::clamp_min_out(out, pre, 0);
      return;
  }
}

// d act(pre) / d pre · grad, as ATen's own backward kernels compute it.
void activation_backward_out(at::Tensor& out, const at::Tensor& grad, const at::Tensor& pre,
                             Activation act) {
  switch (act) {
    case Activation::kGeluErf:
      at::gelu_backward_out(out, grad, pre, "none");
      return;
    case Activation::kGeluTanh:
      at::gelu_backward_out(out, grad, pre, "tanh");
      return;
    case Activation::kSilu:
      at::silu_backward_out(out, grad, pre);
      return;
    case Activation::kRelu:
      at::threshold_backward_out(out, grad, pre, 0);
      return;
  }
}

// absent optional tensors travel through autograd as empty ones
at::Tensor opt(const at::Tensor& t) {
  return t.defined() && t.numel() > 0 ? t : at::Tensor();
}

std::atomic<bool> kernels_enabled{true};

// The register-tile kernels (expert_kernels.h): float32 CPU tensors summed in float32 (AVX-512),
// or bfloat16 ones summed in float32 (AVX-512 BF16: autocast's dispatched experts).
enum class Kernels { kNone, kFloat, kBf16 };

Kernels kernel_kind(const at::Tensor& x, at::ScalarType acc) {
  if (!kernels_enabled.load() || !x.device().is_cpu() || acc != at::kFloat) return Kernels::kNone;
  if (x.scalar_type() == at::kFloat && expert_kernels::available()) return Kernels::kFloat;
  if (x.scalar_type() == at::kBFloat16 && expert_kernels::bf16_available()) return Kernels::kBf16;
  return Kernels::kNone;
}

const float* fptr(const at::Tensor& t) {
  return t.defined() ? t.data_ptr<float>() : nullptr;
}
const uint16_t* bptr(const at::Tensor& t) {
  return reinterpret_cast<const uint16_t*>(t.data_ptr<at::BFloat16>());
}
uint16_t* bptr_mut(at::Tensor& t) {
  return reinterpret_cast<uint16_t*>(t.data_ptr<at::BFloat16>());
}

// The kernels on tensors. Weights come in two layouts: "neuron rows" [E·s, d] (w_in, w_up) and
// "neuron columns" [d, E·s] (w_out); expert j's block is its s neurons. x, h, y contiguous.
// out[r, :] = x[tokens[r]] · block_jᵀ (+ bias): out [rows, s] in x's dtype.
void gather_products(Kernels kind, const at::Tensor& x, const at::Tensor& tok,
                     const std::vector<int64_t>& counts, int64_t s, const at::Tensor& w,
                     bool neuron_rows, const at::Tensor& bias, at::Tensor& out) {
  const int64_t d = x.size(1), es = static_cast<int64_t>(counts.size()) * s;
  auto bc =
      bias.defined() ? bias.to(at::kFloat).contiguous() : at::Tensor();  // float32 in both kinds
  if (kind == Kernels::kFloat) {
    auto b =
        neuron_rows ? w.t().contiguous() : w.contiguous();  // [d, E·s]: block j a row-major panel
    expert_kernels::gather_gemm(fptr(x), d, d, tok.data_ptr<int64_t>(), counts, s, fptr(b), es,
                                fptr(bc), out.data_ptr<float>());
  } else {
    auto b = w.contiguous();
    expert_kernels::gather_gemm_bf16(bptr(x), d, d, tok.data_ptr<int64_t>(), counts, s, bptr(b),
                                     neuron_rows ? 1 : es, neuron_rows ? d : 1, fptr(bc),
                                     bptr_mut(out));
  }
}

// y[tokens[r], :] += h[r] · block_j, y float32 [n, d]
void scatter_products(Kernels kind, const at::Tensor& h, const at::Tensor& tok,
                      const std::vector<int64_t>& counts, int64_t s, const at::Tensor& w,
                      bool neuron_rows, at::Tensor& y) {
  const int64_t d = y.size(1), es = static_cast<int64_t>(counts.size()) * s;
  if (kind == Kernels::kFloat) {
    auto b = neuron_rows ? w.contiguous() : w.t().contiguous();  // [E·s, d]
    expert_kernels::scatter_gemm(h.data_ptr<float>(), tok.data_ptr<int64_t>(), counts, s, fptr(b),
                                 d, d, y.data_ptr<float>(), d);
  } else {
    auto b = w.contiguous();
    expert_kernels::scatter_gemm_bf16(bptr(h), tok.data_ptr<int64_t>(), counts, s, bptr(b),
                                      neuron_rows ? d : 1, neuron_rows ? 1 : es, d,
                                      y.data_ptr<float>(), d);
  }
}

// dest [d, E·s] (any dtype and strides): column block j = Σ over expert j's rows r of
// x[tokens[r]]ᵀ h[r], summed in float32 (written in place when dest is contiguous float32)
void weight_grad_products(Kernels kind, const at::Tensor& x, const at::Tensor& tok,
                          const std::vector<int64_t>& counts, int64_t s, const at::Tensor& h,
                          at::Tensor dest) {
  const int64_t d = x.size(1), es = static_cast<int64_t>(counts.size()) * s;
  const bool direct = dest.scalar_type() == at::kFloat && dest.is_contiguous();
  auto t = direct ? dest : torch::empty({d, es}, x.options().dtype(at::kFloat));
  auto hc = h.contiguous();
  if (kind == Kernels::kFloat)
    expert_kernels::gather_weight_grad(fptr(x), d, d, tok.data_ptr<int64_t>(), counts, s, fptr(hc),
                                       t.data_ptr<float>(), es);
  else
    expert_kernels::gather_weight_grad_bf16(bptr(x), d, d, tok.data_ptr<int64_t>(), counts, s,
                                            bptr(hc), t.data_ptr<float>(), es);
  if (!direct) dest.copy_(t);
}

// Consecutive experts whose rows are gathered and scattered together: one index_select and one
// index_add per group rather than per expert (in one profile of a BERT-base FFN at N 64, the
// per-expert gathers and scatters took 45 ms against 21 ms for one n·k-row call each way), with
// a transient buffer of at most `group_bytes` (or one expert's rows).
struct ExpertGroup {
  int64_t first = 0, end = 0;  // experts [first, end)
  int64_t row = 0, rows = 0;   // their rows [row, row + rows)
};

std::vector<ExpertGroup> expert_groups(const std::vector<int64_t>& counts, int64_t row_bytes,
                                       int64_t group_bytes) {
  const int64_t target = std::max<int64_t>(1, group_bytes / std::max<int64_t>(1, row_bytes));
  std::vector<ExpertGroup> groups;
  ExpertGroup g;
  for (int64_t j = 0; j < static_cast<int64_t>(counts.size()); ++j) {
    if (g.rows > 0 && g.rows + counts[j] > target) {
      groups.push_back(g);
      g = ExpertGroup{j, j, g.row + g.rows, 0};
    }
    g.end = j + 1;
    g.rows += counts[j];
  }
  groups.push_back(g);
  return groups;
}

int64_t largest_group(const std::vector<ExpertGroup>& groups) {
  int64_t m = 0;
  for (const auto& g : groups) m = std::max(m, g.rows);
  return std::max<int64_t>(m, 1);
}

// Two passes over the experts each way, the elementwise work done once over all rows between
// them: per expert only the GEMMs remain, per group the gather and the scatter.
class DispatchedExpertFfnFn : public torch::autograd::Function<DispatchedExpertFfnFn> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x_in, const at::Tensor& w_in,
                            const at::Tensor& b_in_e, const at::Tensor& w_up_e,
                            const at::Tensor& w_out, const at::Tensor& weights_e,
                            const at::Tensor& tokens, std::vector<int64_t> counts, int64_t act_code,
                            int64_t group_bytes, int64_t acc_code) {
    RECORD_FUNCTION("emoe::dispatched_experts", std::vector<c10::IValue>());
    const auto act = static_cast<Activation>(act_code);
    const at::Tensor b_in = opt(b_in_e), w_up = opt(w_up_e), weights = opt(weights_e);
    const int64_t n = x_in.size(0), d = x_in.size(1), e = static_cast<int64_t>(counts.size());
    const int64_t s = w_in.size(0) / e, rows = tokens.size(0);
    auto x = x_in.contiguous();
    const auto acc = static_cast<c10::ScalarType>(acc_code);
    ctx->saved_data["counts"] = c10::IValue(counts);
    ctx->saved_data["act"] = act_code;
    ctx->saved_data["has_b_in"] = b_in.defined();
    ctx->saved_data["group_bytes"] = group_bytes;
    ctx->saved_data["acc"] = acc_code;
    if (const auto kind = kernel_kind(x, acc); kind != Kernels::kNone) {
      // gathers and scatters inside the products
      auto tok = tokens.contiguous();
      auto pre = torch::empty({rows, s}, x.options());
      gather_products(kind, x, tok, counts, s, w_in, /*neuron_rows=*/true, b_in, pre);
      at::Tensor up;
      if (w_up.defined()) {
        up = torch::empty({rows, s}, x.options());
        gather_products(kind, x, tok, counts, s, w_up, true, {}, up);
      }
      auto h = torch::empty({rows, s}, x.options());
      activation_out(h, pre, act);
      if (up.defined()) h.mul_(up);
      if (weights.defined()) h.mul_(weights.unsqueeze(1));
      auto out = torch::zeros({n, d}, x.options().dtype(acc));
      scatter_products(kind, h, tok, counts, s, w_out, /*neuron_rows=*/false, out);
      ctx->save_for_backward({x, w_in, w_up_e, w_out, weights_e, tok, pre,
                              up.defined() ? up : torch::empty({0}, x.options())});
      return out;
    }
    const auto groups =
        expert_groups(counts, d * static_cast<int64_t>(x.element_size()), group_bytes);
    auto pre = torch::empty({rows, s}, x.options());
    auto up = w_up.defined() ? torch::empty({rows, s}, x.options()) : at::Tensor();
    auto buf = torch::empty({largest_group(groups), d}, x.options());
    // pass 1: a group's rows gathered, each expert's times its blocks of w_in (and w_up)
    for (const auto& grp : groups) {
      if (grp.rows == 0) continue;
      auto xg = buf.narrow(0, 0, grp.rows);
      at::index_select_out(xg, x, 0, tokens.narrow(0, grp.row, grp.rows));
      for (int64_t j = grp.first, off = 0; j < grp.end; off += counts[j], ++j) {
        const int64_t c = counts[j];
        if (c == 0) continue;
        auto xj = xg.narrow(0, off, c);
        auto prej = pre.narrow(0, grp.row + off, c);
        auto w_in_j = w_in.narrow(0, j * s, s);
        emoe::gemm_out(prej, xj, w_in_j.t(),
                       b_in.defined() ? b_in.narrow(0, j * s, s) : at::Tensor(),
                       /*accumulate=*/false, /*shapes_vary=*/true);
        if (up.defined()) {
          auto upj = up.narrow(0, grp.row + off, c);
          emoe::gemm_out(upj, xj, w_up.narrow(0, j * s, s).t(), {}, false, true);
        }
      }
    }
    // once over all rows: activation, gating, routing weight
    auto h = torch::empty({rows, s}, x.options());
    activation_out(h, pre, act);
    if (up.defined()) h.mul_(up);
    if (weights.defined()) h.mul_(weights.unsqueeze(1));
    // pass 2: each expert's rows times its block of w_out, added into their tokens' outputs (in
    // the accumulation dtype: float32 when the experts compute in bfloat16)
    auto out = torch::zeros({n, d}, x.options().dtype(acc));
    for (const auto& grp : groups) {
      if (grp.rows == 0) continue;
      auto yg = buf.narrow(0, 0, grp.rows);
      for (int64_t j = grp.first, off = 0; j < grp.end; off += counts[j], ++j) {
        const int64_t c = counts[j];
        if (c == 0) continue;
        auto yj = yg.narrow(0, off, c);
        emoe::gemm_out(yj, h.narrow(0, grp.row + off, c), w_out.narrow(1, j * s, s).t(), {}, false,
                       true);
      }
      out.index_add_(0, tokens.narrow(0, grp.row, grp.rows),
                     yg.scalar_type() == acc ? yg : yg.to(acc));
    }
    ctx->save_for_backward({x, w_in, w_up_e, w_out, weights_e, tokens, pre,
                            up.defined() ? up : torch::empty({0}, x.options())});
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto& x = saved[0];
    const auto& w_in = saved[1];
    const at::Tensor w_up = opt(saved[2]);
    const auto& w_out = saved[3];
    const at::Tensor weights = opt(saved[4]);
    const auto& tokens = saved[5];
    const auto& pre = saved[6];
    const at::Tensor up = opt(saved[7]);
    const auto counts = ctx->saved_data["counts"].toIntVector();
    const auto act = static_cast<Activation>(ctx->saved_data["act"].toInt());
    const bool has_b_in = ctx->saved_data["has_b_in"].toBool();
    const bool need_x = ctx->needs_input_grad(0), need_w_in = ctx->needs_input_grad(1);
    const bool need_b_in = has_b_in && ctx->needs_input_grad(2);
    const bool need_w_up = w_up.defined() && ctx->needs_input_grad(3);
    const bool need_w_out = ctx->needs_input_grad(4);
    const bool need_weights = weights.defined() && ctx->needs_input_grad(5);
    const int64_t d = x.size(1), e = static_cast<int64_t>(counts.size()), s = w_in.size(0) / e;
    const int64_t rows = pre.size(0);
    auto o = x.options();
    const auto acc = static_cast<c10::ScalarType>(ctx->saved_data["acc"].toInt());
    auto g = grads[0].to(x.scalar_type()).contiguous();
    at::Tensor gx = need_x ? torch::zeros(x.sizes(), o.dtype(acc)) : at::Tensor();
    at::Tensor g_w_in = need_w_in ? torch::empty(w_in.sizes(), o) : at::Tensor();
    at::Tensor g_w_up = need_w_up ? torch::empty(w_up.sizes(), o) : at::Tensor();
    at::Tensor g_w_out = need_w_out ? torch::empty(w_out.sizes(), o) : at::Tensor();
    const auto groups = expert_groups(counts, d * static_cast<int64_t>(x.element_size()),
                                      ctx->saved_data["group_bytes"].toInt());
    const auto kind = kernel_kind(x, acc);
    const bool kernels = kind != Kernels::kNone;
    auto buf = kernels ? at::Tensor() : torch::empty({largest_group(groups), d}, o);
    // recomputed rather than kept: a = act(pre), h = a (⊙ up), hw = h (· weight)
    auto a = torch::empty({rows, s}, o);
    activation_out(a, pre, act);
    auto h = up.defined() ? a * up : a;
    auto hw = weights.defined() ? h * weights.unsqueeze(1) : h;
    // pass 1: gradient of h (before the routing weight) and of w_out, expert by expert
    auto gh = torch::empty({rows, s}, o);
    const auto tok = kernels ? tokens.contiguous() : tokens;
    if (kernels) {
      gather_products(kind, g, tok, counts, s, w_out, /*neuron_rows=*/false, {}, gh);
      if (need_w_out) weight_grad_products(kind, g, tok, counts, s, hw, g_w_out);
    }
    for (const auto& grp : kernels ? std::vector<ExpertGroup>{} : groups) {
      for (int64_t j = grp.first; j < grp.end; ++j)
        if (counts[j] == 0) {  // an expert without tokens: zero weight gradients
          if (need_w_in) g_w_in.narrow(0, j * s, s).zero_();
          if (need_w_up) g_w_up.narrow(0, j * s, s).zero_();
          if (need_w_out) g_w_out.narrow(1, j * s, s).zero_();
        }
      if (grp.rows == 0) continue;
      auto gg = buf.narrow(0, 0, grp.rows);
      at::index_select_out(gg, g, 0, tokens.narrow(0, grp.row, grp.rows));
      for (int64_t j = grp.first, off = 0; j < grp.end; off += counts[j], ++j) {
        const int64_t c = counts[j];
        if (c == 0) continue;
        auto gj = gg.narrow(0, off, c);
        auto ghj = gh.narrow(0, grp.row + off, c);
        emoe::gemm_out(ghj, gj, w_out.narrow(1, j * s, s), {}, false, true);  // [c, d] · [d, s]
        if (need_w_out) {
          auto gwo = g_w_out.narrow(1, j * s, s);
          emoe::gemm_out(gwo, gj.t(), hw.narrow(0, grp.row + off, c), {}, false, true);
        }
      }
    }
    // once over all rows
    at::Tensor g_weights;
    if (weights.defined()) {
      if (need_weights) g_weights = (gh * h).sum(1);  // <g_t, y_r> = <g_t W_out,j, h_r>
      gh.mul_(weights.unsqueeze(1));
    }
    at::Tensor g_up;
    if (up.defined()) {
      g_up = gh * a;
      gh.mul_(up);  // now the gradient of act(pre)
    }
    auto g_pre = torch::empty({rows, s}, o);
    activation_backward_out(g_pre, gh, pre, act);
    at::Tensor g_b_in;
    if (need_b_in) {  // each expert's rows summed into its block
      auto expert_of_row =
          torch::arange(e, tokens.options())
              .repeat_interleave(torch::tensor(counts, torch::kLong).to(tokens.device()));
      g_b_in = torch::zeros({e, s}, o).index_add_(0, expert_of_row, g_pre).view({e * s});
    }
    // pass 2: gradients of w_in, w_up and x, expert by expert; x's rows are gathered per group
    // and each expert's input gradient replaces its (used) input rows in the buffer
    if (kernels) {
      // the weight gradients come out as [d, E·s] (expert j's columns j·s..), transposed once
      if (need_w_in) weight_grad_products(kind, x, tok, counts, s, g_pre, g_w_in.t());
      if (need_w_up) weight_grad_products(kind, x, tok, counts, s, g_up, g_w_up.t());
      if (need_x) {
        scatter_products(kind, g_pre, tok, counts, s, w_in, /*neuron_rows=*/true, gx);
        if (up.defined()) scatter_products(kind, g_up, tok, counts, s, w_up, true, gx);
      }
    }
    for (const auto& grp : kernels ? std::vector<ExpertGroup>{} : groups) {
      if (grp.rows == 0 || !(need_x || need_w_in || need_w_up)) continue;
      auto idx = tokens.narrow(0, grp.row, grp.rows);
      auto xg = buf.narrow(0, 0, grp.rows);
      if (need_w_in || need_w_up) at::index_select_out(xg, x, 0, idx);
      for (int64_t j = grp.first, off = 0; j < grp.end; off += counts[j], ++j) {
        const int64_t c = counts[j];
        if (c == 0) continue;
        auto g_pre_j = g_pre.narrow(0, grp.row + off, c);
        auto xj = xg.narrow(0, off, c);
        if (need_w_in) {
          auto gwi = g_w_in.narrow(0, j * s, s);
          emoe::gemm_out(gwi, g_pre_j.t(), xj, {}, false, true);
        }
        if (need_w_up) {
          auto gwu = g_w_up.narrow(0, j * s, s);
          emoe::gemm_out(gwu, g_up.narrow(0, grp.row + off, c).t(), xj, {}, false, true);
        }
        if (need_x) {
          emoe::gemm_out(xj, g_pre_j, w_in.narrow(0, j * s, s), {}, false, true);
          if (up.defined())
            emoe::gemm_out(xj, g_up.narrow(0, grp.row + off, c), w_up.narrow(0, j * s, s), {},
                           /*accumulate=*/true, true);
        }
      }
      if (need_x) gx.index_add_(0, idx, xg.scalar_type() == acc ? xg : xg.to(acc));
    }
    if (gx.defined() && gx.scalar_type() != x.scalar_type()) gx = gx.to(x.scalar_type());
    return {gx,           g_w_in,       g_b_in,       g_w_up,       g_w_out,     g_weights,
            at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

bool set_expert_kernels(bool enabled) {
  return kernels_enabled.exchange(enabled);
}

bool expert_kernels_used(const at::Tensor& x) {
  return kernel_kind(x, at::kFloat) != Kernels::kNone;
}

at::Tensor dispatched_expert_ffn(const at::Tensor& x, const at::Tensor& tokens,
                                 const std::vector<int64_t>& counts, const at::Tensor& weights,
                                 const at::Tensor& w_in, const at::Tensor& b_in,
                                 const at::Tensor& w_up, const at::Tensor& w_out, Activation act,
                                 int64_t group_bytes, c10::optional<at::ScalarType> accumulate) {
  EMOE_CHECK(x.dim() == 2 && w_in.dim() == 2 && w_out.dim() == 2, UsageError,
             "dispatched_expert_ffn: expected 2-d x, w_in and w_out");
  EMOE_CHECK(
      !counts.empty() && w_in.size(0) % static_cast<int64_t>(counts.size()) == 0 &&
          w_out.size(1) == w_in.size(0) && w_in.size(1) == x.size(1) && w_out.size(0) == x.size(1),
      UsageError, "dispatched_expert_ffn: {} experts do not fit w_in [{}, {}] and w_out [{}, {}]",
      counts.size(), w_in.size(0), w_in.size(1), w_out.size(0), w_out.size(1));
  int64_t rows = 0;
  for (auto c : counts) rows += c;
  EMOE_CHECK(rows == tokens.size(0) && (!weights.defined() || weights.numel() == rows), UsageError,
             "dispatched_expert_ffn: segments cover {} rows, tokens has {}", rows, tokens.size(0));
  auto empty = torch::empty({0}, x.options());
  if (rows == 0)
    return torch::zeros(x.sizes(), x.options().dtype(accumulate.value_or(x.scalar_type())));
  return DispatchedExpertFfnFn::apply(
      x, w_in, b_in.defined() ? b_in : empty, w_up.defined() ? w_up : empty, w_out,
      weights.defined() ? weights.reshape({-1}) : empty, tokens, counts, static_cast<int64_t>(act),
      group_bytes, static_cast<int64_t>(accumulate.value_or(x.scalar_type())));
}

}  // namespace emoe
