// AdamW parameter groups and learning-rate schedules.
#include "emoe/train/optim.h"

#include <ATen/Parallel.h>
#include <ATen/record_function.h>
#include <immintrin.h>
#include <torch/torch.h>

#include <cmath>
#include <cstring>
#include <sstream>
#include <string>
#include <type_traits>

#include "emoe/core/bf16_round.h"
#include "emoe/core/bf16_shadow.h"
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

Optimizer::~Optimizer() {
  if (adamw_) drop_bf16_shadows(parameters());
}

void Optimizer::set_lr_factor(double factor) {
  auto& pg = adamw_->param_groups();
  for (size_t i = 0; i < pg.size(); ++i)
    static_cast<torch::optim::AdamWOptions&>(pg[i].options()).lr(groups_[i].base_lr * factor);
}

double Optimizer::current_lr() const {
  return static_cast<const torch::optim::AdamWOptions&>(adamw_->param_groups()[0].options()).lr();
}

namespace {

// x rounded to bfloat16 as ATen's vectorised conversion rounds it: to nearest even, NaN 0xFFFF
uint16_t round_bf16(float x) {
  if (std::isnan(x)) return 0xFFFF;
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return static_cast<uint16_t>(bf16_round::rne(u));
}

// AdamW over elements [begin, end) of p, its gradient g and the moments m, v, one element at a
// time (the tails, and CPUs without AVX2); pb (may be null): p's new values rounded to bfloat16.
void adamw_scalar(float* p, const float* g, float* m, float* v, uint16_t* pb, int64_t begin,
                  int64_t end, float decay_factor, float beta1, float beta2, float sqrt_bc2,
                  float eps, float step_size) {
  const float one_minus_b1 = 1.0f - beta1, one_minus_b2 = 1.0f - beta2;
  for (int64_t i = begin; i < end; ++i) {
    const float gi = g[i];
    const float mi = m[i] * beta1 + gi * one_minus_b1;
    const float vi = v[i] * beta2 + gi * gi * one_minus_b2;
    m[i] = mi;
    v[i] = vi;
    const float denom = std::sqrt(vi) / sqrt_bc2 + eps;
    p[i] = p[i] * decay_factor - step_size * (mi / denom);
    if (pb) pb[i] = round_bf16(p[i]);
  }
}

// The same in vector registers: the same operations in the same order (products and sums
// separately rounded, no fused multiply-add; square root and division exact), so the result does
// not depend on which one runs. Written out because GCC does not vectorise the scalar loop: its
// std::sqrt may set errno (a per-function no-math-errno did not change that), and the loop ran
// one float at a time, ~5x slower than memory allows (250 ms of a BERT-base step).
#define EMOE_ADAMW_VECTOR_BODY(VEC, W, LOAD, STORE, SET1, ADD, SUB, MUL, DIV, SQRT, BF16) \
  const VEC b1 = SET1(beta1), b2 = SET1(beta2), omb1 = SET1(1.0f - beta1),                \
            omb2 = SET1(1.0f - beta2), sbc2 = SET1(sqrt_bc2), ep = SET1(eps),             \
            decay = SET1(decay_factor), step = SET1(step_size);                           \
  int64_t i = begin;                                                                      \
  for (; i + (W) <= end; i += (W)) {                                                      \
    const VEC gi = LOAD(g + i);                                                           \
    const VEC mi = ADD(MUL(LOAD(m + i), b1), MUL(gi, omb1));                              \
    const VEC vi = ADD(MUL(LOAD(v + i), b2), MUL(MUL(gi, gi), omb2));                     \
    STORE(m + i, mi);                                                                     \
    STORE(v + i, vi);                                                                     \
    const VEC denom = ADD(DIV(SQRT(vi), sbc2), ep);                                       \
    const VEC pn = SUB(MUL(LOAD(p + i), decay), MUL(step, DIV(mi, denom)));               \
    STORE(p + i, pn);                                                                     \
    if (pb) BF16(pn, pb + i);                                                             \
  }                                                                                       \
  adamw_scalar(p, g, m, v, pb, i, end, decay_factor, beta1, beta2, sqrt_bc2, eps, step_size);

// 16 (8) floats rounded to bfloat16 as round_bf16 rounds them, stored at out
__attribute__((target("avx512f"))) inline void store_bf16_avx512(__m512 x, uint16_t* out) {
  const __m512i r = bf16_round::rne(_mm512_castps_si512(x));
  bf16_round::store_low_halves(out, _mm512_mask_blend_epi32(_mm512_cmp_ps_mask(x, x, _CMP_ORD_Q),
                                                            _mm512_set1_epi32(0xFFFF), r));
}

__attribute__((target("avx2"))) inline void store_bf16_avx2(__m256 x, uint16_t* out) {
  const __m256i r = bf16_round::rne(_mm256_castps_si256(x));
  bf16_round::store_low_halves(
      out, _mm256_blendv_epi8(_mm256_set1_epi32(0xFFFF), r,
                              _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_ORD_Q))));
}

