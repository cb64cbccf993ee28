// `emoe forward` and `emoe generate` on a T5 model folder.
#include <filesystem>
#include <fstream>

#include "emoe/io/safetensors.h"
#include "emoe/models/generate.h"
#include "emoe/models/loader.h"
#include "support/test_support.h"

using emoe::test::run_emoe;

namespace {

// An error naming `fragment` on stderr, and exit code 2.
void t5_expect_usage_error(const emoe::test::CommandResult& r, const std::string& fragment) {
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find(fragment), std::string::npos) << r.err;
}

}  // namespace

TEST(T5Cli, ForwardTakesDecoderInputIdsAndWritesDecoderLogits) {
  EMOE_REQUIRE_SHARED(dir, "fixtures/tiny/t5_cg");
  emoe::test::TempDir tmp;
  auto fx = emoe::load_safetensors(dir + "/fixture.safetensors");
  emoe::save_safetensors(tmp.file("in.safetensors"),
                         {{"input_ids", fx["input_ids"]},
                          {"attention_mask", fx["attention_mask"]},
                          {"decoder_input_ids", fx["decoder_input_ids"]}});
  auto r = run_emoe("forward " + dir + " -i " + tmp.file("in.safetensors") + " -o " +
                    tmp.file("out.safetensors"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto out = emoe::load_safetensors(tmp.file("out.safetensors"));
  EXPECT_LT(emoe::test::max_abs_diff(out["logits"], fx["logits"]), emoe::test::kGoldenTol);
  EXPECT_LT(
      emoe::test::max_abs_diff(out["encoder_last_hidden_state"], fx["encoder_last_hidden_state"]),
      emoe::test::kGoldenTol);
  EXPECT_LT(emoe::test::max_abs_diff(out["decoder_hidden_states"], fx["decoder_hidden_states"]),
            emoe::test::kGoldenTol);
  EXPECT_LT(emoe::test::max_abs_diff(out["encoder_hidden_states"], fx["encoder_hidden_states"]),
            emoe::test::kGoldenTol);
  EXPECT_EQ(out.count("loss"), 0u);

  // labels alone: decoder_input_ids are the labels shifted right, and the loss is written
  emoe::save_safetensors(tmp.file("labels.safetensors"), {{"input_ids", fx["input_ids"]},
                                                          {"attention_mask", fx["attention_mask"]},
                                                          {"labels", fx["labels"]}});
  r = run_emoe("forward " + dir + " -i " + tmp.file("labels.safetensors") + " -o " +
               tmp.file("l.safetensors") + " --no-hidden-states --attentions");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto lo = emoe::load_safetensors(tmp.file("l.safetensors"));
  EXPECT_LT(emoe::test::max_abs_diff(lo["logits"], fx["logits"]), emoe::test::kGoldenTol);
  EXPECT_LT(emoe::test::max_abs_diff(lo["loss"], fx["loss"]), emoe::test::kGoldenTol);
  EXPECT_LT(emoe::test::max_abs_diff(lo["cross_attentions"], fx["cross_attentions"]),
            emoe::test::kGoldenTol);
  EXPECT_LT(emoe::test::max_abs_diff(lo["decoder_attentions"], fx["decoder_attentions"]),
            emoe::test::kGoldenTol);
  EXPECT_EQ(lo.count("decoder_hidden_states"), 0u);
}

TEST(T5Cli, ForwardRefusesMissingOrMisplacedDecoderIds) {
  EMOE_REQUIRE_SHARED(dir, "fixtures/tiny/t5_cg");
  emoe::test::TempDir tmp;
  auto fx = emoe::load_safetensors(dir + "/fixture.safetensors");
  emoe::save_safetensors(tmp.file("enc.safetensors"), {{"input_ids", fx["input_ids"]}});
  auto r =
      run_emoe("forward " + dir + " -i " + tmp.file("enc.safetensors") + " -o " + tmp.file("o"));
  t5_expect_usage_error(r, "needs tensor 'decoder_input_ids'");
  EXPECT_FALSE(std::filesystem::exists(tmp.file("o")));
  auto bad = fx["decoder_input_ids"].clone();
  bad[0][1] = 100;
  emoe::save_safetensors(tmp.file("big.safetensors"),
                         {{"input_ids", fx["input_ids"]}, {"decoder_input_ids", bad}});
  t5_expect_usage_error(
      run_emoe("forward " + dir + " -i " + tmp.file("big.safetensors") + " -o " + tmp.file("o")),
      "tensor 'decoder_input_ids': ids must lie in [0, 100), found 0..100");
  EMOE_REQUIRE_SHARED(gpt2, "fixtures/tiny/gpt2_lm");
  emoe::save_safetensors(
      tmp.file("dec.safetensors"),
      {{"input_ids", fx["input_ids"]}, {"decoder_input_ids", fx["decoder_input_ids"]}});
  t5_expect_usage_error(
      run_emoe("forward " + gpt2 + " -i " + tmp.file("dec.safetensors") + " -o " + tmp.file("o")),
      "'decoder_input_ids' is for encoder-decoder models; this is a gpt2 model");
}

TEST(T5Cli, GeneratePrintsTheDecodedOutputOfTheLibraryGeneration) {
  EMOE_REQUIRE_SHARED(dir, "fixtures/tiny/t5_v11_cg");
  // the fixture has no tokenizer: a 100-token WordPiece vocabulary whose [SEP] is T5's eos (1)
  emoe::test::TempDir tmp;
  for (const char* f : {"config.json", "model.safetensors", "generation_config.json"})
    std::filesystem::copy_file(dir + "/" + f, tmp.file(f));
  {
    std::ofstream v(tmp.file("vocab.txt"));
    v << "[PAD]\n[SEP]\n[UNK]\n[CLS]\n";
    for (int i = 4; i < 100; ++i) v << "w" << i << "\n";
  }
  // and one more special token, a word these beams produce
  std::ofstream(tmp.file("special_tokens_map.json")) << R"({"additional_special_tokens": ["w11"]})";
  // the same ids through the library: [CLS] w5 w6 w7 [SEP] (a prompt where beams change the output)
  auto model = emoe::load_model(dir);
  auto expected_text = [&](int64_t beams, bool special = false) {
    emoe::GenerateOptions o;
    o.max_new_tokens = 8;
    o.eos_ids = {1};
    o.pad_id = 0;
    o.num_beams = beams;
    auto prompt = torch::tensor({3, 5, 6, 7, 1}, torch::kLong).unsqueeze(0);
    auto ids = emoe::generate_seq2seq(*model, prompt, {}, o);
    std::string text;
    for (int64_t i = 1; i < ids.size(1); ++i) {
      int64_t t = ids[0][i].item<int64_t>();
      static const char* kNames[] = {"[PAD]", "[SEP]", "[UNK]", "[CLS]"};
      if ((t < 4 || t == 11) && !special) continue;  // special tokens are skipped when decoding
      text +=
          (text.empty() ? "" : " ") + (t < 4 ? std::string(kNames[t]) : "w" + std::to_string(t));
    }
    return text + "\n";
  };
  auto r = run_emoe("generate " + tmp.path() + " --prompt 'w5 w6 w7' -n 8 -q");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, expected_text(1));
  r = run_emoe("generate " + tmp.path() + " --prompt 'w5 w6 w7' -n 8 --num-beams 3 -q");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, expected_text(3));
  EXPECT_NE(expected_text(3), expected_text(1));
  // --show-special keeps them (T5's sentinels and eos)
  r = run_emoe("generate " + tmp.path() +
               " --prompt 'w5 w6 w7' -n 8 --num-beams 3 --show-special -q");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, expected_text(3, true));
  EXPECT_NE(r.out, expected_text(3));
  // no prompt: T5 has nothing to encode
  t5_expect_usage_error(run_emoe("generate " + tmp.path() + " -n 2 -q"),
                        "needs input text for its encoder");
}
