// End-to-end fine-tuning on real data (short configurations of the same code path the
// experiments use): every method trains and evaluates, resume is bitwise exact, the best model
// reloads, and instruction tuning with MMLU scoring runs.
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "emoe/core/error.h"
#include "emoe/io/safetensors.h"
#include "emoe/methods/model_folder.h"
#include "emoe/models/small_gemm.h"
#include "emoe/moe/kernel_choices.h"
#include "emoe/train/method_table.h"
#include "emoe/train/trainer.h"
#include "support/test_support.h"

namespace fs = std::filesystem;

namespace {

emoe::RunConfig tiny_run(const std::string& model, const std::string& method,
                         const std::string& out, std::vector<std::string> extra = {}) {
  std::vector<std::string> sets = {"model=" + model,
                                   "task=sst2",
                                   "data_dir=" + emoe::test::shared_path("data"),
                                   "method=" + method,
                                   "output=" + out,
                                   "train.batch_size=8",
                                   "train.epochs=2",
                                   "train.max_length=32",
                                   "train.max_train_examples=48",
                                   "train.max_eval_examples=40",
                                   "train.log_every=2",
                                   "train.lr=1e-3",
                                   "moe.experts=4",
                                   "moe.topk=2",
                                   "moe.kmeans={restarts: 1}",
                                   "peft.experts=3"};
  sets.insert(sets.end(), extra.begin(), extra.end());
  return emoe::load_run_config("", sets);
}

// A full fine-tuning run of bert-mini stopped after 2 steps (a checkpoint to resume); returns run.
std::string stopped_run(const std::string& bert, const std::string& run) {
  auto stopped = emoe::run_training(
      tiny_run(bert, "full", run, {"save_best=false", "train.stop_after_steps=2"}), false);
  EXPECT_TRUE(stopped.stopped_early);
  return run;
}

std::map<std::string, torch::Tensor> checkpoint_weights(const std::string& run) {
  std::ifstream in(run + "/checkpoints/latest");
  std::string name;
  std::getline(in, name);
  return emoe::load_safetensors(run + "/checkpoints/" + name + "/model.safetensors");
}

}  // namespace

// Every row of the method table (train/method_table.cpp) trains 2 steps on bert-mini, evaluates
// and writes its model; a PEFT method trains fewer parameters than the model has (which ones:
// tests/unit/method_table_test.cpp).
class TrainE2EMethod : public ::testing::TestWithParam<std::string> {};

TEST_P(TrainE2EMethod, TrainsEvaluatesAndWritesItsModel) {
  EMOE_REQUIRE_SHARED(bert, "models/bert-mini");
  EMOE_REQUIRE_SHARED(data, "data/glue/SST-2");
  emoe::test::TempDir tmp;
  const emoe::MethodInfo& info = emoe::method_info(GetParam());
  const std::string& method = info.name;
  auto out = tmp.file("run");
  auto r = emoe::run_training(tiny_run(bert, method, out, {"train.max_steps=2"}), false);
  ASSERT_FALSE(r.stopped_early);
  const auto& res = r.results;
  EXPECT_GE(res["best_epoch"].get<int64_t>(), 1);
  double acc = res["best"]["dev"]["metrics"]["accuracy"].get<double>();
  EXPECT_GE(acc, 0.0);
  EXPECT_LE(acc, 100.0);
  EXPECT_TRUE(fs::exists(out + "/results.json"));
  EXPECT_TRUE(fs::exists(out + "/metrics.jsonl"));
  EXPECT_TRUE(fs::exists(out + "/model/config.json"));
  if (info.peft == emoe::PeftMethod::kLora || info.peft == emoe::PeftMethod::kIa3)
    EXPECT_TRUE(fs::exists(out + "/adapter/adapter_model.safetensors"));
  // dense exports (LoRA merged, EMoE recomposed) need no moe.json / peft.json
  if ((info.peft == emoe::PeftMethod::kNone || info.peft == emoe::PeftMethod::kLora) &&
      (!info.uses_moe() || info.is_emoe())) {
    EXPECT_FALSE(fs::exists(out + "/model/moe.json"));
    EXPECT_FALSE(fs::exists(out + "/model/peft.json"));
  }
  if (info.uses_moe()) EXPECT_TRUE(fs::exists(out + "/model_moe/moe.json"));
  const int64_t trainable = res["parameters"]["trainable"].get<int64_t>();
  const int64_t total = res["parameters"]["total"].get<int64_t>();
  EXPECT_EQ(trainable < total, info.peft != emoe::PeftMethod::kNone);
}

