// Text-to-text pieces: rank classification against direct forwards, the median over templates,
// mixing rates, the mixture's epoch draws and the prompt templates.
#include "emoe/eval/rank_classification.h"

#include <torch/torch.h>

#include <cmath>
#include <map>

#include "emoe/core/error.h"
#include "emoe/data/mixture.h"
#include "emoe/data/templates.h"
#include "emoe/io/hf_config.h"
#include "emoe/models/loader.h"
#include "support/test_support.h"

namespace {

emoe::ModelPtr rank_tiny_t5() {
  nlohmann::json j = {{"model_type", "t5"},
                      {"vocab_size", 40},
                      {"d_model", 16},
                      {"d_kv", 8},
                      {"d_ff", 24},
                      {"num_layers", 2},
                      {"num_decoder_layers", 2},
                      {"num_heads", 2},
                      {"pad_token_id", 0},
                      {"eos_token_id", 1},
                      {"decoder_start_token_id", 0}};
  torch::manual_seed(3);
  auto m = emoe::create_model(emoe::JsonFields(j, "t5/config.json"), emoe::Head::kSeq2SeqLM);
  torch::NoGradGuard g;
  for (auto& p : m->parameters()) p.normal_(0, 0.5);  // far from uniform: choices differ clearly
  m->eval();
  return m;
}

// log p(choice | source) by one forward of the pair alone: the sum (or mean) of token log-probs
double rank_direct_score(emoe::PretrainedModelImpl& m, const std::vector<int64_t>& source,
                         const std::vector<int64_t>& choice, bool mean) {
  torch::NoGradGuard g;
  emoe::ModelInputs in;
  in.input_ids = torch::tensor(source, torch::kLong).unsqueeze(0);
  in.labels = torch::tensor(choice, torch::kLong).unsqueeze(0);
  auto logp = torch::log_softmax(m.forward(in).logits.to(torch::kDouble), -1)[0];
  double s = 0;
  for (size_t i = 0; i < choice.size(); ++i)
    s += logp[static_cast<int64_t>(i)][choice[i]].item<double>();
  return mean ? s / static_cast<double>(choice.size()) : s;
}

std::vector<emoe::RankExample> rank_examples() {
  // different source lengths (padding inside a batch) and choices of different lengths
  std::vector<emoe::RankExample> v(5);
  v[0].source = {5, 6, 7, 8, 1};
  v[0].choices = {{9, 1}, {10, 11, 12, 1}};
  v[1].source = {13, 1};
  v[1].choices = {{9, 1}, {10, 11, 12, 1}};
  v[2].source = {14, 15, 16, 17, 18, 19, 20, 1};
  v[2].choices = {{21, 1}, {22, 1}, {23, 24, 1}};
  v[3].source = {25, 26, 1};
  v[3].choices = {{9, 1}, {10, 11, 12, 1}};
  v[4].source = {27, 28, 29, 1};
  v[4].choices = {{21, 1}, {22, 1}, {23, 24, 1}};
  return v;
}

}  // namespace

TEST(RankClassification, ScoresEqualDirectForwardsOfEachPair) {
  auto m = rank_tiny_t5();
  auto data = rank_examples();
  std::vector<const emoe::RankExample*> ptrs;
  for (const auto& e : data) ptrs.push_back(&e);
  for (bool mean : {false, true}) {
    SCOPED_TRACE(mean ? "mean" : "sum");
    emoe::RankOptions o;
    o.batch_size = 2;  // batches of 2, 2, 1 examples
    o.length_normalize = mean;
    auto scores = emoe::rank_choice_scores(*m, ptrs, 0, o);
    ASSERT_EQ(scores.size(), data.size());
    for (size_t i = 0; i < data.size(); ++i) {
      ASSERT_EQ(scores[i].size(), data[i].choices.size());
      for (size_t c = 0; c < data[i].choices.size(); ++c)
        EXPECT_NEAR(scores[i][c], rank_direct_score(*m, data[i].source, data[i].choices[c], mean),
                    1e-5)
            << "example " << i << " choice " << c;
    }
  }
}

