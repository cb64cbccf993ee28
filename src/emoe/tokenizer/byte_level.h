// GPT-2's byte-level pieces: the byte <-> printable-character table and the pre-tokenizer regex.
#pragma once
#include <array>
#include <string>
#include <string_view>
#include <vector>

namespace emoe {

// bytes_to_unicode(): every byte maps to a printable code point ("Ġ" for a space).
const std::array<char32_t, 256>& byte_to_unicode();
// The inverse, or -1 for a code point that is no byte's image.
int unicode_to_byte(char32_t cp);

// The UTF-8 bytes of `text` mapped through byte_to_unicode, as a UTF-8 string.
std::string bytes_to_byte_level(std::string_view text);
// Inverse of bytes_to_byte_level; false when `text` holds a character that is no byte's image.
bool byte_level_to_bytes(std::string_view text, std::string& bytes);

// re.findall(r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+", text)
// with Python's `regex` module semantics, written out by hand. Returns the pieces (UTF-8).
std::vector<std::string> gpt2_pretokenize(std::string_view text);

}  // namespace emoe
