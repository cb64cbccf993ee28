// Pretraining: the WordPiece vocabulary trainer, the demo's synthetic data, the pretraining
// config and short pretraining runs of BERT (masked LM) and Llama (causal LM).
#include <filesystem>
#include <fstream>
#include <set>

#include "emoe/core/error.h"
#include "emoe/data/synthetic.h"
#include "emoe/models/loader.h"
#include "emoe/tokenizer/tokenizer.h"
#include "emoe/tokenizer/wordpiece_trainer.h"
#include "emoe/train/pretrain.h"
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
  EXPECT_EQ(static_cast<int64_t>(emoe::train_wordpiece_vocab({"The cat sat.", "the cat ran", "a dog"}, o).size()),
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
  EXPECT_NE(emoe::make_synthetic_reviews(o).train[0].text + emoe::make_synthetic_reviews(o).train[1].text,
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
  for (const char* f : {"corpus.txt", "dev.tsv", "ood.tsv"}) EXPECT_TRUE(fs::exists(tmp.file(std::string("d/") + f)));
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
  EXPECT_NE(msg({"corpus=x", "arch=xlnet"}).find("arch: expected bert, gpt2, llama or t5"), std::string::npos);
  EXPECT_NE(msg({}).find("corpus: required"), std::string::npos);
  EXPECT_NE(msg({"corpus=x", "hidden=30", "heads=4"}).find("not a multiple of heads"), std::string::npos);
  EXPECT_NE(msg({"corpus=x", "steps=abc"}).find("steps"), std::string::npos);
  EXPECT_NE(msg({"corpus=x", "arch=gpt2"}).find("give a tokenizer folder"), std::string::npos);
  EXPECT_NE(msg({"corpus=x", "max_length=500"}).find("max_length"), std::string::npos);
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
  for (const char* f : {"config.json", "model.safetensors", "vocab.txt", "pretrain.jsonl", "pretrain_config.json"})
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
    for (int i = 0; i < 300; ++i) c << "once upon a time there was a little cat number " << i % 5 << ".\n";
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
}
