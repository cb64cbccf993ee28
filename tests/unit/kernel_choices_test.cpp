// The timed kernel choices as a record (moe/kernel_choices.h): what a process chose round-trips
// through JSON into another process (forget_kernel_choices stands in for one), the pinned choices
// are used untimed, and a record from another CPU or a malformed one pins nothing.
#include "emoe/moe/kernel_choices.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "emoe/core/error.h"
#include "emoe/models/matmul.h"
#include "emoe/models/small_gemm.h"
#include "emoe/moe/expert_ffn.h"
#include "support/test_support.h"

namespace {

bool all_empty(const nlohmann::json& record) {
  for (const char* f :
       {"float32_library", "onednn_implementations", "small_products", "expert_paths"})
    if (!record.at(f).empty()) return false;
  return true;
}

}  // namespace

TEST(KernelChoices, RecordRoundTripsAndPinnedChoicesAreNotTimedAgain) {
  emoe::forget_kernel_choices();
  ASSERT_TRUE(all_empty(emoe::kernel_choices_json()));
  const auto setting = emoe::set_float32_gemm(emoe::Float32Gemm::kMeasured);
  torch::manual_seed(3);
  // a float32 product past 16M multiply-adds (600 x 300 x 200: 36M): both choices timed
  auto a = torch::randn({600, 300}), b = torch::randn({300, 200});
  const auto want = a.to(torch::kDouble).mm(b.to(torch::kDouble));
  auto out = torch::empty({600, 200});
  emoe::gemm_out(out, a, b);
  const bool onednn = emoe::onednn_matmul_enabled(a);
  auto record = emoe::kernel_choices_json();
  if (onednn) {
    EXPECT_EQ(record["float32_library"].size(), 1u) << record.dump();
    EXPECT_EQ(record["onednn_implementations"].size(), 1u) << record.dump();
    EXPECT_EQ(emoe::float32_gemm_measurements().first, 1);
  }
  // (oneDNN for the product below, whichever library won its timing: a primitive to cache)
  for (auto& entry : record["float32_library"].items()) entry.value() = "onednn";
  // a small product and an expert shape as another run would have chosen them
  record["small_products"]["6,5,64,48,0,0"] = "library";
  record["expert_paths"]["float32,64,16,4,0"] = "library";
  const auto cpu = record["cpu"];
  EXPECT_FALSE(cpu["isa"].get<std::string>().empty());

  emoe::forget_kernel_choices();  // a new process
  ASSERT_TRUE(all_empty(emoe::kernel_choices_json()));
  const auto pin = emoe::pin_kernel_choices(record, "run/kernels.json");
  EXPECT_TRUE(pin.pinned);
  EXPECT_NE(pin.message.find("kernel choices pinned from run/kernels.json"), std::string::npos)
      << pin.message;
  EXPECT_EQ(emoe::kernel_choices_json(), record);
  for (const auto& line : emoe::onednn_implementation_choices())
    EXPECT_NE(line.find("(pinned)"), std::string::npos) << line;
  const auto reports = emoe::expert_path_reports();
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_EQ(reports[0], "4 experts of 16 x 64, float32: library (pinned)");
  EXPECT_EQ(emoe::expert_path({at::kFloat, 64, 16, 4, false}), emoe::ExpertPath::kLibrary);
  EXPECT_EQ(emoe::small_gemm_choices_made().at("6,5,64,48,0,0"), "library");
  // the pinned product again: no timing, the same choices, the right product
  const auto lines = emoe::onednn_implementation_choices().size();
  emoe::gemm_out(out, a, b);
  EXPECT_LE(emoe::test::max_abs_diff(out, want), 1e-4 * (1.0 + want.abs().max().item<double>()));
  EXPECT_EQ(emoe::float32_gemm_measurements().first, 0);
  EXPECT_EQ(emoe::onednn_implementation_choices().size(), lines);
  EXPECT_EQ(emoe::kernel_choices_json(), record);
  // pinned again (a data-parallel rank at each checkpoint): nothing changes, no new lines
  const auto reports_before = emoe::expert_path_reports().size();
  const auto cached = emoe::onednn_primitives_cached();
  EXPECT_TRUE(emoe::pin_kernel_choices(record, "again").pinned);
  EXPECT_EQ(emoe::onednn_implementation_choices().size(), lines);
  EXPECT_EQ(emoe::expert_path_reports().size(), reports_before);
  EXPECT_EQ(emoe::onednn_primitives_cached(), cached);
  if (onednn) {
    // another implementation pinned for a class this process chose: its cached primitives
    // (made with the old choice) go, so that the next product takes the new one
    EXPECT_GT(cached, 0);
    auto other = record;
    auto& impls = other["onednn_implementations"];
    impls[impls.begin().key()] = "another:impl";
    EXPECT_TRUE(emoe::pin_kernel_choices(other, "other").pinned);
    EXPECT_EQ(emoe::onednn_primitives_cached(), 0);
    emoe::gemm_out(out, a, b);  // (an implementation oneDNN does not offer: its first)
    EXPECT_LE(emoe::test::max_abs_diff(out, want), 1e-4 * (1.0 + want.abs().max().item<double>()));
  }
  emoe::set_float32_gemm(setting);
  emoe::forget_kernel_choices();
}

