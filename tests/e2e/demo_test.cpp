// End to end: `emoe demo` (quick configuration) and `emoe pretrain` from the command line.
#include <filesystem>
#include <fstream>

#include "support/test_support.h"

namespace fs = std::filesystem;
using emoe::test::run_emoe;

TEST(DemoCli, QuickDemoPrintsTheTableAndWritesReportAndFigures) {
  emoe::test::TempDir tmp;
  auto r = run_emoe("demo --quick -o " + tmp.file("demo"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const char* row : {"| full |", "| lora |", "| emoe |", "out of domain: restaurants"})
    EXPECT_NE(r.out.find(row), std::string::npos) << row << "\n" << r.out;
  EXPECT_NE(r.err.find("demo [6/6]"), std::string::npos) << "progress display\n" << r.err;
  for (const char* f : {"report.md", "demo.json", "figures/usage_phases.png",
                        "figures/usage_layer_0.png", "pretrained/model.safetensors",
                        "pretrained/vocab.txt", "data/ood.tsv", "runs/emoe/model/config.json"})
    EXPECT_TRUE(fs::exists(tmp.file(std::string("demo/") + f))) << f;
  std::ifstream in(tmp.file("demo/report.md"));
  std::string md((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(md.find("| emoe |"), std::string::npos);
  EXPECT_NE(md.find("![](figures/usage_phases.png)"), std::string::npos) << md;
  // the EMoE run's exported model is recomposed into plain BERT (no moe.json)
  EXPECT_FALSE(fs::exists(tmp.file("demo/runs/emoe/model/moe.json")));
  // a second run replaces the first; a folder that is not the demo's is refused, untouched
  r = run_emoe("demo --quick --methods full -o " + tmp.file("demo"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_FALSE(fs::exists(tmp.file("demo/runs/emoe")));
  fs::create_directories(tmp.file("mine"));
  std::ofstream(tmp.file("mine/keep.txt")) << "x";
  r = run_emoe("demo --quick -o " + tmp.file("mine"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("is not a demo output folder"), std::string::npos) << r.err;
  EXPECT_TRUE(fs::exists(tmp.file("mine/keep.txt")));
  r = run_emoe("demo --quick --task sst2 -o " + tmp.file("x"));
  EXPECT_EQ(r.exit_code, 2);
}

TEST(DemoCli, UserModelAndTask) {
  EMOE_REQUIRE_SHARED(stories, "models/stories260K/hf");
  EMOE_REQUIRE_SHARED(data, "data");
  emoe::test::TempDir tmp;
  auto r = run_emoe("demo --quick --model " + stories + " --task sst2 --data " + data +
                    " --methods full,emoe -o " + tmp.file("d"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("| emoe |"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("out of domain: imdb"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("out of domain, mean"), std::string::npos) << r.out;
}

TEST(PretrainCli, TrainsSavesAndRejectsBadConfigs) {
  emoe::test::TempDir tmp;
  {
    std::ofstream c(tmp.file("corpus.txt"));
    for (int i = 0; i < 200; ++i) c << "the cat sat on the mat number " << i % 7 << " .\n";
  }
  std::ofstream(tmp.file("p.yaml"))
      << "arch: bert\nhidden: 32\nlayers: 1\nheads: 2\nintermediate: 64\n"
         "max_positions: 32\nmax_length: 16\nbatch_size: 8\nsteps: 5\n";
  auto r = run_emoe("pretrain -c " + tmp.file("p.yaml") + " --corpus " + tmp.file("corpus.txt") +
                    " -o " + tmp.file("m"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("5 steps"), std::string::npos) << r.out;
  r = run_emoe("info " + tmp.file("m"));
  EXPECT_EQ(r.exit_code, 0) << r.err;
  r = run_emoe("pretrain -c " + tmp.file("p.yaml") + " --set layerz=2 --corpus " +
               tmp.file("corpus.txt") + " -o " + tmp.file("bad"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("unknown key 'layerz'"), std::string::npos) << r.err;
  r = run_emoe("pretrain -c " + tmp.file("p.yaml") + " --corpus " + tmp.file("nope.txt") + " -o " +
               tmp.file("bad2"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("nope.txt"), std::string::npos) << r.err;
}
