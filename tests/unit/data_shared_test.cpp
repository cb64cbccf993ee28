// The readers on the real files of ../shared/data: row counts, label sets, OOD label spaces,
// Alpaca, MMLU, and tokenisation with the bert-mini and stories260K tokenizers.
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>
#include <vector>

#include "emoe/core/error.h"
#include "emoe/data/batching.h"
#include "emoe/data/dataset.h"
#include "emoe/tokenizer/tokenizer.h"
#include "support/test_support.h"

namespace {

// Examples per label id.
std::map<int64_t, int64_t> shared_label_counts(const emoe::Dataset& d) {
  std::map<int64_t, int64_t> counts;
  for (const auto& e : d.examples) counts[static_cast<int64_t>(e.label)] += 1;
  return counts;
}

struct SharedGlueCase {
  std::string task, split;
  size_t rows;
  std::map<int64_t, int64_t> labels;  // empty: unlabelled or regression
};

TEST(DataShared, GlueSplitsHaveTheOfficialCountsAndLabels) {
  EMOE_REQUIRE_SHARED(root, "data");
  // Counts from `wc -l` minus the header; label counts from `cut | sort | uniq -c`.
  const std::vector<SharedGlueCase> cases = {
      {"cola", "train", 8551, {{0, 2528}, {1, 6023}}},
      // GLUE's dev = in_domain_dev (527) + out_of_domain_dev (516)
      {"cola", "dev", 1043, {{0, 324}, {1, 719}}},
      {"cola", "dev_in_domain", 527, {{0, 162}, {1, 365}}},
      {"cola", "test", 1063, {}},
      {"sst2", "train", 67349, {{0, 29780}, {1, 37569}}},
      {"sst2", "dev", 872, {{0, 428}, {1, 444}}},
      {"sst2", "test", 1821, {}},
      {"mrpc", "train", 3668, {{0, 1194}, {1, 2474}}},
      {"mrpc", "dev", 408, {{0, 129}, {1, 279}}},
      {"mrpc", "test", 1725, {}},
      {"stsb", "train", 5749, {}},
      {"stsb", "dev", 1500, {}},
      {"stsb", "test", 1379, {}},
      {"rte", "train", 2490, {{0, 1249}, {1, 1241}}},  // entailment 0, not_entailment 1
      {"rte", "dev", 277, {{0, 146}, {1, 131}}},
      {"rte", "test", 3000, {}},
      {"qnli", "dev", 5463, {{0, 2702}, {1, 2761}}},
      {"qnli", "test", 5463, {}},
      // MNLI here only as subsets: entailment 0, neutral 1, contradiction 2.
      {"mnli", "dev_hard", 4573, {{0, 1701}, {1, 1486}, {2, 1386}}},
      {"mnli-mm", "dev_hard", 4530, {{0, 1710}, {1, 1400}, {2, 1420}}},
      {"mnli", "dev_textfooler", 1000, {{0, 373}, {1, 311}, {2, 316}}},
      {"mnli-mm", "dev_textfooler", 1000, {{0, 346}, {1, 319}, {2, 335}}},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.task + "/" + c.split);
    auto d = emoe::load_glue(c.task, c.split, root);
    EXPECT_EQ(d.examples.size(), c.rows);
    EXPECT_EQ(d.task.name, c.task);
    const bool labelled = c.split != "test";
    for (const auto& e : d.examples) {
      ASSERT_EQ(e.has_label, labelled);
      ASSERT_FALSE(e.texts.empty());
      ASSERT_FALSE(e.texts[0].empty());
    }
    if (!c.labels.empty()) EXPECT_EQ(shared_label_counts(d), c.labels);
  }
}