INSTANTIATE_TEST_SUITE_P(Methods, TrainE2EMethod, ::testing::ValuesIn(emoe::method_names()),
                         [](const ::testing::TestParamInfo<std::string>& p) {
                           std::string s;
                           for (char c : p.param)
                             s += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
                           return s;
                         });

// Issue 24: an EMoE run reports its routed and its recomposed dense metrics apart, says which
// form model/ holds, and each equals what `emoe eval` measures on that folder; max_shard_size
// shards model/.
TEST(TrainE2E, EmoeRunReportsRoutedAndDenseMetricsApart) {
  EMOE_REQUIRE_SHARED(bert, "models/bert-mini");
  EMOE_REQUIRE_SHARED(data, "data/glue/SST-2");
  emoe::test::TempDir tmp;
  const auto out = tmp.file("emoe");
  // top-1 of 4 experts: the routed model computes a quarter of each converted FFN
  auto r = emoe::run_training(
      tiny_run(bert, "emoe", out, {"moe.topk=1", "train.epochs=1", "max_shard_size=4MB"}), false);
  const auto& res = r.results;
  EXPECT_EQ(res["model_computes"], "dense");
  EXPECT_EQ(res["model_moe_computes"], "routed");
  ASSERT_TRUE(res.contains("best_routed") && res.contains("best_dense")) << res.dump();
  EXPECT_EQ(res["best_routed"], res["best"]);
  const double routed_loss = res["best_routed"]["dev"]["loss"].get<double>();
  const double dense_loss = res["best_dense"]["dev"]["loss"].get<double>();
  EXPECT_NE(routed_loss, dense_loss);  // k < N: the two forms differ
  // model/ is sharded (bert-mini is about 11 MB in float32), model_moe/ too
  EXPECT_TRUE(fs::exists(out + "/model/model.safetensors.index.json"));
  EXPECT_FALSE(fs::exists(out + "/model/model.safetensors"));
  EXPECT_TRUE(fs::exists(out + "/model_moe/model.safetensors.index.json"));
  // `emoe eval` of each folder measures what results.json says it computes
  const std::string common =
      " --task sst2 --data-dir " + emoe::test::shared_path("data") + " --max-length 32 --json -q";
  // max_eval_examples=40 of the run: eval --max-examples 40 takes the same subset
  // model/ without --max-length: the run's config.json gives max_length 32
  const std::string data_flags =
      " --task sst2 --data-dir " + emoe::test::shared_path("data") + " --json -q";
  auto dense40 = emoe::test::run_emoe("eval " + out + "/model" + data_flags + " --max-examples 40");
  auto routed40 =
      emoe::test::run_emoe("eval " + out + "/model_moe" + common + " --max-examples 40");
  ASSERT_EQ(dense40.exit_code, 0) << dense40.err;
  ASSERT_EQ(routed40.exit_code, 0) << routed40.err;
  auto d40 = nlohmann::json::parse(dense40.out)["dev"];
  auto r40 = nlohmann::json::parse(routed40.out)["dev"];
  EXPECT_NEAR(d40["loss"].get<double>(), dense_loss, 1e-4);
  EXPECT_NEAR(r40["loss"].get<double>(), routed_loss, 1e-4);
  EXPECT_EQ(d40["metrics"]["accuracy"], res["best_dense"]["dev"]["metrics"]["accuracy"]);
  EXPECT_EQ(r40["metrics"]["accuracy"], res["best_routed"]["dev"]["metrics"]["accuracy"]);
  // GMoE cannot be recomposed: model/ holds the routed form, no dense metrics apart
  auto g = emoe::run_training(tiny_run(bert, "gmoe", tmp.file("gmoe"), {"train.epochs=1"}), false);
  EXPECT_EQ(g.results["model_computes"], "routed");
  EXPECT_FALSE(g.results.contains("best_dense"));
}

