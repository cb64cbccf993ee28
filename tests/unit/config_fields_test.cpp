// The run configuration's field table: complete, enforced range by range, and docs/config.md is
// its current output.
#include "emoe/train/config_fields.h"

#include <cmath>
#include <fstream>
#include <set>
#include <sstream>

#include "emoe/core/error.h"
#include "emoe/train/run_config.h"
#include "support/test_support.h"

namespace {

// A classification run with its own data set, and a seq2seq run: between them every key.
nlohmann::json fields_base_config(bool seq2seq, const std::string& method = "emoe") {
  nlohmann::json j = {{"model", "m"}, {"method", method}, {"output", "o"}};
  if (seq2seq) {
    j["objective"] = "seq2seq";
    j["mixture"] = {{"tasks", {"sst2"}}};
  } else {
    j["task"] = "sst2";
  }
  return j;
}

void fields_set(nlohmann::json& j, const std::string& key, const nlohmann::json& v) {
  nlohmann::json* node = &j;
  size_t start = 0;
  for (size_t dot; (dot = key.find('.', start)) != std::string::npos; start = dot + 1) {
    const std::string part = key.substr(start, dot - start);
    if (!node->contains(part) || !(*node)[part].is_object())
      (*node)[part] = nlohmann::json::object();
    node = &(*node)[part];
  }
  (*node)[key.substr(start)] = v;
}

// The error of loading `j`, or "" when it loads and validates.
std::string fields_error(const nlohmann::json& j) {
  try {
    emoe::RunConfig::from_json(j, "t").validate();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

bool fields_seq2seq_only(const std::string& key) {
  return key.rfind("mixture.", 0) == 0 || key == "train.max_target_length";
}

// A method that reads the key (peft.* on an emoe run would only be warned about).
std::string fields_method(const std::string& key) {
  return key.rfind("peft.", 0) == 0 ? "molora" : "emoe";
}

// Leaf keys of a resolved config, a table key counting as a leaf (dataset.ood is a mapping).
void fields_leaves(const nlohmann::json& j, const std::string& prefix,
                   const std::set<std::string>& table, std::set<std::string>& out) {
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string key = prefix.empty() ? it.key() : prefix + "." + it.key();
    if (it.value().is_null() && key == "dataset") continue;  // no dataset: its keys unset
    if (table.count(key) || !it.value().is_object())
      out.insert(key);
    else
      fields_leaves(it.value(), key, table, out);
  }
}

}  // namespace

TEST(ConfigFields, EveryResolvedKeyIsInTheTableAndBack) {
  std::set<std::string> table;
  for (const auto& f : emoe::run_config_fields())
    EXPECT_TRUE(table.insert(f.key).second) << f.key << " is listed twice";
  nlohmann::json cls = fields_base_config(false);
  cls["dataset"] = {{"train", "a.tsv"}, {"dev", "b.tsv"}, {"labels", {"neg", "pos"}}};
  cls["max_shard_size"] = "2GB";
  cls["train"] = {
      {"trainable", "moe-layers"}, {"sharding", "gradients"}, {"gradient_checkpointing", true}};
  std::set<std::string> resolved;
  for (const auto& j : {cls, fields_base_config(true)}) {
    const auto c = emoe::RunConfig::from_json(j, "t");
    fields_leaves(c.to_json(), "", table, resolved);
  }
  // not written when empty: the method's default layers
  for (const char* k : {"moe.layers", "moe.encoder_layers", "moe.decoder_layers"})
    resolved.erase(k);
  for (const auto& k : resolved) EXPECT_TRUE(table.count(k)) << k << " is not in the field table";
  for (const auto& k : table)
    EXPECT_TRUE(resolved.count(k) || k == "moe.layers" || k == "moe.encoder_layers" ||
                k == "moe.decoder_layers")
        << k << " is in no resolved config";
}

TEST(ConfigFields, EveryRangeRefusesTheValuesOutsideIt) {
  int checked = 0;
  for (const auto& f : emoe::run_config_fields()) {
    if (!f.range) continue;
    const bool integer = f.type == "integer";
    std::vector<double> outside, inside;
    if (std::isfinite(f.range->min)) {
      outside.push_back(f.range->min_open ? f.range->min : f.range->min - 1);
      inside.push_back(f.range->min_open ? f.range->min + (integer ? 1 : 1e-3) : f.range->min);
    }
    if (std::isfinite(f.range->max)) {
      outside.push_back(f.range->max_open ? f.range->max : f.range->max + 1);
      inside.push_back(f.range->max_open ? f.range->max - (integer ? 1 : 1e-3) : f.range->max);
    }
    const std::string message = f.key + ": expected " + f.range->to_string();
    for (double v : outside) {
      nlohmann::json j = fields_base_config(fields_seq2seq_only(f.key), fields_method(f.key));
      fields_set(j, f.key, integer ? nlohmann::json(static_cast<int64_t>(v)) : nlohmann::json(v));
      const std::string err = fields_error(j);
      EXPECT_NE(err.find(message), std::string::npos) << f.key << "=" << v << ": " << err;
      ++checked;
    }
    for (double v : inside) {  // may be refused by another rule, never by the range
      nlohmann::json j = fields_base_config(fields_seq2seq_only(f.key), fields_method(f.key));
      fields_set(j, f.key, integer ? nlohmann::json(static_cast<int64_t>(v)) : nlohmann::json(v));
      EXPECT_EQ(fields_error(j).find(message), std::string::npos) << f.key << "=" << v;
    }
  }
  EXPECT_GE(checked, 50);
  // not a number at all: refused when read, naming the key
  nlohmann::json j = fields_base_config(false);
  fields_set(j, "train.lr", std::numeric_limits<double>::infinity());
  EXPECT_NE(fields_error(j).find("train.lr: expected (0, inf), got inf"), std::string::npos)
      << fields_error(j);
}

TEST(ConfigFields, DeviceNamesTheRunConfigKey) {
  nlohmann::json j = fields_base_config(false);
  j["device"] = "tpu";
  EXPECT_NE(fields_error(j).find("run config: device: expected cpu, cuda or cuda:N, got 'tpu'"),
            std::string::npos)
      << fields_error(j);
  j["device"] = "cuda:1x";
  EXPECT_NE(fields_error(j).find("run config: device: expected cpu, cuda or cuda:N"),
            std::string::npos)
      << fields_error(j);
}

TEST(ConfigFields, DocsConfigMdIsTheTablesOutput) {
  std::ifstream in(emoe::test::source_dir() + "/docs/config.md");
  ASSERT_TRUE(in) << "docs/config.md is missing: build/emoe train --fields > docs/config.md";
  std::stringstream ss;
  ss << in.rdbuf();
  EXPECT_EQ(ss.str(), emoe::config_fields_markdown())
      << "docs/config.md is stale: regenerate it with build/emoe train --fields > docs/config.md";
}
