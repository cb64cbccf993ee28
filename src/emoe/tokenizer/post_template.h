// Where a tokenizer puts its special tokens around one or two sequences (HF's post-processor).
#pragma once
#include <cstdint>
#include <optional>
#include <vector>

#include "emoe/tokenizer/tokenizer.h"

namespace emoe {

// One slot of a template: sequence A, sequence B, or a fixed special token id.
struct TemplateItem {
  enum class Kind { kSequenceA, kSequenceB, kSpecial };
  Kind kind = Kind::kSpecial;
  int64_t id = -1;  // for kSpecial
  int64_t type_id = 0;
};

// HF's build_inputs_with_special_tokens + create_token_type_ids_from_sequences as data, so that
// tokenizer.json's TemplateProcessing maps onto the same code as the slow tokenizers.
struct PostTemplate {
  std::vector<TemplateItem> single;
  std::vector<TemplateItem> pair;

  // BERT: [CLS] A [SEP] (B [SEP]); type ids 0 for the first part, 1 for B [SEP].
  static PostTemplate bert(int64_t cls, int64_t sep);
  // GPT-2 / Llama: (bos) A (eos) ((bos) B (eos)); type ids 1 from the second sequence's part on.
  static PostTemplate bos_eos(std::optional<int64_t> bos, std::optional<int64_t> eos);

  int64_t num_special(bool is_pair) const;
  Encoding apply(const std::vector<int64_t>& a, const std::vector<int64_t>* b) const;
  // encode()/encode_pair() of a tokenizer from the text's ids: truncation to max_length (> 0)
  // with room for the template's tokens, then the template, or without it type ids 0 for both.
  Encoding encode(std::vector<int64_t> a, std::vector<int64_t>* b, bool add_special_tokens,
                  int64_t max_length) const;
};

}  // namespace emoe
