// The bad-input matrix of docs/errors.md: every row is run as written there. Each must exit with
// code 2, print exactly one line `emoe: error: ...` containing the row's text, and leave no `-o`
// target behind that was not there before.
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <regex>

#include "support/test_support.h"

namespace fs = std::filesystem;
using emoe::test::run_emoe;

namespace {

struct ErrorRow {
  std::string id, command, expected;
};

std::vector<ErrorRow> read_error_table(const std::string& path) {
  std::ifstream in(path);
  std::vector<ErrorRow> rows;
  std::string line;
  const std::regex row(R"(^\| (\d+) \|[^|]*\|[^|]*\| `(.+)` \| `(.+)` \|$)");
  while (std::getline(in, line)) {
    std::smatch m;
    if (std::regex_match(line, m, row)) rows.push_back({m[1], m[2], m[3]});
  }
  return rows;
}

std::string bad_slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void bad_write(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

// Rewrites a safetensors header (the data stays as it is).
void edit_header(const std::string& path, const std::function<void(nlohmann::json&)>& edit) {
  std::string f = bad_slurp(path);
  uint64_t n = 0;
  std::memcpy(&n, f.data(), 8);
  auto h = nlohmann::json::parse(f.substr(8, n));
  edit(h);
  std::string hb = h.dump();
  hb.append((8 - hb.size() % 8) % 8, ' ');
  uint64_t m = hb.size();
  std::string out(reinterpret_cast<const char*>(&m), 8);
  bad_write(path, out + hb + f.substr(8 + n));
}

void edit_config(const std::string& dir, const std::function<void(nlohmann::json&)>& edit) {
  auto j = nlohmann::json::parse(bad_slurp(dir + "/config.json"));
  edit(j);
  bad_write(dir + "/config.json", j.dump());
}

// A safetensors file of int64 [1, n] tensors (forward's inputs).
void write_ids(const std::string& path,
               const std::vector<std::pair<std::string, std::vector<int64_t>>>& tensors) {
  nlohmann::json h = nlohmann::json::object();
  std::string data;
  for (const auto& [name, v] : tensors) {
    const auto begin = data.size();
    data.append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(int64_t));
    h[name] = {{"dtype", "I64"},
               {"shape", {1, static_cast<int64_t>(v.size())}},
               {"data_offsets", {begin, data.size()}}};
  }
  std::string hb = h.dump();
  hb.append((8 - hb.size() % 8) % 8, ' ');
  uint64_t m = hb.size();
  bad_write(path, std::string(reinterpret_cast<const char*>(&m), 8) + hb + data);
}

void make_fixtures(const std::string& t, const std::string& bert, const std::string& stories) {
  auto copy = [&](const std::string& name) {
    fs::copy(bert, t + "/" + name, fs::copy_options::recursive);
    return t + "/" + name;
  };
  fs::create_directories(t + "/noconfig");
  fs::copy(bert + "/model.safetensors", t + "/noconfig/model.safetensors");
  bad_write(copy("badjson") + "/config.json", "{not json");
  edit_config(copy("wrongtype"), [](nlohmann::json& j) { j["num_hidden_layers"] = "four"; });
  edit_config(copy("hugevocab"),
              [](nlohmann::json& j) { j["vocab_size"] = int64_t{1000000000000}; });
  edit_config(copy("hugemodel"), [](nlohmann::json& j) {
    j["num_hidden_layers"] = 4000;
    j["hidden_size"] = 65536;
    j["num_attention_heads"] = 1024;
    j["intermediate_size"] = 262144;
  });
  fs::resize_file(copy("trunc") + "/model.safetensors", 1000);
  fs::create_directories(t + "/pickle");
  fs::copy(bert + "/config.json", t + "/pickle/config.json");
  bad_write(t + "/pickle/pytorch_model.bin", "x");
  edit_config(copy("wrongshape"), [](nlohmann::json& j) {
    j["intermediate_size"] = 2 * j["intermediate_size"].get<int>();
  });
  edit_header(copy("unkdtype") + "/model.safetensors",
              [](nlohmann::json& h) { h["bert.embeddings.LayerNorm.bias"]["dtype"] = "Q7"; });
  edit_header(copy("overlap") + "/model.safetensors", [](nlohmann::json& h) {
    auto& a = h["bert.embeddings.LayerNorm.weight"]["data_offsets"];
    auto& b = h["bert.embeddings.LayerNorm.bias"]["data_offsets"];
    const auto len = b[1].get<int64_t>() - b[0].get<int64_t>();
    b = {a[0].get<int64_t>(), a[0].get<int64_t>() + len};
  });
  edit_header(copy("missingtensor") + "/model.safetensors",
              [](nlohmann::json& h) { h.erase("bert.embeddings.LayerNorm.bias"); });
  {
    auto p = copy("hdrjson") + "/model.safetensors";
    std::string f = bad_slurp(p);
    f[8] = '#';
    bad_write(p, f);
  }
  edit_config(copy("dropout1"), [](nlohmann::json& j) { j["hidden_dropout_prob"] = 1.5; });
  {  // a NaN as the first value of one (float32) tensor
    auto p = copy("nanweight") + "/model.safetensors";
    std::string f = bad_slurp(p);
    uint64_t n = 0;
    std::memcpy(&n, f.data(), 8);
    auto h = nlohmann::json::parse(f.substr(8, n));
    const auto& e = h["bert.embeddings.LayerNorm.bias"];
    ASSERT_EQ(e["dtype"], "F32");
    const float nan = std::numeric_limits<float>::quiet_NaN();
    std::memcpy(&f[8 + n + e["data_offsets"][0].get<size_t>()], &nan, sizeof nan);
    bad_write(p, f);
  }
  bad_write(t + "/list.yaml", "- model: m\n- task: sst2\n");
  bad_write(t + "/dup.yaml", "model: m\ntask: sst2\ntask: cola\n");
  bad_write(t + "/bad.yaml", "model: [unclosed\n");
  bad_write(t + "/unk.yaml", "model: m\ntask: sst2\nmethd: full\n");
  bad_write(t + "/type.yaml", "model: m\ntask: sst2\ntrain: {lr: abc}\n");
  bad_write(t + "/corpus.txt", "the cat sat on the mat .\n");
  bad_write(t + "/badlabel.tsv", "sentence\tlabel\ngood\t1\nbad\t7\n");
  bad_write(t + "/nocol.tsv", "text\tlabel\ngood\t1\n");
  bad_write(t + "/bad_alpaca.json", "[{\"instruction\": \"x\", \"output\": \n");
  fs::create_directories(t + "/notok");
  fs::copy(bert + "/config.json", t + "/notok/config.json");
  fs::create_directories(t + "/badvocab");
  bad_write(t + "/badvocab/vocab.json", "{\"a\": 1, \n");
  bad_write(t + "/badvocab/merges.txt", "#version: 0.2\n");
  fs::create_directories(t + "/badtokjson");
  bad_write(t + "/badtokjson/tokenizer.json", R"({"model": {"type": "WordPiece", "vocab": 5}})");
  bad_write(t + "/sweep.yaml", "model: " + bert + "\ntask: sst2\nmethod: emoe\n");
  write_ids(t + "/types.safetensors", {{"input_ids", {2, 100, 3}}, {"token_type_ids", {0, 5, 0}}});
  write_ids(t + "/labels.safetensors",
            {{"input_ids", {2, 100, 3}}, {"labels", {-100, 9000, -100}}});
  fs::copy(stories, t + "/shortpos", fs::copy_options::recursive);
  edit_config(t + "/shortpos", [](nlohmann::json& j) { j["max_position_embeddings"] = 4; });
  bad_write(t + "/null.jsonl", "{\"sentence\": null, \"label\": 1}\n");
  bad_write(t + "/number.jsonl", "{\"sentence\": 5, \"label\": 1}\n");
  bad_write(t + "/ok.tsv", "sentence\tlabel\ngood\tpos\n");
  bad_write(t + "/header.tsv", "sentence\tlabel\n");
  bad_write(t + "/empty_out.json",
            R"([{"instruction": "a", "output": ""}, {"instruction": "b", "output": ""}])");
  fs::create_directories(t + "/done-sweep/emoe/default/seed-0");  // a finished run, another config
  bad_write(t + "/done-sweep/emoe/default/seed-0/results.json", "{}");
  bad_write(t + "/done-sweep/emoe/default/seed-0/config.json", R"({"train": {"lr": 0.5}})");
  fs::create_directories(t + "/run");
  bad_write(t + "/run/config.json", R"({"train": {}})");
}

std::string substitute(std::string s, const std::map<std::string, std::string>& vars) {
  for (const auto& [k, v] : vars)
    for (size_t p; (p = s.find(k)) != std::string::npos;) s.replace(p, k.size(), v);
  return s;
}

}  // namespace

