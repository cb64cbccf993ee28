// Incremental decoding with a KV cache, matching Hugging Face's greedy/sampling generate(), for
// decoder-only and encoder-decoder models.
#include "emoe/models/generate.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>

#include "emoe/core/error.h"

namespace emoe {

namespace {

// The decoder's self-attention caches are made, at their second step, with room for `positions`
// (the prompt and every new token): one buffer per layer, no regrowth. (Cross-attention keys and
// values are stored once and never appended to.)
void reserve_positions(KvCache* cache, int64_t positions) {
  for (auto& kv : cache->layers) kv.reserve = positions;
}

at::Tensor pick_next(const at::Tensor& logits, const GenerateOptions& o, at::Generator& gen) {
  // greedy: ATen's argmax over bfloat16 rows on the CPU is scalar (0.58 ms for 8 x 32000, 7 % of
  // a decoding step); widened to float32 (exact, the same first maximum) it is not
  if (o.temperature <= 0.0)
    return logits.device().is_cpu() && logits.scalar_type() != at::kFloat &&
                   logits.scalar_type() != at::kDouble
               ? logits.to(at::kFloat).argmax(-1)
               : logits.argmax(-1);
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

// One row's n-best list of finished hypotheses (Hugging Face's BeamHypotheses).
struct BeamHypotheses {
  int64_t num_beams = 1;
  double length_penalty = 1.0;
  bool early_stopping = false;
  std::vector<std::pair<double, std::vector<int64_t>>> beams;  // score, tokens
  double worst_score = 1e9;

  void add(std::vector<int64_t> hyp, double sum_logprobs) {
    const double score = sum_logprobs / std::pow(static_cast<double>(hyp.size()), length_penalty);
    if (static_cast<int64_t>(beams.size()) < num_beams || score > worst_score) {
      beams.emplace_back(score, std::move(hyp));
      if (static_cast<int64_t>(beams.size()) > num_beams) {
        // drop the worst (the first of equal scores, as Python's sorted() of (score, index))
        size_t worst = 0;
        for (size_t i = 1; i < beams.size(); ++i)
          if (beams[i].first < beams[worst].first) worst = i;
        beams.erase(beams.begin() + static_cast<std::ptrdiff_t>(worst));
        worst_score = beams[0].first;
        for (const auto& b : beams) worst_score = std::min(worst_score, b.first);
      } else {
        worst_score = std::min(score, worst_score);
      }
    }
  }
  bool is_done(double best_sum_logprobs, int64_t cur_len) const {
    if (static_cast<int64_t>(beams.size()) < num_beams) return false;
    if (early_stopping) return true;
    const double attainable =
        best_sum_logprobs / std::pow(static_cast<double>(cur_len), length_penalty);
    return worst_score >= attainable;
  }
  // The best hypothesis: the highest score, the last added among equals (Python's sorted + pop).
  const std::vector<int64_t>& best() const {
    size_t b = 0;
    for (size_t i = 1; i < beams.size(); ++i)
      if (beams[i].first >= beams[b].first) b = i;
    return beams[b].second;
  }
};

std::vector<int64_t> beam_row_tokens(const at::Tensor& cpu_ids, int64_t row) {
  auto r = cpu_ids[row].contiguous();
  return std::vector<int64_t>(r.data_ptr<int64_t>(), r.data_ptr<int64_t>() + r.numel());
}

// Hugging Face's beam_search() with BeamSearchScorer for an encoder-decoder model: inputs
// expanded to B * num_beams rows, the caches reordered after each step.
at::Tensor beam_search_seq2seq(PretrainedModelImpl& model, const at::Tensor& ids,
                               const at::Tensor& mask, int64_t start, std::optional<int64_t> pad,
                               const GenerateOptions& o) {
  const int64_t b = ids.size(0), nb = o.num_beams;
  const auto dev = ids.device();
  auto ids_x = ids.repeat_interleave(nb, 0);
  auto mask_x = mask.repeat_interleave(nb, 0);
  auto long_cpu = torch::TensorOptions().dtype(torch::kLong);
  auto beam_scores = torch::zeros({b, nb}, torch::TensorOptions().dtype(torch::kFloat).device(dev));
  beam_scores.narrow(1, 1, nb - 1).fill_(-1e9);
  beam_scores = beam_scores.view({-1});
  std::vector<BeamHypotheses> hyps(b);
  for (auto& h : hyps) {
    h.num_beams = nb;
    h.length_penalty = o.length_penalty;
    h.early_stopping = o.early_stopping;
  }
  std::vector<bool> done(b, false);
  const int64_t max_length = 1 + o.max_new_tokens;
  const int64_t n_eos = static_cast<int64_t>(o.eos_ids.size());
  auto is_eos = [&](int64_t t) {
    return std::find(o.eos_ids.begin(), o.eos_ids.end(), t) != o.eos_ids.end();
  };

  KvCache cache;
  at::Tensor encoder_out;
  at::Tensor seqs = torch::full({b * nb, 1}, start, ids.options());
  for (int64_t step = 0; step < o.max_new_tokens; ++step) {
    ModelInputs in;
    in.input_ids = ids_x;
    in.attention_mask = mask_x;
    in.encoder_last_hidden_state = encoder_out;
    in.decoder_input_ids = o.use_cache ? seqs.narrow(1, seqs.size(1) - 1, 1) : seqs;
    in.cache = o.use_cache ? &cache : nullptr;
    auto r = model.forward(in);
    if (step == 0) reserve_positions(&cache, max_length);
    if (!encoder_out.defined()) encoder_out = r.encoder_last_hidden_state;
    auto logits = r.logits.select(1, -1).to(torch::kFloat);
    const int64_t v = logits.size(-1);
    auto scores = (torch::log_softmax(logits, -1) + beam_scores.unsqueeze(1)).view({b, nb * v});
    const int64_t candidates = std::max<int64_t>(2, 1 + n_eos) * nb;
    EMOE_CHECK(candidates <= nb * v, UsageError,
               "--num-beams {}: beam search keeps {} candidates per row, more than the {} a "
               "vocabulary of {} allows",
               nb, candidates, nb * v, v);
    auto [top_scores, top_ids] = scores.topk(candidates, 1, true, true);
    top_scores = top_scores.to(torch::kCPU);
    top_ids = top_ids.to(torch::kCPU);
    auto seqs_cpu = seqs.to(torch::kCPU);
    const int64_t cur_len = seqs.size(1);

    auto next_scores = torch::zeros({b, nb}, torch::kFloat);
    auto next_tokens = torch::zeros({b, nb}, long_cpu);
    auto next_rows = torch::zeros({b, nb}, long_cpu);
    auto ts = top_scores.accessor<float, 2>();
    auto ti = top_ids.accessor<int64_t, 2>();
    for (int64_t row = 0; row < b; ++row) {
      if (done[row]) {  // finished rows feed pad tokens (from row 0, as Hugging Face)
        next_tokens[row].fill_(pad.value_or(0));
        continue;
      }
      int64_t beam = 0;
      for (int64_t rank = 0; rank < top_ids.size(1); ++rank) {
        const int64_t token = ti[row][rank] % v, source = row * nb + ti[row][rank] / v;
        if (is_eos(token)) {
          if (rank >= nb) continue;  // only eos among the best num_beams candidates ends a beam
          hyps[row].add(beam_row_tokens(seqs_cpu, source), static_cast<double>(ts[row][rank]));
        } else {
          next_scores[row][beam] = ts[row][rank];
          next_tokens[row][beam] = token;
          next_rows[row][beam] = source;
          ++beam;
        }
        if (beam == nb) break;
      }
      // the best candidate score (topk is sorted), whether it ends the beam or not
      done[row] = hyps[row].is_done(static_cast<double>(ts[row][0]), cur_len);
    }
    auto rows = next_rows.view({-1}).to(dev);
    beam_scores = next_scores.view({-1}).to(dev);
    seqs = torch::cat({seqs.index_select(0, rows), next_tokens.view({-1, 1}).to(dev)}, 1);
    for (auto* layers : {&cache.layers, &cache.cross})
      for (auto& kv : *layers) kv.select_rows(rows);
    if (std::all_of(done.begin(), done.end(), [](bool d) { return d; })) break;
  }

  // open beams of unfinished rows join their row's hypotheses; the best one per row is returned
  auto seqs_cpu = seqs.to(torch::kCPU);
  auto final_scores = beam_scores.to(torch::kCPU);
  std::vector<std::vector<int64_t>> best(b);
  for (int64_t row = 0; row < b; ++row) {
    if (!done[row])
      for (int64_t i = 0; i < nb; ++i)
        hyps[row].add(beam_row_tokens(seqs_cpu, row * nb + i),
                      final_scores[row * nb + i].item<double>());
    best[row] = hyps[row].best();
  }
  size_t longest = 0, shortest = std::numeric_limits<size_t>::max();
  for (const auto& h : best) {
    longest = std::max(longest, h.size());
    shortest = std::min(shortest, h.size());
  }
  const int64_t width = std::min<int64_t>(static_cast<int64_t>(longest) + 1, max_length);
  EMOE_CHECK(shortest == longest || pad.has_value(), InputError,
             "beam search: rows of different lengths need a pad id");
  auto out = torch::full({b, width}, pad.value_or(0), long_cpu);
  for (int64_t row = 0; row < b; ++row) {
    const int64_t n = static_cast<int64_t>(best[row].size());
    for (int64_t i = 0; i < n; ++i) out[row][i] = best[row][i];
    if (n < width && !o.eos_ids.empty()) out[row][n] = o.eos_ids[0];  // the eos that ended it
  }
  return out.to(dev);
}

}  // namespace

void GenerateOptions::validate() const {
  EMOE_CHECK(max_new_tokens >= 0, UsageError, "--max-new-tokens: expected >= 0, got {}",
             max_new_tokens);
  EMOE_CHECK(top_p > 0.0 && top_p <= 1.0, UsageError, "--top-p: expected (0, 1], got {}", top_p);
  EMOE_CHECK(temperature >= 0.0, UsageError, "--temperature: expected >= 0, got {}", temperature);
  EMOE_CHECK(top_k >= 0, UsageError, "--top-k: expected >= 0, got {}", top_k);
  EMOE_CHECK(num_beams >= 1, UsageError, "--num-beams: expected >= 1, got {}", num_beams);
  EMOE_CHECK(
      num_beams == 1 || temperature == 0.0, UsageError,
      "--num-beams {}: beam search is greedy; sampling (--temperature {}) needs --num-beams 1",
      num_beams, temperature);
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
  EMOE_CHECK(o.num_beams == 1, UsageError,
             "--num-beams {}: beam search is implemented for encoder-decoder models (T5) only",
             o.num_beams);
  const int64_t limit = s.max_positions - input_ids.size(1);
  EMOE_CHECK(limit >= 0, InputError, "prompt of {} tokens exceeds the model's {} positions",
             input_ids.size(1), s.max_positions);
  const int64_t steps = std::min(o.max_new_tokens, limit);
  if (steps < o.max_new_tokens)
    spdlog::warn("generation capped at {} new tokens by the model's {} positions", steps,
                 s.max_positions);

  torch::NoGradGuard no_grad;
  auto dev = model.parameters()[0].device();
  auto ids = input_ids.to(dev).to(torch::kLong);
  const int64_t b = ids.size(0);
  auto mask =
      attention_mask.defined() ? attention_mask.to(dev).to(torch::kLong) : torch::ones_like(ids);
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
    in.last_logits_only = true;
    auto logits = model.forward(in).logits.select(1, -1);
    if (step == 0) reserve_positions(&cache, ids.size(1) + steps);
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

at::Tensor generate_seq2seq(PretrainedModelImpl& model, const at::Tensor& input_ids,
                            const at::Tensor& attention_mask, const GenerateOptions& o,
                            const std::function<void(int64_t, const at::Tensor&)>& on_step) {
  const auto& s = model.summary();
  EMOE_CHECK(s.encoder_decoder() && s.head == Head::kSeq2SeqLM, UsageError,
             "generate_seq2seq needs an encoder-decoder model with a language-model head; this "
             "is a {} {} model",
             s.model_type, head_name(s.head));
  EMOE_CHECK(input_ids.dim() == 2 && input_ids.size(1) > 0, InputError,
             "generate: expected a non-empty [batch, seq] input");
  const auto start = o.decoder_start_id ? o.decoder_start_id : s.decoder_start_token_id;
  EMOE_CHECK(start.has_value(), InputError, "generate: the model has no decoder_start_token_id");
  o.validate();

  torch::NoGradGuard no_grad;
  auto dev = model.parameters()[0].device();
  auto ids = input_ids.to(dev).to(torch::kLong);
  const int64_t b = ids.size(0);
  auto mask =
      attention_mask.defined() ? attention_mask.to(dev).to(torch::kLong) : torch::ones_like(ids);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(o.seed);
  std::optional<int64_t> pad = o.pad_id;
  if (!pad && !o.eos_ids.empty()) pad = o.eos_ids[0];
  if (o.num_beams > 1) return beam_search_seq2seq(model, ids, mask, *start, pad, o);
  auto unfinished = torch::ones({b}, ids.options());

  KvCache cache;
  at::Tensor encoder_out;  // computed by the first step, then passed back in
  at::Tensor out = torch::full({b, 1}, *start, ids.options());
  for (int64_t step = 0; step < o.max_new_tokens; ++step) {
    ModelInputs in;
    in.input_ids = ids;
    in.attention_mask = mask;
    in.encoder_last_hidden_state = encoder_out;
    in.decoder_input_ids = o.use_cache ? out.narrow(1, out.size(1) - 1, 1) : out;
    in.cache = o.use_cache ? &cache : nullptr;
    auto r = model.forward(in);
    if (step == 0) reserve_positions(&cache, 1 + o.max_new_tokens);
    if (!encoder_out.defined()) encoder_out = r.encoder_last_hidden_state;
    auto next = pick_next(r.logits.select(1, -1), o, gen);
    if (pad) next = next * unfinished + (*pad) * (1 - unfinished);
    out = torch::cat({out, next.unsqueeze(1)}, 1);
    if (on_step) on_step(step, next);
    if (!o.eos_ids.empty()) {
      for (auto e : o.eos_ids) unfinished = unfinished * (next != e).to(torch::kLong);
      if (unfinished.max().item<int64_t>() == 0) break;
    }
  }
  return out;
}

}  // namespace emoe