TEST(RankClassification, PredictsTheHighestScoreAndTakesTheMedianOverTemplates) {
  auto m = rank_tiny_t5();
  auto base = rank_examples();
  // the direct argmax of each example; templates 0 and 2 label it so (100 %), template 1 labels
  // it wrong (0 %), template 3 right for the first 3 of 5 (60 %): median of {100, 0, 100, 60} = 80
  std::vector<int64_t> best;
  for (const auto& e : base) {
    std::vector<double> s;
    for (const auto& c : e.choices) s.push_back(rank_direct_score(*m, e.source, c, false));
    best.push_back(std::max_element(s.begin(), s.end()) - s.begin());
    ASSERT_GT(std::abs(s[0] - s[1]), 1e-3) << "a near tie makes the test fragile";
  }
  std::vector<emoe::RankExample> data;
  for (int64_t t = 0; t < 4; ++t)
    for (size_t i = 0; i < base.size(); ++i) {
      auto e = base[i];
      e.templ = t;
      const bool right = t == 0 || t == 2 || (t == 3 && i < 3);
      e.label = right ? best[i] : (best[i] + 1) % static_cast<int64_t>(e.choices.size());
      data.push_back(e);
    }
  emoe::RankOptions o;
  o.batch_size = 3;
  auto r = emoe::evaluate_rank_classification(*m, data, 4, 0, o);
  ASSERT_EQ(r.template_accuracy.size(), 4u);
  EXPECT_DOUBLE_EQ(r.template_accuracy[0], 100.0);
  EXPECT_DOUBLE_EQ(r.template_accuracy[1], 0.0);
  EXPECT_DOUBLE_EQ(r.template_accuracy[2], 100.0);
  EXPECT_DOUBLE_EQ(r.template_accuracy[3], 60.0);
  EXPECT_DOUBLE_EQ(r.median_accuracy, 80.0);
  EXPECT_EQ(r.examples, 20);
  // two shards, counts summed over "ranks": the same numbers
  std::vector<std::vector<double>> parts;
  emoe::EvalShard s0, s1;
  s0.size = s1.size = 2;
  s1.rank = 1;
  auto gather = [&parts](const std::vector<double>& v) {
    parts.push_back(v);
    return parts;
  };
  emoe::evaluate_rank_classification(*m, data, 4, 0, o, [&] {
    auto s = s0;
    s.all_gather = [&parts](const std::vector<double>& v) {
      parts = {v};
      return parts;
    };
    return s;
  }());
  s1.all_gather = gather;
  auto r1 = emoe::evaluate_rank_classification(*m, data, 4, 0, o, s1);
  EXPECT_EQ(r1.template_accuracy, r.template_accuracy);
  EXPECT_DOUBLE_EQ(r1.median_accuracy, 80.0);
}

TEST(RankClassification, MedianOfOddEvenAndEmpty) {
  EXPECT_DOUBLE_EQ(emoe::median_of({3, 1, 2}), 2.0);
  EXPECT_DOUBLE_EQ(emoe::median_of({4, 1, 3, 2}), 2.5);
  EXPECT_DOUBLE_EQ(emoe::median_of({}), 0.0);
}

TEST(RankClassification, RefusesADecoderOnlyModel) {
  auto m = emoe::test::tiny_bert_classifier();
  auto data = rank_examples();
  EXPECT_THROW(emoe::rank_choice_scores(*m, {&data[0]}, 0, {}), emoe::UsageError);
}

