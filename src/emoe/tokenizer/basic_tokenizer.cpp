// BERT BasicTokenizer (transformers 4.33 tokenization_bert.py) on Unicode code points.
#include "emoe/tokenizer/basic_tokenizer.h"

#include <cstring>

#include "emoe/tokenizer/unicode.h"

namespace emoe {

bool bert_is_whitespace(char32_t cp) {
  if (cp == U' ' || cp == U'\t' || cp == U'\n' || cp == U'\r') return true;
  return std::strcmp(unicode::category(cp), "Zs") == 0;
}

bool bert_is_control(char32_t cp) {
  if (cp == U'\t' || cp == U'\n' || cp == U'\r') return false;
  return unicode::category(cp)[0] == 'C';
}

bool bert_is_punctuation(char32_t cp) {
  if ((cp >= 33 && cp <= 47) || (cp >= 58 && cp <= 64) || (cp >= 91 && cp <= 96) ||
      (cp >= 123 && cp <= 126))
    return true;
  return unicode::category(cp)[0] == 'P';
}

bool bert_is_chinese_char(char32_t cp) {
  return (cp >= 0x4E00 && cp <= 0x9FFF) || (cp >= 0x3400 && cp <= 0x4DBF) ||
         (cp >= 0x20000 && cp <= 0x2A6DF) || (cp >= 0x2A700 && cp <= 0x2B73F) ||
         (cp >= 0x2B740 && cp <= 0x2B81F) || (cp >= 0x2B820 && cp <= 0x2CEAF) ||
         (cp >= 0xF900 && cp <= 0xFAFF) || (cp >= 0x2F800 && cp <= 0x2FA1F);
}

namespace {

// Python's str.split() with no argument: runs of str.isspace() characters separate words.
std::vector<std::u32string> whitespace_split(const std::u32string& text) {
  std::vector<std::u32string> out;
  std::u32string cur;
  for (char32_t cp : text) {
    if (unicode::is_py_space(cp)) {
      if (!cur.empty()) out.push_back(std::move(cur));
      cur.clear();
    } else {
      cur.push_back(cp);
    }
  }
  if (!cur.empty()) out.push_back(std::move(cur));
  return out;
}

std::u32string strip_accents(const std::u32string& token) {
  std::u32string out;
  for (char32_t cp : unicode::nfd(token))
    if (std::strcmp(unicode::category(cp), "Mn") != 0) out.push_back(cp);
  return out;
}

void split_on_punctuation(const std::u32string& token, std::vector<std::u32string>& out) {
  bool start_new = true;
  for (char32_t cp : token) {
    if (bert_is_punctuation(cp)) {
      out.push_back(std::u32string(1, cp));
      start_new = true;
    } else {
      if (start_new) out.emplace_back();
      start_new = false;
      out.back().push_back(cp);
    }
  }
}

}  // namespace

std::vector<std::u32string> BasicTokenizer::tokenize(const std::string& input,
                                                     const std::set<std::string>& extra) const {
  std::u32string text;
  for (char32_t cp : unicode::decode_utf8(input)) {  // _clean_text
    if (cp == 0 || cp == 0xFFFD || bert_is_control(cp)) continue;
    text.push_back(bert_is_whitespace(cp) ? U' ' : cp);
  }
  if (options_.tokenize_chinese_chars) {
    std::u32string spaced;
    for (char32_t cp : text) {
      if (bert_is_chinese_char(cp)) {
        spaced.push_back(U' ');
        spaced.push_back(cp);
        spaced.push_back(U' ');
      } else {
        spaced.push_back(cp);
      }
    }
    text = std::move(spaced);
  }
  text = unicode::nfc(text);
  auto is_never_split = [&](const std::u32string& token) {
    if (options_.never_split.empty() && extra.empty()) return false;
    std::string utf8 = unicode::encode_utf8(token);
    return options_.never_split.count(utf8) > 0 || extra.count(utf8) > 0;
  };
  std::vector<std::u32string> split_tokens;
  for (std::u32string token : whitespace_split(text)) {
    if (is_never_split(token)) {
      split_tokens.push_back(token);
      continue;
    }
    if (options_.do_lower_case) {
      token = unicode::lower(token);
      if (options_.strip_accents.value_or(true)) token = strip_accents(token);
    } else if (options_.strip_accents.value_or(false)) {
      token = strip_accents(token);
    }
    split_on_punctuation(token, split_tokens);
  }
  // whitespace_tokenize(" ".join(split_tokens)): drops empty pieces and splits any that still
  // hold whitespace (lower-casing or NFD never creates any, but keep HF's exact rule).
  std::vector<std::u32string> out;
  for (const std::u32string& t : split_tokens)
    for (std::u32string& w : whitespace_split(t)) out.push_back(std::move(w));
  return out;
}

}  // namespace emoe
