// Pretraining: the WordPiece vocabulary trainer, the demo's synthetic data, the pretraining
// config, T5 span corruption and short pretraining runs of BERT (masked LM), Llama / GPT-2
// (causal LM) and T5.
#include "emoe/train/pretrain.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <set>

#include "emoe/core/error.h"
#include "emoe/data/synthetic.h"
#include "emoe/models/loader.h"
#include "emoe/tokenizer/tokenizer.h"
#include "emoe/tokenizer/wordpiece_trainer.h"
#include "support/test_support.h"

namespace fs = std::filesystem;

TEST(WordPieceTrainer, SpecialsThenCharactersThenFrequentWords) {
  emoe::WordPieceTrainerOptions o;
  o.vocab_size = 100;
  o.min_frequency = 2;
  auto v = emoe::train_wordpiece_vocab({"The cat sat.", "the cat ran", "a dog"}, o);
  ASSERT_GE(v.size(), 5u);
  EXPECT_EQ(std::vector<std::string>(v.begin(), v.begin() + 5),
            (std::vector<std::string>{"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"}));
  std::set<std::string> s(v.begin(), v.end());
  EXPECT_EQ(s.size(), v.size()) << "duplicates";
  for (const char* t : {"t", "##t", "c", "##c", ".", "the", "cat"}) EXPECT_TRUE(s.count(t)) << t;
  // lower-cased; words seen once are left to the characters
  for (const char* t : {"The", "sat", "dog"}) EXPECT_FALSE(s.count(t)) << t;
  // the size limit holds, and a limit below the characters is refused
  o.vocab_size = static_cast<int64_t>(v.size()) - 1;
  EXPECT_EQ(static_cast<int64_t>(
                emoe::train_wordpiece_vocab({"The cat sat.", "the cat ran", "a dog"}, o).size()),
            o.vocab_size);
  o.vocab_size = 6;
  EXPECT_THROW(emoe::train_wordpiece_vocab({"abc"}, o), emoe::UsageError);
}

TEST(SyntheticReviews, DeterministicTwoDomainsBothLabels) {
  emoe::SyntheticOptions o;
  o.corpus_sentences = 200, o.train = 300, o.dev = 50, o.ood = 300;
  auto a = emoe::make_synthetic_reviews(o);
  auto b = emoe::make_synthetic_reviews(o);
  ASSERT_EQ(a.train.size(), 300u);
  ASSERT_EQ(a.ood.size(), 300u);
  for (size_t i = 0; i < a.train.size(); ++i) EXPECT_EQ(a.train[i].text, b.train[i].text);
  o.seed = 1;
  EXPECT_NE(
      emoe::make_synthetic_reviews(o).train[0].text + emoe::make_synthetic_reviews(o).train[1].text,
      a.train[0].text + a.train[1].text);
  // the domains differ: film words never appear out of domain, restaurant words never in domain
  auto count = [](const std::vector<emoe::SyntheticReview>& v, const std::string& w) {
    int n = 0;
    for (const auto& r : v) n += r.text.find(w) != std::string::npos;
    return n;
  };
  EXPECT_GT(count(a.train, "the film"), 0);
  EXPECT_EQ(count(a.ood, "the film"), 0);
  EXPECT_GT(count(a.ood, "the food"), 0);
  EXPECT_EQ(count(a.train, "the food"), 0);
  int pos = 0;
  for (const auto& r : a.train) pos += r.label == 1;
  EXPECT_GT(pos, 100);
  EXPECT_LT(pos, 200);
  // files
  emoe::test::TempDir tmp;
  emoe::write_synthetic_reviews(a, tmp.file("d"));
  std::ifstream in(tmp.file("d/train.tsv"));
  std::string header;
  std::getline(in, header);
  EXPECT_EQ(header, "sentence\tlabel");
  for (const char* f : {"corpus.txt", "dev.tsv", "ood.tsv"})
    EXPECT_TRUE(fs::exists(tmp.file(std::string("d/") + f)));
}