TEST(BadInput, EveryRowOfDocsErrorsMd) {
  EMOE_REQUIRE_SHARED(bert, "models/bert-mini");
  EMOE_REQUIRE_SHARED(stories, "models/stories260K/hf");
  EMOE_REQUIRE_SHARED(data, "data");
  const auto rows = read_error_table(emoe::test::source_dir() + "/docs/errors.md");
  ASSERT_GE(rows.size(), 40u) << "docs/errors.md lists fewer than 40 cases";
  emoe::test::TempDir tmp;
  make_fixtures(tmp.path(), bert, stories);
  const std::map<std::string, std::string> vars = {
      {"{tmp}", tmp.path()}, {"{bert}", bert}, {"{stories}", stories}, {"{data}", data}};
  for (const auto& r : rows) {
    SCOPED_TRACE("docs/errors.md case " + r.id + ": emoe " + r.command);
    const std::string args = substitute(r.command, vars);
    std::smatch m;
    std::string target;
    if (std::regex_search(args, m, std::regex(R"(-o (\S+))"))) target = m[1];
    const bool existed = !target.empty() && fs::exists(target);
    const auto before =
        existed && fs::is_directory(target) ? fs::last_write_time(target) : fs::file_time_type{};
    auto res = run_emoe(args + " -q");  // -q: no progress log lines before the error
    EXPECT_EQ(res.exit_code, 2) << res.err;
    EXPECT_EQ(res.err.rfind("emoe: error: ", 0), 0u) << res.err;
    EXPECT_EQ(std::count(res.err.begin(), res.err.end(), '\n'), 1) << "one line expected:\n"
                                                                   << res.err;
    EXPECT_NE(res.err.find(r.expected), std::string::npos) << res.err;
    if (!target.empty()) {
      EXPECT_EQ(fs::exists(target), existed) << target << " was left behind";
      if (existed && fs::is_directory(target))
        EXPECT_EQ(fs::last_write_time(target), before) << target << " changed";
    }
  }
}
