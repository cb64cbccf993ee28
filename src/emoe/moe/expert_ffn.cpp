// Dispatched experts in one autograd function (see expert_ffn.h).
#include "emoe/moe/expert_ffn.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <ATen/record_function.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <map>
#include <mutex>
#include <tuple>

#include "emoe/core/bf16_shadow.h"
#include "emoe/core/cpu_info.h"
#include "emoe/core/error.h"
#include "emoe/models/matmul.h"
#include "emoe/models/row_kernels.h"
#include "emoe/moe/expert_kernels.h"

namespace emoe {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// GELU (erf) on the row kernels where they apply (row_kernels.h: float32 and bfloat16, vectorised,
// rounded once — what the dense FFN's activate() runs), else ATen's
bool row_gelu(const at::Tensor& pre, Activation act) {
  return act == Activation::kGeluErf && gelu_erf_applies(pre);
}

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

// act(pre), a new tensor
at::Tensor activation(const at::Tensor& pre, Activation act) {
  if (row_gelu(pre, act)) return gelu_erf_forward(pre);
  auto out = torch::empty_like(pre);
  activation_out(out, pre, act);
  return out;
}

// d act(pre) / d pre · grad, a new tensor
at::Tensor activation_backward(const at::Tensor& grad, const at::Tensor& pre, Activation act) {
  if (row_gelu(pre, act)) return gelu_erf_backward(pre, grad);
  auto out = torch::empty_like(pre);
  activation_backward_out(out, grad, pre, act);
  return out;
}

// Gated experts with SiLU (SwiGLU: Llama, Qwen, Mistral) on the row kernels where they apply:
// silu(pre) ⊙ up in one pass each way, in float32 rounded once (row_kernels.h).
bool fused_silu_gate(const at::Tensor& pre, const at::Tensor& up, Activation act) {
  return up.defined() && act == Activation::kSilu && silu_mul_applies(pre, up);
}

// h = act(pre) (⊙ up): the experts' hidden rows before the routing weight.
at::Tensor hidden_rows(const at::Tensor& pre, const at::Tensor& up, Activation act) {
  if (fused_silu_gate(pre, up, act)) return silu_mul_forward(pre, up);
  auto h = activation(pre, act);
  if (up.defined()) h.mul_(up);
  return h;
}

// absent optional tensors travel through autograd as empty ones
at::Tensor opt(const at::Tensor& t) {
  return t.defined() && t.numel() > 0 ? t : at::Tensor();
}

std::atomic<bool> kernels_enabled{true};

thread_local int forced_path = -1;  // an ExpertPath forced for this thread, or -1

// The CPU kernels (expert_kernels.h): float32 CPU tensors summed in float32 (AVX-512 register
// tiles), or bfloat16 ones summed in float32 (autocast's dispatched experts) on AVX-512 BF16
// register tiles or AMX tiles — whichever expert_path() chose for the shape — or none (library
// GEMMs per expert).
enum class Kernels { kNone, kFloat, kBf16, kAmx };

bool path_fits(ExpertPath path, at::ScalarType dtype) {
  switch (path) {
    case ExpertPath::kLibrary:
      return true;
    case ExpertPath::kAvx512:
      return dtype == at::kFloat && expert_kernels::available();
    case ExpertPath::kAvx512Bf16:  // (amx_available() also asks Linux for the tile state, once)
      return dtype == at::kBFloat16 && expert_kernels::bf16_available();
    case ExpertPath::kAmx:
      return dtype == at::kBFloat16 && emoe::amx_available();
  }
  return false;
}

Kernels kernel_kind(const at::Tensor& x, at::ScalarType acc, int64_t s, int64_t e, bool gated) {
  if (!kernels_enabled.load() || !x.device().is_cpu() || acc != at::kFloat) return Kernels::kNone;
  const auto dtype = x.scalar_type();
  if (dtype != at::kFloat && dtype != at::kBFloat16) return Kernels::kNone;
  ExpertPath path = ExpertPath::kLibrary;
  if (forced_path >= 0 && path_fits(static_cast<ExpertPath>(forced_path), dtype))
    path = static_cast<ExpertPath>(forced_path);
  else
    path = expert_path({dtype, x.size(1), s, e, gated});
  if (!path_fits(path, dtype)) return Kernels::kNone;
  switch (path) {
    case ExpertPath::kAvx512:
      return Kernels::kFloat;
    case ExpertPath::kAvx512Bf16:
      return Kernels::kBf16;
    case ExpertPath::kAmx:
      return Kernels::kAmx;
    case ExpertPath::kLibrary:
      break;
  }
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
    auto* gemm =
        kind == Kernels::kAmx ? expert_kernels::gather_gemm_amx : expert_kernels::gather_gemm_bf16;
    gemm(bptr(x), d, d, tok.data_ptr<int64_t>(), counts, s, bptr(b), neuron_rows ? 1 : es,
         neuron_rows ? d : 1, fptr(bc), bptr_mut(out));
  }
}

