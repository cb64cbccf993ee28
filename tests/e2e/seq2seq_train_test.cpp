// Text-to-text fine-tuning of a tiny T5 on a GLUE mixture with a held-out task scored by rank
// classification: `emoe pretrain` makes the model, `emoe train` with objective seq2seq runs the
// PEFT methods, resumes exactly, and refuses objectives that do not fit the architecture.
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "support/test_support.h"

using emoe::test::run_emoe;

namespace {

// A T5 (d_model 64, 2 + 2 blocks) with one step of span corruption, on the 512-piece
// SentencePiece model saved as a T5Tokenizer.
std::string s2s_make_tiny_t5(const emoe::test::TempDir& tmp, const std::string& tok_dir) {
  {
    std::ofstream corpus(tmp.file("corpus.txt"));
    corpus << "a small corpus line for the tiny model\nanother line of text\n";
  }
  const std::string out = tmp.file("t5");
  auto r = run_emoe(
      "pretrain --set arch=t5 --set hidden=64 --set layers=2 --set heads=4 --set intermediate=128 "
      "--set tokenizer=" +
      tok_dir + " --set corpus=" + tmp.file("corpus.txt") +
      " --set steps=1 --set batch_size=2 --set max_length=16 --set log_every=1 --set threads=1 "
      "--set output=" +
      out);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return out;
}

std::string s2s_args(const std::string& model, const std::string& method, const std::string& out) {
  return "train --set model=" + model + " --set objective=seq2seq --set method=" + method +
         " --set data_dir=" + emoe::test::shared_path("data") +
         " --set 'mixture={tasks: [sst2, mrpc], rate: temperature, cap: 12}' --set 'heldout=[rte]'"
         " --set train.batch_size=8 --set train.epochs=1 --set train.max_train_examples=12"
         " --set train.max_eval_examples=6 --set train.max_length=48 --set train.lr=3e-3"
         " --set train.log_every=1 --set peft.experts=2 --set threads=1 --set save_best=false "
         "--set output=" +
         out;
}

nlohmann::json s2s_results(const std::string& run) {
  std::ifstream in(run + "/results.json");
  return nlohmann::json::parse(in);
}

}  // namespace

TEST(Seq2SeqTrain, PeftMethodsOnATinyT5MixtureReportHeldOutMedianAccuracy) {
  EMOE_REQUIRE_SHARED(tok, "fixtures/tokenizers/llama-tok512");
  EMOE_REQUIRE_SHARED(glue, "data/glue/RTE");
  emoe::test::TempDir tmp;
  const auto model = s2s_make_tiny_t5(tmp, tok);
  {
    std::ifstream in(model + "/config.json");
    auto cfg = nlohmann::json::parse(in);
    EXPECT_EQ(cfg["model_type"], "t5");
    EXPECT_EQ(cfg["vocab_size"], 613);  // T5Tokenizer: 512 pieces, 100 sentinels, <pad>
    EXPECT_TRUE(std::filesystem::exists(model + "/spiece.model"));
    EXPECT_EQ(cfg["decoder_start_token_id"], cfg["pad_token_id"]);
  }
  int64_t base = 0;
  for (std::string method : {"ia3", "lora", "mov", "molora"}) {
    SCOPED_TRACE(method);
    const auto out = tmp.file("run_" + method);
    auto r = run_emoe(s2s_args(model, method, out));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    auto res = s2s_results(out);
    EXPECT_EQ(res["objective"], "seq2seq");
    EXPECT_EQ(res["main_metric"], "heldout_mean_median_accuracy");
    ASSERT_TRUE(res.contains("heldout_mean_median_accuracy")) << res.dump();
    const double acc = res["heldout_mean_median_accuracy"].get<double>();
    EXPECT_GE(acc, 0.0);
    EXPECT_LE(acc, 100.0);
    const auto& rte = res["best"]["rte"];
    EXPECT_TRUE(rte["heldout"].get<bool>());
    EXPECT_DOUBLE_EQ(rte["metrics"]["median_accuracy"].get<double>(), acc);
    EXPECT_EQ(rte["metrics"].size(), 4u);  // median + 3 templates
    EXPECT_EQ(rte["examples"], 18);        // 6 examples x 3 templates
    EXPECT_FALSE(res["best"]["sst2"]["heldout"].get<bool>());
    EXPECT_TRUE(std::isfinite(res["dev_loss"].get<double>()));
    // temperature 2 on 12 + 12 examples: equal rates; 24 draws = 3 steps of 8
    EXPECT_DOUBLE_EQ(res["mixture"]["tasks"]["sst2"]["rate"].get<double>(), 0.5);
    EXPECT_EQ(res["steps"], 3);
    // the T5 stays frozen: the adapters add exactly the trainable parameters
    const auto trainable = res["parameters"]["trainable"].get<int64_t>();
    const auto frozen = res["parameters"]["total"].get<int64_t>() - trainable;
    EXPECT_GT(trainable, 0);
    if (base == 0) base = frozen;
    EXPECT_EQ(frozen, base);
    // the analytic cost counts the decoder's target tokens too; only adapters train
    ASSERT_TRUE(res.contains("cost")) << res.dump();
    EXPECT_GT(res["cost"]["target_len"].get<int64_t>(), 0);
    const double fwd = res["cost"]["forward_gmacs_per_token"].get<double>();
    const double train = res["cost"]["train_gmacs_per_token"].get<double>();
    EXPECT_GT(fwd, 0.0);
    EXPECT_GE(train, 2 * fwd);
    EXPECT_LT(train, 2.5 * fwd);
  }
}

