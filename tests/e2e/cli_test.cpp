// End-to-end runs of the emoe binary: the main commands and the bad-input matrix (exit code 2,
// one error line, nothing half-written).
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "emoe/io/safetensors.h"
#include "emoe/moe/kernel_choices.h"
#include "support/test_support.h"

namespace fs = std::filesystem;
using emoe::test::run_emoe;

namespace {

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Exit 2 with exactly one "emoe: error:" line on stderr that mentions `expect`.
void expect_one_error(const emoe::test::CommandResult& r, const std::string& expect) {
  EXPECT_EQ(r.exit_code, 2) << r.err;
  int errors = 0;
  std::stringstream ss(r.err);
  std::string line, error_line;
  while (std::getline(ss, line))
    if (line.rfind("emoe: error:", 0) == 0) ++errors, error_line = line;
  EXPECT_EQ(errors, 1) << r.err;
  EXPECT_NE(error_line.find(expect), std::string::npos) << "stderr: " << r.err;
}

// A copy of a fixture model folder whose weights file is replaced by `weights` bytes.
void copy_model(const std::string& src, const std::string& dst) {
  fs::create_directories(dst);
  for (const auto& e : fs::directory_iterator(src))
    if (e.is_regular_file()) fs::copy_file(e.path(), fs::path(dst) / e.path().filename());
}

}  // namespace

TEST(Cli, GenerateFromBosReproducesLlama2cOutput) {
  EMOE_REQUIRE_SHARED(dir, "models/stories260K/hf");
  EMOE_REQUIRE_SHARED(ref, "models/stories260K/llama2c/run_c_stdout_t0_n200.txt");
  auto r = run_emoe("generate " + dir + " --max-new-tokens 200");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, slurp(ref));
  // a prompt, as run.c -i would continue it
  auto p = run_emoe("generate " + dir + " --prompt 'Once upon a time' -n 20 -q");
  ASSERT_EQ(p.exit_code, 0) << p.err;
  EXPECT_EQ(p.out.rfind("Once upon a time, there was a little girl named Lily.", 0), 0u) << p.out;
  // sampling is reproducible for a seed
  auto s1 = run_emoe("generate " + dir + " -n 30 -t 0.9 --top-p 0.9 --seed 7 -q");
  auto s2 = run_emoe("generate " + dir + " -n 30 -t 0.9 --top-p 0.9 --seed 7 -q");
  EXPECT_EQ(s1.out, s2.out);
}