TEST(TrainE2E, ResumeFinishesWithBitwiseEqualWeights) {
  EMOE_REQUIRE_SHARED(bert, "models/bert-mini");
  EMOE_REQUIRE_SHARED(data, "data/glue/SST-2");
  emoe::test::TempDir tmp;
  for (std::string method : {"full", "emoe", "lora"}) {
    SCOPED_TRACE(method);
    auto a = tmp.file(method + "-straight"), b = tmp.file(method + "-stopped");
    emoe::run_training(tiny_run(bert, method, a, {"save_best=false"}), false);
    auto stopped = emoe::run_training(
        tiny_run(bert, method, b, {"save_best=false", "train.stop_after_steps=5"}), false);
    ASSERT_TRUE(stopped.stopped_early);
    EXPECT_FALSE(fs::exists(b + "/results.json"));
    // resuming without --resume is refused; with it, the run completes
    EXPECT_THROW(emoe::run_training(tiny_run(bert, method, b, {"save_best=false"}), false),
                 emoe::UsageError);
    emoe::run_training(tiny_run(bert, method, b, {"save_best=false"}), true);
    auto wa = checkpoint_weights(a), wb = checkpoint_weights(b);
    ASSERT_EQ(wa.size(), wb.size());
    for (auto& [k, t] : wa) EXPECT_TRUE(torch::equal(t, wb.at(k))) << k;
    auto ra = emoe::JsonFields::from_file(a + "/results.json").raw();
    auto rb = emoe::JsonFields::from_file(b + "/results.json").raw();
    EXPECT_EQ(ra["best"]["dev"]["metrics"], rb["best"]["dev"]["metrics"]);
    EXPECT_EQ(ra["best"]["dev"]["loss"], rb["best"]["dev"]["loss"]);
  }
}

// train.gradient_checkpointing: in one process (the same kernel choices) a run with every block
// recomputed in its backward pass logs the losses and ends with the weights of the run without
// (dropout, EMoE's routing and balance-free gates alike); the setting is not part of the run, so
// a plain run resumes with it.
TEST(TrainE2E, GradientCheckpointingTrainsTheSameRun) {
  EMOE_REQUIRE_SHARED(bert, "models/bert-mini");
  EMOE_REQUIRE_SHARED(data, "data/glue/SST-2");
  emoe::test::TempDir tmp;
  for (std::string method : {"full", "emoe"}) {
    SCOPED_TRACE(method);
    auto a = tmp.file(method + "-plain"), b = tmp.file(method + "-checkpointed");
    emoe::run_training(tiny_run(bert, method, a, {"save_best=false"}), false);
    emoe::run_training(
        tiny_run(bert, method, b, {"save_best=false", "train.gradient_checkpointing=true"}), false);
    EXPECT_EQ(emoe::test::train_losses(a), emoe::test::train_losses(b));
    EXPECT_FALSE(emoe::test::train_losses(a).empty());
    auto wa = checkpoint_weights(a), wb = checkpoint_weights(b);
    ASSERT_EQ(wa.size(), wb.size());
    for (auto& [k, t] : wa) EXPECT_TRUE(torch::equal(t, wb.at(k))) << k;
    auto cfg = emoe::JsonFields::from_file(b + "/config.json").raw();
    EXPECT_EQ(cfg["train"]["gradient_checkpointing"], true);
  }
  auto c = tmp.file("resumed");
  stopped_run(bert, c);
  emoe::run_training(
      tiny_run(bert, "full", c, {"save_best=false", "train.gradient_checkpointing=true"}), true);
  auto wa = checkpoint_weights(tmp.file("full-plain")), wc = checkpoint_weights(c);
  for (auto& [k, t] : wa) EXPECT_TRUE(torch::equal(t, wc.at(k))) << k;
}

