// Fuzzes config.json: the input is the file in a model folder. It is read with
// read_model_config, its architecture and head detected, and the architecture's own config
// parsed and validated (BertConfig / Gpt2Config / LlamaConfig / T5Config::from_json). When the
// sizes it names are tiny (at most ~300k parameters by the estimate below, which leaves out
// num_labels on purpose: create_model must bound that itself), the model is built with
// create_model, which also runs the size checks against oversized configs.
#include <algorithm>
#include <cstdint>
#include <string>

#include "emoe/core/error.h"
#include "emoe/io/hf_config.h"
#include "emoe/models/bert.h"
#include "emoe/models/gpt2.h"
#include "emoe/models/llama.h"
#include "emoe/models/loader.h"
#include "emoe/models/t5.h"
#include "fuzz_util.h"

namespace {

double estimate(const emoe::JsonFields& cfg, const std::string& type) {
  auto d = [](int64_t v) { return static_cast<double>(v); };
  if (type == "bert") {
    auto c = emoe::BertConfig::from_json(cfg);
    const double h = d(c.hidden_size);
    return (d(c.vocab_size) + d(c.max_position_embeddings) + d(c.type_vocab_size)) * h +
           d(c.num_hidden_layers) * (4 * h * h + 2 * h * d(c.intermediate_size));
  }
  if (type == "gpt2") {
    auto c = emoe::Gpt2Config::from_json(cfg);
    const double h = d(c.n_embd);
    const double ff = c.n_inner > 0 ? d(c.n_inner) : 4 * h;
    return (d(c.vocab_size) + d(c.n_positions)) * h * 2 + d(c.n_layer) * (4 * h * h + 2 * h * ff);
  }
  if (type == "llama") {
    auto c = emoe::LlamaConfig::from_json(cfg);
    const double h = d(c.hidden_size);
    return d(c.vocab_size) * h * 2 +
           d(c.num_hidden_layers) * (4 * h * h + 3 * h * d(c.intermediate_size));
  }
  auto c = emoe::T5Config::from_json(cfg);
  const double h = d(c.d_model), inner = d(c.num_heads) * d(c.d_kv);
  return d(c.vocab_size) * h * 2 +
         (d(c.num_layers) + d(c.num_decoder_layers)) * (4 * h * inner + 3 * h * d(c.d_ff)) +
         2 * d(c.relative_attention_num_buckets) * d(c.num_heads);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  emoe_fuzz::put("config.json", std::string(reinterpret_cast<const char*>(data), size));
  try {
    emoe::JsonFields cfg = emoe::read_model_config(emoe_fuzz::folder());
    const std::string type = emoe::detect_model_type(cfg);
    const emoe::Head head = emoe::default_head(cfg);
    const double params = estimate(cfg, type);
    if (params >= 0 && params <= 3e5) {
      auto model = emoe::create_model(cfg, head);
      (void)model;
    }
  } catch (const emoe::InputError&) {
  } catch (const emoe::RuntimeError&) {
  }
  return 0;
}
