// Evaluation loops.
#include "emoe/eval/evaluate.h"

#include <torch/torch.h>

#include <chrono>
#include <cmath>

#include "emoe/core/error.h"
#include "emoe/eval/metrics.h"

namespace emoe {

namespace {

struct EvalModeGuard {
  explicit EvalModeGuard(torch::nn::Module& m) : m_(m), was_(m.is_training()) { m_.eval(); }
  ~EvalModeGuard() { m_.train(was_); }
  torch::nn::Module& m_;
  bool was_;
};

// This shard's examples: rank, rank + size, ...
std::vector<const EncodedExample*> shard_of(const std::vector<EncodedExample>& data,
                                            const EvalShard& shard) {
  std::vector<const EncodedExample*> out;
  for (size_t i = static_cast<size_t>(shard.rank); i < data.size();
       i += static_cast<size_t>(shard.size))
    out.push_back(&data[i]);
  return out;
}

c10::Device model_device(PretrainedModelImpl& model) {
  auto ps = model.parameters();
  return ps.empty() ? c10::Device(c10::kCPU) : ps.front().device();
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

EvalOutput evaluate_classifier(PretrainedModelImpl& model, const std::vector<EncodedExample>& data,
                               const TaskSpec& task, int64_t batch_size, int64_t pad_id,
                               const std::vector<int64_t>& prediction_labels,
                               const EvalShard& shard) {
  auto t0 = std::chrono::steady_clock::now();
  EvalModeGuard guard(model);
  torch::NoGradGuard no_grad;
  const auto dev = model_device(model);
  const auto mine = shard_of(data, shard);
  std::vector<double> pred, gold;
  double loss_sum = 0;
  for (size_t b = 0; b < mine.size(); b += static_cast<size_t>(batch_size)) {
    std::vector<const EncodedExample*> ex(
        mine.begin() + static_cast<std::ptrdiff_t>(b),
        mine.begin() + static_cast<std::ptrdiff_t>(
                           std::min(mine.size(), b + static_cast<size_t>(batch_size))));
    auto batch = collate(ex, pad_id, task.regression, false);
    ModelInputs in;
    in.input_ids = batch.input_ids.to(dev);
    in.attention_mask = batch.attention_mask.to(dev);
    if (batch.token_type_ids.defined()) in.token_type_ids = batch.token_type_ids.to(dev);
    in.labels = batch.labels.to(dev);
    auto out = model.forward(in);
    loss_sum += out.loss.item<double>() * static_cast<double>(ex.size());
    auto logits = out.logits.to(torch::kCPU).to(torch::kFloat);
    if (task.regression) {
      auto v = logits.view({-1});
      for (int64_t i = 0; i < v.size(0); ++i) pred.push_back(v[i].item<double>());
    } else {
      auto a = logits.argmax(-1);
      for (int64_t i = 0; i < a.size(0); ++i) {
        int64_t c = a[i].item<int64_t>();
        if (!prediction_labels.empty()) c = prediction_labels.at(c);
        pred.push_back(static_cast<double>(c));
      }
    }
    for (auto* e : ex) gold.push_back(e->label);
  }
  if (shard.size > 1) {
    // back into the set's order: rank r's j-th example is example r + j * size
    auto all_pred = shard.all_gather(pred), all_gold = shard.all_gather(gold);
    auto losses = shard.all_gather({loss_sum});
    pred.assign(data.size(), 0.0), gold.assign(data.size(), 0.0), loss_sum = 0;
    for (size_t r = 0; r < all_pred.size(); ++r) {
      for (size_t j = 0; j < all_pred[r].size(); ++j) {
        pred[r + j * static_cast<size_t>(shard.size)] = all_pred[r][j];
        gold[r + j * static_cast<size_t>(shard.size)] = all_gold[r][j];
      }
      loss_sum += losses[r].at(0);
    }
  }
  EvalOutput o;
  o.examples = static_cast<int64_t>(data.size());
  o.loss = data.empty() ? 0 : loss_sum / static_cast<double>(data.size());
  if (!data.empty()) o.metrics = compute_metrics(task.metrics, pred, gold, task.regression);
  o.seconds = seconds_since(t0);
  return o;
}

namespace {

// The mean per-token loss of a language model over `data`: `seq2seq` collates text-to-text
// examples (every label token counts), otherwise causal LM examples (the labels after the first
// position count, as the loss is shifted).
EvalOutput token_loss(PretrainedModelImpl& model, const std::vector<EncodedExample>& data,
                      int64_t batch_size, int64_t pad_id, const EvalShard& shard, bool seq2seq) {
  auto t0 = std::chrono::steady_clock::now();
  EvalModeGuard guard(model);
  torch::NoGradGuard no_grad;
  const auto dev = model_device(model);
  const auto mine = shard_of(data, shard);
  double nll = 0, tokens = 0;
  for (size_t b = 0; b < mine.size(); b += static_cast<size_t>(batch_size)) {
    std::vector<const EncodedExample*> ex(
        mine.begin() + static_cast<std::ptrdiff_t>(b),
        mine.begin() + static_cast<std::ptrdiff_t>(
                           std::min(mine.size(), b + static_cast<size_t>(batch_size))));
    auto batch = seq2seq ? collate_seq2seq(ex, pad_id) : collate(ex, pad_id, false, true);
    ModelInputs in;
    in.input_ids = batch.input_ids.to(dev);
    in.attention_mask = batch.attention_mask.to(dev);
    in.labels = batch.labels.to(dev);
    auto out = model.forward(in);
    const auto counted =
        seq2seq ? batch.labels : batch.labels.narrow(1, 1, batch.labels.size(1) - 1);
    double n = (counted != -100).sum().item<double>();
    if (n > 0) nll += out.loss.item<double>() * n;
    tokens += n;
  }
  if (shard.size > 1) {
    auto parts = shard.all_gather({nll, tokens});
    nll = 0, tokens = 0;
    for (const auto& p : parts) nll += p.at(0), tokens += p.at(1);
  }
  EvalOutput o;
  o.examples = static_cast<int64_t>(data.size());
  o.loss = tokens > 0 ? nll / tokens : 0;
  o.seconds = seconds_since(t0);
  return o;
}

}  // namespace

EvalOutput evaluate_lm_loss(PretrainedModelImpl& model, const std::vector<EncodedExample>& data,
                            int64_t batch_size, int64_t pad_id, const EvalShard& shard) {
  EvalOutput o = token_loss(model, data, batch_size, pad_id, shard, false);
  o.metrics["perplexity"] = std::exp(o.loss);
  return o;
}

EvalOutput evaluate_seq2seq_loss(PretrainedModelImpl& model,
                                 const std::vector<EncodedExample>& data, int64_t batch_size,
                                 int64_t pad_id, const EvalShard& shard) {
  return token_loss(model, data, batch_size, pad_id, shard, true);
}

int64_t pick_choice(const at::Tensor& next_logits, const std::vector<int64_t>& letter_tokens) {
  auto lp = next_logits.to(torch::kCPU).to(torch::kFloat).log_softmax(-1);
  int64_t best = 0;
  double best_v = -std::numeric_limits<double>::infinity();
  for (size_t i = 0; i < letter_tokens.size(); ++i) {
    double v = lp[letter_tokens[i]].item<double>();
    if (v > best_v) best_v = v, best = static_cast<int64_t>(i);
  }
  return best;
}

std::vector<int64_t> answer_letter_tokens(const Tokenizer& tok) {
  std::vector<int64_t> out;
  for (const char* letter : {" A", " B", " C", " D"}) {
    auto ids = tok.encode_plain(letter);
    EMOE_CHECK(!ids.empty(), InputError, "the tokenizer has no token for '{}'", letter);
    out.push_back(ids.back());
  }
  for (size_t i = 0; i < out.size(); ++i)
    for (size_t j = i + 1; j < out.size(); ++j)
      EMOE_CHECK(out[i] != out[j], InputError,
                 "the tokenizer maps two answer letters to the same token ({}); cannot score MMLU",
                 out[i]);
  return out;
}

MultipleChoiceResult evaluate_multiple_choice(
    const std::function<at::Tensor(const std::vector<int64_t>&)>& next_logits, const Tokenizer& tok,
    const std::vector<MultipleChoiceExample>& questions,
    const std::vector<MultipleChoiceExample>& dev, int64_t shots, int64_t max_length) {
  auto letters = answer_letter_tokens(tok);
  std::map<std::string, std::pair<int64_t, int64_t>> per;  // subject -> (correct, total)
  int64_t correct = 0;
  for (const auto& q : questions) {
    std::vector<MultipleChoiceExample> k;
    for (const auto& d : dev)
      if (static_cast<int64_t>(k.size()) < shots && d.subject == q.subject) k.push_back(d);
    auto ids = tok.encode(mmlu_prompt(q, k), true).ids;
    if (max_length > 0 && static_cast<int64_t>(ids.size()) > max_length)
      ids.erase(ids.begin(), ids.end() - max_length);
    int64_t choice = pick_choice(next_logits(ids), letters);
    bool ok = choice == q.answer;
    correct += ok;
    per[q.subject].first += ok;
    per[q.subject].second += 1;
  }
  MultipleChoiceResult r;
  r.questions = static_cast<int64_t>(questions.size());
  r.accuracy = questions.empty()
                   ? 0
                   : 100.0 * static_cast<double>(correct) / static_cast<double>(r.questions);
  for (const auto& [s, c] : per)
    r.per_subject[s] = 100.0 * static_cast<double>(c.first) / static_cast<double>(c.second);
  return r;
}

MultipleChoiceResult evaluate_mmlu(PretrainedModelImpl& model, const Tokenizer& tok,
                                   const std::vector<MultipleChoiceExample>& questions,
                                   const std::vector<MultipleChoiceExample>& dev, int64_t shots,
                                   int64_t max_length) {
  EvalModeGuard guard(model);
  torch::NoGradGuard no_grad;
  return evaluate_multiple_choice(
      [&](const std::vector<int64_t>& ids) {
        ModelInputs in;
        in.input_ids = torch::tensor(ids, torch::kLong).unsqueeze(0);
        return model.forward(in).logits[0][-1];
      },
      tok, questions, dev, shots, max_length);
}

}  // namespace emoe