TEST(TrainE2E, AblationsAndStoriesClassifier) {
  EMOE_REQUIRE_SHARED(stories, "models/stories260K/hf");
  EMOE_REQUIRE_SHARED(bert, "models/bert-mini");
  emoe::test::TempDir tmp;
  // LoRA -> EMoE: train dense with LoRA, evaluate with the expert mask
  auto r1 = emoe::run_training(
      tiny_run(bert, "lora", tmp.file("lora-emoe"), {"ablation=train-dense-eval-moe"}), false);
  EXPECT_TRUE(r1.results["best"]["dev"]["metrics"].contains("accuracy"));
  // EMoE -> dense: train with the mask, evaluate dense
  auto r2 = emoe::run_training(
      tiny_run(bert, "emoe", tmp.file("emoe-dense"), {"ablation=train-moe-eval-dense"}), false);
  EXPECT_TRUE(r2.results["best"]["dev"]["metrics"].contains("accuracy"));
  // the Llama-architecture model as a sequence classifier
  auto r3 = emoe::run_training(tiny_run(stories, "emoe", tmp.file("stories"), {"moe.layers=[1,3]"}),
                               false);
  EXPECT_TRUE(fs::exists(tmp.file("stories/model/model.safetensors")));
  auto m = emoe::load_any_model(tmp.file("stories/model"));
  EXPECT_EQ(m->summary().head, emoe::Head::kSequenceClassification);
}

TEST(TrainE2E, InstructionTuningWithMmluScoring) {
  EMOE_REQUIRE_SHARED(stories, "models/stories260K/hf");
  EMOE_REQUIRE_SHARED(alpaca, "data/instruct/alpaca/alpaca_5000.json");
  EMOE_REQUIRE_SHARED(mmlu, "data/instruct/mmlu/data");
  emoe::test::TempDir tmp;
  auto cfg = emoe::load_run_config(
      "",
      {"model=" + stories, "objective=instruction", "instruct_data=" + alpaca, "mmlu_dir=" + mmlu,
       "mmlu_max_questions=12", "mmlu_shots=1", "method=emoe", "moe.experts=4", "moe.topk=2",
       "moe.layers=[1,3]", "train.max_train_examples=40", "train.batch_size=8", "train.epochs=1",
       "train.max_length=256", "train.lr=1e-3", "output=" + tmp.file("alpaca")});
  auto r = emoe::run_training(cfg, false);
  const auto& best = r.results["best"];
  EXPECT_GT(best["dev"]["loss"].get<double>(), 0.0);
  EXPECT_EQ(best["mmlu"]["examples"].get<int64_t>(), 12);
  double acc = best["mmlu"]["metrics"]["accuracy"].get<double>();
  EXPECT_GE(acc, 0.0);
  EXPECT_LE(acc, 100.0);
}

// A run that diverges stops with a clear message before NaN reaches the weights or a checkpoint.
TEST(Train, DivergenceStopsCleanlyAndCheckpointsStayFinite) {
  EMOE_REQUIRE_SHARED(stories, "models/stories260K/hf");
  emoe::test::TempDir tmp;
  auto cfg = tiny_run(stories, "full", tmp.file("run"),
                      {"train.lr=1e12", "train.save_every=1", "train.grad_clip=0"});
  try {
    emoe::run_training(cfg, false);
    FAIL() << "a learning rate of 1e12 trained without diverging";
  } catch (const emoe::RuntimeError& e) {
    EXPECT_NE(std::string(e.what()).find("non-finite"), std::string::npos) << e.what();
  }
  if (fs::exists(tmp.file("run/checkpoints/latest")))
    for (const auto& [name, t] : checkpoint_weights(tmp.file("run")))
      EXPECT_TRUE(torch::isfinite(t).all().item<bool>()) << name;
}

// bf16 mixed precision (train.precision): the same run in fp32 and bf16 starts from the same
// weights, so the first logged losses differ by the bf16 rounding only; the evaluation runs
// under bf16 as well. (The 200-step comparison is scripts/bf16_check.sh.)
TEST(TrainE2E, Bf16MixedPrecisionTracksFp32) {
  EMOE_REQUIRE_SHARED(bert, "models/bert-mini");
  EMOE_REQUIRE_SHARED(data, "data/glue/SST-2");
  emoe::test::TempDir tmp;
  std::vector<std::string> common = {"save_best=false", "train.max_steps=2", "train.log_every=1",
                                     "train.max_eval_examples=16", "ood=[]"};
  auto a = tmp.file("fp32"), b = tmp.file("bf16");
  emoe::run_training(tiny_run(bert, "full", a, common), false);
  common.push_back("train.precision=bf16-mixed");
  auto rb = emoe::run_training(tiny_run(bert, "full", b, common), false);
  auto la = emoe::test::train_losses(a), lb = emoe::test::train_losses(b);
  ASSERT_EQ(la.size(), 2u);
  ASSERT_EQ(lb.size(), 2u);
  EXPECT_NE(la[0], lb[0]);  // autocast did run the matrix multiplies in bf16
  EXPECT_NEAR(la[0], lb[0], 0.02 * la[0]);
  EXPECT_TRUE(std::isfinite(rb.results["best"]["dev"]["loss"].get<double>()));
  EXPECT_THROW(tiny_run(bert, "full", b, {"train.precision=fp16"}).validate(), emoe::InputError);
}