// y[tokens[r], :] += h[r] · block_j, y float32 [n, d] contiguous; with accumulate false y is
// overwritten (what it held is not read: it may be torch::empty)
void scatter_products(Kernels kind, const at::Tensor& h, const at::Tensor& tok,
                      const std::vector<int64_t>& counts, int64_t s, const at::Tensor& w,
                      bool neuron_rows, at::Tensor& y, bool accumulate) {
  const int64_t d = y.size(1), es = static_cast<int64_t>(counts.size()) * s;
  if (kind == Kernels::kAmx) {  // (sums each token's terms apart, then writes them)
    auto b = w.contiguous();
    expert_kernels::scatter_gemm_amx(bptr(h), tok.data_ptr<int64_t>(), counts, s, bptr(b),
                                     neuron_rows ? d : 1, neuron_rows ? 1 : es, d,
                                     y.data_ptr<float>(), d, y.size(0), accumulate);
    return;
  }
  if (!accumulate) y.zero_();
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
// x[tokens[r]]ᵀ h[r], summed in float32, written in place when dest is float32 (at any strides:
// the gradient of a [E·s, d] weight is dest's transpose; a separate transposing copy of it took
// 3.4 ms per BERT-base layer)
void weight_grad_products(Kernels kind, const at::Tensor& x, const at::Tensor& tok,
                          const std::vector<int64_t>& counts, int64_t s, const at::Tensor& h,
                          at::Tensor dest) {
  const int64_t d = x.size(1), es = static_cast<int64_t>(counts.size()) * s;
  auto hc = h.contiguous();
  const bool direct = dest.scalar_type() == at::kFloat;
  auto t = direct ? dest : torch::empty({d, es}, x.options().dtype(at::kFloat));
  const int64_t w_k = t.stride(0), w_c = t.stride(1);
  if (kind == Kernels::kFloat)
    expert_kernels::gather_weight_grad(fptr(x), d, d, tok.data_ptr<int64_t>(), counts, s, fptr(hc),
                                       t.data_ptr<float>(), w_k, w_c);
  else if (kind == Kernels::kAmx)
    expert_kernels::gather_weight_grad_amx(bptr(x), d, d, tok.data_ptr<int64_t>(), counts, s,
                                           bptr(hc), t.data_ptr<float>(), w_k, w_c);
  else
    expert_kernels::gather_weight_grad_bf16(bptr(x), d, d, tok.data_ptr<int64_t>(), counts, s,
                                            bptr(hc), t.data_ptr<float>(), w_k, w_c);
  if (!direct) dest.copy_(t);
}

// [E, s]: row j the sum of expert j's rows of g [rows, s] (its segment), in float32 for reduced
// floating types (their opmath type). On the CPU one pass over g (per-expert ATen sums with a
// dtype change filled and copied for each call: ~10 ms per BERT-base layer); elsewhere an
// index_add over the rows' experts.
at::Tensor segment_row_sums(const at::Tensor& g, const std::vector<int64_t>& counts) {
  const int64_t e = static_cast<int64_t>(counts.size()), s = g.size(1);
  const auto out_dtype = at::toOpMathType(g.scalar_type());
  if (!g.device().is_cpu()) {
    auto expert_of_row = torch::arange(e, g.options().dtype(torch::kLong))
                             .repeat_interleave(torch::tensor(counts, torch::kLong).to(g.device()));
    return torch::zeros({e, s}, g.options().dtype(out_dtype))
        .index_add_(0, expert_of_row, g.to(out_dtype));
  }
  auto gc = g.contiguous();
  auto out = torch::zeros({e, s}, g.options().dtype(out_dtype));
  std::vector<int64_t> first(e + 1, 0);
  for (int64_t j = 0; j < e; ++j) first[j + 1] = first[j] + counts[j];
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, gc.scalar_type(), "segment_row_sums",
                                  [&] {
                                    using acc_t = at::opmath_type<scalar_t>;
                                    const scalar_t* src = gc.data_ptr<scalar_t>();
                                    acc_t* dst = out.data_ptr<acc_t>();
                                    at::parallel_for(0, e, 1, [&](int64_t j0, int64_t j1) {
                                      for (int64_t j = j0; j < j1; ++j) {
                                        acc_t* o = dst + j * s;
                                        for (int64_t r = first[j]; r < first[j + 1]; ++r)
                                          for (int64_t c = 0; c < s; ++c)
                                            o[c] += static_cast<acc_t>(src[r * s + c]);
                                      }
                                    });
                                  });
  return out;
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
  // Inputs in their own dtypes (float32 parameters under autocast), cast once here to the compute
  // dtype; the gradients go back in the inputs' dtypes — the kernels' float32 weight gradients
  // straight into float32 tensors, with no bfloat16 round trip.
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x_arg,
                            const at::Tensor& w_in_arg, const at::Tensor& b_in_arg,
                            const at::Tensor& w_up_arg, const at::Tensor& w_out_arg,
                            const at::Tensor& weights_arg, const at::Tensor& tokens,
                            std::vector<int64_t> counts, int64_t act_code, int64_t group_bytes,
                            int64_t acc_code, int64_t compute_code) {
    RECORD_FUNCTION("emoe::dispatched_experts", std::vector<c10::IValue>());
    const auto compute = static_cast<c10::ScalarType>(compute_code);
    auto cast = [&](const at::Tensor& t) {
      if (!t.defined() || t.scalar_type() == compute) return t;
      // the weights: the optimiser's bfloat16 copies where current (bf16_shadow.h)
      return compute == at::kBFloat16 && t.dim() == 2 ? bf16_cast(t) : t.to(compute);
    };
    ctx->saved_data["dtypes"] =
        std::vector<int64_t>{static_cast<int64_t>(x_arg.scalar_type()),
                             static_cast<int64_t>(w_in_arg.scalar_type()),
                             static_cast<int64_t>(b_in_arg.scalar_type()),
                             static_cast<int64_t>(w_up_arg.scalar_type()),
                             static_cast<int64_t>(w_out_arg.scalar_type()),
                             static_cast<int64_t>(weights_arg.scalar_type())};
    const at::Tensor w_in = cast(w_in_arg), b_in_e = cast(b_in_arg), w_up_e = cast(w_up_arg);
    const at::Tensor w_out = cast(w_out_arg), weights_e = cast(weights_arg);
    const auto act = static_cast<Activation>(act_code);
    const at::Tensor b_in = opt(b_in_e), w_up = opt(w_up_e), weights = opt(weights_e);
    const int64_t n = x_arg.size(0), d = x_arg.size(1), e = static_cast<int64_t>(counts.size());
    const int64_t s = w_in.size(0) / e, rows = tokens.size(0);
    auto x = cast(x_arg).contiguous();
    const auto acc = static_cast<c10::ScalarType>(acc_code);
    ctx->saved_data["counts"] = c10::IValue(counts);
    ctx->saved_data["act"] = act_code;
    ctx->saved_data["has_b_in"] = b_in.defined();
    ctx->saved_data["group_bytes"] = group_bytes;
    ctx->saved_data["acc"] = acc_code;
    if (const auto kind = kernel_kind(x, acc, s, e, w_up.defined()); kind != Kernels::kNone) {
      // gathers and scatters inside the products
      auto tok = tokens.contiguous();
      auto pre = torch::empty({rows, s}, x.options());
      gather_products(kind, x, tok, counts, s, w_in, /*neuron_rows=*/true, b_in, pre);
      at::Tensor up;
      if (w_up.defined()) {
        up = torch::empty({rows, s}, x.options());
        gather_products(kind, x, tok, counts, s, w_up, true, {}, up);
      }
      auto h = hidden_rows(pre, up, act);
      if (weights.defined()) h.mul_(weights.unsqueeze(1));
      auto out = torch::empty({n, d}, x.options().dtype(acc));
      scatter_products(kind, h, tok, counts, s, w_out, /*neuron_rows=*/false, out,
                       /*accumulate=*/false);
      // act(pre) kept where it is h itself (EMoE: not gated, unit weights), else recomputed
      const bool keep = !up.defined() && !weights.defined();
      ctx->save_for_backward({x, w_in, w_up_e, w_out, weights_e, tok, pre,
                              up.defined() ? up : torch::empty({0}, x.options()),
                              keep ? h : torch::empty({0}, x.options())});
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
    auto h = hidden_rows(pre, up, act);
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
    const bool keep = !up.defined() && !weights.defined();
    ctx->save_for_backward({x, w_in, w_up_e, w_out, weights_e, tokens, pre,
                            up.defined() ? up : torch::empty({0}, x.options()),
                            keep ? h : torch::empty({0}, x.options())});
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
    const auto dtypes =
        ctx->saved_data["dtypes"].toIntVector();  // x, w_in, b_in, w_up, w_out, weights
    auto dtype = [&](int i) { return static_cast<c10::ScalarType>(dtypes[i]); };
    auto g = grads[0].to(x.scalar_type()).contiguous();
    const auto groups = expert_groups(counts, d * static_cast<int64_t>(x.element_size()),
                                      ctx->saved_data["group_bytes"].toInt());
    const auto kind = kernel_kind(x, acc, s, e, w_up.defined());
    const bool kernels = kind != Kernels::kNone;
    // the kernels write float32 weight gradients into any float32 or compute-dtype tensor; the
    // library path writes them in the compute dtype (converted at the end)
    auto weight_grad = [&](bool need, const at::Tensor& w, int i) {
      return need ? torch::empty(w.sizes(), o.dtype(kernels ? dtype(i) : x.scalar_type()))
                  : at::Tensor();
    };
    // (the kernels overwrite x's gradient; the library path adds each group's part into it)
    at::Tensor gx = !need_x   ? at::Tensor()
                    : kernels ? torch::empty(x.sizes(), o.dtype(acc))
                              : torch::zeros(x.sizes(), o.dtype(acc));
    at::Tensor g_w_in = weight_grad(need_w_in, w_in, 1);
    at::Tensor g_w_up = weight_grad(need_w_up, w_up, 3);
    at::Tensor g_w_out = weight_grad(need_w_out, w_out, 4);
    auto buf = kernels ? at::Tensor() : torch::empty({largest_group(groups), d}, o);
    // a = act(pre) (kept by the forward for EMoE's experts, else recomputed), h = a (⊙ up),
    // hw = h (· weight)
    const bool fused_gate = fused_silu_gate(pre, up, act);
    at::Tensor a = opt(saved[8]), h;
    if (fused_gate) {
      h = silu_mul_forward(pre, up);  // (a itself is not needed: the backward kernel takes pre)
    } else {
      if (!a.defined()) a = activation(pre, act);
      h = up.defined() ? a * up : a;
    }
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
    at::Tensor g_up, g_pre;
    if (fused_gate) {
      std::tie(g_pre, g_up) = silu_mul_backward(pre, up, gh);
    } else {
      if (up.defined()) {
        g_up = gh * a;
        gh.mul_(up);  // now the gradient of act(pre)
      }
      g_pre = activation_backward(gh, pre, act);
    }
    at::Tensor g_b_in;
    if (need_b_in) g_b_in = segment_row_sums(g_pre, counts).view({e * s});
    // pass 2: gradients of w_in, w_up and x, expert by expert; x's rows are gathered per group
    // and each expert's input gradient replaces its (used) input rows in the buffer
    if (kernels) {
      // the weight gradients come out as [d, E·s] (expert j's columns j·s..), transposed once
      if (need_w_in) weight_grad_products(kind, x, tok, counts, s, g_pre, g_w_in.t());
      if (need_w_up) weight_grad_products(kind, x, tok, counts, s, g_up, g_w_up.t());
      if (need_x) {
        scatter_products(kind, g_pre, tok, counts, s, w_in, /*neuron_rows=*/true, gx,
                         /*accumulate=*/false);
        if (up.defined()) scatter_products(kind, g_up, tok, counts, s, w_up, true, gx, true);
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
    auto back = [&](const at::Tensor& t, int i) {
      return t.defined() && t.scalar_type() != dtype(i) ? t.to(dtype(i)) : t;
    };
    return {back(gx, 0),      back(g_w_in, 1),    back(g_b_in, 2), back(g_w_up, 3),
            back(g_w_out, 4), back(g_weights, 5), at::Tensor(),    at::Tensor(),
            at::Tensor(),     at::Tensor(),       at::Tensor(),    at::Tensor()};
  }
};

struct PathChoice {
  ExpertPath path = ExpertPath::kLibrary;
  std::string report;
};

// One forward and backward of `shape`'s experts on the calling thread's forced path: 1024 tokens
// over min(N, 16) experts of the shape's width, k = a quarter of them (the work per expert row
// of the real layer, in less memory), the best of three after a warm-up.
double time_path(const ExpertShape& shape, ExpertPath path) {
  const int64_t n = 1024, d = shape.d, s = shape.s, e = std::min<int64_t>(shape.experts, 16);
  const int64_t k = std::max<int64_t>(1, e / 4);
  auto prev = force_expert_path(path);
  torch::AutoGradMode grad_mode(true);
  c10::impl::ExcludeDispatchKeyGuard no_autocast(
      c10::DispatchKeySet({c10::DispatchKey::AutocastCPU, c10::DispatchKey::AutocastCUDA}));
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1234);
  auto param = [&](std::vector<int64_t> dims, double scale) {
    return (at::randn(dims, gen, torch::TensorOptions()) * scale)
        .to(shape.dtype)
        .requires_grad_(true);
  };
  auto x = param({n, d}, 1.0), w_in = param({e * s, d}, 0.03), b_in = param({e * s}, 0.02);
  auto w_out = param({d, e * s}, 0.03);
  auto w_up = shape.gated ? param({e * s, d}, 0.03) : at::Tensor();
  // k distinct experts per token, rows sorted by expert
  auto experts = at::rand({n, e}, gen, torch::TensorOptions())
                     .argsort(/*dim=*/1, /*descending=*/false)
                     .narrow(1, 0, k);
  auto flat = experts.reshape({-1});
  auto order = flat.argsort(/*dim=*/0, /*descending=*/false);
  auto tokens = torch::arange(n).repeat_interleave(k).index_select(0, order);
  at::Tensor counts_t = at::bincount(flat, c10::optional<at::Tensor>(), e);
  std::vector<int64_t> counts(counts_t.data_ptr<int64_t>(), counts_t.data_ptr<int64_t>() + e);
  torch::autograd::variable_list leaves = {x, w_in, b_in, w_out};
  if (shape.gated) leaves.push_back(w_up);
  double best = 1e30;
  for (int rep = 0; rep < 4; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    auto y = dispatched_expert_ffn(x, tokens, counts, at::Tensor(), w_in, b_in, w_up, w_out,
                                   shape.gated ? Activation::kSilu : Activation::kGeluErf,
                                   int64_t{16} << 20, at::kFloat);
    auto grads = torch::autograd::grad(torch::autograd::variable_list{y.sum()}, leaves);
    const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (rep > 0) best = std::min(best, t);  // rep 0: the warm-up
  }
  force_expert_path(prev);
  return best;
}

std::string shape_text(const ExpertShape& shape) {
  return fmt::format("{} experts of {} x {}{}, {}", shape.experts, shape.s, shape.d,
                     shape.gated ? " (gated)" : "",
                     shape.dtype == at::kBFloat16 ? "bfloat16" : "float32");
}

PathChoice choose_path(const ExpertShape& shape) {
  const auto available = expert_paths_available(shape.dtype);
  PathChoice c;
  const char* env = std::getenv("EMOE_EXPERT_KERNELS");
  const std::string want = env ? env : "";
  if (!want.empty() && want != "auto") {
    // a path of the other dtype (amx for float32 experts) leaves this one measured
    std::vector<std::string> names = {"library"};
    bool known = want == "library";
    for (auto dtype : {at::kFloat, at::kBFloat16})
      for (auto p : expert_paths_available(dtype)) {
        if (p == ExpertPath::kLibrary) continue;
        names.push_back(to_string(p));
        known = known || want == to_string(p);
      }
    EMOE_CHECK(known, UsageError,
               "EMOE_EXPERT_KERNELS: expected auto or a path this CPU has ({}), got '{}'",
               fmt::join(names, ", "), want);
    for (auto p : available)
      if (want == to_string(p)) {
        c.path = p;
        c.report = fmt::format("{} (EMOE_EXPERT_KERNELS)", want);
        return c;
      }
  }
  if (available.size() == 1) {
    c.report = shape.dtype == at::kBFloat16 ? "library (no AVX-512 BF16 or AMX kernels on this CPU)"
                                            : "library (no AVX-512 kernels on this CPU)";
    return c;
  }
  // the most specialised path first (amx, avx512-bf16 / avx512, library); a later one must be
  // 10 % faster to replace it, so that close calls fall the same way in every process
  std::vector<std::string> parts;
  double best = 1e30;
  for (auto it = available.rbegin(); it != available.rend(); ++it) {
    const double t = time_path(shape, *it);
    parts.push_back(fmt::format("{} {:.1f} ms", to_string(*it), t * 1e3));
    if (t < 0.9 * best) best = t, c.path = *it;
  }
  c.report = fmt::format("{} (measured: {})", to_string(c.path), fmt::join(parts, ", "));
  return c;
}

struct PathChoices {
  std::mutex mutex;
  std::map<std::tuple<int, int64_t, int64_t, int64_t, bool>, PathChoice> by_shape;
  std::vector<std::string> reports;  // in the order chosen
};

PathChoices& path_choices() {
  static PathChoices c;
  return c;
}

const PathChoice& path_choice(const ExpertShape& shape) {
  auto& c = path_choices();
  const auto key =
      std::make_tuple(static_cast<int>(shape.dtype), shape.d, shape.s, shape.experts, shape.gated);
  {
    std::lock_guard<std::mutex> lock(c.mutex);
    auto it = c.by_shape.find(key);
    if (it != c.by_shape.end()) return it->second;
  }
  // measured outside the lock (the measurement runs the experts, which ask again: forced path)
  auto choice = choose_path(shape);
  std::lock_guard<std::mutex> lock(c.mutex);
  auto [it, fresh] = c.by_shape.emplace(key, choice);
  if (fresh) {
    c.reports.push_back(fmt::format("{}: {}", shape_text(shape), it->second.report));
    spdlog::info("dispatched experts, {}", c.reports.back());
  }
  return it->second;
}

}  // namespace

