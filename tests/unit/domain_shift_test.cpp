// In-domain vs out-of-domain expert selection: total-variation distances of known counts, and the
// files `emoe analyze` writes from a usage record with dev and out-of-domain phases.
#include "emoe/analysis/domain_shift.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "emoe/analysis/report.h"
#include "emoe/core/error.h"
#include "emoe/moe/usage.h"
#include "support/test_support.h"

namespace fs = std::filesystem;

namespace {

// A usage.json of two layers of 4 experts: dev counted at two evaluations (summed), two
// out-of-domain sets.
nlohmann::json shift_usage(bool with_ood) {
  nlohmann::json snaps = nlohmann::json::array();
  auto add = [&](int64_t step, const std::string& phase, std::vector<std::vector<double>> c) {
    snaps.push_back({{"step", step}, {"phase", phase}, {"counts", c}});
  };
  add(10, "train", {{5, 5, 5, 5}, {1, 2, 3, 4}});
  add(10, "dev", {{2, 1, 0, 0}, {1, 1, 1, 1}});
  add(20, "dev", {{1, 0, 0, 0}, {1, 1, 1, 1}});  // dev totals: {3, 1, 0, 0}, {2, 2, 2, 2}
  if (with_ood) {
    add(20, "imdb", {{10, 10, 10, 10}, {2, 2, 2, 2}});  // TV 0.5 and 0
    add(20, "yelp", {{0, 0, 6, 2}, {0, 0, 0, 8}});      // TV 1 (disjoint) and 0.75
  }
  nlohmann::json src = nlohmann::json::array();
  for (int l : {1, 3})
    src.push_back({{"name", fmt::format("layer {}", l)},
                   {"kind", "selections"},
                   {"experts", 4},
                   {"layer", l}});
  return {{"format", "emoe-usage"}, {"version", 1}, {"sources", src}, {"snapshots", snaps}};
}

std::string shift_read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

TEST(DomainShift, TotalVariationOfKnownCounts) {
  // shares {.75, .25, 0, 0} vs uniform: (.5 + 0 + .25 + .25) / 2
  EXPECT_DOUBLE_EQ(emoe::total_variation({3, 1, 0, 0}, {1, 1, 1, 1}), 0.5);
  EXPECT_DOUBLE_EQ(emoe::total_variation({30, 10, 0, 0}, {7, 7, 7, 7}), 0.5);  // scale-free
  EXPECT_DOUBLE_EQ(emoe::total_variation({1, 1, 0, 0}, {0, 0, 4, 5}), 1.0);    // disjoint
  EXPECT_DOUBLE_EQ(emoe::total_variation({2, 3, 5}, {4, 6, 10}), 0.0);
  EXPECT_DOUBLE_EQ(emoe::total_variation({0, 0}, {1, 3}), 0.0);  // nothing counted on one side
  EXPECT_THROW(emoe::total_variation({1, 2}, {1, 2, 3}), emoe::InputError);
  auto s = emoe::usage_shares({1, 3});
  EXPECT_DOUBLE_EQ(s[0], 0.25);
  EXPECT_DOUBLE_EQ(s[1], 0.75);
}

TEST(DomainShift, AnalyzeWritesSharesDistancesAndFigures) {
  emoe::test::TempDir tmp;
  const std::string run = tmp.file("run");
  fs::create_directories(run);
  std::ofstream(run + "/usage.json") << shift_usage(true).dump();
  auto usage = emoe::UsageRecorder::load(run + "/usage.json");
  auto shifts = emoe::domain_shifts(usage);
  ASSERT_EQ(shifts.size(), 4u);  // 2 layers x 2 sets, layer-major
  EXPECT_EQ(shifts[0].source, "layer 1");
  EXPECT_EQ(shifts[0].ood, "imdb");
  EXPECT_DOUBLE_EQ(shifts[0].tv, 0.5);
  EXPECT_DOUBLE_EQ(shifts[0].in_share[0], 0.75);  // dev summed over both evaluations
  EXPECT_DOUBLE_EQ(shifts[1].tv, 1.0);
  EXPECT_DOUBLE_EQ(shifts[2].tv, 0.0);
  EXPECT_DOUBLE_EQ(shifts[3].tv, 0.75);

  const std::string out = tmp.file("analysis");
  auto r = emoe::analyze_run(run, out);
  for (const char* f : {"id_vs_ood.png", "id_vs_ood_tv.png", "id_vs_ood.csv", "id_vs_ood.md"})
    EXPECT_TRUE(fs::exists(out + "/" + f)) << f;
  EXPECT_EQ(std::count_if(r.figures.begin(), r.figures.end(),
                          [](const std::string& f) { return f.find("id_vs_ood") != f.npos; }),
            2);
  const std::string md = shift_read(out + "/id_vs_ood.md");
  EXPECT_NE(md.find("| layer 1 | imdb | 0.5000 |"), std::string::npos) << md;
  EXPECT_NE(md.find("| layer 3 | yelp | 0.7500 |"), std::string::npos) << md;
  EXPECT_NE(md.find("| layer 1 | 0.7500 |"), std::string::npos) << md;  // mean of 0.5 and 1
  EXPECT_NE(shift_read(r.summary).find("In-domain vs out-of-domain"), std::string::npos);
  const std::string csv = shift_read(out + "/id_vs_ood.csv");
  EXPECT_NE(csv.find("layer 3,yelp,3,0.250000,1.000000"), std::string::npos) << csv;
  std::ifstream png(out + "/id_vs_ood.png", std::ios::binary);
  char magic[8] = {};
  png.read(magic, 8);
  EXPECT_EQ(std::string(magic + 1, 3), "PNG");

  // a run evaluated on dev alone: no comparison, no files
  const std::string plain = tmp.file("plain");
  fs::create_directories(plain);
  std::ofstream(plain + "/usage.json") << shift_usage(false).dump();
  emoe::analyze_run(plain, plain + "/analysis");
  EXPECT_FALSE(fs::exists(plain + "/analysis/id_vs_ood.png"));
  EXPECT_EQ(shift_read(plain + "/analysis/summary.md").find("In-domain vs out-of-domain"),
            std::string::npos);
}
