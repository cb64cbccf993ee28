// One list syntax on every multi-valued flag (issue 29): `--ood imdb,yelp` and `--ood imdb yelp`
// give the same run; and what a user reads while training (the plan line, the first rate).
#include <filesystem>
#include <regex>

#include "emoe/io/safetensors.h"
#include "support/test_support.h"

namespace fs = std::filesystem;
using emoe::test::run_emoe;

namespace {

// convert's printout without its time column (the only part that differs between two runs).
std::string without_times(const std::string& printed) {
  return std::regex_replace(printed, std::regex(R"(\| [0-9.]+ \|\n)"), "| - |\n");
}

}  // namespace

TEST(ListFlags, EvalOodTakesCommasAndRepeatedValuesAlike) {
  EMOE_REQUIRE_SHARED(bert, "models/bert-mini");
  EMOE_REQUIRE_SHARED(data, "data/ood");
  emoe::test::TempDir tmp;
  const std::string data_dir = emoe::test::shared_path("data");
  // a classifier to evaluate: one training step
  auto t = run_emoe("train --set model=" + bert + " --set task=sst2 --set data_dir=" + data_dir +
                    " --set method=full --set train.max_steps=1 --set train.max_train_examples=16"
                    " --set train.max_eval_examples=8 -q -o " +
                    tmp.file("run"));
  ASSERT_EQ(t.exit_code, 0) << t.err;
  const std::string base = "eval " + tmp.file("run/model") + " --task sst2 --data-dir " + data_dir +
                           " --max-examples 16 -q --ood ";
  auto commas = run_emoe(base + "imdb,yelp");
  ASSERT_EQ(commas.exit_code, 0) << commas.err;
  EXPECT_NE(commas.out.find("| imdb |"), std::string::npos) << commas.out;
  EXPECT_NE(commas.out.find("| yelp |"), std::string::npos) << commas.out;
  for (const char* other : {"imdb yelp", "imdb --ood yelp"}) {
    auto r = run_emoe(base + other);
    ASSERT_EQ(r.exit_code, 0) << other << ": " << r.err;
    EXPECT_EQ(r.out, commas.out) << other;
  }
}

TEST(ListFlags, ConvertLayersTakesCommasAndRepeatedValuesAlike) {
  EMOE_REQUIRE_SHARED(stories, "models/stories260K/hf");
  emoe::test::TempDir tmp;
  const std::string base = "convert " + stories + " -N 4 -k 2 --restarts 1 -q ";
  auto commas = run_emoe(base + "-o " + tmp.file("a") + " --layers 1,3");
  ASSERT_EQ(commas.exit_code, 0) << commas.err;
  auto spaces = run_emoe(base + "-o " + tmp.file("b") + " --layers 1 3");
  ASSERT_EQ(spaces.exit_code, 0) << spaces.err;
  EXPECT_NE(commas.out.find("on layers 1,3"), std::string::npos) << commas.out;
  auto same_folder = [&](std::string s) {
    return std::regex_replace(without_times(s), std::regex(tmp.path() + "/[ab]"), "OUT");
  };
  EXPECT_EQ(same_folder(spaces.out), same_folder(commas.out));
  EXPECT_EQ(emoe::load_safetensors(tmp.file("a/model.safetensors")).size(),
            emoe::load_safetensors(tmp.file("b/model.safetensors")).size());
}

// The README's forward example needs an input file: tokenize -o writes it.
TEST(ListFlags, TokenizeWritesTheBatchForwardReads) {
  EMOE_REQUIRE_SHARED(stories, "models/stories260K/hf");
  emoe::test::TempDir tmp;
  auto t = run_emoe("tokenize " + stories + " -o " + tmp.file("in.safetensors"),
                    "Once upon a time\nThe cat\n");
  ASSERT_EQ(t.exit_code, 0) << t.err;
  auto in = emoe::load_safetensors(tmp.file("in.safetensors"));
  ASSERT_EQ(in["input_ids"].size(0), 2);
  EXPECT_EQ(in["attention_mask"].sum().item<int64_t>(),
            in["attention_mask"][0].sum().item<int64_t>() +
                in["attention_mask"][1].sum().item<int64_t>());
  EXPECT_LT(in["attention_mask"][1].sum().item<int64_t>(), in["input_ids"].size(1));  // padded
  auto f = run_emoe("forward " + stories + " -i " + tmp.file("in.safetensors") + " -o " +
                    tmp.file("out.safetensors"));
  ASSERT_EQ(f.exit_code, 0) << f.err;
  EXPECT_EQ(emoe::load_safetensors(tmp.file("out.safetensors"))["logits"].size(1),
            in["input_ids"].size(1));
  EXPECT_EQ(run_emoe("tokenize " + stories + " --decode -o " + tmp.file("x"), "[1]\n").exit_code,
            2);
}

// With train.max_steps the plan line says the steps that run (it said "1 epochs x 125 steps"),
// and no progress line shows a rate measured over microseconds ("13513513.51 it/s").
TEST(ListFlags, TrainingPlanLineAndRatesAreWhatRuns) {
  EMOE_REQUIRE_SHARED(stories, "models/stories260K/hf");
  EMOE_REQUIRE_SHARED(data, "data/glue/SST-2");
  emoe::test::TempDir tmp;
  auto r = run_emoe("train --set model=" + stories +
                    " --set task=sst2 --set data_dir=" + emoe::test::shared_path("data") +
                    " --set method=full --set train.max_steps=3 --set train.log_every=1"
                    " --set train.max_train_examples=256 --set train.max_eval_examples=16"
                    " --set train.batch_size=8 --set train.max_length=32 --set save_best=false"
                    " -o " +
                    tmp.file("run"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("3 steps (train.max_steps; an epoch is 32 steps)"), std::string::npos)
      << r.err;
  EXPECT_EQ(r.err.find("epochs x"), std::string::npos) << r.err;
  const std::regex rate(R"(train (\d+)/3 .* (\S+) it/s)");
  int lines = 0;
  for (auto it = std::sregex_iterator(r.err.begin(), r.err.end(), rate);
       it != std::sregex_iterator(); ++it, ++lines) {
    if ((*it)[1] == "1")
      EXPECT_EQ((*it)[2], "-") << "the first update has no interval to measure";
    else
      EXPECT_LT(std::stod((*it)[2]), 1e4) << it->str();
  }
  EXPECT_EQ(lines, 3) << r.err;
}
