// Unicode helpers for the tokenizers: UTF-8 <-> code points, categories, case, NFD/NFC (utf8proc).
#pragma once
#include <string>
#include <string_view>

namespace emoe::unicode {

// Code points of `text`; an invalid UTF-8 sequence becomes U+FFFD per maximal invalid subpart
// (the same rule as Python's bytes.decode("utf-8", errors="replace")).
std::u32string decode_utf8(std::string_view text);
// Bytes to text as Python's bytes.decode("utf-8", errors="replace").
std::string sanitize_utf8(std::string_view bytes);
// Whether `bytes` is well-formed UTF-8 (no overlong forms, surrogates or code points past
// U+10FFFF).
bool is_valid_utf8(std::string_view bytes);
std::string encode_utf8(std::u32string_view cps);
void append_utf8(std::string& out, char32_t cp);

// Unicode general category as Python's unicodedata.category spells it ("Lu", "Mn", "Cn", ...).
const char* category(char32_t cp);
bool is_letter(char32_t cp);  // L*
bool is_number(char32_t cp);  // N*
// The White_Space property: what \s matches in the `regex` module that GPT-2's pattern uses.
bool is_white_space(char32_t cp);
// Python's str.isspace(): what str.strip() removes (White_Space plus U+001C..U+001F).
bool is_py_space(char32_t cp);

// Python's str.lower() of one code point (full mapping: U+0130 becomes "i\u0307").
void append_lower(std::u32string& out, char32_t cp);
std::u32string lower(std::u32string_view cps);

// Canonical decomposition / composition, as Python's unicodedata.normalize("NFD" / "NFC").
std::u32string nfd(std::u32string_view cps);
std::u32string nfc(std::u32string_view cps);

// Python's str.strip() family on UTF-8 text (whitespace as str.isspace()).
std::string py_lstrip(std::string_view text);
std::string py_rstrip(std::string_view text);

}  // namespace emoe::unicode
