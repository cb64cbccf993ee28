// `emoe info --system`: this machine as the kernels see it, text and JSON.
#include <cstdlib>
#include <nlohmann/json.hpp>

#include "support/test_support.h"

TEST(InfoSystem, DescribesTheMachineAndRefusesAModelFolderWithIt) {
  auto r = emoe::test::run_emoe("info --system");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const char* line : {"cpu ", "isa ", "threads ", "products ", "decoding ", "experts "})
    EXPECT_NE(r.out.find(line), std::string::npos) << line << " missing:\n" << r.out;
  auto j = emoe::test::run_emoe("info --system --json");
  ASSERT_EQ(j.exit_code, 0) << j.err;
  auto doc = nlohmann::json::parse(j.out);
  EXPECT_GE(doc["logical_cores"].get<int>(), 1);
  EXPECT_GE(doc["threads"].get<int>(), 1);
  EXPECT_TRUE(doc["isa"].is_array());
  auto both = emoe::test::run_emoe("info --system some/model");
  EXPECT_EQ(both.exit_code, 2);
  EXPECT_NE(both.err.find("--system describes this machine"), std::string::npos) << both.err;
  auto none = emoe::test::run_emoe("info");
  EXPECT_EQ(none.exit_code, 2);
  EXPECT_NE(none.err.find("MODEL_DIR: required"), std::string::npos) << none.err;
}

// The bfloat16 experts' path: measured by default (one of the paths this CPU has), the one
// EMOE_EXPERT_KERNELS names when set, and a clear error (exit 2) for a value it cannot run.
TEST(InfoSystem, NamesTheBfloat16ExpertPathAndHonoursEmoeExpertKernels) {
  ::unsetenv("EMOE_EXPERT_KERNELS");
  auto j = emoe::test::run_emoe("info --system --json");
  ASSERT_EQ(j.exit_code, 0) << j.err;
  const auto path = nlohmann::json::parse(j.out)["dispatched_experts_bfloat16_path"];
  EXPECT_TRUE(path == "amx" || path == "avx512-bf16" || path == "library") << path;
  // how it was chosen: measured among several paths, or the only one this CPU has
  const auto how = nlohmann::json::parse(j.out)["dispatched_experts_bfloat16"].get<std::string>();
  EXPECT_TRUE(how.find("(measured: ") != std::string::npos ||
              how.find("no AVX-512 BF16 or AMX kernels on this CPU") != std::string::npos)
      << how;
  ::setenv("EMOE_EXPERT_KERNELS", "library", 1);
  auto lib = emoe::test::run_emoe("info --system --json");
  ::setenv("EMOE_EXPERT_KERNELS", "tpu", 1);
  auto bad = emoe::test::run_emoe("info --system");
  ::unsetenv("EMOE_EXPERT_KERNELS");
  ASSERT_EQ(lib.exit_code, 0) << lib.err;
  EXPECT_EQ(nlohmann::json::parse(lib.out)["dispatched_experts_bfloat16_path"], "library");
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.err.find("EMOE_EXPERT_KERNELS: expected auto or a path this CPU has"),
            std::string::npos)
      << bad.err;
  EXPECT_NE(bad.err.find("got 'tpu'"), std::string::npos) << bad.err;
}

// Decoding's products: emoe's kernels (the best set this CPU has, or the library per shape),
// the set EMOE_SMALL_GEMM names, and a clear error (exit 2) for one this CPU cannot run.
TEST(InfoSystem, NamesTheDecodingProductsAndHonoursEmoeSmallGemm) {
  ::unsetenv("EMOE_SMALL_GEMM");
  auto j = emoe::test::run_emoe("info --system --json");
  ASSERT_EQ(j.exit_code, 0) << j.err;
  const auto small = nlohmann::json::parse(j.out)["decoding_products"].get<std::string>();
  EXPECT_TRUE(small == "avx512-bf16" || small == "avx512" || small == "avx2" || small == "library")
      << small;
  ::setenv("EMOE_SMALL_GEMM", "library", 1);
  auto lib = emoe::test::run_emoe("info --system --json");
  ::setenv("EMOE_SMALL_GEMM", "neon", 1);
  auto bad = emoe::test::run_emoe("info --system");
  ::unsetenv("EMOE_SMALL_GEMM");
  ASSERT_EQ(lib.exit_code, 0) << lib.err;
  EXPECT_EQ(nlohmann::json::parse(lib.out)["decoding_products"], "library");
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.err.find("EMOE_SMALL_GEMM: expected auto, library"), std::string::npos) << bad.err;
  EXPECT_NE(bad.err.find("got 'neon'"), std::string::npos) << bad.err;
}

TEST(InfoSystem, NamesTheRowKernelsAndHonoursEmoeRowKernels) {
  ::unsetenv("EMOE_ROW_KERNELS");
  auto j = emoe::test::run_emoe("info --system --json");
  ASSERT_EQ(j.exit_code, 0) << j.err;
  const auto rows = nlohmann::json::parse(j.out)["row_kernels"].get<std::string>();
  EXPECT_TRUE(rows == "avx512" || rows == "avx2" || rows == "library") << rows;
  ::setenv("EMOE_ROW_KERNELS", "library", 1);
  auto lib = emoe::test::run_emoe("info --system --json");
  ::setenv("EMOE_ROW_KERNELS", "sve", 1);
  auto bad = emoe::test::run_emoe("info --system");
  ::unsetenv("EMOE_ROW_KERNELS");
  ASSERT_EQ(lib.exit_code, 0) << lib.err;
  EXPECT_EQ(nlohmann::json::parse(lib.out)["row_kernels"], "library");
  EXPECT_EQ(bad.exit_code, 2) << bad.err;
  EXPECT_NE(bad.err.find("EMOE_ROW_KERNELS: expected auto, library"), std::string::npos) << bad.err;
}
