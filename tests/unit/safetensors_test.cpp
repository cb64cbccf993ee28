// safetensors reader/writer: round trips, dtype conversion, sharding, and every header defect.
#include "emoe/io/safetensors.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "emoe/core/error.h"
#include "emoe/io/atomic_file.h"
#include "support/test_support.h"

namespace fs = std::filesystem;

namespace {

// Writes a file made of an 8-byte length, the given header text, and `data` bytes.
void write_raw(const std::string& path, const std::string& header, size_t data_bytes,
               std::optional<uint64_t> claimed_len = std::nullopt) {
  std::ofstream out(path, std::ios::binary);
  uint64_t n = claimed_len.value_or(header.size());
  for (int i = 0; i < 8; ++i) out.put(static_cast<char>((n >> (8 * i)) & 0xff));
  out << header;
  for (size_t i = 0; i < data_bytes; ++i) out.put('\0');
}

std::string error_of(const std::string& path) {
  try {
    emoe::SafetensorsFile f(path);
  } catch (const emoe::InputError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(Safetensors, RoundTripKeepsValuesDtypesAndMetadata) {
  emoe::test::TempDir tmp;
  auto f32 = torch::randn({3, 4});
  auto bf16 = torch::randn({5}).to(torch::kBFloat16);
  auto f16 = torch::randn({2, 2}).to(torch::kHalf);
  auto i64 = torch::arange(6).view({2, 3});
  auto empty = torch::zeros({0, 4});
  auto path = tmp.file("a.safetensors");
  emoe::save_safetensors(path, {{"w", f32}, {"b", bf16}, {"h", f16}, {"ids", i64}, {"e", empty}},
                         {{"format", "pt"}, {"note", "x"}});
  emoe::SafetensorsFile f(path);
  EXPECT_EQ(f.entries().size(), 5u);
  EXPECT_EQ(f.metadata().at("note"), "x");
  EXPECT_EQ(f.entry("b").dtype, "BF16");
  EXPECT_EQ(f.entry("h").dtype, "F16");
  EXPECT_TRUE(torch::equal(f.load("w"), f32));
  EXPECT_TRUE(torch::equal(f.load("b"), bf16));
  EXPECT_TRUE(torch::equal(f.load("ids"), i64));
  EXPECT_EQ(f.load("e").sizes(), empty.sizes());
  // floating tensors convert to the requested compute dtype; integers stay integers
  EXPECT_EQ(f.load("b", torch::kFloat).scalar_type(), torch::kFloat);
  EXPECT_TRUE(torch::equal(f.load("h", torch::kFloat), f16.to(torch::kFloat)));
  EXPECT_EQ(f.load("ids", torch::kFloat).scalar_type(), torch::kLong);
  // header is padded to 8 bytes
  std::ifstream in(path, std::ios::binary);
  uint64_t n = 0;
  in.read(reinterpret_cast<char*>(&n), 8);
  EXPECT_EQ(n % 8, 0u);
}

TEST(Safetensors, ReadsHuggingFaceFiles) {
  EMOE_REQUIRE_SHARED(path, "fixtures/tiny/gpt2_lm/model.safetensors");
  emoe::SafetensorsFile f(path);
  EXPECT_EQ(f.entry("transformer.h.0.attn.c_attn.weight").shape, (std::vector<int64_t>{32, 96}));
  EXPECT_EQ(f.metadata().at("format"), "pt");
}

TEST(Safetensors, ShardedIndexIsFollowed) {
  emoe::test::TempDir tmp;
  emoe::save_safetensors(tmp.file("model-00001-of-00002.safetensors"), {{"a", torch::ones({2})}});
  emoe::save_safetensors(tmp.file("model-00002-of-00002.safetensors"), {{"b", torch::zeros({3})}});
  std::ofstream(tmp.file("model.safetensors.index.json"))
      << R"({"metadata": {"total_size": 20}, "weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}})";
  emoe::CheckpointReader r(tmp.path());
  EXPECT_EQ(r.names(), (std::vector<std::string>{"a", "b"}));
  EXPECT_TRUE(torch::equal(r.load("b"), torch::zeros({3})));
  // an index naming a tensor its shard lacks is an error
  std::ofstream(tmp.file("model.safetensors.index.json"))
      << R"({"weight_map": {"zzz": "model-00001-of-00002.safetensors"}})";
  EXPECT_THROW(emoe::CheckpointReader{tmp.path()}, emoe::InputError);
  std::ofstream(tmp.file("model.safetensors.index.json")) << R"({"weight_map": {"a": "../x"}})";
  EXPECT_THROW(emoe::CheckpointReader{tmp.path()}, emoe::InputError);
}

