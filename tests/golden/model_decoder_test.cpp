// Golden tests: tiny GPT-2, Llama, Qwen2, Qwen3, Mistral and Llama 3 models against Hugging Face
// transformers' outputs.
#include <filesystem>
#include <fstream>
#include <functional>

#include "emoe/io/safetensors.h"
#include "emoe/models/generate.h"
#include "emoe/models/llama.h"
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
      EXPECT_LT(max_abs_diff_masked(hs[l], fx[side + ".hidden_states"][l], m),
                emoe::test::kGoldenTol)
          << "hidden " << l;
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
      if (ref_grads[i].defined())
        EXPECT_LT(max_abs_diff(params[i].grad(), ref_grads[i]), 1e-5) << "parameter " << i;
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
  EXPECT_TRUE(torch::equal(bids, fx["gen_batch_left.output_ids"]))
      << bids << fx["gen_batch_left.output_ids"];
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

// --- The Llama family's relatives (issue 24): Qwen2, Qwen3, Mistral, Llama 3 RoPE scaling ------

namespace {

// The RoPE inverse frequencies the model uses, against the fixture's rope.inv_freq.
void check_inv_freq(const std::string& dir, emoe::LlamaFamily family) {
  auto fx = emoe::test::load_fixture(dir + "/fixture.safetensors");
  auto cfg = emoe::LlamaConfig::from_json(emoe::read_model_config(dir), family);
  auto inv = cfg.inv_freq(/*max_position=*/0, torch::kCPU);
  EXPECT_LT(max_abs_diff(inv, fx["rope.inv_freq"]), 1e-6) << inv << fx["rope.inv_freq"];
}

}  // namespace

TEST(Qwen2Golden, LmLogitsHiddenLossGeneration) {
  EMOE_REQUIRE_SHARED(dir, "fixtures/tiny/qwen2_lm");
  auto model = emoe::test::load_test_model(dir);
  EXPECT_EQ(model->summary().model_type, "qwen2");
  auto params = model->named_parameters();
  EXPECT_TRUE(params.contains("model.layers.0.self_attn.k_proj.bias"));
  EXPECT_FALSE(params.contains("model.layers.0.self_attn.o_proj.bias"));
  EXPECT_FALSE(params.contains("lm_head.weight")) << "tied to embed_tokens";
  check_inv_freq(dir, emoe::LlamaFamily::kQwen2);
  check_lm_fixture(dir);
}

TEST(Qwen3Golden, LmLogitsHiddenLossGeneration) {
  EMOE_REQUIRE_SHARED(dir, "fixtures/tiny/qwen3_lm");
  auto model = emoe::test::load_test_model(dir);
  EXPECT_EQ(model->summary().model_type, "qwen3");
  auto params = model->named_parameters();
  EXPECT_EQ(params["model.layers.0.self_attn.q_proj.weight"].sizes(), (at::IntArrayRef{64, 32}));
  EXPECT_EQ(params["model.layers.1.self_attn.k_norm.weight"].sizes(), (at::IntArrayRef{16}));
  check_inv_freq(dir, emoe::LlamaFamily::kQwen3);
  check_lm_fixture(dir);
}

TEST(MistralGolden, LmLogitsHiddenLossGeneration) {
  EMOE_REQUIRE_SHARED(dir, "fixtures/tiny/mistral_lm");
  EXPECT_EQ(emoe::test::load_test_model(dir)->summary().model_type, "mistral");
  check_inv_freq(dir, emoe::LlamaFamily::kMistral);
  check_lm_fixture(dir);
}

TEST(Llama3Golden, RopeScalingLogitsBeyondTheOriginalLength) {
  EMOE_REQUIRE_SHARED(dir, "fixtures/tiny/llama3_lm");
  check_inv_freq(dir, emoe::LlamaFamily::kLlama);
  check_lm_fixture(dir);
  // long.*: 24 positions, beyond original_max_position_embeddings 16, right-padded
  auto fx = emoe::test::load_fixture(dir + "/fixture.safetensors");
  auto model = emoe::test::load_test_model(dir);
  emoe::ModelInputs in;
  in.input_ids = fx["long.input_ids"];
  in.attention_mask = fx["long.attention_mask"];
  in.labels = fx["long.labels_masked"];
  auto out = model->forward(in);
  EXPECT_LT(max_abs_diff(out.logits, fx["long.logits"]), emoe::test::kGoldenTol);
  EXPECT_LT(max_abs_diff(out.loss, fx["long.loss_masked"]), emoe::test::kGoldenTol);
}