__attribute__((target("avx512f"))) void adamw_avx512(float* p, const float* g, float* m, float* v,
                                                     uint16_t* pb, int64_t begin, int64_t end,
                                                     float decay_factor, float beta1, float beta2,
                                                     float sqrt_bc2, float eps, float step_size) {
  EMOE_ADAMW_VECTOR_BODY(__m512, 16, _mm512_loadu_ps, _mm512_storeu_ps, _mm512_set1_ps,
                         _mm512_add_ps, _mm512_sub_ps, _mm512_mul_ps, _mm512_div_ps, _mm512_sqrt_ps,
                         store_bf16_avx512)
}

__attribute__((target("avx2"))) void adamw_avx2(float* p, const float* g, float* m, float* v,
                                                uint16_t* pb, int64_t begin, int64_t end,
                                                float decay_factor, float beta1, float beta2,
                                                float sqrt_bc2, float eps, float step_size) {
  EMOE_ADAMW_VECTOR_BODY(__m256, 8, _mm256_loadu_ps, _mm256_storeu_ps, _mm256_set1_ps,
                         _mm256_add_ps, _mm256_sub_ps, _mm256_mul_ps, _mm256_div_ps, _mm256_sqrt_ps,
                         store_bf16_avx2)
}
#undef EMOE_ADAMW_VECTOR_BODY

void adamw_span(float* p, const float* g, float* m, float* v, uint16_t* pb, int64_t begin,
                int64_t end, float decay_factor, float beta1, float beta2, float sqrt_bc2,
                float eps, float step_size) {
  static const int isa =
      __builtin_cpu_supports("avx512f") ? 2 : (__builtin_cpu_supports("avx2") ? 1 : 0);
  if (isa == 2)
    adamw_avx512(p, g, m, v, pb, begin, end, decay_factor, beta1, beta2, sqrt_bc2, eps, step_size);
  else if (isa == 1)
    adamw_avx2(p, g, m, v, pb, begin, end, decay_factor, beta1, beta2, sqrt_bc2, eps, step_size);
  else
    adamw_scalar(p, g, m, v, pb, begin, end, decay_factor, beta1, beta2, sqrt_bc2, eps, step_size);
}

// One pass of AdamW over n contiguous floats, over the intra-op threads (pb: see adamw_scalar).
void adamw_kernel(float* p, const float* g, float* m, float* v, uint16_t* pb, int64_t n,
                  float decay_factor, float beta1, float beta2, float sqrt_bc2, float eps,
                  float step_size) {
  at::parallel_for(0, n, 1 << 14, [&](int64_t begin, int64_t end) {
    adamw_span(p, g, m, v, pb, begin, end, decay_factor, beta1, beta2, sqrt_bc2, eps, step_size);
  });
}

// The key of a parameter's entry in torch::optim::Optimizer::state(), as libtorch's own AdamW
// makes it (so that its serialisation finds the entries made here): the parameter's TensorImpl
// address, as text in libtorch 1.13 (c10::guts::to_string), the address itself in 2.x.
template <typename Key>
Key optimizer_state_key(const at::Tensor& p) {
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream os;
    os << p.unsafeGetTensorImpl();
    return os.str();
  } else {
    return static_cast<Key>(p.unsafeGetTensorImpl());
  }
}

}  // namespace