TEST(Safetensors, PickleCheckpointsAreRefused) {
  emoe::test::TempDir tmp;
  std::ofstream(tmp.file("pytorch_model.bin")) << "not loaded";
  try {
    emoe::CheckpointReader r(tmp.path());
    FAIL() << "expected an error";
  } catch (const emoe::InputError& e) {
    EXPECT_NE(std::string(e.what()).find("pickle"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("safetensors"), std::string::npos) << e.what();
  }
  EXPECT_THROW(emoe::CheckpointReader(tmp.file("pytorch_model.bin")), emoe::InputError);
}

struct BadHeaderCase {
  std::string name, header;
  size_t data;
  std::optional<uint64_t> claimed;
  std::string expect;  // a substring of the message
};

class SafetensorsBadHeader : public ::testing::TestWithParam<BadHeaderCase> {};

TEST_P(SafetensorsBadHeader, GivesOneClearError) {
  const auto& c = GetParam();
  emoe::test::TempDir tmp;
  auto path = tmp.file("bad.safetensors");
  write_raw(path, c.header, c.data, c.claimed);
  std::string msg = error_of(path);
  ASSERT_FALSE(msg.empty()) << "no error for " << c.name;
  EXPECT_NE(msg.find(c.expect), std::string::npos) << msg;
  EXPECT_NE(msg.find(path), std::string::npos) << "message should name the file: " << msg;
  EXPECT_EQ(msg.find('\n'), std::string::npos) << "one line: " << msg;
}

INSTANTIATE_TEST_SUITE_P(
    Defects, SafetensorsBadHeader,
    ::testing::Values(
        BadHeaderCase{"length past end",
                      R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 4, 4096,
                      "runs past the end"},
        BadHeaderCase{"huge header", "{}", 0, 200ull * 1000 * 1000, "exceeds"},
        BadHeaderCase{"not json", "{not json", 0, std::nullopt, "not valid JSON"},
        BadHeaderCase{"not an object", "[1,2]", 0, std::nullopt, "expected a JSON object"},
        BadHeaderCase{"unknown dtype", R"({"a":{"dtype":"F7","shape":[1],"data_offsets":[0,4]}})",
                      4, std::nullopt, "unknown or unsupported dtype 'F7'"},
        BadHeaderCase{"negative shape",
                      R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4, std::nullopt,
                      "non-negative"},
        BadHeaderCase{"offsets out of range",
                      R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 4, std::nullopt,
                      "out of range"},
        BadHeaderCase{"size mismatch", R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})",
                      8, std::nullopt, "expected 12"},
        BadHeaderCase{"end before begin",
                      R"({"a":{"dtype":"F32","shape":[0],"data_offsets":[8,4]}})", 8, std::nullopt,
                      "end before begin"},
        BadHeaderCase{
            "overlap",
            R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
            12, std::nullopt, "overlap"},
        BadHeaderCase{"missing offsets", R"({"a":{"dtype":"F32","shape":[1]}})", 4, std::nullopt,
                      "data_offsets"},
        BadHeaderCase{"bad metadata", R"({"__metadata__":{"k":1}})", 0, std::nullopt,
                      "__metadata__"},
        BadHeaderCase{
            "huge shape",
            R"({"a":{"dtype":"F32","shape":[4294967296,4294967296,4294967296],"data_offsets":[0,4]}})",
            4, std::nullopt, "too many elements"}),
    [](const auto& info) {
      std::string n = info.param.name;
      for (auto& ch : n)
        if (!isalnum(static_cast<unsigned char>(ch))) ch = '_';
      return n;
    });

TEST(Safetensors, TruncatedFilesAreRejected) {
  emoe::test::TempDir tmp;
  auto path = tmp.file("short.safetensors");
  std::ofstream(path, std::ios::binary) << "abc";
  EXPECT_NE(error_of(path).find("too short"), std::string::npos);
  // a real file cut in the middle of its data
  auto full = tmp.file("full.safetensors");
  emoe::save_safetensors(full, {{"w", torch::randn({64, 64})}});
  auto size = std::filesystem::file_size(full);
  std::filesystem::resize_file(full, size - 100);
  EXPECT_NE(error_of(full).find("out of range"), std::string::npos) << error_of(full);
  EXPECT_NE(error_of(tmp.file("nope.safetensors")).find("cannot open"), std::string::npos);
}