// train.nonfinite: skip — the same diverging run finishes: steps with a non-finite loss or
// gradient are skipped and counted, and no weight ever becomes non-finite.
TEST(Train, NonFiniteStepsAreSkippedByPolicy) {
  EMOE_REQUIRE_SHARED(stories, "models/stories260K/hf");
  emoe::test::TempDir tmp;
  auto cfg = tiny_run(stories, "full", tmp.file("run"),
                      {"train.lr=1e12", "train.save_every=1", "train.grad_clip=0",
                       "train.nonfinite=skip", "save_best=false"});
  auto r = emoe::run_training(cfg, false);
  EXPECT_GT(r.results["skipped_steps"].get<int64_t>(), 0);
  EXPECT_LE(r.results["skipped_steps"].get<int64_t>(), r.results["steps"].get<int64_t>());
  for (const auto& [name, t] : checkpoint_weights(tmp.file("run")))
    EXPECT_TRUE(torch::isfinite(t).all().item<bool>()) << name;
  EXPECT_THROW(tiny_run(stories, "full", tmp.file("x"), {"train.nonfinite=ignore"}).validate(),
               emoe::InputError);
}

TEST(TrainE2E, OwnDatasetNeedsNoGlueTask) {
  EMOE_REQUIRE_SHARED(bert, "models/bert-mini");
  emoe::test::TempDir tmp;
  fs::create_directories(tmp.file("reviews"));
  for (const char* split : {"train", "dev"}) {
    std::ofstream out(tmp.file(std::string("reviews/") + split + ".tsv"));
    out << "sentence\tlabel\n";
    for (int i = 0; i < 12; ++i)
      out << (i % 2 ? "a fine and lovely film" : "a dull and tiresome film") << " " << i << "\t"
          << (i % 2 ? "pos" : "neg") << "\n";
  }
  std::ofstream(tmp.file("reviews/held.tsv"))
      << "sentence\tlabel\na tiresome film\tneg\na lovely film\tpos\na fine film\tpos\n";
  auto cfg = emoe::load_run_config(
      "", {"model=" + bert,
           "dataset={train: " + tmp.file("reviews/train.tsv") +
               ", dev: " + tmp.file("reviews/dev.tsv") +
               ", ood: {held: " + tmp.file("reviews/held.tsv") + "}, labels: [neg, pos]}",
           "output=" + tmp.file("run"), "train.batch_size=4", "train.epochs=1",
           "train.max_length=16", "train.log_every=1"});
  EXPECT_EQ(cfg.task, "reviews");
  EXPECT_EQ(emoe::dataset_name("data/sentiment.csv"), "sentiment");
  auto r = emoe::run_training(cfg, false);
  EXPECT_TRUE(r.results["best"]["dev"]["metrics"].contains("accuracy")) << r.results.dump();
  EXPECT_TRUE(fs::exists(tmp.file("run/model/config.json")));
  // Issue 24: `emoe eval MODEL -c RUN` re-evaluates on the run's own files (dev and the
  // out-of-domain set) at the run's max_length, as the run did
  auto e = emoe::test::run_emoe("eval " + tmp.file("run/model") + " -c " +
                                tmp.file("run/config.json") + " --json -q");
  ASSERT_EQ(e.exit_code, 0) << e.err;
  auto j = nlohmann::json::parse(e.out);
  for (const char* set : {"dev", "held"}) {
    SCOPED_TRACE(set);
    ASSERT_TRUE(j.contains(set)) << e.out;
    EXPECT_EQ(j[set]["examples"], r.results["best"][set]["examples"]);
    EXPECT_EQ(j[set]["metrics"]["accuracy"], r.results["best"][set]["metrics"]["accuracy"]);
    EXPECT_NEAR(j[set]["loss"].get<double>(), r.results["best"][set]["loss"].get<double>(), 1e-4);
  }
  // a YAML run config names its data the same way
  std::ofstream(tmp.file("run.yaml"))
      << "model: " << bert << "\ndataset:\n  train: " << tmp.file("reviews/train.tsv")
      << "\n  dev: " << tmp.file("reviews/dev.tsv")
      << "\n  labels: [neg, pos]\ntrain:\n  max_length: 16\n";
  auto y = emoe::test::run_emoe("eval " + tmp.file("run/model") + " -c " + tmp.file("run.yaml") +
                                " --json -q");
  ASSERT_EQ(y.exit_code, 0) << y.err;
  // the same examples and metric; the loss to rounding only: each eval process times its own
  // kernel choices (ATen or oneDNN per shape), which may sum in another order
  auto yd = nlohmann::json::parse(y.out)["dev"];
  EXPECT_EQ(yd["examples"], j["dev"]["examples"]);
  EXPECT_EQ(yd["metrics"], j["dev"]["metrics"]);
  EXPECT_NEAR(yd["loss"].get<double>(), j["dev"]["loss"].get<double>(), 1e-6);
  // -c and --task exclude each other; one of them is needed
  auto both = emoe::test::run_emoe("eval " + tmp.file("run/model") + " -c " + tmp.file("run.yaml") +
                                   " --task sst2");
  EXPECT_EQ(both.exit_code, 2) << both.err;
  auto none = emoe::test::run_emoe("eval " + tmp.file("run/model"));
  EXPECT_EQ(none.exit_code, 2) << none.err;
  EXPECT_NE(none.err.find("give --task T or -c RUN.yaml"), std::string::npos) << none.err;
}