TEST(DataShared, GlueTextsKeepTheirQuotesAndScores) {
  EMOE_REQUIRE_SHARED(root, "data");
  // MRPC dev row 1: the second sentence starts with a bare, unmatched double quote.
  auto mrpc = emoe::load_glue("mrpc", "dev", root);
  ASSERT_EQ(mrpc.examples[0].texts.size(), 2u);
  EXPECT_EQ(mrpc.examples[0].texts[0],
            "He said the foodservice pie business doesn't fit the company's long-term growth "
            "strategy.");
  EXPECT_EQ(mrpc.examples[0].texts[1],
            "\"The foodservice pie business does not fit our long-term growth strategy.");
  EXPECT_EQ(mrpc.examples[0].label, 1);
  auto stsb = emoe::load_glue("stsb", "dev", root);
  EXPECT_DOUBLE_EQ(stsb.examples[0].label, 5.0);
  EXPECT_DOUBLE_EQ(stsb.examples[1].label, 4.75);
  double sum = 0;
  for (const auto& e : stsb.examples) {
    ASSERT_GE(e.label, 0.0);
    ASSERT_LE(e.label, 5.0);
    sum += e.label;
  }
  EXPECT_NEAR(sum, 3545.8613333333324, 1e-6);
  // TextFooler's MNLI mismatched sample also ships with numeric ids: they must agree.
  auto words = emoe::load_glue("mnli-mm", "dev_textfooler", root);
  emoe::TableSpec spec;
  spec.path = root + "/glue/MNLI/textfooler_1k/mnli_numeric_labels.tsv";
  spec.header = false;
  spec.quoted = false;
  spec.text_cols = {"1", "2"};
  spec.label_col = "0";
  auto ids = emoe::load_table(spec, emoe::glue_task("mnli"));
  ASSERT_EQ(ids.examples.size(), words.examples.size());
  for (size_t i = 0; i < ids.examples.size(); ++i) {
    ASSERT_EQ(ids.examples[i].label, words.examples[i].label) << "row " << i;
    ASSERT_EQ(ids.examples[i].texts[0], words.examples[i].texts[0]) << "row " << i;
  }
}

TEST(DataShared, MissingGlueTaskNamesTheFile) {
  EMOE_REQUIRE_SHARED(root, "data");
  try {
    emoe::load_glue("qqp", "train", root);
    ADD_FAILURE() << "QQP is not in ../shared/data";
  } catch (const emoe::InputError& e) {
    EXPECT_EQ(std::string(e.what()),
              root + "/glue/QQP/train.tsv: not found (GLUE task qqp, split train)");
  }
  EXPECT_THROW(emoe::load_glue("mnli", "dev", root), emoe::InputError);
  EXPECT_THROW(emoe::load_glue("qnli", "train", root), emoe::InputError);
}

struct SharedOodCase {
  std::string task, set;
  size_t rows;
};

TEST(DataShared, OodSetsLoadInsideTheTaskLabelSpace) {
  EMOE_REQUIRE_SHARED(root, "data");
  // Rows: GLUE-X sheets less the rows without a usable label (empty, or the sentiment sheets'
  // -1/-2 "could not tell" codes); the other files whole.
  const std::vector<SharedOodCase> cases = {
      {"sst2", "imdb", 474},
      {"sst2", "yelp", 448},
      {"sst2", "amazon", 408},
      {"sst2", "flipkart", 500},
      {"sst2", "textfooler-imdb", 1000},
      {"sst2", "textfooler-yelp", 1000},
      {"sst2", "textfooler-mr", 1000},
      {"sst2", "advglue", 148},
      {"cola", "grammar", 500},
      {"cola", "out_of_domain_dev", 516},
      {"mnli", "mnli-mismatched", 500},
      {"mnli", "snli", 500},
      {"mnli", "sick", 500},
      {"mnli", "scitail", 500},
      {"mnli", "hans", 500},
      {"mnli", "snli-hard", 3261},
      {"mnli", "textfooler-snli", 1000},
      {"mnli", "advglue", 121},
      {"mnli-mm", "advglue", 162},
      {"qnli", "advglue", 148},
      {"qnli", "newsqa", 500},
      {"rte", "advglue", 81},
      {"rte", "snli", 500},
      {"rte", "hans", 500},
      {"qqp", "twitter", 500},
      {"qqp", "advglue", 78},
      {"mrpc", "qqp", 500},
      {"mrpc", "twitter", 500},
      {"stsb", "sick", 500},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.task + "-ood/" + c.set);
    auto d = emoe::load_ood(c.task, c.set, root);
    EXPECT_EQ(d.examples.size(), c.rows);
    EXPECT_EQ(d.task.name, c.task);
    EXPECT_EQ(d.name, c.task + "-ood/" + c.set);
  }
  // Every set of every task: labels inside the task's space, texts as the task expects.
  for (const auto& task : emoe::glue_task_names()) {
    const auto spec = emoe::glue_task(task);
    const size_t texts = task == "sst2" || task == "cola" ? 1 : 2;
    for (const auto& set : emoe::ood_set_names(task)) {
      SCOPED_TRACE(task + "-ood/" + set);
      auto d = emoe::load_ood(task, set, root);
      ASSERT_FALSE(d.examples.empty());
      std::set<int64_t> seen;
      for (const auto& e : d.examples) {
        ASSERT_EQ(e.texts.size(), texts);
        ASSERT_TRUE(e.has_label);
        if (spec.regression) continue;
        ASSERT_EQ(e.label, static_cast<double>(static_cast<int64_t>(e.label)));
        ASSERT_GE(e.label, 0);
        ASSERT_LT(e.label, spec.num_labels());
        seen.insert(static_cast<int64_t>(e.label));
      }
      if (!spec.regression) EXPECT_GE(seen.size(), 2u);  // not a constant column
    }
  }
}

