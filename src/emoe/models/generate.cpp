// Incremental decoding with a KV cache, matching Hugging Face's greedy/sampling generate().
#include "emoe/models/generate.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include "emoe/core/error.h"

namespace emoe {

namespace {

at::Tensor pick_next(const at::Tensor& logits, const GenerateOptions& o, at::Generator& gen) {
  if (o.temperature <= 0.0) return logits.argmax(-1);
  auto scores = logits.to(torch::kFloat).to(torch::kCPU) / o.temperature;
  const float neg_inf = -std::numeric_limits<float>::infinity();
  if (o.top_k > 0 && o.top_k < scores.size(-1)) {
    auto kth = std::get<0>(scores.topk(o.top_k, -1)).narrow(-1, o.top_k - 1, 1);
    scores = scores.masked_fill(scores < kth, neg_inf);
  }
  if (o.top_p < 1.0) {
    auto [sorted, idx] = scores.sort(-1, /*descending=*/false);
    auto cum = sorted.softmax(-1).cumsum(-1);
    auto remove_sorted = cum <= (1.0 - o.top_p);
    remove_sorted.narrow(-1, remove_sorted.size(-1) - 1, 1).fill_(false);  // keep the best one
    auto remove = torch::zeros_like(remove_sorted).scatter(-1, idx, remove_sorted);
    scores = scores.masked_fill(remove, neg_inf);
  }
  auto probs = scores.softmax(-1);
  return torch::multinomial(probs, 1, /*replacement=*/false, gen).squeeze(-1).to(logits.device());
}

}  // namespace

void GenerateOptions::validate() const {
  EMOE_CHECK(max_new_tokens >= 0, UsageError, "--max-new-tokens: expected >= 0, got {}", max_new_tokens);
  EMOE_CHECK(top_p > 0.0 && top_p <= 1.0, UsageError, "--top-p: expected (0, 1], got {}", top_p);
  EMOE_CHECK(temperature >= 0.0, UsageError, "--temperature: expected >= 0, got {}", temperature);
  EMOE_CHECK(top_k >= 0, UsageError, "--top-k: expected >= 0, got {}", top_k);
}

at::Tensor generate(PretrainedModelImpl& model, const at::Tensor& input_ids,
                    const at::Tensor& attention_mask, const GenerateOptions& o,
                    const std::function<void(int64_t, const at::Tensor&)>& on_step) {
  const auto& s = model.summary();
  EMOE_CHECK(s.causal && s.head == Head::kCausalLM, UsageError,
             "generate needs a decoder model with a language-model head; this is a {} {} model",
             s.model_type, head_name(s.head));
  EMOE_CHECK(input_ids.dim() == 2 && input_ids.size(1) > 0, InputError,
             "generate: expected a non-empty [batch, seq] prompt");
  o.validate();
  const int64_t limit = s.max_positions - input_ids.size(1);
  EMOE_CHECK(limit >= 0, InputError, "prompt of {} tokens exceeds the model's {} positions",
             input_ids.size(1), s.max_positions);
  const int64_t steps = std::min(o.max_new_tokens, limit);
  if (steps < o.max_new_tokens)
    spdlog::warn("generation capped at {} new tokens by the model's {} positions", steps, s.max_positions);

  torch::NoGradGuard no_grad;
  auto dev = model.parameters()[0].device();
  auto ids = input_ids.to(dev).to(torch::kLong);
  const int64_t b = ids.size(0);
  auto mask = attention_mask.defined() ? attention_mask.to(dev).to(torch::kLong)
                                       : torch::ones_like(ids);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(o.seed);
  std::optional<int64_t> pad = o.pad_id;
  if (!pad && !o.eos_ids.empty()) pad = o.eos_ids[0];
  auto unfinished = torch::ones({b}, ids.options());

  KvCache cache;
  at::Tensor out = ids;
  at::Tensor step_ids = ids;
  for (int64_t step = 0; step < steps; ++step) {
    ModelInputs in;
    in.input_ids = o.use_cache ? step_ids : out;
    in.attention_mask = mask;
    in.position_ids = default_position_ids(mask, b, in.input_ids.size(1), 0, dev);
    in.cache = o.use_cache ? &cache : nullptr;
    auto logits = model.forward(in).logits.select(1, -1);
    auto next = pick_next(logits, o, gen);
    if (pad) next = next * unfinished + (*pad) * (1 - unfinished);
    out = torch::cat({out, next.unsqueeze(1)}, 1);
    mask = torch::cat({mask, torch::ones({b, 1}, mask.options())}, 1);
    step_ids = next.unsqueeze(1);
    if (on_step) on_step(step, next);
    if (!o.eos_ids.empty()) {
      for (auto e : o.eos_ids) unfinished = unfinished * (next != e).to(torch::kLong);
      if (unfinished.max().item<int64_t>() == 0) break;
    }
  }
  return out;
}

}  // namespace emoe