// Weights that blow up under train.nonfinite: skip are never saved: whatever the run does (stop
// after max_consecutive_skips, or refuse a checkpoint), no safetensors file in the run folder
// holds a NaN or an infinity, and the run does not end as a success.
TEST(Train, SkipPolicyNeverSavesNonFiniteWeights) {
  EMOE_REQUIRE_SHARED(stories, "models/stories260K/hf");
  emoe::test::TempDir tmp;
  auto cfg = tiny_run(stories, "full", tmp.file("run"),
                      {"train.lr=1e30", "train.save_every=1", "train.grad_clip=0",
                       "train.nonfinite=skip", "train.max_consecutive_skips=3"});
  try {
    emoe::run_training(cfg, false);
    FAIL() << "weights of order 1e30 trained to the end as a success";
  } catch (const emoe::RuntimeError& e) {
    const std::string what = e.what();
    EXPECT_TRUE(what.find("in a row skipped") != std::string::npos ||
                what.find("not finite") != std::string::npos)
        << what;
  }
  EXPECT_FALSE(fs::exists(tmp.file("run/results.json")));
  int files = 0;
  for (const auto& e : fs::recursive_directory_iterator(tmp.file("run"))) {
    if (e.path().extension() != ".safetensors") continue;
    ++files;
    for (const auto& [name, t] : emoe::load_safetensors(e.path().string()))
      if (t.is_floating_point())
        EXPECT_TRUE(torch::isfinite(t).all().item<bool>()) << e.path() << ": " << name;
  }
  EXPECT_GT(files, 0) << "no checkpoint was written before the explosion";
}