TEST(KernelChoices, ForeignOrMalformedRecordsPinNothing) {
  emoe::forget_kernel_choices();
  auto good = emoe::kernel_choices_json();
  good["float32_library"]["600,300,;300,1,;200,1,;200,1,;-"] = "aten";
  good["small_products"]["6,5,64,48,0,0"] = "library";

  // timed on another CPU: nothing pinned, and the log line says why
  auto foreign = good;
  foreign["cpu"]["model"] = "Another CPU 9000";
  const auto pin = emoe::pin_kernel_choices(foreign, "k.json");
  EXPECT_FALSE(pin.pinned);
  EXPECT_NE(pin.message.find("timed on another CPU (Another CPU 9000"), std::string::npos)
      << pin.message;
  EXPECT_TRUE(all_empty(emoe::kernel_choices_json()));

  auto expect_error = [&](nlohmann::json record, const std::string& text) {
    try {
      emoe::pin_kernel_choices(record, "k.json");
      ADD_FAILURE() << "pinned: " << record.dump();
    } catch (const emoe::InputError& e) {
      const std::string what = e.what();
      EXPECT_EQ(what.rfind("k.json: ", 0), 0u) << what;
      EXPECT_NE(what.find(text), std::string::npos) << what;
    }
    // the valid maps before the bad one were not kept either
    EXPECT_TRUE(all_empty(emoe::kernel_choices_json())) << text;
  };
  auto r = good;
  r.erase("cpu");
  expect_error(r, "'cpu': expected");
  struct Bad {
    const char* field;
    std::string key;
    nlohmann::json value;
    const char* expect;
  };
  const std::vector<Bad> bad = {
      {"float32_library", "k", "blas", "expected aten or onednn, got 'blas'"},
      {"small_products", "1,2", "library",
       "small product '1,2': expected six comma-separated integers"},
      {"small_products", "6,5,64,48,0,123456789012345678901", "library",
       "expected six comma-separated integers"},
      {"small_products", "6,5,64,48,0,0", "fast",
       "expected kernels, library or widening, got 'fast'"},
      {"expert_paths", "float32,64,16,4,0", "warp",
       "'warp' is not a path this CPU has for float32"},
      {"expert_paths", "float16,64,16,4,0", "library",
       "experts 'float16,64,16,4,0': expected float32|bfloat16"},
      {"onednn_implementations", "f32 class", 3,
       "'onednn_implementations.f32 class': expected a string, got 3"}};
  for (const auto& b : bad) {
    r = good;
    r[b.field][b.key] = b.value;
    expect_error(r, b.expect);
  }
  r = good;
  r["expert_paths"] = nlohmann::json::array();
  expect_error(r, "'expert_paths': expected an object of strings");
}