namespace {

// A fixture's model with config.json edited (same weights), on the CPU.
emoe::ModelPtr model_with(const std::string& dir, const emoe::test::TempDir& tmp,
                          const std::function<void(nlohmann::json&)>& edit) {
  auto j = nlohmann::json::parse(std::ifstream(dir + "/config.json"));
  edit(j);
  std::ofstream(tmp.file("config.json")) << j.dump();
  std::filesystem::copy_file(dir + "/model.safetensors", tmp.file("model.safetensors"),
                             std::filesystem::copy_options::overwrite_existing);
  return emoe::load_model(tmp.path());
}

}  // namespace

TEST(MistralGolden, SlidingWindowSeesOnlyTheLastWindowPositions) {
  EMOE_REQUIRE_SHARED(dir, "fixtures/tiny/mistral_lm");
  emoe::test::TempDir tmp;
  auto fx = emoe::test::load_fixture(dir + "/fixture.safetensors");
  auto ids = fx["right.input_ids"].narrow(0, 0, 1);  // one row of 10 real tokens
  auto logits = [&](const emoe::ModelPtr& m, const torch::Tensor& x) {
    emoe::ModelInputs in;
    in.input_ids = x;
    return m->forward(in).logits;
  };
  auto full = model_with(dir, tmp, [](auto&) {});
  // a window as long as the sequence changes nothing
  auto wide = model_with(dir, tmp, [](auto& j) { j["sliding_window"] = 10; });
  EXPECT_LT(max_abs_diff(logits(full, ids), logits(wide, ids)), 1e-6);
  // window 3, 2 layers: position p depends on tokens p-4..p only; changing token 0 leaves
  // positions 5.. unchanged and changes position 4 (and the unwindowed model everywhere)
  auto narrow = model_with(dir, tmp, [](auto& j) { j["sliding_window"] = 3; });
  auto changed = ids.clone();
  changed[0][0] = (ids[0][0].item<int64_t>() + 1) % 100;
  auto a = logits(narrow, ids), b = logits(narrow, changed);
  EXPECT_LT(max_abs_diff(a.narrow(1, 5, 5), b.narrow(1, 5, 5)), 1e-6);
  EXPECT_GT(max_abs_diff(a.narrow(1, 4, 1), b.narrow(1, 4, 1)), 1e-6);
  EXPECT_GT(max_abs_diff(logits(full, ids).narrow(1, 9, 1), logits(full, changed).narrow(1, 9, 1)),
            1e-6);
  EXPECT_GT(max_abs_diff(a, logits(full, ids)), 1e-6);
  // incremental decoding with the KV cache sees the same window as the full forward
  emoe::GenerateOptions g;
  g.max_new_tokens = 6;
  auto cached = emoe::generate(*narrow, ids.narrow(1, 0, 4), {}, g);
  g.use_cache = false;
  EXPECT_TRUE(torch::equal(cached, emoe::generate(*narrow, ids.narrow(1, 0, 4), {}, g)));
}

TEST(Qwen2Golden, SlidingWindowFromMaxWindowLayersOn) {
  EMOE_REQUIRE_SHARED(dir, "fixtures/tiny/qwen2_lm");
  emoe::test::TempDir tmp;
  auto ids = emoe::test::load_fixture(dir + "/fixture.safetensors")["right.input_ids"];
  auto logits = [&](const emoe::ModelPtr& m) {
    emoe::ModelInputs in;
    in.input_ids = ids.narrow(0, 0, 1);
    return m->forward(in).logits;
  };
  auto plain = logits(model_with(dir, tmp, [](auto&) {}));
  auto windowed = [&](bool use, int64_t from_layer) {
    return logits(model_with(dir, tmp, [&](auto& j) {
      j["use_sliding_window"] = use;
      j["sliding_window"] = 3;
      j["max_window_layers"] = from_layer;
    }));
  };
  // use_sliding_window false, or every layer below max_window_layers: full attention
  EXPECT_LT(max_abs_diff(windowed(false, 0), plain), 1e-6);
  EXPECT_LT(max_abs_diff(windowed(true, 2), plain), 1e-6);
  // from layer 1 on, or every layer: windowed, and not the same
  auto one = windowed(true, 1), both = windowed(true, 0);
  EXPECT_GT(max_abs_diff(one, plain), 1e-6);
  EXPECT_GT(max_abs_diff(both, one), 1e-6);
}
