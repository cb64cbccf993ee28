// Tokenising datasets, padding examples into batches, and the deterministic order of each epoch.
#include "emoe/data/batching.h"

#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <numeric>
#include <optional>
#include <random>

#include "emoe/core/error.h"

namespace emoe {

namespace {

// Loss is taken only on positions whose target is not this (PyTorch's ignore_index default).
constexpr int64_t kBatchIgnoreIndex = -100;

// SplitMix64's finaliser: spreads (seed, epoch) over all 64 bits before seeding the generator.
uint64_t batching_mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

// Uniform in [0, bound) by rejection, so the result does not depend on the standard library
// (std::uniform_int_distribution's algorithm is implementation-defined, mt19937_64 is not).
uint64_t batching_uniform(std::mt19937_64& rng, uint64_t bound) {
  const uint64_t limit =
      std::numeric_limits<uint64_t>::max() - std::numeric_limits<uint64_t>::max() % bound;
  uint64_t r = rng();
  while (r >= limit) r = rng();
  return r % bound;
}

}  // namespace

std::vector<EncodedExample> encode_dataset(const Dataset& data, const Tokenizer& tok,
                                           int64_t max_length) {
  std::vector<EncodedExample> out;
  out.reserve(data.examples.size());
  for (size_t i = 0; i < data.examples.size(); ++i) {
    const Example& ex = data.examples[i];
    EMOE_CHECK(ex.texts.size() == 1 || ex.texts.size() == 2, UsageError,
               "{}: example {}: {} texts, expected one sentence or a pair", data.name, i,
               ex.texts.size());
    Encoding enc = ex.texts.size() == 1
                       ? tok.encode(ex.texts[0], true, max_length)
                       : tok.encode_pair(ex.texts[0], ex.texts[1], true, max_length);
    EncodedExample e;
    e.ids = std::move(enc.ids);
    e.type_ids = enc.token_type_ids.size() == e.ids.size() ? std::move(enc.token_type_ids)
                                                           : std::vector<int64_t>(e.ids.size(), 0);
    e.label = ex.label;
    out.push_back(std::move(e));
  }
  return out;
}

std::vector<EncodedExample> encode_instructions(const std::vector<InstructionExample>& data,
                                                const Tokenizer& tok, int64_t max_length) {
  const std::optional<int64_t> eos = tok.special().eos;
  std::vector<EncodedExample> out;
  out.reserve(data.size());
  for (const auto& ex : data) {
    // The prompt as the model sees it at inference (BOS when the template adds one), then the
    // bare response tokens and EOS: the loss teaches the response and where it ends.
    std::vector<int64_t> prompt = tok.encode(alpaca_prompt(ex), true).ids;
    std::vector<int64_t> response = tok.encode_plain(ex.output);
    if (eos) response.push_back(*eos);
    EncodedExample e;
    e.ids = prompt;
    e.ids.insert(e.ids.end(), response.begin(), response.end());
    e.lm_labels.assign(prompt.size(), kBatchIgnoreIndex);
    e.lm_labels.insert(e.lm_labels.end(), response.begin(), response.end());
    if (max_length > 0 && static_cast<int64_t>(e.ids.size()) > max_length) {
      e.ids.resize(max_length);
      e.lm_labels.resize(max_length);
    }
    e.type_ids.assign(e.ids.size(), 0);
    out.push_back(std::move(e));
  }
  return out;
}

Batch collate(const std::vector<const EncodedExample*>& examples, int64_t pad_id, bool regression,
              bool lm) {
  EMOE_CHECK(!examples.empty(), UsageError, "collate: no examples");
  const int64_t b = static_cast<int64_t>(examples.size());
  int64_t t = 0;
  for (const auto* e : examples) t = std::max<int64_t>(t, static_cast<int64_t>(e->ids.size()));
  EMOE_CHECK(t > 0, UsageError, "collate: every example of the batch is empty");

  auto ids = torch::full({b, t}, pad_id, torch::kLong);
  auto mask = torch::zeros({b, t}, torch::kLong);
  auto types = torch::zeros({b, t}, torch::kLong);
  auto ids_a = ids.accessor<int64_t, 2>();
  auto mask_a = mask.accessor<int64_t, 2>();
  auto types_a = types.accessor<int64_t, 2>();
  at::Tensor labels;
  if (lm) {
    labels = torch::full({b, t}, kBatchIgnoreIndex, torch::kLong);
  } else if (regression) {
    labels = torch::zeros({b}, torch::kFloat);
  } else {
    labels = torch::zeros({b}, torch::kLong);
  }
  for (int64_t i = 0; i < b; ++i) {
    const EncodedExample& e = *examples[i];
    const int64_t n = static_cast<int64_t>(e.ids.size());
    EMOE_CHECK(e.type_ids.empty() || static_cast<int64_t>(e.type_ids.size()) == n, UsageError,
               "collate: example {}: {} token type ids for {} tokens", i, e.type_ids.size(), n);
    for (int64_t j = 0; j < n; ++j) {
      ids_a[i][j] = e.ids[j];
      mask_a[i][j] = 1;
      types_a[i][j] = e.type_ids.empty() ? 0 : e.type_ids[j];
    }
    if (lm) {
      EMOE_CHECK(static_cast<int64_t>(e.lm_labels.size()) == n, UsageError,
                 "collate: example {}: {} LM labels for {} tokens (encode it with "
                 "encode_instructions)",
                 i, e.lm_labels.size(), n);
      auto lab = labels.accessor<int64_t, 2>();
      for (int64_t j = 0; j < n; ++j) lab[i][j] = e.lm_labels[j];
    } else if (regression) {
      labels.accessor<float, 1>()[i] = static_cast<float>(e.label);
    } else {
      labels.accessor<int64_t, 1>()[i] = static_cast<int64_t>(std::llround(e.label));
    }
  }
  return {ids, mask, types, labels};
}

Batch collate_seq2seq(const std::vector<const EncodedExample*>& examples, int64_t pad_id) {
  Batch b = collate(examples, pad_id, false, false);
  int64_t l = 1;
  for (const auto* e : examples)
    l = std::max<int64_t>(l, static_cast<int64_t>(e->target_ids.size()));
  auto labels =
      torch::full({static_cast<int64_t>(examples.size()), l}, kBatchIgnoreIndex, torch::kLong);
  auto lab = labels.accessor<int64_t, 2>();
  for (size_t i = 0; i < examples.size(); ++i) {
    const auto& t = examples[i]->target_ids;
    EMOE_CHECK(!t.empty(), UsageError, "collate_seq2seq: example {} has no target ids", i);
    for (size_t j = 0; j < t.size(); ++j)
      lab[static_cast<int64_t>(i)][static_cast<int64_t>(j)] = t[j];
  }
  b.labels = labels;
  return b;
}

std::vector<int64_t> epoch_order(int64_t n, uint64_t seed, int64_t epoch, bool shuffle) {
  EMOE_CHECK(n >= 0, UsageError, "epoch_order: {} examples", n);
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  if (!shuffle) return order;
  std::mt19937_64 rng(batching_mix(seed ^ batching_mix(static_cast<uint64_t>(epoch))));
  // Fisher-Yates from the back: position i takes a uniformly chosen element of [0, i].
  for (int64_t i = n - 1; i > 0; --i) {
    auto j = static_cast<int64_t>(batching_uniform(rng, static_cast<uint64_t>(i) + 1));
    std::swap(order[i], order[j]);
  }
  return order;
}

std::vector<int64_t> fixed_subset(int64_t total, int64_t n) {
  auto order = epoch_order(total, 20240601ull, 0, true);
  order.resize(std::min(total, std::max<int64_t>(0, n)));
  return order;
}

}  // namespace emoe