TEST(Seq2SeqTrain, ResumedMixtureRunEqualsTheUninterruptedOne) {
  EMOE_REQUIRE_SHARED(tok, "fixtures/tokenizers/llama-tok512");
  EMOE_REQUIRE_SHARED(glue, "data/glue/RTE");
  emoe::test::TempDir tmp;
  const auto model = s2s_make_tiny_t5(tmp, tok);
  const auto a = tmp.file("a"), b = tmp.file("b");
  ASSERT_EQ(run_emoe(s2s_args(model, "ia3", a)).exit_code, 0);
  auto r = run_emoe(s2s_args(model, "ia3", b) + " --set train.stop_after_steps=2");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = run_emoe(s2s_args(model, "ia3", b) + " --resume");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto ra = s2s_results(a), rb = s2s_results(b);
  for (const char* set : {"dev", "sst2", "mrpc", "rte"}) {
    SCOPED_TRACE(set);
    EXPECT_EQ(ra["best"][set]["metrics"], rb["best"][set]["metrics"]);
  }
  EXPECT_EQ(ra["best"]["dev"]["loss"].get<double>(), rb["best"]["dev"]["loss"].get<double>());
  EXPECT_EQ(ra["steps"], rb["steps"]);
}

TEST(Seq2SeqTrain, ObjectiveMustFitTheArchitecture) {
  EMOE_REQUIRE_SHARED(tok, "fixtures/tokenizers/llama-tok512");
  EMOE_REQUIRE_SHARED(bert, "fixtures/tiny/bert_seqcls");
  emoe::test::TempDir tmp;
  const auto model = s2s_make_tiny_t5(tmp, tok);
  // classification on T5: an input error naming the key
  auto r = run_emoe("train --set model=" + model + " --set task=sst2 --set data_dir=" +
                    emoe::test::shared_path("data") + " --set output=" + tmp.file("c"));
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("objective: classification is not available for the encoder-decoder"),
            std::string::npos)
      << r.err;
  // seq2seq on BERT
  r = run_emoe(s2s_args(bert, "ia3", tmp.file("d")));
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("objective: seq2seq needs an encoder-decoder model"), std::string::npos)
      << r.err;
  // a task without templates, and a held-out task that is also trained
  r = run_emoe(s2s_args(model, "ia3", tmp.file("e")) + " --set 'mixture.tasks=[stsb]'");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("mixture.tasks: no text-to-text templates for task 'stsb'"),
            std::string::npos)
      << r.err;
  r = run_emoe(s2s_args(model, "ia3", tmp.file("f")) + " --set 'heldout=[sst2]'");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("heldout: task 'sst2' is also a training task"), std::string::npos) << r.err;
}
