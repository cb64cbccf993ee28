// End to end: train EMoE, then `emoe analyze`, `emoe prune`, pruning -> training, `emoe bench`.
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "emoe/io/hf_config.h"
#include "support/test_support.h"

namespace fs = std::filesystem;
using emoe::test::run_emoe;

TEST(AnalysisCli, AnalyzePruneAndPruneThenTrain) {
  EMOE_REQUIRE_SHARED(bert, "models/bert-mini");
  EMOE_REQUIRE_SHARED(data, "data");
  emoe::test::TempDir tmp;
  const std::string common = " --set model=" + bert + " --set data_dir=" + data +
                             " --set task=sst2 --set method=emoe --set moe.experts=8 --set "
                             "moe.topk=2 --set moe.layers=[0,2]"
                             " --set train.max_train_examples=64 --set train.max_eval_examples=32 "
                             "--set train.batch_size=16"
                             " --set train.epochs=2 --set train.max_length=32 --set "
                             "train.usage_interval=2 --set ood=[imdb]";
  auto r = run_emoe("train" + common + " -o " + tmp.file("run"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const char* f :
       {"usage.json", "usage.csv", "moe.json", "model_moe/moe.json", "model/config.json"})
    EXPECT_TRUE(fs::exists(tmp.file(std::string("run/") + f))) << f;

  r = run_emoe("analyze " + tmp.file("run"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const char* f : {"usage_layer_0.png", "usage_layer_2.png", "usage_phases.png",
                        "split_quality.png", "summary.md"})
    EXPECT_TRUE(fs::exists(tmp.file(std::string("run/analysis/") + f))) << f;
  std::ifstream in(tmp.file("run/analysis/summary.md"));
  std::string md((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(md.find("| layer 0 | selections | train |"), std::string::npos) << md;
  EXPECT_NE(md.find("| layer 2 | selections | imdb |"), std::string::npos) << md;
  // dev vs the out-of-domain set: shares, total-variation distance, figures
  for (const char* f : {"id_vs_ood.png", "id_vs_ood_tv.png", "id_vs_ood.csv", "id_vs_ood.md"})
    EXPECT_TRUE(fs::exists(tmp.file(std::string("run/analysis/") + f))) << f;
  EXPECT_NE(md.find("| layer 2 | imdb | 0."), std::string::npos) << md;

  r = run_emoe("prune " + tmp.file("run"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const char* row : {"| 8 |", "| 4 |", "| 2 |", "| 1 |"})
    EXPECT_NE(r.out.find(row), std::string::npos) << r.out;
  // keeping all N experts reproduces the run's own best dev score
  auto res = emoe::JsonFields::from_file(tmp.file("run/results.json")).raw();
  auto pr = nlohmann::json::parse(std::ifstream(tmp.file("run/prune.json")));
  EXPECT_NEAR(pr[0]["dev"]["accuracy"].get<double>(),
              res["best"]["dev"]["metrics"]["accuracy"].get<double>(), 1e-9);

  // pruning -> training on the same split
  r = run_emoe("train" + common + " --set prune_from=" + tmp.file("run") +
               " --set prune_keep=2 -o " + tmp.file("pruned"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto moe = emoe::JsonFields::from_file(tmp.file("pruned/model_moe/moe.json")).raw();
  EXPECT_EQ(moe["layers"]["0"]["allowed"].size(), 2u);
  // a different split is refused
  r = run_emoe("train" + common + " --set moe.seed=5 --set prune_from=" + tmp.file("run") +
               " --set prune_keep=2 -o " + tmp.file("bad"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("split differently"), std::string::npos) << r.err;
}

// The activation-clustering picture of a pretrained model's layer, and its usage errors.
TEST(AnalysisCli, CoactivationPictureOfAModelLayer) {
  EMOE_REQUIRE_SHARED(bert, "models/bert-mini");
  EMOE_REQUIRE_SHARED(text, "data/corpus/wikitext-2/valid.txt");
  emoe::test::TempDir tmp;
  auto r = run_emoe("analyze --coactivation " + bert + " --sample " + text +
                    " --layer 1 --experts 8 --max-tokens 600 -o " + tmp.file("co"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(fs::exists(tmp.file("co/coactivation_layer1.png")));
  std::ifstream in(tmp.file("co/coactivation_layer1.md"));
  std::string md((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(md.find("| EMoE (balanced k-means) |"), std::string::npos) << md;
  EXPECT_NE(r.out.find("within / between experts"), std::string::npos) << r.out;

  r = run_emoe("analyze --coactivation " + bert + " -o " + tmp.file("x"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--sample FILE"), std::string::npos) << r.err;
  r = run_emoe("analyze " + tmp.file("co") + " --coactivation " + bert + " --sample " + text);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("not both"), std::string::npos) << r.err;
  r = run_emoe("analyze --coactivation " + bert + " --sample " + text + " --layer 9");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--layer 9: the model has FFN layers 0..3"), std::string::npos) << r.err;
  r = run_emoe("analyze --coactivation " + bert + " --sample " + text + " --experts 7");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--experts: d_ff 1024 is not divisible by N = 7"), std::string::npos)
      << r.err;
  r = run_emoe("analyze");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("RUN_DIR is required"), std::string::npos) << r.err;
}

TEST(AnalysisCli, BenchPrintsOneRowPerMethod) {
  EMOE_REQUIRE_SHARED(stories, "models/stories260K/hf");
  emoe::test::TempDir tmp;
  auto r = run_emoe("bench " + stories +
                    " --methods dense,lora,emoe --batch 2 --seq 16 --steps 1 --json " +
                    tmp.file("b.json"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const char* m : {"| dense |", "| lora |", "| emoe |"})
    EXPECT_NE(r.out.find(m), std::string::npos) << r.out;
  auto rows = nlohmann::json::parse(std::ifstream(tmp.file("b.json")));
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[0]["parameters"], rows[2]["parameters"]) << "EMoE adds no parameters";
  EXPECT_LT(rows[1]["trainable"].get<int64_t>(), rows[0]["trainable"].get<int64_t>());
  EXPECT_EQ(run_emoe("bench " + stories + " --methods magic").exit_code, 2);
}

// A sweep over two keys (the papers' k/N grid): besides the best-point table, a table per
// evaluation set of the mean over seeds at every (N, k), rows the first key, and heatmap panels
// in METHOD/grid.png; each cell is the mean of its runs' best-epoch dev scores.
TEST(AnalysisCli, SweepOverTwoKeysWritesTheGridTableAndHeatmap) {
  EMOE_REQUIRE_SHARED(bert, "models/bert-mini");
  EMOE_REQUIRE_SHARED(data, "data");
  emoe::test::TempDir tmp;
  {
    std::ofstream cfg(tmp.file("sweep.yaml"));
    cfg << "model: " << bert << "\ntask: sst2\nmethod: emoe\ndata_dir: " << data
        << "\nood: []\nsave_best: false\nmoe: {kmeans: {restarts: 1}}\n"
           "train: {epochs: 1, batch_size: 16, max_length: 32, max_train_examples: 32, "
           "max_eval_examples: 32}\n";
  }
  auto r = run_emoe("sweep -c " + tmp.file("sweep.yaml") +
                    " --grid moe.experts=4,8 --grid moe.topk=1,2 --seeds 0,1 -o " + tmp.file("sw"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(fs::exists(tmp.file("sw/emoe/grid.png")));
  std::ifstream in(tmp.file("sw/sweep.md"));
  std::string md((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(md.find("emoe: moe.experts (rows) x moe.topk (columns), accuracy mean over seeds"),
            std::string::npos)
      << md;
  EXPECT_NE(md.find("| dev | 1 | 2 |"), std::string::npos) << md;
  // the cell of N 8, k 2: the mean of its two seeds' best-epoch dev accuracy
  const auto runs = nlohmann::json::parse(std::ifstream(tmp.file("sw/sweep.json")));
  std::vector<double> n8k2;
  for (const auto& run : runs)
    if (run["point"] == nlohmann::json({"moe.experts=8", "moe.topk=2"}))
      n8k2.push_back(run["results"]["dev"]["metrics"]["accuracy"].get<double>());
  ASSERT_EQ(n8k2.size(), 2u);
  const double mean = (n8k2[0] + n8k2[1]) / 2;
  const double sd = std::fabs(n8k2[0] - n8k2[1]) / 2;
  const auto row = md.find("| 8 | ", md.find("| dev | 1 | 2 |"));
  ASSERT_NE(row, std::string::npos) << md;
  const auto line = md.substr(row, md.find('\n', row) - row);
  EXPECT_NE(line.find(fmt::format("| {:.2f} ± {:.2f} |", mean, sd)), std::string::npos)
      << line << "\n"
      << md;
  // run again: the finished runs are reused; with another config in the same -o: refused
  const std::string again = "sweep -c " + tmp.file("sweep.yaml") +
                            " --grid moe.experts=4,8 --grid moe.topk=1,2 --seeds 0,1 -o " +
                            tmp.file("sw");
  auto same = run_emoe(again);
  ASSERT_EQ(same.exit_code, 0) << same.err;
  EXPECT_NE(same.err.find("done before; reusing its results"), std::string::npos) << same.err;
  auto other = run_emoe(again + " --set train.lr=0.001");
  EXPECT_EQ(other.exit_code, 2) << other.err;
  EXPECT_NE(other.err.find("finished with another config (train.lr: "), std::string::npos)
      << other.err;
}
