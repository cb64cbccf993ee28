// Golden tests: tiny GPT-2 and Llama models against Hugging Face transformers' outputs.
#include "emoe/io/safetensors.h"
#include "emoe/models/generate.h"
#include "emoe/models/loader.h"
#include "support/test_support.h"

using emoe::test::max_abs_diff;
using emoe::test::max_abs_diff_masked;

namespace {

// right.* and left.* logits, hidden states and losses of a causal LM fixture.
void check_lm_fixture(const std::string& dir) {
  auto fx = emoe::test::load_fixture(dir + "/fixture.safetensors");
  auto model = emoe::test::load_test_model(dir);
  ASSERT_EQ(model->summary().head, emoe::Head::kCausalLM);
  for (std::string side : {"right", "left"}) {
    SCOPED_TRACE(side);
    emoe::ModelInputs in;
    in.input_ids = fx[side + ".input_ids"];
    in.attention_mask = fx[side + ".attention_mask"];
    if (fx.count(side + ".position_ids")) in.position_ids = fx[side + ".position_ids"];
    in.labels = fx[side + ".labels_masked"];
    in.output_hidden_states = true;
    auto out = model->forward(in);
    auto m = fx[side + ".attention_mask"];
    EXPECT_LT(max_abs_diff_masked(out.logits, fx[side + ".logits"], m), emoe::test::kGoldenTol);
    auto hs = torch::stack(out.hidden_states);
    for (int64_t l = 0; l < hs.size(0); ++l)
      EXPECT_LT(max_abs_diff_masked(hs[l], fx[side + ".hidden_states"][l], m), emoe::test::kGoldenTol) << "hidden " << l;
    EXPECT_LT(max_abs_diff(out.loss, fx[side + ".loss_masked"]), emoe::test::kGoldenTol);
    if (side == "right") {
      in.labels = fx["right.input_ids"];
      EXPECT_LT(max_abs_diff(model->forward(in).loss, fx["right.loss"]), emoe::test::kGoldenTol);
      // right padding: every position is well defined
      EXPECT_LT(max_abs_diff(out.logits, fx["right.logits"]), emoe::test::kGoldenTol);
    }
  }
  // training's loss-only head (chunked, without logits): the same loss and the same gradients
  {
    emoe::ModelInputs in;
    in.input_ids = fx["right.input_ids"];
    in.attention_mask = fx["right.attention_mask"];
    in.labels = fx["right.labels_masked"];
    auto ref = model->forward(in);
    ref.loss.backward();
    std::vector<torch::Tensor> ref_grads;
    for (auto& p : model->parameters()) {
      ref_grads.push_back(p.grad().defined() ? p.grad().clone() : torch::Tensor());
      p.mutable_grad() = torch::Tensor();
    }
    in.output_logits = false;
    auto out = model->forward(in);
    EXPECT_FALSE(out.logits.defined());
    EXPECT_LT(max_abs_diff(out.loss, ref.loss), 1e-5);
    out.loss.backward();
    auto params = model->parameters();
    for (size_t i = 0; i < params.size(); ++i) {
      ASSERT_EQ(params[i].grad().defined(), ref_grads[i].defined()) << i;
      if (ref_grads[i].defined()) EXPECT_LT(max_abs_diff(params[i].grad(), ref_grads[i]), 1e-5) << "parameter " << i;
      params[i].mutable_grad() = torch::Tensor();
    }
  }
  // greedy generation, single prompt and a left-padded batch
  auto eos = model->summary().eos_token_id;
  emoe::GenerateOptions g;
  if (eos) g.eos_ids = {*eos};
  g.pad_id = model->summary().pad_token_id;
  auto prompt = fx["gen.prompt"];
  g.max_new_tokens = fx["gen.output_ids"].size(1) - prompt.size(1);
  auto ids = emoe::generate(*model, prompt, {}, g);
  EXPECT_TRUE(torch::equal(ids, fx["gen.output_ids"])) << ids << fx["gen.output_ids"];
  auto bp = fx["gen_batch_left.input_ids"];
  g.max_new_tokens = fx["gen_batch_left.output_ids"].size(1) - bp.size(1);
  auto bids = emoe::generate(*model, bp, fx["gen_batch_left.attention_mask"], g);
  EXPECT_TRUE(torch::equal(bids, fx["gen_batch_left.output_ids"])) << bids << fx["gen_batch_left.output_ids"];
  // without the KV cache the same tokens come out
  g.use_cache = false;
  auto nocache = emoe::generate(*model, bp, fx["gen_batch_left.attention_mask"], g);
  EXPECT_TRUE(torch::equal(nocache, bids));
}
}  // namespace

TEST(Gpt2Golden, LmLogitsHiddenLossGeneration) {
  EMOE_REQUIRE_SHARED(dir, "fixtures/tiny/gpt2_lm");
  check_lm_fixture(dir);
}

TEST(LlamaGolden, LmLogitsHiddenLossGeneration) {
  EMOE_REQUIRE_SHARED(dir, "fixtures/tiny/llama_lm");
  check_lm_fixture(dir);
}

TEST(Gpt2Golden, SequenceClassificationPoolsLastRealToken) {
  EMOE_REQUIRE_SHARED(dir, "fixtures/tiny/gpt2_seqcls");
  auto fx = emoe::test::load_fixture(dir + "/fixture.safetensors");
  auto model = emoe::test::load_test_model(dir);
  ASSERT_EQ(model->summary().head, emoe::Head::kSequenceClassification);
  for (std::string side : {"right", "left"}) {
    SCOPED_TRACE(side);
    emoe::ModelInputs in;
    in.input_ids = fx[side + ".input_ids"];
    in.attention_mask = fx[side + ".attention_mask"];
    if (fx.count(side + ".position_ids")) in.position_ids = fx[side + ".position_ids"];
    in.labels = fx["labels"];
    auto out = model->forward(in);
    EXPECT_LT(max_abs_diff(out.logits, fx[side + ".logits"]), emoe::test::kGoldenTol);
    EXPECT_LT(max_abs_diff(out.loss, fx[side + ".loss"]), emoe::test::kGoldenTol);
  }
}