// A run folder is checked as a run folder: `latest` naming a path out of it is refused, a
// damaged optimizer.pt is the input's fault (exit 2), and a copied folder resumes.
TEST(Train, RunFolderIntegrityOnResume) {
  EMOE_REQUIRE_SHARED(bert, "models/bert-mini");
  EMOE_REQUIRE_SHARED(data, "data/glue/SST-2");
  emoe::test::TempDir tmp;
  const auto run = stopped_run(bert, tmp.file("run"));
  // a copy elsewhere resumes (the output path is not part of the run)
  auto copy = tmp.file("copy");
  fs::copy(run, copy, fs::copy_options::recursive);
  fs::remove(copy + "/.emoe.lock");
  auto resumed = emoe::run_training(tiny_run(bert, "full", copy, {"save_best=false"}), true);
  EXPECT_FALSE(resumed.stopped_early);
  // a changed setting is named
  try {
    emoe::run_training(tiny_run(bert, "full", run, {"save_best=false", "train.lr=5e-4"}), true);
    FAIL() << "a changed learning rate resumed";
  } catch (const emoe::UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("train.lr: 0.001 in config.json, 0.0005 given"),
              std::string::npos)
        << e.what();
  }
  std::string name;
  std::getline(std::ifstream(run + "/checkpoints/latest"), name);
  const auto optimizer = run + "/checkpoints/" + name + "/optimizer.pt";
  fs::resize_file(optimizer, fs::file_size(optimizer) / 2);
  try {
    emoe::run_training(tiny_run(bert, "full", run, {"save_best=false"}), true);
    FAIL() << "a truncated optimizer.pt resumed";
  } catch (const emoe::InputError& e) {
    EXPECT_NE(std::string(e.what()).find("optimizer.pt: not a readable optimiser state"),
              std::string::npos)
        << e.what();
  }
  std::ofstream(run + "/checkpoints/latest") << "../../copy/checkpoints/" << name << "\n";
  try {
    emoe::run_training(tiny_run(bert, "full", run, {"save_best=false"}), true);
    FAIL() << "latest pointing out of the run folder was followed";
  } catch (const emoe::InputError& e) {
    EXPECT_NE(std::string(e.what()).find("not a step-N checkpoint folder of this run"),
              std::string::npos)
        << e.what();
  }
}

// A checkpoint keeps the kernels its run timed (kernels.json) and --resume pins them before its
// first step, so that the resumed run's products run where the uninterrupted run's did; a
// damaged record is the input's fault, one from another CPU is only reported.
TEST(Train, ResumePinsTheKernelsItsRunTimed) {
  EMOE_REQUIRE_SHARED(bert, "models/bert-mini");
  EMOE_REQUIRE_SHARED(data, "data/glue/SST-2");
  emoe::test::TempDir tmp;
  const auto run = stopped_run(bert, tmp.file("run"));
  std::string name;
  std::getline(std::ifstream(run + "/checkpoints/latest"), name);
  const auto kernels = run + "/checkpoints/" + name + "/kernels.json";
  ASSERT_TRUE(fs::exists(kernels));
  auto record = nlohmann::json::parse(std::ifstream(kernels));
  EXPECT_EQ(record["cpu"], emoe::kernel_choices_json()["cpu"]);
  // a choice the tiny model never times, as a run on a bigger one would have made it
  record["small_products"]["6,3,1000,7,0,0"] = "library";
  auto keep = fs::path(tmp.file("kernels.json"));
  std::ofstream(keep) << record.dump();
  auto restore = [&] { fs::copy_file(keep, kernels, fs::copy_options::overwrite_existing); };

  auto bad = [&](const std::string& text, const std::string& why) {
    std::ofstream(kernels) << text;
    try {
      emoe::run_training(tiny_run(bert, "full", run, {"save_best=false"}), true);
      ADD_FAILURE() << "resumed with kernels.json " << text;
    } catch (const emoe::InputError& e) {
      EXPECT_NE(std::string(e.what()).find("kernels.json: " + why), std::string::npos) << e.what();
    }
  };
  bad("{", "not valid JSON");
  auto warp = record;
  warp["expert_paths"]["bfloat16,8,2,4,0"] = "warp";
  bad(warp.dump(), "experts 'bfloat16,8,2,4,0': 'warp' is not a path this CPU has");

  // another CPU's record: resumes, nothing pinned
  auto foreign = record;
  foreign["cpu"]["model"] = "Another CPU 9000";
  std::ofstream(kernels) << foreign.dump();
  emoe::forget_kernel_choices();  // a new process
  auto copy = tmp.file("copy");
  fs::copy(run, copy, fs::copy_options::recursive);
  fs::remove(copy + "/.emoe.lock");
  emoe::run_training(tiny_run(bert, "full", copy, {"save_best=false"}), true);
  EXPECT_EQ(emoe::small_gemm_choices_made().count("6,3,1000,7,0,0"), 0u);

  // this CPU's: pinned before the first step, and kept by the run's later checkpoints
  restore();
  emoe::forget_kernel_choices();
  emoe::run_training(tiny_run(bert, "full", run, {"save_best=false"}), true);
  EXPECT_EQ(emoe::small_gemm_choices_made().at("6,3,1000,7,0,0"), "library");
  std::getline(std::ifstream(run + "/checkpoints/latest"), name);
  auto last = nlohmann::json::parse(std::ifstream(run + "/checkpoints/" + name + "/kernels.json"));
  EXPECT_EQ(last["small_products"]["6,3,1000,7,0,0"], "library");
  // and the finished run's own record (EMOE_KERNELS=<it> repeats the run on its kernels)
  auto final_record = nlohmann::json::parse(std::ifstream(run + "/kernels.json"));
  EXPECT_EQ(final_record, emoe::kernel_choices_json());
  emoe::forget_kernel_choices();
}

