// Sample text for calibration (co-activation split, MoEfication): lines -> padded id batches.
#pragma once
#include <string>
#include <vector>

#include "emoe/models/model.h"

namespace emoe::cli {

// Reads up to `max_tokens` tokens of text lines from `path`, tokenised with the model folder's
// tokenizer, as right-padded batches of 16 sequences of at most `max_len` tokens.
std::vector<ModelInputs> read_sample_batches(const std::string& path, const std::string& model_dir,
                                             int64_t max_tokens, int64_t max_len);

}  // namespace emoe::cli
