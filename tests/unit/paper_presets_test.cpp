// configs/paper/ against the table of docs/paper_protocol.md: every preset loads, and its resolved
// values are the ones the document states (so that the two cannot drift apart).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "emoe/core/error.h"
#include "emoe/train/run_config.h"
#include "support/test_support.h"

namespace {

namespace fs = std::filesystem;

std::string preset_trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t`"), e = s.find_last_not_of(" \t`");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

std::vector<std::string> preset_cells(const std::string& line) {
  std::vector<std::string> out;
  std::stringstream ss(line.substr(1));  // after the leading '|'
  std::string cell;
  while (std::getline(ss, cell, '|')) out.push_back(preset_trim(cell));
  if (!out.empty() && out.back().empty()) out.pop_back();
  return out;
}

struct PresetTable {
  std::vector<std::string> keys;                         // column keys after "file"
  std::map<std::string, std::vector<std::string>> rows;  // file -> cells
};

// The markdown table whose header starts with "| file |".
PresetTable read_preset_table(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << path;
  PresetTable t;
  std::string line;
  bool inside = false;
  while (std::getline(in, line)) {
    if (!inside) {
      if (line.rfind("| file |", 0) == 0) {
        auto c = preset_cells(line);
        t.keys.assign(c.begin() + 1, c.end());
        inside = true;
        std::getline(in, line);  // |---|---|
      }
      continue;
    }
    if (line.empty() || line[0] != '|') break;
    auto c = preset_cells(line);
    EXPECT_EQ(c.size(), t.keys.size() + 1) << line;
    EXPECT_TRUE(t.rows.emplace(c[0], std::vector<std::string>(c.begin() + 1, c.end())).second)
        << c[0] << " has two rows";
  }
  return t;
}

// A dotted key ("train.lr") of the resolved config.
const nlohmann::json* preset_lookup(const nlohmann::json& j, const std::string& key) {
  const nlohmann::json* cur = &j;
  std::stringstream ss(key);
  std::string part;
  while (std::getline(ss, part, '.')) {
    if (!cur->is_object() || !cur->contains(part)) return nullptr;
    cur = &(*cur)[part];
  }
  return cur;
}

// A cell against the resolved value: numbers to 1e-12 (relative), lists and strings exactly.
bool preset_cell_matches(const std::string& cell, const nlohmann::json& value) {
  nlohmann::json want;
  try {
    want = nlohmann::json::parse(cell);
  } catch (const nlohmann::json::exception&) {
    want = cell;  // a bare word: a string
  }
  if (want.is_number() && value.is_number()) {
    const double a = want.get<double>(), b = value.get<double>();
    return std::abs(a - b) <= 1e-12 * std::max(1.0, std::abs(b));
  }
  if (want.is_array() && value.is_array() && want.size() == value.size()) {
    for (size_t i = 0; i < want.size(); ++i)
      if (!preset_cell_matches(want[i].dump(), value[i])) return false;
    return true;
  }
  return want == value;
}

}  // namespace

TEST(PaperPresets, EveryFileMatchesTheProtocolTable) {
  const std::string root = emoe::test::source_dir();
  const PresetTable table = read_preset_table(root + "/docs/paper_protocol.md");
  ASSERT_FALSE(table.keys.empty()) << "docs/paper_protocol.md: no table starting with | file |";
  std::set<std::string> files;
  for (const auto& e : fs::directory_iterator(root + "/configs/paper"))
    if (e.path().extension() == ".yaml") files.insert(e.path().filename().string());
  ASSERT_GE(files.size(), 10u);
  for (const auto& [file, cells] : table.rows)
    EXPECT_TRUE(files.count(file))
        << "docs/paper_protocol.md: row " << file << " has no file in configs/paper/";
  for (const auto& file : files) {
    SCOPED_TRACE(file);
    auto row = table.rows.find(file);
    if (row == table.rows.end()) {
      ADD_FAILURE() << "configs/paper/" << file << " has no row in docs/paper_protocol.md";
      continue;
    }
    // the model is the user's: the file leaves it out and runs with --set model=DIR
    const std::string path = root + "/configs/paper/" + file;
    EXPECT_THROW(emoe::load_run_config(path), emoe::InputError);
    const emoe::RunConfig cfg = emoe::load_run_config(path, {"model=/models/dummy"});
    const nlohmann::json resolved = cfg.to_json();
    for (size_t i = 0; i < table.keys.size(); ++i) {
      const std::string& key = table.keys[i];
      const std::string& cell = row->second[i];
      if (cell == "—") {
        // a key the method does not read
        if (key.rfind("moe.", 0) == 0) EXPECT_FALSE(cfg.uses_moe()) << key;
        if (key.rfind("peft.", 0) == 0)
          EXPECT_EQ(cfg.peft_method(), emoe::PeftMethod::kNone) << key;
        continue;
      }
      const nlohmann::json* v = preset_lookup(resolved, key);
      if (v == nullptr) {
        ADD_FAILURE() << key << ": not a key of the resolved config";
        continue;
      }
      EXPECT_TRUE(preset_cell_matches(cell, *v)) << key << ": docs/paper_protocol.md says " << cell
                                                 << ", the file resolves to " << v->dump();
    }
  }
}

TEST(PaperPresets, TheAuthorsLayerPresetsAndGlueRecipe) {
  // a few values stated in issue 26 and SPEC §4, checked on the files directly
  const std::string dir = emoe::test::source_dir() + "/configs/paper/";
  auto load = [&](const std::string& f) {
    return emoe::load_run_config(dir + f, {"model=/models/dummy"});
  };
  auto emoe_base = load("bert-base-glue-emoe.yaml");
  EXPECT_EQ(emoe_base.moe.layers, (std::vector<int64_t>{10}));
  EXPECT_EQ(emoe_base.moe.experts, 64);
  EXPECT_EQ(emoe_base.moe.topk, 16);
  EXPECT_DOUBLE_EQ(emoe_base.train.grad_clip, 0.0);
  EXPECT_EQ(emoe_base.train.epochs, 10);
  EXPECT_TRUE(emoe_base.moe.tutel);
  EXPECT_DOUBLE_EQ(emoe_base.moe.capacity_factor, 1.5);
  auto gmoe = load("bert-base-glue-gmoe.yaml");
  EXPECT_EQ(gmoe.moe.experts, 6);
  EXPECT_EQ(gmoe.moe.topk, 1);
  EXPECT_EQ(load("bert-base-glue-emoe-learn.yaml").moe.gate, emoe::GateKind::kCosine);
  EXPECT_EQ(load("gpt2-xl-glue-emoe-lora.yaml").moe.layers, (std::vector<int64_t>{44}));
  EXPECT_EQ(load("bert-base-glue-lora.yaml").train.epochs, 20);
  auto llama = load("llama-7b-alpaca-emoe.yaml");
  EXPECT_EQ(llama.moe.layers, (std::vector<int64_t>{28, 30}));  // from 28, every 2, of 32
  EXPECT_EQ(llama.train.batch_size * llama.train.grad_accum, 128);
  EXPECT_FALSE(llama.moe.tutel);
}