TEST(Safetensors, ByteSizesReadAsHuggingFaceSpellsThem) {
  EXPECT_EQ(emoe::parse_byte_size("500MB", "x"), 500000000u);
  EXPECT_EQ(emoe::parse_byte_size("2GB", "x"), 2000000000u);
  EXPECT_EQ(emoe::parse_byte_size("10KB", "x"), 10000u);
  EXPECT_EQ(emoe::parse_byte_size("1GiB", "x"), 1073741824u);
  EXPECT_EQ(emoe::parse_byte_size("1.5MB", "x"), 1500000u);
  EXPECT_EQ(emoe::parse_byte_size("8Kb", "x"), 1000u);  // bits, as Hugging Face reads "b"
  EXPECT_EQ(emoe::parse_byte_size("4096", "x"), 4096u);
  EXPECT_EQ(emoe::parse_byte_size("100B", "x"), 100u);
  for (const char* bad : {"", "12XB", "-5MB", "0", "MB", "1e3", "2 G B"}) {
    SCOPED_TRACE(bad);
    try {
      emoe::parse_byte_size(bad, "--max-shard-size");
      FAIL() << "accepted";
    } catch (const emoe::InputError& e) {
      EXPECT_EQ(std::string(e.what()).rfind("--max-shard-size: expected a size such as 500MB", 0),
                0u)
          << e.what();
    }
  }
}

TEST(Safetensors, ShardedFolderReadsBackBitIdentical) {
  emoe::test::TempDir tmp;
  std::vector<std::pair<std::string, torch::Tensor>> tensors = {
      {"z.weight", torch::randn({64, 16})},                       // 4096 bytes
      {"a.weight", torch::randn({16, 16}).to(torch::kBFloat16)},  // 512 bytes
      {"m.big", torch::randn({2000})},                            // 8000 bytes: alone
      {"b.ids", torch::arange(10)},                               // 80 bytes
      {"c.half", torch::randn({3, 5}).to(torch::kHalf)}};         // 30 bytes
  const auto files = emoe::save_safetensors_folder(tmp.path(), tensors, {{"format", "pt"}}, 4608);
  EXPECT_EQ(files, (std::vector<std::string>{
                       "model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors",
                       "model-00003-of-00003.safetensors", "model.safetensors.index.json"}));
  EXPECT_FALSE(fs::exists(tmp.file("model.safetensors")));
  auto index = nlohmann::json::parse(std::ifstream(tmp.file("model.safetensors.index.json")));
  EXPECT_EQ(index["metadata"]["total_size"].get<uint64_t>(), 4096u + 512 + 8000 + 80 + 30);
  EXPECT_EQ(index["weight_map"]["z.weight"], "model-00001-of-00003.safetensors");
  EXPECT_EQ(index["weight_map"]["a.weight"], "model-00001-of-00003.safetensors");
  EXPECT_EQ(index["weight_map"]["m.big"], "model-00002-of-00003.safetensors");
  EXPECT_EQ(index["weight_map"]["c.half"], "model-00003-of-00003.safetensors");
  emoe::CheckpointReader r(tmp.path());
  EXPECT_EQ(r.names().size(), tensors.size());
  for (const auto& [name, t] : tensors) {
    auto back = r.load(name);
    EXPECT_EQ(back.scalar_type(), t.scalar_type()) << name;
    EXPECT_TRUE(torch::equal(back, t)) << name;
  }
  // under the limit: one model.safetensors, no index
  emoe::test::TempDir one;
  EXPECT_EQ(emoe::save_safetensors_folder(one.path(), tensors, {}, 1 << 20),
            (std::vector<std::string>{"model.safetensors"}));
  EXPECT_FALSE(fs::exists(one.file("model.safetensors.index.json")));
}

TEST(AtomicFolder, AFailedWriteLeavesTheOldFolderAndNoStaging) {
  emoe::test::TempDir tmp;
  const auto dir = tmp.file("model");
  emoe::write_folder_atomic(
      dir, [](const std::string& s) { std::ofstream(s + "/a.txt") << "one"; },
      [](const std::string&) { return false; });
  std::ofstream(dir + "/notes.md") << "kept";
  EXPECT_THROW(emoe::write_folder_atomic(
                   dir,
                   [](const std::string& s) {
                     std::ofstream(s + "/a.txt") << "two";
                     throw emoe::RuntimeError("disk full");
                   },
                   [](const std::string&) { return false; }),
               emoe::RuntimeError);
  std::ifstream in(dir + "/a.txt");
  std::string text;
  in >> text;
  EXPECT_EQ(text, "one");
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(tmp.path())) names.push_back(e.path().filename());
  EXPECT_EQ(names, (std::vector<std::string>{"model"}));  // no staging folder left
  // a successful write replaces what it owns, keeps other files, and leaves nothing beside
  emoe::write_folder_atomic(
      dir + "/", [](const std::string& s) { std::ofstream(s + "/b.txt") << "three"; },
      [](const std::string& name) { return name == "a.txt"; });
  EXPECT_FALSE(fs::exists(dir + "/a.txt"));
  EXPECT_TRUE(fs::exists(dir + "/b.txt"));
  EXPECT_TRUE(fs::exists(dir + "/notes.md"));
  names.clear();
  for (const auto& e : fs::directory_iterator(tmp.path())) names.push_back(e.path().filename());
  EXPECT_EQ(names, (std::vector<std::string>{"model"}));
}
