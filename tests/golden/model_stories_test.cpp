// Golden tests: the real stories260K Llama against Hugging Face and llama2.c's run.c.
#include <fstream>
#include <sstream>

#include "emoe/io/safetensors.h"
#include "emoe/models/generate.h"
#include "emoe/models/loader.h"
#include "support/test_support.h"

using emoe::test::max_abs_diff;

TEST(StoriesGolden, LogitsAtAll200Positions) {
  EMOE_REQUIRE_SHARED(dir, "models/stories260K/hf");
  EMOE_REQUIRE_SHARED(fxdir, "fixtures/stories260K");
  auto fx = emoe::test::load_fixture(fxdir + "/fixture.safetensors");
  auto model = emoe::test::load_test_model(dir);
  emoe::ModelInputs in;
  in.input_ids = fx["bos200.input_ids"];
  auto out = model->forward(in);
  EXPECT_LT(max_abs_diff(out.logits, fx["bos200.logits"]), 1e-4);
  EXPECT_LT(max_abs_diff(out.logits, fx["bos200.run_c_logits"]), 1e-4);
  EXPECT_TRUE(torch::equal(out.logits.argmax(-1), fx["bos200.greedy_next_ids"]));
}

TEST(StoriesGolden, GreedyFromBosReproducesRunC) {
  EMOE_REQUIRE_SHARED(dir, "models/stories260K/hf");
  EMOE_REQUIRE_SHARED(fxdir, "fixtures/stories260K");
  auto fx = emoe::test::load_fixture(fxdir + "/fixture.safetensors");
  auto model = emoe::test::load_test_model(dir);
  emoe::GenerateOptions g;
  g.max_new_tokens = 200;  // as run.c -n 200; HF's reference ran with no eos
  auto ids = emoe::generate(*model, torch::tensor({{1L}}).to(emoe::test::test_device()), {}, g);
  ASSERT_EQ(ids.size(1), 201);
  EXPECT_TRUE(torch::equal(ids.narrow(1, 1, 200), fx["bos200.greedy_next_ids"]));
}

TEST(StoriesGolden, FivePromptsLogitsAndContinuations) {
  EMOE_REQUIRE_SHARED(dir, "models/stories260K/hf");
  EMOE_REQUIRE_SHARED(fxdir, "fixtures/stories260K");
  auto fx = emoe::test::load_fixture(fxdir + "/fixture.safetensors");
  auto model = emoe::test::load_test_model(dir);
  for (int i = 0; i < 5; ++i) {
    SCOPED_TRACE(i);
    std::string p = "p" + std::to_string(i);
    emoe::ModelInputs in;
    in.input_ids = fx[p + ".input_ids"];
    EXPECT_LT(max_abs_diff(model->forward(in).logits, fx[p + ".logits"]), 1e-4);
    emoe::GenerateOptions g;
    g.max_new_tokens = fx[p + ".greedy_ids"].size(1);
    auto ids = emoe::generate(*model, fx[p + ".input_ids"], {}, g);
    auto cont = ids.narrow(1, fx[p + ".input_ids"].size(1), g.max_new_tokens);
    EXPECT_TRUE(torch::equal(cont, fx[p + ".greedy_ids"]));
  }
  // all five left-padded in one batch
  emoe::ModelInputs in;
  in.input_ids = fx["batch_left.input_ids"];
  in.attention_mask = fx["batch_left.attention_mask"];
  in.position_ids = fx["batch_left.position_ids"];
  auto m = fx["batch_left.attention_mask"];
  EXPECT_LT(emoe::test::max_abs_diff_masked(model->forward(in).logits, fx["batch_left.logits"], m),
            1e-4);
  emoe::GenerateOptions g;
  g.max_new_tokens = fx["batch_left.generated_ids"].size(1) - in.input_ids.size(1);
  auto ids = emoe::generate(*model, in.input_ids, m, g);
  EXPECT_TRUE(torch::equal(ids, fx["batch_left.generated_ids"]));
}
