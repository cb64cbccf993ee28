// PCRE2 behind emoe::Regex: compiled once with UTF and UCP, JIT-compiled when the CPU allows.
#include "emoe/tokenizer/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "emoe/core/error.h"

namespace emoe {

struct Regex::Impl {
  pcre2_code* code = nullptr;
  bool jit = false;
  ~Impl() {
    if (code) pcre2_code_free(code);
  }
};

namespace {

std::string pcre2_message(int code) {
  PCRE2_UCHAR buffer[256];
  int n = pcre2_get_error_message(code, buffer, sizeof(buffer));
  if (n < 0) return fmt::format("PCRE2 error {}", code);
  return std::string(reinterpret_cast<const char*>(buffer), static_cast<size_t>(n));
}

// The length of the UTF-8 character starting with byte `lead` (1 for a stray byte).
size_t utf8_length(unsigned char lead) {
  if (lead < 0xC0) return 1;
  if (lead < 0xE0) return 2;
  if (lead < 0xF0) return 3;
  return 4;
}

// Frees match data on every path.
struct MatchData {
  explicit MatchData(const pcre2_code* code)
      : data(pcre2_match_data_create_from_pattern(code, nullptr)) {}
  ~MatchData() {
    if (data) pcre2_match_data_free(data);
  }
  pcre2_match_data* data;
};

}  // namespace

Regex::Regex(const std::string& pattern, const std::string& where)
    : impl_(std::make_unique<Impl>()), pattern_(pattern) {
  int error = 0;
  PCRE2_SIZE offset = 0;
  // UCP: \s, \d, \w and POSIX classes follow Unicode properties, as Oniguruma's do.
  impl_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                              PCRE2_UTF | PCRE2_UCP, &error, &offset, nullptr);
  EMOE_CHECK(impl_->code, InputError,
             "{}: cannot compile the regular expression '{}': {} at offset {}", where, pattern,
             pcre2_message(error), offset);
  // JIT is an optimisation only: without it (no JIT support on this CPU) matching is the same.
  impl_->jit = pcre2_jit_compile(impl_->code, PCRE2_JIT_COMPLETE) == 0;
}

Regex::~Regex() = default;

std::vector<std::pair<size_t, size_t>> Regex::find_all(std::string_view text) const {
  std::vector<std::pair<size_t, size_t>> spans;
  MatchData md(impl_->code);
  EMOE_CHECK(md.data, RuntimeError, "PCRE2: cannot allocate match data");
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t start = 0;
  while (start <= text.size()) {
    // The subject is valid UTF-8 (checked by the caller), so PCRE2 need not check it again.
    int rc = impl_->jit ? pcre2_jit_match(impl_->code, subject, text.size(), start,
                                          PCRE2_NO_UTF_CHECK, md.data, nullptr)
                        : pcre2_match(impl_->code, subject, text.size(), start, PCRE2_NO_UTF_CHECK,
                                      md.data, nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    EMOE_CHECK(rc >= 0, InputError, "regular expression '{}': matching failed: {}", pattern_,
               pcre2_message(rc));
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.data);
    size_t b = ov[0], e = ov[1];
    if (e > b) {
      spans.emplace_back(b, e);
      start = e;
    } else {  // an empty match: nothing to keep, step over one character
      if (b >= text.size()) break;
      start = b + utf8_length(static_cast<unsigned char>(text[b]));
    }
  }
  return spans;
}

}  // namespace emoe
