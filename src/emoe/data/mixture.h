// Multi-task mixtures (Raffel et al. 2020, §3.5.2): mixing rates per task, a deterministic,
// shuffled list of (task, example, template) draws per epoch, the same for every run with a seed,
// and the text-to-text training pool a mixture draws from.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "emoe/data/batching.h"
#include "emoe/data/dataset.h"
#include "emoe/data/templates.h"
#include "emoe/tokenizer/tokenizer.h"

namespace emoe {

// objective seq2seq: the multi-task training mixture (Raffel et al. 2020, §3.5.2).
struct MixtureConfig {
  std::vector<std::string> tasks;              // GLUE tasks with templates (data/templates.h)
  std::string rate = "examples-proportional";  // examples-proportional | temperature
  int64_t cap = 3000;                          // per-task example limit K (0 = none)
  double temperature = 2.0;                    // temperature scaling: rate ∝ min(n, cap)^(1/T)
  // all: a random template per draw; first: only the first
  std::string templates = "all";
};

// "examples-proportional": rate_t ∝ min(n_t, cap); "temperature": rate_t ∝ min(n_t, cap)^(1/T).
// cap <= 0 means no cap. InputError for an unknown scheme or a non-positive temperature.
std::vector<double> mixing_rates(const std::vector<int64_t>& sizes, const std::string& scheme,
                                 int64_t cap, double temperature);

struct MixtureDraw {
  int64_t task = 0, example = 0, templ = 0;
};

// The examples of one epoch: epoch_size draws, task t's share rounded from rate_t * epoch_size
// (largest remainders), its examples taken in a seeded permutation (repeated when the share
// exceeds the task's size), each with a template drawn uniformly from templates[t]; the whole
// list shuffled. Depends only on the arguments.
std::vector<MixtureDraw> mixture_epoch(const std::vector<int64_t>& sizes,
                                       const std::vector<double>& rates,
                                       const std::vector<int64_t>& templates, int64_t epoch_size,
                                       uint64_t seed, int64_t epoch);

// Σ min(n_t, cap) (Σ n_t without a cap): the examples of one mixture epoch.
int64_t mixture_epoch_size(const std::vector<int64_t>& sizes, int64_t cap);

// Text-to-text examples of a templated task: the filled template as the source (truncated to
// max_length), an answer's text as the target (cut to max_target_length - 1 tokens, then eos).
class TextToTextEncoder {
 public:
  // InputError naming `model` when the tokenizer has no eos token.
  TextToTextEncoder(const Tokenizer& tok, int64_t max_length, int64_t max_target_length,
                    const std::string& model);
  std::vector<int64_t> source(const PromptTemplate& t, const Example& e) const;
  std::vector<int64_t> target(const std::string& text) const;
  // The source and, as the target, the answer of the example's label under template t.
  EncodedExample labelled(const PromptTemplate& t, const Example& e) const;

 private:
  const Tokenizer& tok_;
  int64_t max_length_, max_target_length_, eos_;
};

// A split of a GLUE task without its unlabelled examples, cut to the fixed subset of
// max_examples (0: all).
Dataset load_labelled_glue(const std::string& task, const std::string& split,
                           const std::string& data_root, int64_t max_examples);

// The training pool of a mixture: every training example with each of its templates, task after
// task, and the rates that draw an epoch from it.
struct MixturePool {
  std::vector<EncodedExample> examples;
  std::vector<int64_t> sizes, templates, offsets;  // per task: examples, templates, first index
  std::vector<double> rates;
  int64_t epoch_size = 0;  // draws per epoch
  // The pool indices of an epoch (mixture_epoch's draws).
  std::vector<int64_t> epoch_order(uint64_t seed, int64_t epoch) const;
};

// Reads the training split of every task of the mixture (max_train_examples of each, 0: all),
// encodes it and logs the mixing rates. InputError when the mixture has no training example.
MixturePool build_mixture(const MixtureConfig& cfg, const TextToTextEncoder& encoder,
                          const std::string& data_root, int64_t max_train_examples);

}  // namespace emoe
