// Rank classification of answer choices with an encoder-decoder model.
#include "emoe/eval/rank_classification.h"

#include <torch/torch.h>

#include <algorithm>
#include <chrono>

#include "emoe/core/error.h"

namespace emoe {

namespace {

struct RankEvalModeGuard {
  explicit RankEvalModeGuard(torch::nn::Module& m) : m_(m), was_(m.is_training()) { m_.eval(); }
  ~RankEvalModeGuard() { m_.train(was_); }
  torch::nn::Module& m_;
  bool was_;
};

}  // namespace

double median_of(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

std::vector<std::vector<double>> rank_choice_scores(PretrainedModelImpl& model,
                                                    const std::vector<const RankExample*>& examples,
                                                    int64_t pad_id, const RankOptions& options) {
  EMOE_CHECK(model.summary().encoder_decoder(), UsageError,
             "rank classification needs an encoder-decoder model; this is a {} model",
             model.summary().model_type);
  EMOE_CHECK(options.batch_size >= 1, UsageError, "rank classification: batch size {}",
             options.batch_size);
  RankEvalModeGuard guard(model);
  torch::NoGradGuard no_grad;
  auto ps = model.parameters();
  const auto dev = ps.empty() ? c10::Device(c10::kCPU) : ps.front().device();
  const int64_t start = model.summary().decoder_start_token_id.value_or(pad_id);
  std::vector<std::vector<double>> out;
  out.reserve(examples.size());
  const auto bs = static_cast<size_t>(options.batch_size);
  for (size_t b = 0; b < examples.size(); b += bs) {
    const size_t e = std::min(examples.size(), b + bs);
    const auto n = static_cast<int64_t>(e - b);
    // the sources, right-padded: one encoder pass (the decoder sees only its start token here)
    int64_t s = 1;
    for (size_t i = b; i < e; ++i)
      s = std::max<int64_t>(s, static_cast<int64_t>(examples[i]->source.size()));
    auto ids = torch::full({n, s}, pad_id, torch::kLong);
    auto mask = torch::zeros({n, s}, torch::kLong);
    // the choices: one decoder row each, labels right-padded with -100
    std::vector<int64_t> row_example;
    int64_t l = 1;
    for (size_t i = b; i < e; ++i) {
      const auto& ex = *examples[i];
      EMOE_CHECK(!ex.choices.empty(), UsageError,
                 "rank classification: an example without choices");
      const auto len = static_cast<int64_t>(ex.source.size());
      if (len > 0) {
        ids[static_cast<int64_t>(i - b)].narrow(0, 0, len).copy_(
            torch::tensor(ex.source, torch::kLong));
        mask[static_cast<int64_t>(i - b)].narrow(0, 0, len).fill_(1);
      }
      for (const auto& c : ex.choices) {
        EMOE_CHECK(!c.empty(), UsageError, "rank classification: an empty answer choice");
        l = std::max<int64_t>(l, static_cast<int64_t>(c.size()));
        row_example.push_back(static_cast<int64_t>(i - b));
      }
    }
    const auto rows = static_cast<int64_t>(row_example.size());
    auto labels = torch::full({rows, l}, -100, torch::kLong);
    int64_t r = 0;
    for (size_t i = b; i < e; ++i)
      for (const auto& c : examples[i]->choices)
        labels[r++]
            .narrow(0, 0, static_cast<int64_t>(c.size()))
            .copy_(torch::tensor(c, torch::kLong));

    ModelInputs enc_in;
    enc_in.input_ids = ids.to(dev);
    enc_in.attention_mask = mask.to(dev);
    enc_in.decoder_input_ids =
        torch::full({n, 1}, start, torch::TensorOptions(torch::kLong).device(dev));
    auto enc = model.forward(enc_in).encoder_last_hidden_state;

    auto pick = torch::tensor(row_example, torch::kLong).to(dev);
    ModelInputs in;
    in.encoder_last_hidden_state = enc.index_select(0, pick);
    in.attention_mask = enc_in.attention_mask.index_select(0, pick);
    in.labels = labels.to(dev);
    auto logits = model.forward(in).logits.to(torch::kFloat);
    auto logp = torch::log_softmax(logits, -1);
    auto lab = in.labels;
    auto valid = lab != -100;
    auto tok =
        logp.gather(-1, lab.clamp_min(0).unsqueeze(-1)).squeeze(-1) * valid.to(torch::kFloat);
    auto score = tok.sum(1);
    if (options.length_normalize) score = score / valid.sum(1).clamp_min(1).to(torch::kFloat);
    auto sc = score.to(torch::kCPU).to(torch::kDouble).contiguous();
    const double* p = sc.data_ptr<double>();
    r = 0;
    for (size_t i = b; i < e; ++i) {
      std::vector<double> v;
      for (size_t c = 0; c < examples[i]->choices.size(); ++c) v.push_back(p[r++]);
      out.push_back(std::move(v));
    }
  }
  return out;
}

RankResult evaluate_rank_classification(PretrainedModelImpl& model,
                                        const std::vector<RankExample>& data, int64_t num_templates,
                                        int64_t pad_id, const RankOptions& options,
                                        const EvalShard& shard) {
  auto t0 = std::chrono::steady_clock::now();
  EMOE_CHECK(num_templates >= 1, UsageError, "rank classification: {} templates", num_templates);
  std::vector<const RankExample*> mine;
  for (size_t i = static_cast<size_t>(shard.rank); i < data.size();
       i += static_cast<size_t>(shard.size))
    mine.push_back(&data[i]);
  auto scores = rank_choice_scores(model, mine, pad_id, options);
  // per template: correct, total
  std::vector<double> counts(static_cast<size_t>(2 * num_templates), 0.0);
  for (size_t i = 0; i < mine.size(); ++i) {
    const auto t = mine[i]->templ;
    EMOE_CHECK(t >= 0 && t < num_templates, UsageError, "rank classification: template {} of {}", t,
               num_templates);
    const auto& s = scores[i];
    const auto pred = std::max_element(s.begin(), s.end()) - s.begin();  // first of equals
    counts[static_cast<size_t>(2 * t)] += pred == mine[i]->label ? 1.0 : 0.0;
    counts[static_cast<size_t>(2 * t + 1)] += 1.0;
  }
  if (shard.size > 1) {
    auto all = shard.all_gather(counts);
    std::fill(counts.begin(), counts.end(), 0.0);
    for (const auto& v : all)
      for (size_t j = 0; j < counts.size() && j < v.size(); ++j) counts[j] += v[j];
  }
  RankResult res;
  for (int64_t t = 0; t < num_templates; ++t) {
    const double total = counts[static_cast<size_t>(2 * t + 1)];
    res.template_accuracy.push_back(total > 0 ? 100.0 * counts[static_cast<size_t>(2 * t)] / total
                                              : 0.0);
  }
  res.median_accuracy = median_of(res.template_accuracy);
  res.examples = static_cast<int64_t>(data.size());
  res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return res;
}

}  // namespace emoe
