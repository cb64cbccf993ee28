// HF's longest_first truncation for one sequence or a pair.
#include "emoe/tokenizer/truncation.h"

#include <algorithm>
#include <cstdlib>

#include "emoe/core/error.h"

namespace emoe {

void truncate_longest_first(std::vector<int64_t>& ids, std::vector<int64_t>* pair,
                            int64_t num_special, int64_t max_length) {
  auto len_ids = static_cast<int64_t>(ids.size());
  int64_t len_pair = pair ? static_cast<int64_t>(pair->size()) : 0;
  int64_t total = len_ids + len_pair + num_special;
  if (max_length <= 0 || total <= max_length) return;
  int64_t remove = total - max_length;

  if (!pair) {
    // HF logs an error and returns the sequence untruncated; a clear error is more useful.
    EMOE_CHECK(len_ids > remove, InputError,
               "max_length {} is too small: the template adds {} special tokens, which leaves no "
               "room for the text ({} tokens)",
               max_length, num_special, len_ids);
    ids.resize(static_cast<size_t>(len_ids - remove));
    return;
  }
  EMOE_CHECK(max_length >= num_special, InputError,
             "max_length {} is too small for a pair: the template alone adds {} special tokens",
             max_length, num_special);
  int64_t first_remove = std::min(std::abs(len_pair - len_ids), remove);
  int64_t second_remove = remove - first_remove;
  int64_t ids_to_move = 0, pair_to_move = 0;
  if (len_ids > len_pair) {
    ids_to_move = first_remove + second_remove / 2;
    pair_to_move = second_remove - second_remove / 2;
  } else {
    ids_to_move = second_remove / 2;
    pair_to_move = first_remove + second_remove - second_remove / 2;
  }
  ids.resize(static_cast<size_t>(std::max<int64_t>(0, len_ids - ids_to_move)));
  pair->resize(static_cast<size_t>(std::max<int64_t>(0, len_pair - pair_to_move)));
}

}  // namespace emoe