void Optimizer::step() {
  RECORD_FUNCTION("emoe::optimizer_step", std::vector<c10::IValue>());
  torch::NoGradGuard no_grad;
  auto& states = adamw_->state();
  using StateKey = typename std::remove_reference_t<decltype(states)>::key_type;
  for (auto& group : adamw_->param_groups()) {
    auto& o = static_cast<torch::optim::AdamWOptions&>(group.options());
    EMOE_CHECK(!o.amsgrad(), UsageError, "AdamW: amsgrad is not supported");
    const double beta1 = std::get<0>(o.betas()), beta2 = std::get<1>(o.betas());
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      const auto& grad = p.grad();
      const auto key = optimizer_state_key<StateKey>(p);
      auto it = states.find(key);
      if (it == states.end()) {
        auto st = std::make_unique<torch::optim::AdamWParamState>();
        st->step(0);
        st->exp_avg(torch::zeros_like(p, torch::MemoryFormat::Preserve));
        st->exp_avg_sq(torch::zeros_like(p, torch::MemoryFormat::Preserve));
        states[key] = std::move(st);
        it = states.find(key);
      }
      auto& st = static_cast<torch::optim::AdamWParamState&>(*it->second);
      st.step(st.step() + 1);
      const double bc1 = 1 - std::pow(beta1, static_cast<double>(st.step()));
      const double bc2 = 1 - std::pow(beta2, static_cast<double>(st.step()));
      const double step_size = o.lr() / bc1;
      const double decay_factor = 1 - o.lr() * o.weight_decay();
      auto& m = st.exp_avg();
      auto& v = st.exp_avg_sq();
      const bool fused = p.device().is_cpu() && p.scalar_type() == torch::kFloat &&
                         grad.scalar_type() == torch::kFloat && !grad.is_sparse() &&
                         p.is_contiguous() && grad.is_contiguous() && m.is_contiguous() &&
                         v.is_contiguous();
      if (fused) {
        // and p's bfloat16 copy where a forward under autocast asked for one (bf16_shadow.h)
        adamw_kernel(p.data_ptr<float>(), grad.data_ptr<float>(), m.data_ptr<float>(),
                     v.data_ptr<float>(), bf16_shadow_target(p), p.numel(),
                     static_cast<float>(decay_factor), static_cast<float>(beta1),
                     static_cast<float>(beta2), static_cast<float>(std::sqrt(bc2)),
                     static_cast<float>(o.eps()), static_cast<float>(step_size));
        bf16_shadow_written(p);  // (the version moves on, as an in-place op would move it)
        continue;
      }
      if (o.weight_decay() != 0) p.mul_(decay_factor);
      m.mul_(beta1).add_(grad, 1 - beta1);
      v.mul_(beta2).addcmul_(grad, grad, 1 - beta2);
      auto denom = (v.sqrt() / std::sqrt(bc2)).add_(o.eps());
      p.addcdiv_(m, denom, -step_size);
    }
  }
}

void Optimizer::zero_grad() {
  RECORD_FUNCTION("emoe::zero_grad", std::vector<c10::IValue>());
  for (auto& group : adamw_->param_groups())
    for (auto& p : group.params())
      if (p.grad().defined()) p.mutable_grad() = torch::Tensor();
}

std::vector<torch::Tensor> Optimizer::parameters() const {
  std::vector<torch::Tensor> out;
  for (const auto& g : adamw_->param_groups())
    for (const auto& p : g.params()) out.push_back(p);
  return out;
}

std::vector<std::string> Optimizer::parameter_names() const {
  return names_;
}

namespace {

template <typename States>
auto* find_adamw_state(States& states, const torch::Tensor& p) {
  using StateKey = typename std::remove_reference_t<decltype(states)>::key_type;
  auto it = states.find(optimizer_state_key<StateKey>(p));
  return it == states.end() ? nullptr
                            : static_cast<torch::optim::AdamWParamState*>(it->second.get());
}

}  // namespace

Optimizer::ParamState Optimizer::state_of(const torch::Tensor& p) {
  ParamState s;
  if (auto* st = find_adamw_state(adamw_->state(), p)) {
    s.step = st->step();
    s.exp_avg = st->exp_avg();
    s.exp_avg_sq = st->exp_avg_sq();
  }
  return s;
}

void Optimizer::set_state(const torch::Tensor& p, const ParamState& s) {
  auto& states = adamw_->state();
  using StateKey = typename std::remove_reference_t<decltype(states)>::key_type;
  auto st = std::make_unique<torch::optim::AdamWParamState>();
  st->step(s.step);
  st->exp_avg(s.exp_avg);
  st->exp_avg_sq(s.exp_avg_sq);
  states[optimizer_state_key<StateKey>(p)] = std::move(st);
}

void Optimizer::drop_state(const torch::Tensor& p) {
  auto& states = adamw_->state();
  using StateKey = typename std::remove_reference_t<decltype(states)>::key_type;
  states.erase(optimizer_state_key<StateKey>(p));
}

int64_t Optimizer::state_bytes() {
  int64_t n = 0;
  for (const auto& p : parameters())
    if (auto* st = find_adamw_state(adamw_->state(), p))
      n += static_cast<int64_t>(st->exp_avg().nbytes() + st->exp_avg_sq().nbytes());
  return n;
}

double schedule_factor(Schedule kind, int64_t step, int64_t total, int64_t warmup) {
  // Hugging Face's schedules (get_linear/cosine_schedule_with_warmup) at 0-based `step`.
  if (step < warmup)
    return static_cast<double>(step) / static_cast<double>(std::max<int64_t>(1, warmup));
  if (kind == Schedule::kConstant) return 1.0;
  const double span = static_cast<double>(std::max<int64_t>(1, total - warmup));
  const double progress = static_cast<double>(step - warmup) / span;
  if (kind == Schedule::kCosine) return std::max(0.0, 0.5 * (1.0 + std::cos(M_PI * progress)));
  return std::max(0.0, 1.0 - progress);  // linear
}

double schedule_factor(const std::string& kind, int64_t step, int64_t total, int64_t warmup) {
  return schedule_factor(parse_schedule(kind), step, total, warmup);
}

}  // namespace emoe