TEST(Cli, ForwardWritesLogitsAndHiddenStates) {
  EMOE_REQUIRE_SHARED(dir, "fixtures/tiny/llama_lm");
  emoe::test::TempDir tmp;
  auto fx = emoe::load_safetensors(dir + "/fixture.safetensors");
  emoe::save_safetensors(tmp.file("in.safetensors"), {{"input_ids", fx["left.input_ids"]},
                                                      {"attention_mask", fx["left.attention_mask"]},
                                                      {"position_ids", fx["left.position_ids"]}});
  auto r = run_emoe("forward " + dir + " -i " + tmp.file("in.safetensors") + " -o " +
                    tmp.file("out.safetensors"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto out = emoe::load_safetensors(tmp.file("out.safetensors"));
  auto m = fx["left.attention_mask"];
  EXPECT_LT(emoe::test::max_abs_diff_masked(out["logits"], fx["left.logits"], m), 1e-4);
  EXPECT_EQ(out["hidden_states"].sizes(), fx["left.hidden_states"].sizes());
  // BERT base model: last_hidden_state and pooler_output, no logits
  EMOE_REQUIRE_SHARED(bert, "fixtures/tiny/bert_model");
  auto fb = emoe::load_safetensors(bert + "/fixture.safetensors");
  emoe::save_safetensors(tmp.file("b.safetensors"), {{"input_ids", fb["input_ids"]},
                                                     {"attention_mask", fb["attention_mask"]},
                                                     {"token_type_ids", fb["token_type_ids"]}});
  r = run_emoe("forward " + bert + " -i " + tmp.file("b.safetensors") + " -o " +
               tmp.file("bo.safetensors"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto bo = emoe::load_safetensors(tmp.file("bo.safetensors"));
  EXPECT_EQ(bo.count("logits"), 0u);
  EXPECT_LT(emoe::test::max_abs_diff(bo["pooler_output"], fb["pooler_output"]), 1e-4);
  EXPECT_LT(emoe::test::max_abs_diff(bo["hidden_states"], fb["hidden_states"]), 1e-4);
}

TEST(Cli, TokenizeEncodesPairsAndDecodes) {
  EMOE_REQUIRE_SHARED(dir, "tokenizers/bert-base-uncased");
  auto r = run_emoe("tokenize " + dir, "hello world\n");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "[101,7592,2088,102]\n");
  r = run_emoe("tokenize " + dir + " --pair", "hello\tworld\n");
  EXPECT_EQ(r.out, "[101,7592,102,2088,102]\n");
  r = run_emoe("tokenize " + dir + " --no-special", "hello world\n");
  EXPECT_EQ(r.out, "[7592,2088]\n");
  r = run_emoe("tokenize " + dir + " --decode --skip-special", "[101,7592,2088,102]\n");
  EXPECT_EQ(r.out, "\"hello world\"\n");
  expect_one_error(run_emoe("tokenize " + dir + " --decode", "[1, \"x\"]\n"), "stdin line 1");
  expect_one_error(run_emoe("tokenize " + dir + " --pair", "no tab here\n"), "tab");
}

TEST(Cli, InfoDescribesEachArchitecture) {
  for (const char* rel : {"models/stories260K/hf", "models/bert-mini", "fixtures/tiny/gpt2_lm"}) {
    EMOE_REQUIRE_SHARED(dir, rel);
    auto r = run_emoe(std::string("info ") + dir + " --json");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    auto j = nlohmann::json::parse(r.out);
    EXPECT_GT(j["parameters"]["total"].get<int64_t>(), 0);
    EXPECT_EQ(j["parameters"]["total"].get<int64_t>(),
              j["parameters"]["embeddings"].get<int64_t>() +
                  j["parameters"]["attention"].get<int64_t>() +
                  j["parameters"]["ffn"].get<int64_t>() +
                  j["parameters"]["norms_and_other"].get<int64_t>() +
                  j["parameters"]["head"].get<int64_t>());
  }
  EMOE_REQUIRE_SHARED(st, "models/stories260K/hf");
  auto r = run_emoe("info " + st);
  EXPECT_NE(r.out.find("valid expert counts N: 1 2 4 43 86 172"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("sentencepiece (512 tokens)"), std::string::npos) << r.out;
}

TEST(Cli, ConvertThenExportRoundTrips) {
  EMOE_REQUIRE_SHARED(dir, "models/stories260K/hf");
  emoe::test::TempDir tmp;
  auto r = run_emoe("convert " + dir + " -o " + tmp.file("moe") +
                    " -N 4 -k 2 --layers 1,3 --restarts 2");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("| 1 | balanced-kmeans | 4 x 43 |"), std::string::npos) << r.out;
  EXPECT_TRUE(fs::exists(tmp.file("moe/moe.json")));
  EXPECT_TRUE(fs::exists(tmp.file("moe/tokenizer.model")));
  auto g = run_emoe("generate " + tmp.file("moe") + " -n 10 -q");
  EXPECT_EQ(g.exit_code, 0) << g.err;
  r = run_emoe("export " + tmp.file("moe") + " --dense -o " + tmp.file("dense"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_FALSE(fs::exists(tmp.file("dense/moe.json")));
  // neurons are back in their original order: the weights equal the source exactly
  auto a = emoe::load_safetensors(dir + "/model.safetensors");
  auto b = emoe::load_safetensors(tmp.file("dense/model.safetensors"));
  ASSERT_EQ(a.size(), b.size());
  for (auto& [k, t] : a) EXPECT_TRUE(torch::equal(t, b[k])) << k;
  // errors
  expect_one_error(run_emoe("convert " + dir + " -o " + tmp.file("x") + " -N 5"),
                   "d_ff 172 is not divisible by N = 5 experts; valid N: 1 2 4 43 86 172");
  expect_one_error(run_emoe("convert " + dir + " -o " + tmp.file("x") + " -N 4 -k 9"), "--topk");
  expect_one_error(run_emoe("convert " + dir + " -o " + tmp.file("x") + " --layers 9"),
                   "layer 9 does not exist");
  expect_one_error(run_emoe("export " + dir + " --dense -o " + tmp.file("x")), "already dense");
  EXPECT_FALSE(fs::exists(tmp.file("x")));
}

// Issue 24: --max-shard-size writes Hugging Face shards that every command reads back; a bad size
// is one error line and nothing is written.
TEST(Cli, MaxShardSizeWritesShardsThatLoad) {
  EMOE_REQUIRE_SHARED(dir, "models/stories260K/hf");
  emoe::test::TempDir tmp;
  auto r = run_emoe("convert " + dir + " -o " + tmp.file("moe") +
                    " -N 4 -k 2 --layers 1,3 --restarts 2 --max-shard-size 300KB -q");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_FALSE(fs::exists(tmp.file("moe/model.safetensors")));
  auto index = nlohmann::json::parse(slurp(tmp.file("moe/model.safetensors.index.json")));
  std::set<std::string> shards;
  for (auto& [k, v] : index["weight_map"].items()) shards.insert(v.get<std::string>());
  EXPECT_GE(shards.size(), 4u);  // about 1 MB of weights
  for (size_t n = 1; n <= shards.size(); ++n)
    EXPECT_TRUE(shards.count(fmt::format("model-{:05d}-of-{:05d}.safetensors", n, shards.size())));
  EXPECT_TRUE(fs::exists(tmp.file("moe/moe.json")));
  auto g = run_emoe("generate " + tmp.file("moe") + " -n 10 -q");
  EXPECT_EQ(g.exit_code, 0) << g.err;
  // export, sharded, back to the source's exact weights
  r = run_emoe("export " + tmp.file("moe") + " --dense -o " + tmp.file("dense") +
               " --max-shard-size 500000");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  emoe::CheckpointReader a(dir), b(tmp.file("dense"));
  ASSERT_EQ(a.names(), b.names());
  for (const auto& k : a.names()) EXPECT_TRUE(torch::equal(a.load(k), b.load(k))) << k;
  auto i = run_emoe("info " + tmp.file("dense") + " --json");
  ASSERT_EQ(i.exit_code, 0) << i.err;
  // exporting again into the same (non-empty) folder is refused and leaves it as it was
  const auto before = fs::file_size(tmp.file("dense/model.safetensors.index.json"));
  r = run_emoe("export " + tmp.file("moe") + " --dense -o " + tmp.file("dense") + " -q");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("not empty"), std::string::npos) << r.err;
  EXPECT_EQ(fs::file_size(tmp.file("dense/model.safetensors.index.json")), before);
  expect_one_error(run_emoe("export " + tmp.file("moe") + " --dense -o " + tmp.file("x") +
                            " --max-shard-size 2XB"),
                   "--max-shard-size: expected a size such as 500MB, 2GB, 10KB, 1GiB or a number "
                   "of bytes, got '2XB'");
  EXPECT_FALSE(fs::exists(tmp.file("x")));
}

// The bad-file matrix of the foundation issue: each gives exit 2 and one clear line.
TEST(Cli, BadModelFilesGiveOneClearError) {
  EMOE_REQUIRE_SHARED(src, "fixtures/tiny/llama_lm");
  emoe::test::TempDir tmp;
  auto weights = slurp(src + "/model.safetensors");
  auto config = slurp(src + "/config.json");
  struct Case {
    std::string name;
    std::function<void(const std::string&)> damage;
    std::string expect;
  };
  auto write = [](const std::string& path, const std::string& bytes) {
    std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
  };
  auto header_of = [&]() {
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(weights[i]);
    return nlohmann::json::parse(weights.substr(8, n));
  };
  auto with_header = [&](const nlohmann::json& h) {
    std::string text = h.dump();
    uint64_t old = 0;
    for (int i = 7; i >= 0; --i) old = (old << 8) | static_cast<unsigned char>(weights[i]);
    std::string out(8, '\0');
    for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((text.size() >> (8 * i)) & 0xff);
    return out + text + weights.substr(8 + old);
  };
  std::vector<Case> cases = {
      {"truncated",
       [&](const std::string& d) {
         write(d + "/model.safetensors", weights.substr(0, weights.size() / 2));
       },
       "out of range"},
      {"tiny file", [&](const std::string& d) { write(d + "/model.safetensors", "abc"); },
       "too short"},
      {"header past end",
       [&](const std::string& d) {
         auto w = weights;
         w[0] = '\xff';
         w[1] = '\xff';
         w[2] = '\x0f';
         write(d + "/model.safetensors", w);
       },
       "runs past the end"},
      {"overlap",
       [&](const std::string& d) {
         auto h = header_of();
         h["model.norm.weight"]["data_offsets"] = h["lm_head.weight"]["data_offsets"];
         h["model.norm.weight"]["shape"] = h["lm_head.weight"]["shape"];
         write(d + "/model.safetensors", with_header(h));
       },
       "overlap"},
      {"out of range offsets",
       [&](const std::string& d) {
         auto h = header_of();
         h["model.norm.weight"]["data_offsets"] = {100000000, 100000128};
         write(d + "/model.safetensors", with_header(h));
       },
       "out of range"},
      {"unknown dtype",
       [&](const std::string& d) {
         auto h = header_of();
         h["model.norm.weight"]["dtype"] = "Q4";
         write(d + "/model.safetensors", with_header(h));
       },
       "unknown or unsupported dtype 'Q4'"},
      {"wrong shape",
       [&](const std::string& d) {
         auto h = header_of();
         h["model.norm.weight"]["shape"] = {4, 8};
         write(d + "/model.safetensors", with_header(h));
       },
       "model.norm.weight: expected [32], got [4, 8]"},
      {"missing tensor",
       [&](const std::string& d) {
         auto h = header_of();
         h.erase("model.norm.weight");
         write(d + "/model.safetensors", with_header(h));
       },
       "1 missing: model.norm.weight"},
      {"malformed config",
       [&](const std::string& d) { write(d + "/config.json", "{\"hidden_size\": 32,"); },
       "config.json: not valid JSON"},
      {"inconsistent config",
       [&](const std::string& d) {
         auto j = nlohmann::json::parse(config);
         j["num_attention_heads"] = 5;
         write(d + "/config.json", j.dump());
       },
       "hidden_size 32 is not a multiple of num_attention_heads 5"},
      {"missing config", [&](const std::string& d) { fs::remove(d + "/config.json"); },
       "missing config.json"},
      {"pickle only",
       [&](const std::string& d) {
         fs::remove(d + "/model.safetensors");
         write(d + "/pytorch_model.bin", "x");
       },
       "pickle"},
  };
  int i = 0;
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    std::string d = tmp.file("m" + std::to_string(i++));
    copy_model(src, d);
    c.damage(d);
    expect_one_error(run_emoe("info " + d), c.expect);
    // forward leaves no output behind when it fails
    emoe::save_safetensors(d + "/in.safetensors",
                           {{"input_ids", torch::ones({1, 3}, torch::kLong)}});
    auto r = run_emoe("forward " + d + " -i " + d + "/in.safetensors -o " + d + "/out.safetensors");
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_FALSE(fs::exists(d + "/out.safetensors"));
  }
}

TEST(Cli, BadInputsAndFlagsGiveOneClearError) {
  EMOE_REQUIRE_SHARED(dir, "fixtures/tiny/llama_lm");
  emoe::test::TempDir tmp;
  emoe::save_safetensors(tmp.file("ids.safetensors"),
                         {{"input_ids", torch::full({1, 3}, 500, torch::kLong)}});
  expect_one_error(
      run_emoe("forward " + dir + " -i " + tmp.file("ids.safetensors") + " -o " + tmp.file("o")),
      "ids must lie in [0, 100)");
  emoe::save_safetensors(tmp.file("f.safetensors"), {{"input_ids", torch::ones({1, 3})}});
  expect_one_error(
      run_emoe("forward " + dir + " -i " + tmp.file("f.safetensors") + " -o " + tmp.file("o")),
      "expected an integer dtype");
  emoe::save_safetensors(tmp.file("m.safetensors"),
                         {{"input_ids", torch::ones({1, 3}, torch::kLong)},
                          {"attention_mask", torch::ones({1, 4}, torch::kLong)}});
  expect_one_error(
      run_emoe("forward " + dir + " -i " + tmp.file("m.safetensors") + " -o " + tmp.file("o")),
      "differs from input_ids");
  emoe::save_safetensors(tmp.file("long.safetensors"),
                         {{"input_ids", torch::ones({1, 80}, torch::kLong)}});
  expect_one_error(
      run_emoe("forward " + dir + " -i " + tmp.file("long.safetensors") + " -o " + tmp.file("o")),
      "exceeds max_position_embeddings 64");
  expect_one_error(run_emoe("generate " + dir + " --dtype float8"), "--dtype");
  expect_one_error(run_emoe("generate " + dir + " --device tpu"), "--device");
  expect_one_error(run_emoe("generate " + dir + " --top-p 2 -t 1"), "--top-p");
  // the tiny fixture folder has no tokenizer files
  expect_one_error(run_emoe("generate " + dir + " --prompt hi"), "no tokenizer files found");
  EMOE_REQUIRE_SHARED(bert, "fixtures/tiny/bert_model");
  expect_one_error(run_emoe("generate " + bert), "needs a decoder language model");
  auto r = run_emoe("frobnicate");
  EXPECT_EQ(r.exit_code, 2);
}

// EMOE_KERNELS=FILE pins a finished run's kernels.json before the command runs (so a repeated
// run computes on its kernels); another CPU's record is reported, an unreadable one refused.
TEST(Cli, EmoeKernelsPinsARecordBeforeTheCommand) {
  emoe::test::TempDir tmp;
  auto record = emoe::kernel_choices_json();
  record["small_products"]["6,3,1000,7,0,0"] = "library";
  std::ofstream(tmp.file("kernels.json")) << record.dump();
  record["cpu"]["model"] = "Another CPU 9000";
  std::ofstream(tmp.file("foreign.json")) << record.dump();
  std::ofstream(tmp.file("bad.json")) << R"({"cpu": 1})";
  struct Env {
    ~Env() { unsetenv("EMOE_KERNELS"); }
  } env;
  setenv("EMOE_KERNELS", tmp.file("kernels.json").c_str(), 1);
  auto r = run_emoe("info --system");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("1 kernel choice pinned from " + tmp.file("kernels.json")),
            std::string::npos)
      << r.err;
  setenv("EMOE_KERNELS", tmp.file("foreign.json").c_str(), 1);
  r = run_emoe("info --system");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("kernels chosen afresh"), std::string::npos) << r.err;
  setenv("EMOE_KERNELS", tmp.file("missing.json").c_str(), 1);
  expect_one_error(run_emoe("info --system"), "EMOE_KERNELS: " + tmp.file("missing.json") +
                                                  ": cannot read the kernel choices");
  setenv("EMOE_KERNELS", tmp.file("bad.json").c_str(), 1);
  expect_one_error(run_emoe("info --system"), "bad.json: 'cpu': expected");
}

// Issue 25: a prompt past the model's positions is refused before any of it is printed, and a
// model folder is not written over: convert refuses a folder with files and leaves it as it was.
TEST(Cli, HostileGenerateAndOutputFolders) {
  EMOE_REQUIRE_SHARED(stories, "models/stories260K/hf");
  emoe::test::TempDir tmp;
  copy_model(stories, tmp.file("short"));
  {
    std::string cfg = slurp(tmp.file("short/config.json"));
    const std::string key = "\"max_position_embeddings\": 512";
    ASSERT_NE(cfg.find(key), std::string::npos) << cfg;
    cfg.replace(cfg.find(key), key.size(), "\"max_position_embeddings\": 4");
    std::ofstream(tmp.file("short/config.json")) << cfg;
  }
  auto r =
      run_emoe("generate " + tmp.file("short") + " --prompt 'once upon a time there was' -n 2");
  expect_one_error(r, "more than the 4 positions of");
  EXPECT_EQ(r.out, "") << "the prompt was echoed before the refusal";

  fs::create_directories(tmp.file("full"));
  std::ofstream(tmp.file("full/keep.txt")) << "mine";
  expect_one_error(run_emoe("convert " + stories + " -o " + tmp.file("full") + " -N 4 -k 2"),
                   "the folder already exists and is not empty");
  EXPECT_EQ(slurp(tmp.file("full/keep.txt")), "mine");
  EXPECT_EQ(std::distance(fs::directory_iterator(tmp.file("full")), fs::directory_iterator()), 1);
  // an empty folder is a fine target
  fs::create_directories(tmp.file("empty"));
  r = run_emoe("convert " + stories + " -o " + tmp.file("empty") + " -N 4 -k 2 --layers 1 -q");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(fs::exists(tmp.file("empty/moe.json")));
}

// train takes --threads/--device/--dtype as every model command does: they become the run
// config's keys (saved in config.json), and a resume with other threads is the same run.
TEST(Cli, TrainTakesThreadsDeviceAndDtype) {
  EMOE_REQUIRE_SHARED(bert, "models/bert-mini");
  EMOE_REQUIRE_SHARED(data, "data");
  emoe::test::TempDir tmp;
  const std::string base = "train --set model=" + bert + " --set task=sst2 --set data_dir=" + data +
                           " --set train.max_train_examples=16 --set train.max_eval_examples=8" +
                           " --set train.batch_size=8 --set ood=[] --set save_best=false -q";
  auto r = run_emoe(base + " --set train.stop_after_steps=1 --threads 1 --device cpu" +
                    " --dtype float32 -o " + tmp.file("run"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto cfg = nlohmann::json::parse(slurp(tmp.file("run/config.json")));
  EXPECT_EQ(cfg["threads"], 1);
  EXPECT_EQ(cfg["device"], "cpu");
  EXPECT_EQ(cfg["dtype"], "float32");
  r = run_emoe(base + " --threads 2 --resume -o " + tmp.file("run"));
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(fs::exists(tmp.file("run/results.json")));
  expect_one_error(run_emoe(base + " --dtype float16 -o " + tmp.file("half")),
                   "dtype: float16 needs a CUDA device");
  EXPECT_FALSE(fs::exists(tmp.file("half")));
}