const char* to_string(ExpertPath path) {
  switch (path) {
    case ExpertPath::kAmx:
      return "amx";
    case ExpertPath::kAvx512Bf16:
      return "avx512-bf16";
    case ExpertPath::kAvx512:
      return "avx512";
    case ExpertPath::kLibrary:
      return "library";
  }
  return "library";
}

std::vector<ExpertPath> expert_paths_available(at::ScalarType dtype) {
  std::vector<ExpertPath> paths = {ExpertPath::kLibrary};
  for (auto p : {ExpertPath::kAvx512, ExpertPath::kAvx512Bf16, ExpertPath::kAmx})
    if (path_fits(p, dtype)) paths.push_back(p);
  return paths;
}

ExpertShape bert_base_expert_shape(at::ScalarType dtype) {
  return {dtype, 768, 48, 64, false};
}

ExpertPath expert_path(const ExpertShape& shape) {
  return path_choice(shape).path;
}

std::string expert_path_report(const ExpertShape& shape) {
  return path_choice(shape).report;
}

std::vector<std::string> expert_path_reports() {
  auto& c = path_choices();
  std::lock_guard<std::mutex> lock(c.mutex);
  return c.reports;
}

std::map<std::string, std::string> expert_path_choices_made() {
  auto& c = path_choices();
  std::lock_guard<std::mutex> lock(c.mutex);
  std::map<std::string, std::string> made;
  for (const auto& [key, choice] : c.by_shape) {
    const auto& [dtype, d, s, experts, gated] = key;
    made[fmt::format("{},{},{},{},{}",
                     static_cast<at::ScalarType>(dtype) == at::kBFloat16 ? "bfloat16" : "float32",
                     d, s, experts, gated ? 1 : 0)] = to_string(choice.path);
  }
  return made;
}