TEST(PretrainConfig, ErrorsNameTheKey) {
  auto msg = [](const std::vector<std::string>& sets) {
    try {
      emoe::load_pretrain_config("", sets);
    } catch (const emoe::InputError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(msg({"corpus=x", "hiden=3"}).find("unknown key 'hiden'"), std::string::npos);
  EXPECT_NE(msg({"corpus=x", "arch=xlnet"})
                .find("arch: expected bert, gpt2, llama, t5, mistral, qwen2, qwen3 or roberta"),
            std::string::npos);
  EXPECT_NE(msg({}).find("corpus: required"), std::string::npos);
  EXPECT_NE(msg({"corpus=x", "hidden=30", "heads=4"}).find("not a multiple of heads"),
            std::string::npos);
  EXPECT_NE(msg({"corpus=x", "steps=abc"}).find("steps"), std::string::npos);
  EXPECT_NE(msg({"corpus=x", "arch=gpt2"}).find("give a tokenizer folder"), std::string::npos);
  EXPECT_NE(msg({"corpus=x", "max_length=500"}).find("max_length"), std::string::npos);
  EXPECT_NE(msg({"corpus=x", "steps=0"}).find("steps: expected >= 1 (0 only to measure"),
            std::string::npos);
  EXPECT_NE(msg({"corpus=x", "precision=fp16"}).find("precision: expected fp32 or bf16-mixed"),
            std::string::npos);
}

namespace {
emoe::PretrainConfig tiny_pretrain(const std::string& corpus, const std::string& out) {
  emoe::PretrainConfig c;
  c.corpus = corpus;
  c.output = out;
  c.hidden = 32, c.layers = 2, c.heads = 2, c.intermediate = 64, c.max_positions = 64;
  c.max_length = 32, c.batch_size = 16, c.steps = 60, c.log_every = 10, c.lr = 3e-3, c.threads = 0;
  return c;
}
}  // namespace

TEST(Pretrain, BertMaskedLmLearnsAndSavesALoadableModel) {
  emoe::test::TempDir tmp;
  emoe::SyntheticOptions so;
  so.corpus_sentences = 500, so.train = so.dev = so.ood = 1;
  emoe::write_synthetic_reviews(emoe::make_synthetic_reviews(so), tmp.file("d"));
  auto c = tiny_pretrain(tmp.file("d/corpus.txt"), tmp.file("m"));
  auto r = emoe::run_pretraining(c);
  EXPECT_LT(r.final_loss, r.first_loss - 0.5) << r.first_loss << " -> " << r.final_loss;
  for (const char* f :
       {"config.json", "model.safetensors", "vocab.txt", "pretrain.jsonl", "pretrain_config.json"})
    EXPECT_TRUE(fs::exists(tmp.file(std::string("m/") + f))) << f;
  auto model = emoe::load_model(tmp.file("m"));
  EXPECT_EQ(model->summary().model_type, "bert");
  EXPECT_EQ(model->summary().hidden_size, 32);
  auto tok = emoe::load_tokenizer(tmp.file("m"));
  auto ids = tok->encode("the film was not great .", true, 32).ids;
  EXPECT_EQ(std::count(ids.begin(), ids.end(), *tok->special().unk), 0);
  // same seed, same model
  auto c2 = c;
  c2.output = tmp.file("m2");
  auto r2 = emoe::run_pretraining(c2);
  EXPECT_EQ(r2.final_loss, r.final_loss);
}

// The dev loss is measured on fixed masks: the trained model's last dev loss is reproduced exactly
// by measuring the saved model as `init` with steps 0 (which writes no model), and continuing
// from `init` in bf16-mixed lowers it.
TEST(Pretrain, DevLossOnFixedMasksIsReproducedFromTheSavedModelAndContinuationLowersIt) {
  emoe::test::TempDir tmp;
  emoe::SyntheticOptions so;
  so.corpus_sentences = 600, so.train = so.dev = so.ood = 1;
  emoe::write_synthetic_reviews(emoe::make_synthetic_reviews(so), tmp.file("d"));
  {  // held-out lines: the last 100 of the corpus, the rest to train on
    std::ifstream in(tmp.file("d/corpus.txt"));
    std::vector<std::string> lines;
    for (std::string l; std::getline(in, l);) lines.push_back(l);
    ASSERT_GT(lines.size(), 200u);
    std::ofstream tr(tmp.file("train.txt")), dv(tmp.file("dev.txt"));
    for (size_t i = 0; i < lines.size(); ++i)
      (i + 100 < lines.size() ? tr : dv) << lines[i] << "\n";
  }
  auto c = tiny_pretrain(tmp.file("train.txt"), tmp.file("m"));
  c.dev_corpus = tmp.file("dev.txt");
  c.dev_every = 20;
  c.max_dev_sequences = 64;
  auto r = emoe::run_pretraining(c);
  ASSERT_GT(r.dev_loss, 0);
  std::vector<double> devs;
  {
    std::ifstream log(tmp.file("m/pretrain.jsonl"));
    for (std::string l; std::getline(log, l);) {
      auto j = nlohmann::json::parse(l);
      if (j.contains("dev_loss")) devs.push_back(j["dev_loss"].get<double>());
    }
  }
  ASSERT_EQ(devs.size(), 3u);  // steps 20, 40 and the end (60)
  EXPECT_LT(devs.back(), devs.front());
  EXPECT_EQ(devs.back(), r.dev_loss);

  emoe::PretrainConfig e;  // the saved model measured again: the same masks, the same loss
  e.corpus = c.corpus;
  e.dev_corpus = c.dev_corpus;
  e.max_dev_sequences = 64;
  e.batch_size = c.batch_size;
  e.max_length = c.max_length;
  e.init = tmp.file("m");
  e.steps = 0;
  e.output = tmp.file("eval");
  auto re = emoe::run_pretraining(e);
  EXPECT_EQ(re.dev_loss, r.dev_loss);
  EXPECT_FALSE(fs::exists(tmp.file("eval/model.safetensors")));
  EXPECT_TRUE(fs::exists(tmp.file("eval/pretrain.jsonl")));

  auto b = e;  // continued from the saved model in bf16-mixed
  b.steps = 40;
  b.lr = 3e-3;
  b.precision = "bf16-mixed";
  b.output = tmp.file("more");
  auto rb = emoe::run_pretraining(b);
  EXPECT_LT(rb.dev_loss, r.dev_loss - 0.05) << r.dev_loss << " -> " << rb.dev_loss;
  auto model = emoe::load_model(tmp.file("more"));
  EXPECT_EQ(model->summary().hidden_size, 32);  // the init's shape, not the config's default
  EXPECT_TRUE(fs::exists(tmp.file("more/vocab.txt")));
}

TEST(Pretrain, LlamaCausalLmWithAGivenTokenizer) {
  EMOE_REQUIRE_SHARED(stories, "models/stories260K/hf");
  EMOE_REQUIRE_SHARED(corpus, "data/corpus/tinystories/tinystories_val_prefix.txt");
  emoe::test::TempDir tmp;
  auto c = tiny_pretrain(corpus, tmp.file("m"));
  c.arch = "llama";
  c.tokenizer = stories;
  c.kv_heads = 1;
  auto r = emoe::run_pretraining(c);
  EXPECT_LT(r.final_loss, r.first_loss - 0.5) << r.first_loss << " -> " << r.final_loss;
  auto model = emoe::load_model(tmp.file("m"));
  EXPECT_EQ(model->summary().model_type, "llama");
  EXPECT_EQ(model->summary().num_kv_heads, 1);
  EXPECT_TRUE(fs::exists(tmp.file("m/tokenizer.model")));
}

TEST(Pretrain, Gpt2CausalLmWithAGivenTokenizer) {
  EMOE_REQUIRE_SHARED(gpt2_tok, "fixtures/tokenizers/gpt2");
  emoe::test::TempDir tmp;
  {
    std::ofstream c(tmp.file("corpus.txt"));
    for (int i = 0; i < 300; ++i)
      c << "once upon a time there was a little cat number " << i % 5 << ".\n";
  }
  auto c = tiny_pretrain(tmp.file("corpus.txt"), tmp.file("m"));
  c.arch = "gpt2";
  c.tokenizer = gpt2_tok;
  c.steps = 40;
  auto r = emoe::run_pretraining(c);
  EXPECT_LT(r.final_loss, r.first_loss - 0.5) << r.first_loss << " -> " << r.final_loss;
  auto model = emoe::load_model(tmp.file("m"));
  EXPECT_EQ(model->summary().model_type, "gpt2");
  EXPECT_EQ(model->summary().intermediate_size, 64);
  EXPECT_TRUE(fs::exists(tmp.file("m/vocab.json")));
  // gradient_checkpointing: the same run (same process, same kernels), block by block recomputed
  c.gradient_checkpointing = true;
  c.output = tmp.file("m-checkpointed");
  auto rc = emoe::run_pretraining(c);
  EXPECT_EQ(rc.first_loss, r.first_loss);
  EXPECT_EQ(rc.final_loss, r.final_loss);
}

TEST(SpanCorruption, SentinelsReplaceSpansAndTheTargetsRestoreThem) {
  const std::vector<int64_t> sentinels = {99, 98, 97, 96, 95};
  std::mt19937_64 rng(3);
  std::set<int64_t> span_counts;
  for (int trial = 0; trial < 200; ++trial) {
    const int64_t n = 2 + trial % 60;
    std::vector<int64_t> ids(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) ids[static_cast<size_t>(i)] = 10 + i;
    auto sc = emoe::span_corrupt(ids, 0.15, 3.0, sentinels, 1, rng);
    ASSERT_EQ(sc.inputs.back(), 1);
    ASSERT_EQ(sc.targets.back(), 1);
    // sentinels in order in both, the same number of spans
    std::vector<int64_t> in_s, out_s;
    for (auto t : sc.inputs)
      if (t >= 95) in_s.push_back(t);
    for (auto t : sc.targets)
      if (t >= 95) out_s.push_back(t);
    ASSERT_EQ(in_s, out_s);
    ASSERT_EQ(in_s, std::vector<int64_t>(sentinels.begin(),
                                         sentinels.begin() + static_cast<int64_t>(in_s.size())));
    // noise: round(0.15 n) within [1, n - 1]; spans: round(noise / 3) within [1, noise]
    const int64_t noise =
        static_cast<int64_t>(sc.targets.size()) - 1 - static_cast<int64_t>(out_s.size());
    EXPECT_EQ(noise, std::clamp<int64_t>(std::llround(0.15 * static_cast<double>(n)), 1, n - 1))
        << n;
    EXPECT_EQ(static_cast<int64_t>(out_s.size()),
              std::clamp<int64_t>(std::llround(static_cast<double>(noise) / 3.0), 1,
                                  std::min<int64_t>(noise, n - noise)));
    span_counts.insert(static_cast<int64_t>(out_s.size()));
    // putting each span back in place of its sentinel gives the text; the text starts kept
    std::vector<int64_t> restored;
    size_t t = 0;
    for (size_t i = 0; i + 1 < sc.inputs.size(); ++i) {
      if (sc.inputs[i] < 95) {
        restored.push_back(sc.inputs[i]);
        continue;
      }
      ASSERT_EQ(sc.targets[t], sc.inputs[i]);
      for (++t; t + 1 < sc.targets.size() && sc.targets[t] < 95; ++t)
        restored.push_back(sc.targets[t]);
    }
    ASSERT_EQ(restored, ids);
    EXPECT_LT(sc.inputs.front(), 95);
    // every span non-empty: no two sentinels in a row in the targets
    for (size_t i = 0; i + 1 < sc.targets.size(); ++i)
      EXPECT_FALSE(sc.targets[i] >= 95 && (sc.targets[i + 1] >= 95 || sc.targets[i + 1] == 1));
  }
  EXPECT_GE(span_counts.size(), 3u);  // 1, 2, 3 spans all occur over these lengths
}

TEST(Pretrain, T5SpanCorruptionSavesAT5TokenizerAndLearns) {
  EMOE_REQUIRE_SHARED(tok, "fixtures/tokenizers/llama-tok512");
  EMOE_REQUIRE_SHARED(corpus, "data/corpus/tinystories/tinystories_val_prefix.txt");
  emoe::test::TempDir tmp;
  auto c = tiny_pretrain(corpus, tmp.file("m"));
  c.arch = "t5";
  c.tokenizer = tok;
  c.steps = 40;
  auto r = emoe::run_pretraining(c);
  EXPECT_LT(r.final_loss, r.first_loss - 0.5) << r.first_loss << " -> " << r.final_loss;
  EXPECT_TRUE(fs::exists(tmp.file("m/spiece.model")));
  EXPECT_FALSE(fs::exists(tmp.file("m/tokenizer.model")));
  auto t5tok = emoe::load_tokenizer(tmp.file("m"));
  EXPECT_EQ(t5tok->vocab_size(), 613);  // 512 pieces, 100 sentinels, <pad>
  EXPECT_EQ(t5tok->token_to_id("<extra_id_0>"), 611);
  auto model = emoe::load_model(tmp.file("m"));
  EXPECT_EQ(model->summary().model_type, "t5");
  EXPECT_EQ(model->summary().vocab_size, 613);
  EXPECT_EQ(model->summary().decoder_start_token_id, 612);
  // the autoencoder objective stays available; a tokenizer without sentinels cannot corrupt spans
  c.t5_objective = "autoencoder";
  c.output = tmp.file("ae");
  c.steps = 2;
  EXPECT_NO_THROW(emoe::run_pretraining(c));
  EMOE_REQUIRE_SHARED(gpt2_tok, "fixtures/tokenizers/gpt2");
  c.t5_objective = "span-corruption";
  c.tokenizer = gpt2_tok;
  c.output = tmp.file("bad");
  try {
    emoe::run_pretraining(c);
    ADD_FAILURE() << "no error";
  } catch (const emoe::InputError& e) {
    EXPECT_NE(std::string(e.what()).find("t5_objective=autoencoder"), std::string::npos)
        << e.what();
  }
  EXPECT_FALSE(fs::exists(tmp.file("bad")));  // refused before anything is written
}