TEST(Mixture, ExamplesProportionalAndTemperatureRatesByHand) {
  // sizes 100, 400, 10000 with cap 900 -> 100, 400, 900
  auto p = emoe::mixing_rates({100, 400, 10000}, "examples-proportional", 900, 2.0);
  ASSERT_EQ(p.size(), 3u);
  EXPECT_DOUBLE_EQ(p[0], 100.0 / 1400.0);
  EXPECT_DOUBLE_EQ(p[1], 400.0 / 1400.0);
  EXPECT_DOUBLE_EQ(p[2], 900.0 / 1400.0);
  // temperature 2: sqrt -> 10, 20, 30
  auto t = emoe::mixing_rates({100, 400, 10000}, "temperature", 900, 2.0);
  EXPECT_NEAR(t[0], 1.0 / 6.0, 1e-12);
  EXPECT_NEAR(t[1], 1.0 / 3.0, 1e-12);
  EXPECT_NEAR(t[2], 1.0 / 2.0, 1e-12);
  // no cap; temperature 1 is examples-proportional
  auto u = emoe::mixing_rates({100, 300}, "temperature", 0, 1.0);
  EXPECT_NEAR(u[0], 0.25, 1e-12);
  EXPECT_EQ(emoe::mixture_epoch_size({100, 400, 10000}, 900), 1400);
  EXPECT_EQ(emoe::mixture_epoch_size({100, 300}, 0), 400);
  EXPECT_THROW(emoe::mixing_rates({1}, "uniform", 0, 1.0), emoe::InputError);
  EXPECT_THROW(emoe::mixing_rates({1}, "temperature", 0, 0.0), emoe::InputError);
}

TEST(Mixture, EpochDrawsFollowTheRatesAndDependOnlyOnSeedAndEpoch) {
  const std::vector<int64_t> sizes = {10, 40, 1000}, templates = {3, 1, 2};
  auto rates = emoe::mixing_rates(sizes, "temperature", 100, 2.0);
  const int64_t n = emoe::mixture_epoch_size(sizes, 100);  // 150
  auto a = emoe::mixture_epoch(sizes, rates, templates, n, 7, 0);
  ASSERT_EQ(static_cast<int64_t>(a.size()), n);
  std::map<int64_t, int64_t> count;
  for (const auto& d : a) {
    count[d.task] += 1;
    ASSERT_GE(d.example, 0);
    ASSERT_LT(d.example, sizes[d.task]);
    ASSERT_GE(d.templ, 0);
    ASSERT_LT(d.templ, templates[d.task]);
  }
  for (int64_t t = 0; t < 3; ++t)
    EXPECT_LE(std::abs(static_cast<double>(count[t]) - rates[t] * static_cast<double>(n)), 1.0)
        << t;
  // task 0 (10 examples) drawn more than 10 times: every example before any repeats
  std::map<int64_t, int64_t> seen;
  for (const auto& d : a)
    if (d.task == 0) seen[d.example] += 1;
  EXPECT_EQ(seen.size(), 10u);
  auto b = emoe::mixture_epoch(sizes, rates, templates, n, 7, 0);
  auto c = emoe::mixture_epoch(sizes, rates, templates, n, 7, 1);
  auto same = [](const std::vector<emoe::MixtureDraw>& x, const std::vector<emoe::MixtureDraw>& y) {
    if (x.size() != y.size()) return false;
    for (size_t i = 0; i < x.size(); ++i)
      if (x[i].task != y[i].task || x[i].example != y[i].example || x[i].templ != y[i].templ)
        return false;
    return true;
  };
  EXPECT_TRUE(same(a, b));
  EXPECT_FALSE(same(a, c));
}

TEST(Templates, EveryTaskHasTwoOrMoreTemplatesWithOneChoicePerLabel) {
  for (const auto& task : emoe::template_task_names()) {
    SCOPED_TRACE(task);
    const auto& tpls = emoe::task_templates(task);
    EXPECT_GE(tpls.size(), 2u);
    for (const auto& t : tpls)
      EXPECT_EQ(t.choices.size(), emoe::glue_task(task).labels.size()) << t.name;
  }
  emoe::Example e;
  e.texts = {"It rains.", "The street is wet."};
  EXPECT_EQ(emoe::fill_template(emoe::task_templates("rte")[0], e),
            "It rains. Does this mean that \"The street is wet.\" is true?");
  e.texts = {"A fine film."};
  EXPECT_EQ(emoe::fill_template(emoe::task_templates("sst2")[0], e),
            "Review: A fine film. Is this review positive or negative?");
  EXPECT_THROW(emoe::fill_template(emoe::task_templates("rte")[0], e), emoe::InputError);
  EXPECT_THROW(emoe::task_templates("stsb"), emoe::InputError);
}