std::string pin_expert_path_choices(const std::map<std::string, std::string>& choices) {
  const char* env = std::getenv("EMOE_EXPERT_KERNELS");
  if (env && *env && std::string(env) != "auto") return "";  // the variable decides
  std::map<std::tuple<int, int64_t, int64_t, int64_t, bool>, PathChoice> parsed;
  for (const auto& [text, name] : choices) {
    std::vector<std::string> parts;
    for (size_t at = 0;;) {
      const size_t end = text.find(',', at);
      parts.push_back(text.substr(at, end == std::string::npos ? std::string::npos : end - at));
      if (end == std::string::npos) break;
      at = end + 1;
    }
    const bool dtype_ok = !parts.empty() && (parts[0] == "float32" || parts[0] == "bfloat16");
    bool ints_ok = parts.size() == 5;
    for (size_t i = 1; ints_ok && i < parts.size(); ++i)
      ints_ok = !parts[i].empty() && parts[i].size() <= 18 &&
                parts[i].find_first_not_of("0123456789") == std::string::npos;
    if (!dtype_ok || !ints_ok)
      return fmt::format(
          "experts '{}': expected float32|bfloat16,width,neurons,experts,gated (0 or 1)", text);
    const auto dtype = parts[0] == "bfloat16" ? at::kBFloat16 : at::kFloat;
    PathChoice choice;
    bool known = false;
    for (auto p : expert_paths_available(dtype))
      if (name == to_string(p)) choice.path = p, known = true;
    if (!known)
      return fmt::format("experts '{}': '{}' is not a path this CPU has for {}", text, name,
                         parts[0]);
    choice.report = fmt::format("{} (pinned)", name);
    parsed[std::make_tuple(static_cast<int>(dtype), std::stoll(parts[1]), std::stoll(parts[2]),
                           std::stoll(parts[3]), parts[4] != "0")] = choice;
  }
  auto& c = path_choices();
  std::lock_guard<std::mutex> lock(c.mutex);
  for (const auto& [key, choice] : parsed) {
    auto it = c.by_shape.find(key);
    if (it != c.by_shape.end() && it->second.path == choice.path) continue;  // (no new line)
    c.by_shape.insert_or_assign(key, choice);
    const auto& [dtype, d, s, experts, gated] = key;
    c.reports.push_back(fmt::format(
        "{}: {}", shape_text({static_cast<at::ScalarType>(dtype), d, s, experts, gated}),
        choice.report));
  }
  return "";
}

