// Unicode helpers implemented on utf8proc, with Python's exact rules where tokenizers rely on them.
#include "emoe/tokenizer/unicode.h"

#include <utf8proc.h>

#include <vector>

#include "emoe/core/error.h"

namespace emoe::unicode {

namespace {

constexpr char32_t kReplacement = 0xFFFD;

// Length of the valid UTF-8 sequence at `p` (1..4), or 0 when it is invalid. On 0, `bad` is the
// length of the maximal invalid subpart to replace by one U+FFFD (Unicode 3.9, "best practice",
// which CPython's decoder follows).
size_t utf8_sequence(const unsigned char* p, size_t n, char32_t* cp, size_t* bad) {
  unsigned char b0 = p[0];
  if (b0 < 0x80) {
    *cp = b0;
    return 1;
  }
  size_t need = 0;
  unsigned char lo = 0x80, hi = 0xBF;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 1;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 2;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 3;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    *bad = 1;
    return 0;
  }
  char32_t value = b0 & (need == 1 ? 0x1F : need == 2 ? 0x0F : 0x07);
  for (size_t k = 1; k <= need; ++k) {
    unsigned char lo_k = k == 1 ? lo : 0x80, hi_k = k == 1 ? hi : 0xBF;
    if (k >= n || p[k] < lo_k || p[k] > hi_k) {
      *bad = k;
      return 0;
    }
    value = (value << 6) | (p[k] & 0x3F);
  }
  *cp = value;
  return need + 1;
}

std::vector<utf8proc_int32_t> decompose(std::u32string_view cps) {
  std::string utf8 = encode_utf8(cps);
  const auto* bytes = reinterpret_cast<const utf8proc_uint8_t*>(utf8.data());
  auto opts = static_cast<utf8proc_option_t>(UTF8PROC_DECOMPOSE | UTF8PROC_STABLE);
  std::vector<utf8proc_int32_t> buf(cps.size() * 4 + 4);
  utf8proc_ssize_t n =
      utf8proc_decompose(bytes, static_cast<utf8proc_ssize_t>(utf8.size()), buf.data(),
                         static_cast<utf8proc_ssize_t>(buf.size()), opts);
  if (n > static_cast<utf8proc_ssize_t>(buf.size())) {
    buf.resize(static_cast<size_t>(n));
    n = utf8proc_decompose(bytes, static_cast<utf8proc_ssize_t>(utf8.size()), buf.data(), n, opts);
  }
  EMOE_CHECK(n >= 0, RuntimeError, "utf8proc: {}", utf8proc_errmsg(n));
  buf.resize(static_cast<size_t>(n));
  return buf;
}

}  // namespace

std::u32string decode_utf8(std::string_view text) {
  std::u32string out;
  out.reserve(text.size());
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  size_t i = 0, n = text.size();
  while (i < n) {
    char32_t cp = 0;
    size_t bad = 0;
    size_t len = utf8_sequence(p + i, n - i, &cp, &bad);
    if (len == 0) {
      out.push_back(kReplacement);
      i += bad;
    } else {
      out.push_back(cp);
      i += len;
    }
  }
  return out;
}

std::string sanitize_utf8(std::string_view bytes) {
  return encode_utf8(decode_utf8(bytes));
}

bool is_valid_utf8(std::string_view bytes) {
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  const size_t n = bytes.size();
  size_t i = 0;
  while (i < n) {
    unsigned char c = p[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t len = c >= 0xC2 && c <= 0xDF   ? 2
                 : c >= 0xE0 && c <= 0xEF ? 3
                 : c >= 0xF0 && c <= 0xF4 ? 4
                                          : 0;
    if (len == 0 || i + len > n) return false;
    for (size_t k = 1; k < len; ++k)
      if ((p[i + k] & 0xC0) != 0x80) return false;
    // the second byte's range excludes overlong forms, surrogates and code points past U+10FFFF
    if ((c == 0xE0 && p[i + 1] < 0xA0) || (c == 0xED && p[i + 1] > 0x9F) ||
        (c == 0xF0 && p[i + 1] < 0x90) || (c == 0xF4 && p[i + 1] > 0x8F))
      return false;
    i += len;
  }
  return true;
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

std::string encode_utf8(std::u32string_view cps) {
  std::string out;
  out.reserve(cps.size());
  for (char32_t cp : cps) append_utf8(out, cp);
  return out;
}

const char* category(char32_t cp) {
  return utf8proc_category_string(static_cast<utf8proc_int32_t>(cp));
}

bool is_letter(char32_t cp) {
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(cp))) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
      return true;
    default:
      return false;
  }
}

bool is_number(char32_t cp) {
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(cp))) {
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_NO:
      return true;
    default:
      return false;
  }
}

bool is_white_space(char32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
         cp == 0x205F || cp == 0x3000;
}

bool is_py_space(char32_t cp) {
  return is_white_space(cp) || (cp >= 0x1C && cp <= 0x1F);
}

void append_lower(std::u32string& out, char32_t cp) {
  if (cp == 0x130) {  // the one unconditional multi-character lower-case mapping
    out.push_back(U'i');
    out.push_back(0x307);
    return;
  }
  out.push_back(static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(cp))));
}

std::u32string lower(std::u32string_view cps) {
  std::u32string out;
  out.reserve(cps.size());
  for (char32_t cp : cps) append_lower(out, cp);
  return out;
}

std::u32string nfd(std::u32string_view cps) {
  std::vector<utf8proc_int32_t> buf = decompose(cps);
  return std::u32string(buf.begin(), buf.end());
}

std::u32string nfc(std::u32string_view cps) {
  std::vector<utf8proc_int32_t> buf = decompose(cps);
  auto opts = static_cast<utf8proc_option_t>(UTF8PROC_COMPOSE | UTF8PROC_STABLE);
  utf8proc_ssize_t n =
      utf8proc_normalize_utf32(buf.data(), static_cast<utf8proc_ssize_t>(buf.size()), opts);
  EMOE_CHECK(n >= 0, RuntimeError, "utf8proc: {}", utf8proc_errmsg(n));
  return std::u32string(buf.begin(), buf.begin() + n);
}

std::string py_lstrip(std::string_view text) {
  std::u32string cps = decode_utf8(text);
  size_t b = 0;
  while (b < cps.size() && is_py_space(cps[b])) ++b;
  return encode_utf8(std::u32string_view(cps).substr(b));
}

std::string py_rstrip(std::string_view text) {
  std::u32string cps = decode_utf8(text);
  size_t e = cps.size();
  while (e > 0 && is_py_space(cps[e - 1])) --e;
  return encode_utf8(std::u32string_view(cps).substr(0, e));
}

}  // namespace emoe::unicode
