// Calibration text batches for the commands that gather activations.
#include "sample_text.h"

#include <torch/torch.h>

#include <fstream>

#include "emoe/core/error.h"
#include "emoe/tokenizer/tokenizer.h"

namespace emoe::cli {

std::vector<ModelInputs> read_sample_batches(const std::string& path, const std::string& model_dir,
                                             int64_t max_tokens, int64_t max_len) {
  std::ifstream in(path);
  EMOE_CHECK(in.good(), InputError, "{}: cannot open sample text", path);
  auto tok = load_tokenizer(model_dir);
  const int64_t pad = tok->special().pad.value_or(0);
  std::vector<std::vector<int64_t>> seqs;
  int64_t total = 0;
  std::string line;
  while (total < max_tokens && std::getline(in, line)) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    auto ids = tok->encode(line, true, max_len).ids;
    if (ids.empty()) continue;
    total += static_cast<int64_t>(ids.size());
    seqs.push_back(std::move(ids));
  }
  EMOE_CHECK(!seqs.empty(), InputError, "{}: no non-empty lines of sample text", path);
  std::vector<ModelInputs> batches;
  for (size_t b = 0; b < seqs.size(); b += 16) {
    size_t e = std::min(seqs.size(), b + 16);
    size_t len = 0;
    for (size_t i = b; i < e; ++i) len = std::max(len, seqs[i].size());
    auto ids =
        torch::full({static_cast<int64_t>(e - b), static_cast<int64_t>(len)}, pad, torch::kLong);
    auto mask = torch::zeros_like(ids);
    for (size_t i = b; i < e; ++i) {
      auto n = static_cast<int64_t>(seqs[i].size());
      ids[i - b].narrow(0, 0, n).copy_(torch::tensor(seqs[i], torch::kLong));
      mask[i - b].narrow(0, 0, n).fill_(1);
    }
    ModelInputs mi;
    mi.input_ids = ids;
    mi.attention_mask = mask;
    batches.push_back(mi);
  }
  return batches;
}

}  // namespace emoe::cli