// Each modern family trains with EMoE and evaluates from its saved model/: the tiny Hugging
// Face fixtures (vocabulary 100) with a 100-entry WordPiece vocabulary beside them (letters and
// continuation letters, so every word tokenizes), a few steps of SST-2, then `emoe eval`.
TEST(TrainE2E, EveryModernFamilyTrainsAndEvaluates) {
  EMOE_REQUIRE_SHARED(data, "data");
  emoe::test::TempDir tmp;
  std::string vocab = "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\n";
  for (char c = 'a'; c <= 'z'; ++c) vocab += std::string(1, c) + "\n##" + std::string(1, c) + "\n";
  for (const char* p : {".", ",", "'", "!", "?", "-", "the", "a##"}) vocab += std::string(p) + "\n";
  for (const char* family : {"roberta_seqcls", "qwen2_lm", "qwen3_lm", "llama3_lm", "mistral_lm"}) {
    SCOPED_TRACE(family);
    const std::string src = emoe::test::shared_path(std::string("fixtures/tiny/") + family);
    const std::string model = tmp.file(family), run = tmp.file(std::string(family) + "-run");
    fs::create_directories(model);
    for (const char* f : {"config.json", "model.safetensors"})
      fs::copy_file(src + "/" + f, model + "/" + f);
    std::ofstream(model + "/vocab.txt") << vocab;
    // the RoBERTa fixture's classifier has 3 labels: a three-label data set of the user's own
    std::vector<std::string> sets = {"train.max_steps=3",
                                     "train.max_length=24",
                                     "train.max_eval_examples=16",
                                     "ood=[]",
                                     "moe.experts=2",
                                     "moe.topk=1",
                                     "moe.layers=[1]"};
    if (std::string(family) == "roberta_seqcls") {
      std::ofstream f(tmp.file("three.tsv"));
      f << "sentence\tlabel\n";
      const char* names[] = {"neg", "neu", "pos"};
      for (int i = 0; i < 24; ++i)
        f << (i % 3 == 0   ? "bad dull film"
              : i % 3 == 1 ? "a film"
                           : "great fun film")
          << "\t" << names[i % 3] << "\n";
      f.close();
      for (const std::string& kv :
           {"dataset.train=" + tmp.file("three.tsv"), "dataset.dev=" + tmp.file("three.tsv"),
            std::string("dataset.labels=[neg, neu, pos]"), std::string("task=")})
        sets.push_back(kv);
    }
    auto r = emoe::run_training(tiny_run(model, "emoe", run, sets), false);
    EXPECT_TRUE(std::isfinite(r.results["best"]["dev"]["loss"].get<double>())) << r.results.dump();
    ASSERT_TRUE(fs::exists(run + "/model/config.json"));
    // the run's own data again (its config.json), from the saved model
    auto e = emoe::test::run_emoe("eval " + run + "/model -c " + run + "/config.json -q");
    EXPECT_EQ(e.exit_code, 0) << e.err;
    EXPECT_NE(e.out.find("accuracy"), std::string::npos) << e.out;
  }
}
