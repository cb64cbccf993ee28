// `emoe info --system`: this machine as the kernels see it, text and JSON.
#include <nlohmann/json.hpp>

#include "support/test_support.h"

TEST(InfoSystem, DescribesTheMachineAndRefusesAModelFolderWithIt) {
  auto r = emoe::test::run_emoe("info --system");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const char* line : {"cpu ", "isa ", "threads ", "products ", "experts "})
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