void forget_expert_path_choices() {
  auto& c = path_choices();
  std::lock_guard<std::mutex> lock(c.mutex);
  c.by_shape.clear();
  c.reports.clear();
}

c10::optional<ExpertPath> force_expert_path(c10::optional<ExpertPath> path) {
  c10::optional<ExpertPath> prev;
  if (forced_path >= 0) prev = static_cast<ExpertPath>(forced_path);
  forced_path = path ? static_cast<int>(*path) : -1;
  return prev;
}

bool set_expert_kernels(bool enabled) {
  return kernels_enabled.exchange(enabled);
}

bool expert_kernels_used(const at::Tensor& x) {
  return kernels_enabled.load() && x.device().is_cpu() &&
         expert_paths_available(x.scalar_type()).size() > 1;
}

at::Tensor dispatched_expert_ffn(const at::Tensor& x, const at::Tensor& tokens,
                                 const std::vector<int64_t>& counts, const at::Tensor& weights,
                                 const at::Tensor& w_in, const at::Tensor& b_in,
                                 const at::Tensor& w_up, const at::Tensor& w_out, Activation act,
                                 int64_t group_bytes, c10::optional<at::ScalarType> accumulate,
                                 c10::optional<at::ScalarType> compute) {
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
  // the bfloat16 path is measured once, here rather than inside the autograd function
  const auto comp = compute.value_or(x.scalar_type());
  // the path for this shape is measured once, here rather than inside the autograd function
  if (x.device().is_cpu() && forced_path < 0 && (comp == at::kBFloat16 || comp == at::kFloat) &&
      kernels_enabled.load())
    (void)expert_path({comp, x.size(1), w_in.size(0) / static_cast<int64_t>(counts.size()),
                       static_cast<int64_t>(counts.size()), w_up.defined()});
  auto empty = torch::empty({0}, x.options());
  if (rows == 0) return torch::zeros(x.sizes(), x.options().dtype(accumulate.value_or(comp)));
  return DispatchedExpertFfnFn::apply(
      x, w_in, b_in.defined() ? b_in : empty, w_up.defined() ? w_up : empty, w_out,
      weights.defined() ? weights.reshape({-1}) : empty, tokens, counts, static_cast<int64_t>(act),
      group_bytes, static_cast<int64_t>(accumulate.value_or(comp)), static_cast<int64_t>(comp));
}

}  // namespace emoe