TEST(DataShared, OodNliLabelMappings) {
  EMOE_REQUIRE_SHARED(root, "data");
  // GLUE-X SNLI codes (label_col_B): entailment 0: 138, neutral 1: 164, contradiction 2: 198.
  EXPECT_EQ(shared_label_counts(emoe::load_ood("mnli", "snli", root)),
            (std::map<int64_t, int64_t>{{0, 138}, {1, 164}, {2, 198}}));
  // RTE/QNLI: neutral and contradiction become not_entailment (1).
  EXPECT_EQ(shared_label_counts(emoe::load_ood("rte", "snli", root)),
            (std::map<int64_t, int64_t>{{0, 138}, {1, 362}}));
  EXPECT_EQ(shared_label_counts(emoe::load_ood("qnli", "snli-hard", root)),
            (std::map<int64_t, int64_t>{{0, 1058}, {1, 2203}}));
  // HANS (entailment 0: 306, not_entailment 1: 194): same ids for RTE; for MNLI the labels stay
  // 0/1 and neutral/contradiction predictions both score as not-entailment.
  auto rte_hans = emoe::load_ood("rte", "hans", root);
  EXPECT_EQ(shared_label_counts(rte_hans), (std::map<int64_t, int64_t>{{0, 306}, {1, 194}}));
  EXPECT_TRUE(rte_hans.prediction_labels.empty());
  auto mnli_hans = emoe::load_ood("mnli", "hans", root);
  EXPECT_EQ(shared_label_counts(mnli_hans), (std::map<int64_t, int64_t>{{0, 306}, {1, 194}}));
  EXPECT_EQ(mnli_hans.prediction_labels, (std::vector<int64_t>{0, 1, 1}));
  EXPECT_TRUE(emoe::load_ood("mnli", "sick", root).prediction_labels.empty());
  // SciTail (label（Z）): entails 0: 158, neutral 1: 342.
  EXPECT_EQ(shared_label_counts(emoe::load_ood("rte", "scitail", root)),
            (std::map<int64_t, int64_t>{{0, 158}, {1, 342}}));
  // Sentiment: GLUE-X IMDB keeps 224 negative and 250 positive rows.
  EXPECT_EQ(shared_label_counts(emoe::load_ood("sst2", "imdb", root)),
            (std::map<int64_t, int64_t>{{0, 224}, {1, 250}}));
}

TEST(DataShared, OodTextsAreUnquoted) {
  EMOE_REQUIRE_SHARED(root, "data");
  // GLUE-X: CSV-style quoting with "" escapes.
  auto snli = emoe::load_ood("mnli", "snli", root);
  EXPECT_EQ(snli.examples[3].texts[0],
            "A woman with a \"taxi\" sign on her head and a yellow vinyl shirt walks in a parade.");
  // TextFooler Yelp: a line that is one CSV-quoted field loses the quotes.
  auto yelp = emoe::load_ood("sst2", "textfooler-yelp", root);
  EXPECT_EQ(yelp.examples[0].texts[0].substr(0, 34), "this is a great little place to gr");
  EXPECT_EQ(yelp.examples[1].texts[0].substr(0, 20), "i love hot n juicy .");
  EXPECT_EQ(yelp.examples[1].label, 0);
}

