// Splits special/added tokens out of a text exactly as transformers 4.33's slow tokenize() does.
#include "emoe/tokenizer/added_tokens.h"

#include "emoe/tokenizer/unicode.h"

namespace emoe {

AddedTokenSplitter::AddedTokenSplitter(std::vector<AddedToken> tokens,
                                       bool lowercase_outside_tokens)
    : tokens_(std::move(tokens)), lowercase_(lowercase_outside_tokens) {
  token_cps_.reserve(tokens_.size());
  for (const AddedToken& t : tokens_) token_cps_.push_back(unicode::decode_utf8(t.content));
}

int AddedTokenSplitter::match_at(const std::u32string& cps, size_t pos) const {
  int best = -1;
  for (size_t k = 0; k < token_cps_.size(); ++k) {
    const std::u32string& t = token_cps_[k];
    if (t.empty() || t.size() > cps.size() - pos) continue;
    if (cps.compare(pos, t.size(), t) != 0) continue;
    if (best < 0 || t.size() > token_cps_[static_cast<size_t>(best)].size())
      best = static_cast<int>(k);
  }
  return best;
}

// re.sub(r"(tok1|tok2|...)|(.+?)", lambda m: m.groups()[0] or m.groups()[1].lower(), text): the
// alternation takes the first listed token that matches, and HF lists them sorted.
std::string AddedTokenSplitter::lowercase_outside(const std::string& text) const {
  std::u32string cps = unicode::decode_utf8(text);
  std::u32string out;
  out.reserve(cps.size());
  size_t i = 0;
  while (i < cps.size()) {
    const std::u32string* hit = nullptr;
    for (const std::u32string& t : token_cps_) {
      if (t.empty() || t.size() > cps.size() - i || cps.compare(i, t.size(), t) != 0) continue;
      if (!hit || t < *hit) hit = &t;
    }
    if (hit) {
      out += *hit;
      i += hit->size();
    } else {
      if (cps[i] == U'\n')  // '.' does not match a newline
        out.push_back(cps[i]);
      else
        unicode::append_lower(out, cps[i]);
      ++i;
    }
  }
  return unicode::encode_utf8(out);
}

std::vector<TextSegment> AddedTokenSplitter::split(const std::string& input) const {
  std::string text = lowercase_ ? lowercase_outside(input) : input;
  struct Piece {
    std::string text;
    int token = -1;  // index into tokens_, or -1 for plain text
  };
  std::vector<Piece> pieces;
  {
    std::u32string cps = unicode::decode_utf8(text);
    size_t start = 0, i = 0;
    while (i < cps.size()) {
      int k = tokens_.empty() ? -1 : match_at(cps, i);
      if (k < 0) {
        ++i;
        continue;
      }
      if (i > start) pieces.push_back({unicode::encode_utf8(cps.substr(start, i - start)), -1});
      pieces.push_back({tokens_[static_cast<size_t>(k)].content, k});
      i += token_cps_[static_cast<size_t>(k)].size();
      start = i;
    }
    if (start < cps.size()) pieces.push_back({unicode::encode_utf8(cps.substr(start)), -1});
  }

  for (size_t i = 0; i < pieces.size(); ++i) {
    if (pieces[i].token < 0) continue;
    const AddedToken& tok = tokens_[static_cast<size_t>(pieces[i].token)];
    Piece* left = i > 0 ? &pieces[i - 1] : nullptr;
    Piece* right = i + 1 < pieces.size() ? &pieces[i + 1] : nullptr;
    if (tok.plain_string) {
      if (right && !right->text.empty()) right->text = unicode::py_lstrip(right->text);
      if (left && !left->text.empty()) left->text = unicode::py_rstrip(left->text);
      continue;
    }
    // rstrip eats the spaces on the token's right, lstrip those on its left.
    if (tok.rstrip && right && !right->text.empty()) right->text = unicode::py_lstrip(right->text);
    if (tok.lstrip && left && !left->text.empty()) left->text = unicode::py_rstrip(left->text);
    if (tok.single_word && left && !left->text.empty() && left->text.back() != ' ') {
      left->text += pieces[i].text;
      left->token = -1;
      pieces[i] = {"", -1};
    } else if (tok.single_word && right && !right->text.empty() && right->text.front() != ' ') {
      pieces[i].text += right->text;
      pieces[i].token = -1;
      *right = {"", -1};
    }
  }

  std::vector<TextSegment> out;
  for (const Piece& p : pieces) {
    if (p.text.empty()) continue;
    if (p.token >= 0)
      out.push_back({"", tokens_[static_cast<size_t>(p.token)].id});
    else
      out.push_back({p.text, -1});
  }
  return out;
}

}  // namespace emoe
