// Regression tests for the fuzzing findings (docs/reliability.md): each reproducer under
// tests/data/fuzz/<target>/ is fed to the public function its libFuzzer harness (fuzz/) calls,
// and must now end in one of our typed errors instead of undefined behaviour, an unbounded
// allocation or a foreign exception. Harness inputs that start with selector bytes (datasets:
// reader and options) are stored as the fuzzer wrote them, so `build-fuzz/fuzz_<target> FILE`
// replays them; the tests strip those bytes the way the harness does.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "emoe/core/error.h"
#include "emoe/data/dataset.h"
#include "emoe/io/hf_config.h"
#include "emoe/io/safetensors.h"
#include "emoe/models/loader.h"
#include "emoe/tokenizer/tokenizer.h"
#include "emoe/train/run_config.h"
#include "support/test_support.h"

namespace {

std::string fuzzrepro_read(const std::string& target, const std::string& name) {
  const std::string path = emoe::test::source_dir() + "/tests/data/fuzz/" + target + "/" + name;
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << "missing reproducer " << path;
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void fuzzrepro_write(const std::string& path, const std::string& bytes) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

// Runs `fn`, expects an emoe::InputError whose message holds every needle on one line.
void fuzzrepro_expect_input_error(const std::function<void()>& fn,
                                  const std::vector<std::string>& needles) {
  try {
    fn();
    ADD_FAILURE() << "expected an InputError mentioning " << needles.front();
  } catch (const emoe::InputError& e) {
    const std::string what = e.what();
    for (const auto& n : needles)
      EXPECT_NE(what.find(n), std::string::npos) << "message: " << what << "\nmissing: " << n;
    EXPECT_EQ(what.find('\n'), std::string::npos) << "one line expected: " << what;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "wrong error type: " << e.what();
  }
}

// A value nested `depth` levels deep: [[[...]]].
std::string fuzzrepro_nested(int depth) {
  return std::string(depth, '[') + std::string(depth, ']');
}

// fuzz_model_config: config.json in a model folder -> read, detect, build (size checks first).
void fuzzrepro_model_config(const std::string& bytes, const std::vector<std::string>& needles) {
  emoe::test::TempDir dir;
  fuzzrepro_write(dir.file("config.json"), bytes);
  fuzzrepro_expect_input_error(
      [&] {
        emoe::JsonFields cfg = emoe::read_model_config(dir.path());
        emoe::create_model(cfg, emoe::default_head(cfg));
      },
      needles);
}

}  // namespace

// A float beyond int64's range where an integer is expected was converted with undefined
// behaviour (UBSan: "1.33333e+38 is outside the range of representable values of type 'long'").
TEST(FuzzRegression, ModelConfigFloatBeyondInt64) {
  fuzzrepro_model_config(fuzzrepro_read("model_config", "vocab_size_1e38.json"),
                         {"config.json", "vocab_size", "expected an integer"});
}

// num_labels had no bound: a classifier head of 1e11 rows was allocated (ASan:
// allocation-size-too-big; without ASan, c10's out-of-memory error escaped as a foreign type).
// Written as a float, any bounded size also slipped past check_config_sizes.
TEST(FuzzRegression, ModelConfigNumLabelsBounded) {
  fuzzrepro_model_config(fuzzrepro_read("model_config", "num_labels_1e11.json"),
                         {"config.json", "num_labels", "refused before allocating"});
  fuzzrepro_model_config(fuzzrepro_read("model_config", "num_labels_float_1e11.json"),
                         {"config.json", "num_labels", "refused before allocating"});
  // the same through id2label (70,000 entries; not stored, it is 800 kB)
  std::string id2label;
  for (int i = 0; i < 70000; ++i) id2label += (i ? ",\"" : "\"") + std::to_string(i) + "\":\"x\"";
  fuzzrepro_model_config(
      "{\"model_type\":\"bert\",\"architectures\":[\"BertForSequenceClassification\"],"
      "\"hidden_size\":16,\"num_attention_heads\":2,\"num_hidden_layers\":1,"
      "\"intermediate_size\":16,\"vocab_size\":10,\"max_position_embeddings\":8,\"id2label\":{" +
          id2label + "}}",
      {"config.json", "id2label", "refused before allocating"});
}

// YAML accepts bytes that are not UTF-8; nlohmann::json::dump() then threw its own type_error
// (316, "invalid UTF-8 byte") from an error message, escaping as a foreign exception.
TEST(FuzzRegression, RunConfigInvalidUtf8) {
  emoe::test::TempDir dir;
  fuzzrepro_write(dir.file("run.yaml"), fuzzrepro_read("run_config", "invalid_utf8.yaml"));
  fuzzrepro_expect_input_error([&] { emoe::load_run_config(dir.file("run.yaml")); },
                               {"run.yaml", "not valid UTF-8", "line 11"});
}

// `epochs: 1.0e300` was converted to int64 with undefined behaviour (UBSan, in nlohmann's get).
TEST(FuzzRegression, RunConfigFloatBeyondInteger) {
  emoe::test::TempDir dir;
  fuzzrepro_write(dir.file("run.yaml"), fuzzrepro_read("run_config", "epochs_1e300.yaml"));
  fuzzrepro_expect_input_error([&] { emoe::load_run_config(dir.file("run.yaml")); },
                               {"run.yaml.train.epochs", "expected an integer"});
}

// fuzz_datasets, reader 0 (TSV, header, quoted, text column "sentence", label "label"): the label
// "1e300" passed as an integral class id and was converted with undefined behaviour.
TEST(FuzzRegression, TableLabelBeyondInt64) {
  const std::string input = fuzzrepro_read("datasets", "label_1e300.bin");
  ASSERT_GE(input.size(), 2u);
  ASSERT_EQ(input[0], '\0');
  emoe::test::TempDir dir;
  emoe::TableSpec spec;
  spec.format = "tsv";
  spec.path = dir.file("t.tsv");
  spec.text_cols = {"sentence"};
  spec.label_col = "label";
  fuzzrepro_write(spec.path, input.substr(2));
  emoe::TaskSpec task;
  task.name = "fuzz";
  task.labels = {"neg", "pos"};
  task.metrics = {"accuracy"};
  task.main_metric = "accuracy";
  fuzzrepro_expect_input_error([&] { emoe::load_table(spec, task); },
                               {"t.tsv:2", "label '1e300'", "expected a class id"});
}

// `a: &x [*x]`: yaml-cpp hands over an alias inside its own anchor; expanding it into JSON
// recursed until the stack overflowed.
TEST(FuzzRegression, RunConfigAliasCycle) {
  emoe::test::TempDir dir;
  fuzzrepro_write(dir.file("run.yaml"), fuzzrepro_read("run_config", "alias_cycle.yaml"));
  fuzzrepro_expect_input_error([&] { emoe::load_run_config(dir.file("run.yaml")); },
                               {"run.yaml", "nested deeper than 64 levels"});
}

// Nine levels of ten aliases each ("billion laughs") expanded into 10^9 JSON values: a hang and
// an unbounded allocation.
TEST(FuzzRegression, RunConfigAliasExpansion) {
  emoe::test::TempDir dir;
  fuzzrepro_write(dir.file("run.yaml"), fuzzrepro_read("run_config", "alias_expansion.yaml"));
  fuzzrepro_expect_input_error([&] { emoe::load_run_config(dir.file("run.yaml")); },
                               {"run.yaml", "more than 10000 values once aliases are expanded"});
}

// Deeply nested JSON: nlohmann parses it iteratively, but printing the value in an error message
// (and copying or comparing it) recursed once per level and overflowed the stack (ASan:
// stack-overflow in serializer::dump). 200,000 levels are generated here rather than stored.
TEST(FuzzRegression, DeepJsonNesting) {
  const std::string deep = fuzzrepro_nested(200000);
  emoe::test::TempDir dir;
  {  // safetensors header: a shape of nested arrays
    const std::string header =
        "{\"t\":{\"dtype\":\"F32\",\"shape\":" + deep + ",\"data_offsets\":[0,0]}}";
    std::string bytes(8, '\0');
    for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
    fuzzrepro_write(dir.file("st/model.safetensors"), bytes + header);
    fuzzrepro_expect_input_error([&] { emoe::CheckpointReader reader(dir.file("st")); },
                                 {"model.safetensors", "nested deeper than 256 levels"});
  }
  // config.json
  fuzzrepro_model_config("{\"model_type\": \"bert\", \"vocab_size\": " + deep + "}",
                         {"config.json", "nested deeper than 256 levels"});
  {  // a JSONL table
    emoe::TableSpec spec;
    spec.format = "jsonl";
    spec.path = dir.file("t.jsonl");
    spec.text_cols = {"sentence"};
    spec.label_col = "label";
    fuzzrepro_write(spec.path, "{\"sentence\": \"fine\", \"label\": 1}\n{\"sentence\": " + deep +
                                   ", \"label\": 1}\n");
    emoe::TaskSpec task;
    task.name = "fuzz";
    task.labels = {"neg", "pos"};
    task.metrics = {"accuracy"};
    task.main_metric = "accuracy";
    fuzzrepro_expect_input_error([&] { emoe::load_table(spec, task); },
                                 {"t.jsonl:2", "nested deeper than 256 levels"});
  }
  {  // tokenizer_config.json next to a vocab.txt
    fuzzrepro_write(dir.file("tok/vocab.txt"), "[UNK]\n[CLS]\n[SEP]\nhello\n");
    fuzzrepro_write(dir.file("tok/tokenizer_config.json"), "{\"unk_token\": " + deep + "}");
    fuzzrepro_expect_input_error([&] { emoe::load_tokenizer(dir.file("tok")); },
                                 {"tokenizer_config.json", "nested deeper than 256 levels"});
  }
}

// fuzz_tokenizer_files: a vocab.json id of ~10^8 among three entries sized the BPE id -> token
// table to 3.8 GB (libFuzzer: out-of-memory, malloc of 3.8e9 bytes). Ids far beyond the number
// of entries are now refused before the table is made; a dense vocabulary still loads.
TEST(FuzzRegression, TokenizerFilesSparseBpeIds) {
  emoe::test::TempDir dir;
  fuzzrepro_write(dir.file("sparse/vocab.json"),
                  "{\"a\": 0, \"b\": 1, \"<|endoftext|>\": 2, \"ab\": 94536407}");
  fuzzrepro_write(dir.file("sparse/merges.txt"), "#version: 0.2\na b\n");
  fuzzrepro_expect_input_error([&] { emoe::load_tokenizer(dir.file("sparse")); },
                               {"vocab.json", "token ids reach 94536407", "has 4 entries"});
  fuzzrepro_write(dir.file("dense/vocab.json"),
                  "{\"a\": 0, \"b\": 1, \"<|endoftext|>\": 2, \"ab\": 3}");
  fuzzrepro_write(dir.file("dense/merges.txt"), "#version: 0.2\na b\n");
  auto tok = emoe::load_tokenizer(dir.file("dense"));
  EXPECT_EQ(tok->vocab_size(), 4);
  EXPECT_EQ(tok->encode("ab").ids, std::vector<int64_t>({3}));
}