TEST(DataShared, AlpacaAndMmlu) {
  EMOE_REQUIRE_SHARED(root, "data");
  auto alpaca = emoe::load_alpaca(root + "/instruct/alpaca/alpaca_5000.json");
  ASSERT_EQ(alpaca.size(), 5000u);
  size_t with_input = 0;
  for (const auto& e : alpaca) with_input += !e.input.empty();
  EXPECT_EQ(with_input, 1943u);
  EXPECT_EQ(alpaca[0].output, "No");
  const std::string prompt = emoe::alpaca_prompt(alpaca[0]);
  EXPECT_NE(prompt.find("### Input:\nSentence 1: I am going to the store.\nSentence 2: I goes to "
                        "the store.\n\n### Response:\n"),
            std::string::npos);

  auto val = emoe::load_mmlu_split(root + "/instruct/mmlu/data/val");
  ASSERT_EQ(val.size(), 1531u);
  std::set<std::string> subjects;
  std::map<int64_t, int64_t> answers;
  for (const auto& q : val) {
    subjects.insert(q.subject);
    ASSERT_EQ(q.choices.size(), 4u);
    answers[q.answer] += 1;
  }
  EXPECT_EQ(subjects.size(), 57u);
  EXPECT_EQ(answers, (std::map<int64_t, int64_t>{{0, 381}, {1, 379}, {2, 387}, {3, 384}}));
  EXPECT_EQ(val.front().subject, "abstract_algebra");
  auto dev = emoe::load_mmlu_split(root + "/instruct/mmlu/data/dev");
  EXPECT_EQ(dev.size(), 285u);
  auto p = emoe::mmlu_prompt(val.front(), {dev[0], dev[1]});
  EXPECT_EQ(p.rfind("The following are multiple choice questions (with answers) about abstract "
                    "algebra.\n\n",
                    0),
            0u);
  EXPECT_EQ(p.substr(p.size() - 8), "\nAnswer:");
}

TEST(DataShared, EncodeWithBertMiniGivesClsSepSequences) {
  EMOE_REQUIRE_SHARED(root, "data");
  EMOE_REQUIRE_SHARED(bert, "models/bert-mini");
  auto tok = emoe::load_tokenizer(bert);
  const int64_t cls = *tok->special().cls, sep = *tok->special().sep;
  for (const auto& [task, max_length] :
       std::vector<std::pair<std::string, int64_t>>{{"sst2", 32}, {"rte", 64}}) {
    auto d = emoe::load_glue(task, "dev", root);
    auto enc = emoe::encode_dataset(d, *tok, max_length);
    ASSERT_EQ(enc.size(), d.examples.size());
    bool truncated = false;
    for (size_t i = 0; i < enc.size(); ++i) {
      const auto& e = enc[i];
      ASSERT_LE(static_cast<int64_t>(e.ids.size()), max_length);
      ASSERT_EQ(e.ids.front(), cls);
      ASSERT_EQ(e.ids.back(), sep);
      ASSERT_EQ(e.type_ids.size(), e.ids.size());
      ASSERT_EQ(e.label, d.examples[i].label);
      truncated = truncated || static_cast<int64_t>(e.ids.size()) == max_length;
      // Pairs: two [SEP]s, type ids 1 from the second segment on.
      if (task == "rte") ASSERT_EQ(e.type_ids.back(), 1);
    }
    EXPECT_TRUE(truncated) << task << ": some example should reach max_length";
    std::vector<const emoe::EncodedExample*> batch = {&enc[0], &enc[1], &enc[2]};
    auto b = emoe::collate(batch, *tok->special().pad, false, false);
    EXPECT_EQ(b.input_ids.size(0), 3);
    EXPECT_EQ(b.attention_mask.sum().item<int64_t>(),
              static_cast<int64_t>(enc[0].ids.size() + enc[1].ids.size() + enc[2].ids.size()));
  }
}

TEST(DataShared, InstructionsWithTheLlamaTokenizerEndInEos) {
  EMOE_REQUIRE_SHARED(root, "data");
  EMOE_REQUIRE_SHARED(stories, "models/stories260K/hf");
  auto tok = emoe::load_tokenizer(stories);
  ASSERT_TRUE(tok->special().bos && tok->special().eos);
  auto alpaca = emoe::load_alpaca(root + "/instruct/alpaca/alpaca_5000.json");
  alpaca.resize(20);
  auto enc = emoe::encode_instructions(alpaca, *tok, 0);
  for (size_t i = 0; i < enc.size(); ++i) {
    const auto& e = enc[i];
    const auto prompt = tok->encode(emoe::alpaca_prompt(alpaca[i]), true).ids;
    const auto response = tok->encode_plain(alpaca[i].output);
    ASSERT_EQ(e.ids.size(), prompt.size() + response.size() + 1);
    ASSERT_EQ(e.ids.front(), *tok->special().bos);
    ASSERT_EQ(e.ids.back(), *tok->special().eos);
    ASSERT_EQ(e.lm_labels.size(), e.ids.size());
    for (size_t j = 0; j < e.ids.size(); ++j)
      ASSERT_EQ(e.lm_labels[j], j < prompt.size() ? -100 : e.ids[j]) << "example " << i;
  }
  auto cut = emoe::encode_instructions(alpaca, *tok, 64);
  for (const auto& e : cut) ASSERT_LE(e.ids.size(), 64u);
}

}  // namespace
