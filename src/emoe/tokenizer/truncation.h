// Truncation to max_length with Hugging Face's "longest_first" strategy.
#pragma once
#include <cstdint>
#include <vector>

namespace emoe {

// Shortens `ids` (and `pair` when given) so that their lengths plus `num_special` fit in
// `max_length`, exactly as transformers 4.33 truncate_sequences(..., "longest_first") with
// truncation_side "right": a single sequence loses its tail; for a pair, the longer sequence is
// cut to the other's length first, then the rest is removed from both, the first sequence getting
// the smaller half. Throws InputError when max_length leaves no room for any text token.
void truncate_longest_first(std::vector<int64_t>& ids, std::vector<int64_t>* pair,
                            int64_t num_special, int64_t max_length);

}  // namespace emoe
