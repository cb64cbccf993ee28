// Golden tests: tiny BERT models against Hugging Face transformers' outputs.
#include "emoe/io/safetensors.h"
#include "emoe/models/loader.h"
#include "support/test_support.h"

using emoe::test::max_abs_diff;

TEST(BertGolden, BaseModelHiddenStatesPoolerAttentions) {
  EMOE_REQUIRE_SHARED(dir, "fixtures/tiny/bert_model");
  auto fx = emoe::test::load_fixture(dir + "/fixture.safetensors");
  auto model = emoe::test::load_test_model(dir);
  EXPECT_EQ(model->summary().head, emoe::Head::kBase);
  emoe::ModelInputs in;
  in.input_ids = fx["input_ids"];
  in.attention_mask = fx["attention_mask"];
  in.token_type_ids = fx["token_type_ids"];
  in.output_hidden_states = true;
  in.output_attentions = true;
  auto out = model->forward(in);
  ASSERT_EQ(out.hidden_states.size(), 3u);
  auto hs = torch::stack(out.hidden_states);
  EXPECT_LT(max_abs_diff(hs, fx["hidden_states"]), emoe::test::kGoldenTol);
  EXPECT_LT(max_abs_diff(out.last_hidden_state, fx["last_hidden_state"]), emoe::test::kGoldenTol);
  EXPECT_LT(max_abs_diff(out.pooler_output, fx["pooler_output"]), emoe::test::kGoldenTol);
  EXPECT_LT(max_abs_diff(torch::stack(out.attentions), fx["attentions"]), emoe::test::kGoldenTol);
}

TEST(BertGolden, SequenceClassificationLogitsAndLoss) {
  EMOE_REQUIRE_SHARED(dir, "fixtures/tiny/bert_seqcls");
  auto fx = emoe::test::load_fixture(dir + "/fixture.safetensors");
  auto model = emoe::test::load_test_model(dir);
  EXPECT_EQ(model->summary().head, emoe::Head::kSequenceClassification);
  EXPECT_EQ(model->summary().num_labels, 3);
  emoe::ModelInputs in;
  in.input_ids = fx["input_ids"];
  in.attention_mask = fx["attention_mask"];
  in.token_type_ids = fx["token_type_ids"];
  in.labels = fx["labels"];
  in.output_hidden_states = true;
  auto out = model->forward(in);
  EXPECT_LT(max_abs_diff(out.logits, fx["logits"]), emoe::test::kGoldenTol);
  EXPECT_LT(max_abs_diff(out.loss, fx["loss"]), emoe::test::kGoldenTol);
  EXPECT_LT(max_abs_diff(torch::stack(out.hidden_states), fx["hidden_states"]),
            emoe::test::kGoldenTol);
}

TEST(BertGolden, BertMiniMaskedLm) {
  EMOE_REQUIRE_SHARED(dir, "models/bert-mini");
  EMOE_REQUIRE_SHARED(fxdir, "fixtures/bert-mini");
  auto fx = emoe::test::load_fixture(fxdir + "/fixture.safetensors");
  auto model = emoe::test::load_test_model(dir);
  EXPECT_EQ(model->summary().head, emoe::Head::kMaskedLM);
  emoe::ModelInputs in;
  in.input_ids = fx["input_ids"];
  in.attention_mask = fx["attention_mask"];
  in.token_type_ids = fx["token_type_ids"];
  in.output_hidden_states = true;
  auto out = model->forward(in);
  auto m = fx["attention_mask"];
  EXPECT_LT(emoe::test::max_abs_diff_masked(out.logits, fx["logits"], m), emoe::test::kGoldenTol);
  auto hs = torch::stack(out.hidden_states);
  for (int64_t l = 0; l < hs.size(0); ++l)
    EXPECT_LT(emoe::test::max_abs_diff_masked(hs[l], fx["hidden_states"][l], m),
              emoe::test::kGoldenTol)
        << "layer " << l;

  emoe::ModelInputs pair;
  pair.input_ids = fx["pair.input_ids"];
  pair.attention_mask = fx["pair.attention_mask"];
  pair.token_type_ids = fx["pair.token_type_ids"];
  auto pout = model->forward(pair);
  EXPECT_LT(max_abs_diff(pout.logits, fx["pair.logits"]), emoe::test::kGoldenTol);
}

TEST(RobertaGolden, SequenceClassificationWithPositionsFromTheInputIds) {
  EMOE_REQUIRE_SHARED(dir, "fixtures/tiny/roberta_seqcls");
  auto fx = emoe::test::load_fixture(dir + "/fixture.safetensors");
  auto model = emoe::test::load_test_model(dir);
  EXPECT_EQ(model->summary().model_type, "roberta");
  EXPECT_EQ(model->summary().head, emoe::Head::kSequenceClassification);
  EXPECT_FALSE(model->named_parameters().contains("roberta.pooler.dense.weight"));
  for (std::string side : {"", "left."}) {
    SCOPED_TRACE(side.empty() ? "right" : "left");
    emoe::ModelInputs in;  // no position_ids: derived from the ids as Hugging Face does
    in.input_ids = fx[side + "input_ids"];
    in.attention_mask = fx[side + "attention_mask"];
    in.labels = fx["labels"];
    in.output_hidden_states = true;
    auto out = model->forward(in);
    ASSERT_EQ(out.hidden_states.size(), 3u);
    for (size_t l = 0; l < out.hidden_states.size(); ++l)
      EXPECT_LT(max_abs_diff(out.hidden_states[l], fx[side + "hidden_states"][l]),
                emoe::test::kGoldenTol)
          << "hidden " << l;
    EXPECT_LT(max_abs_diff(out.logits, fx[side + "logits"]), emoe::test::kGoldenTol);
    EXPECT_LT(max_abs_diff(out.loss, fx[side + "loss"]), emoe::test::kGoldenTol);
  }
  // a round trip through our writer keeps Hugging Face's keys (no pooler, classifier.out_proj)
  emoe::test::TempDir tmp;
  emoe::save_model(*model, tmp.path());
  auto again = emoe::load_model(tmp.path());
  emoe::ModelInputs in;
  in.input_ids = fx["input_ids"];
  in.attention_mask = fx["attention_mask"];
  EXPECT_LT(max_abs_diff(again->forward(in).logits, fx["logits"]), emoe::test::kGoldenTol);
}
