// GPT-2 byte-level helpers: bytes_to_unicode and its pre-tokenizer regex as a hand-written scanner.
#include "emoe/tokenizer/byte_level.h"

#include <unordered_map>

#include "emoe/tokenizer/unicode.h"

namespace emoe {

const std::array<char32_t, 256>& byte_to_unicode() {
  static const std::array<char32_t, 256> table = [] {
    std::array<char32_t, 256> t{};
    std::array<bool, 256> printable{};
    for (int b = '!'; b <= '~'; ++b) printable[b] = true;
    for (int b = 0xA1; b <= 0xAC; ++b) printable[b] = true;
    for (int b = 0xAE; b <= 0xFF; ++b) printable[b] = true;
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) t[b] = printable[b] ? static_cast<char32_t>(b) : next++;
    return t;
  }();
  return table;
}

int unicode_to_byte(char32_t cp) {
  static const std::unordered_map<char32_t, int> inverse = [] {
    std::unordered_map<char32_t, int> m;
    for (int b = 0; b < 256; ++b) m[byte_to_unicode()[b]] = b;
    return m;
  }();
  auto it = inverse.find(cp);
  return it == inverse.end() ? -1 : it->second;
}

std::string bytes_to_byte_level(std::string_view text) {
  std::string out;
  out.reserve(text.size() * 2);
  for (unsigned char c : text) unicode::append_utf8(out, byte_to_unicode()[c]);
  return out;
}

bool byte_level_to_bytes(std::string_view text, std::string& bytes) {
  for (char32_t cp : unicode::decode_utf8(text)) {
    int b = unicode_to_byte(cp);
    if (b < 0) return false;
    bytes.push_back(static_cast<char>(b));
  }
  return true;
}

namespace {

bool is_other(char32_t cp) {
  return !unicode::is_white_space(cp) && !unicode::is_letter(cp) && !unicode::is_number(cp);
}

// Length of the contraction ('s, 't, 're, 've, 'm, 'll, 'd) at `i`, or 0.
size_t contraction_at(const std::u32string& s, size_t i) {
  if (s[i] != U'\'' || i + 1 >= s.size()) return 0;
  char32_t a = s[i + 1];
  if (a == U's' || a == U't' || a == U'm' || a == U'd') return 2;
  if (i + 2 < s.size()) {
    char32_t b = s[i + 2];
    if ((a == U'r' && b == U'e') || (a == U'v' && b == U'e') || (a == U'l' && b == U'l')) return 3;
  }
  return 0;
}

}  // namespace

std::vector<std::string> gpt2_pretokenize(std::string_view text) {
  std::u32string s = unicode::decode_utf8(text);
  std::vector<std::string> out;
  size_t i = 0, n = s.size();
  auto run = [&](size_t from, bool (*pred)(char32_t)) {
    while (from < n && pred(s[from])) ++from;
    return from;
  };
  while (i < n) {
    size_t end = 0;
    if (size_t c = contraction_at(s, i)) {
      end = i + c;
    } else {
      // " ?X+" for X in letters, numbers, others: an optional single space, then a run.
      size_t body = (s[i] == U' ' && i + 1 < n) ? i + 1 : i;
      bool (*classes[])(char32_t) = {unicode::is_letter, unicode::is_number, is_other};
      for (auto pred : classes) {
        if (pred(s[body])) {  // a space itself is none of the three classes
          end = run(body, pred);
          break;
        }
      }
      if (end == 0) {
        // \s+(?!\S) | \s+ : a whitespace run, leaving its last character to the next word
        // when a non-space follows.
        size_t ws_end = run(i, unicode::is_white_space);
        if (ws_end == n || ws_end - i == 1)
          end = ws_end;
        else
          end = ws_end - 1;
      }
    }
    out.push_back(unicode::encode_utf8(std::u32string_view(s).substr(i, end - i)));
    i = end;
  }
  return out;
}

}  // namespace emoe
