// The Rust `tokenizers` pipeline for byte-level BPE: added tokens, normalizer, Split/ByteLevel
// pre-tokenizers, BPE merges by rank (a priority queue, as the Rust Word::merge_all), templates.
#include "emoe/tokenizer/fast_bpe.h"

#include <algorithm>
#include <filesystem>
#include <limits>
#include <queue>
#include <tuple>

#include "emoe/core/error.h"
#include "emoe/tokenizer/byte_level.h"
#include "emoe/tokenizer/pipeline_tokenizer.h"
#include "emoe/tokenizer/tokenizer_config.h"
#include "emoe/tokenizer/unicode.h"

namespace emoe {

namespace {

constexpr size_t kWordCacheEntries = 1 << 18;

uint64_t pair_key(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

bool is_ascii(std::string_view s) {
  for (char c : s)
    if (static_cast<unsigned char>(c) >= 0x80) return false;
  return true;
}

// The first / last code point of UTF-8 text (0 when empty).
char32_t first_char(std::string_view s) {
  if (s.empty()) return 0;
  size_t n = 1;
  while (n < s.size() && n < 4 && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80) ++n;
  std::u32string cps = unicode::decode_utf8(s.substr(0, n));
  return cps.empty() ? 0 : cps[0];
}
char32_t last_char(std::string_view s) {
  if (s.empty()) return 0;
  size_t b = s.size() - 1;
  while (b > 0 && s.size() - b < 4 && (static_cast<unsigned char>(s[b]) & 0xC0) == 0x80) --b;
  std::u32string cps = unicode::decode_utf8(s.substr(b));
  return cps.empty() ? 0 : cps.back();
}
bool is_word_char(char32_t c) {
  return c == U'_' || unicode::is_letter(c) || unicode::is_number(c);
}

// Byte length of the UTF-8 white space starting at `s` (rstrip) / ending at `s`'s end (lstrip).
size_t leading_space(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    size_t n = 1;
    while (i + n < s.size() && n < 4 && (static_cast<unsigned char>(s[i + n]) & 0xC0) == 0x80) ++n;
    std::u32string cps = unicode::decode_utf8(s.substr(i, n));
    if (cps.empty() || !unicode::is_white_space(cps[0])) break;
    i += n;
  }
  return i;
}
size_t trailing_space(std::string_view s) {
  size_t end = s.size();
  while (end > 0) {
    char32_t c = last_char(s.substr(0, end));
    if (!unicode::is_white_space(c)) break;
    size_t n = 1;
    while (n < end && n < 4 && (static_cast<unsigned char>(s[end - n]) & 0xC0) == 0x80) ++n;
    end -= n;
  }
  return s.size() - end;
}

}  // namespace

FastAddedToken to_fast_added_token(const AddedToken& a) {
  FastAddedToken t;
  t.content = a.content;
  t.id = a.id;
  t.special = a.special;
  t.lstrip = a.lstrip;
  t.rstrip = a.rstrip;
  t.single_word = a.single_word;
  t.normalized = !a.special;
  return t;
}

const std::string& gpt2_split_pattern() {
  static const std::string pattern =
      R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
  return pattern;
}

FastBpeTokenizer::FastBpeTokenizer(FastBpeSpec spec)
    : ignore_merges_(spec.ignore_merges),
      normalizer_(spec.normalizer),
      pre_(std::move(spec.pre_tokenizer)),
      post_(std::move(spec.post)),
      clean_up_(spec.clean_up_tokenization_spaces),
      source_(std::move(spec.source)) {
  EMOE_CHECK(!spec.vocab.empty(), InputError, "{}: field 'model.vocab': the vocabulary is empty",
             source_);
  int64_t max_id = -1;
  for (const auto& [token, id] : spec.vocab) max_id = std::max(max_id, id);
  // ids index a table: ones far beyond the number of entries would allocate for nothing
  const auto dense_limit = static_cast<int64_t>(2 * spec.vocab.size() + 65536);
  EMOE_CHECK(max_id < dense_limit && max_id < std::numeric_limits<int32_t>::max(), InputError,
             "{}: field 'model.vocab': ids reach {} but the vocabulary has {} entries (expected "
             "ids below {})",
             source_, max_id, spec.vocab.size(), dense_limit);
  id_to_vocab_.resize(static_cast<size_t>(max_id + 1));
  vocab_.reserve(spec.vocab.size());
  for (auto& [token, id] : spec.vocab) {
    if (ignore_merges_) {
      std::string raw;
      if (byte_level_to_bytes(token, raw)) raw_vocab_[raw] = static_cast<int32_t>(id);
    }
    id_to_vocab_[static_cast<size_t>(id)] = token;
    vocab_[std::move(token)] = id;
  }
  byte_ids_.assign(256, -1);
  for (int b = 0; b < 256; ++b) {
    std::string ch;
    unicode::append_utf8(ch, byte_to_unicode()[static_cast<size_t>(b)]);
    auto it = vocab_.find(ch);
    if (it != vocab_.end()) byte_ids_[static_cast<size_t>(b)] = static_cast<int32_t>(it->second);
  }
  merges_.reserve(spec.merges.size());
  for (size_t r = 0; r < spec.merges.size(); ++r) {
    const auto& [a, b] = spec.merges[r];
    auto ia = vocab_.find(a), ib = vocab_.find(b), inew = vocab_.find(a + b);
    const std::string merged = a + b;
    const std::string* missing = ia == vocab_.end()     ? &a
                                 : ib == vocab_.end()   ? &b
                                 : inew == vocab_.end() ? &merged
                                                        : nullptr;
    EMOE_CHECK(!missing, InputError, "{}: field 'model.merges[{}]': '{}' is not in the vocabulary",
               source_, r, missing ? *missing : merged);
    // a repeated merge keeps its last rank, as the Rust library's map does
    merges_[pair_key(static_cast<int32_t>(ia->second), static_cast<int32_t>(ib->second))] = {
        static_cast<int32_t>(r), static_cast<int32_t>(inew->second)};
  }
  vocab_size_ = max_id + 1;
  for (FastAddedToken& t : spec.added) {
    EMOE_CHECK(!t.content.empty(), InputError, "{}: field 'added_tokens': an empty token", source_);
    EMOE_CHECK(t.id >= 0 && t.id < std::numeric_limits<int32_t>::max(), InputError,
               "{}: field 'added_tokens': token '{}' has id {}", source_, t.content, t.id);
    vocab_size_ = std::max(vocab_size_, t.id + 1);
    added_by_content_[t.content] = added_.size();
    added_by_id_[t.id] = added_.size();
    added_.push_back(std::move(t));
  }
  // The configured roles; one missing from the vocabulary is added, as transformers does.
  const std::pair<const char*, std::optional<int64_t>*> slots[] = {
      {"bos_token", &special_.bos},  {"eos_token", &special_.eos}, {"unk_token", &special_.unk},
      {"sep_token", &special_.sep},  {"pad_token", &special_.pad}, {"cls_token", &special_.cls},
      {"mask_token", &special_.mask}};
  for (const auto& [role, content] : spec.roles) {
    std::optional<int64_t> id = token_to_id(content);
    if (!id) {
      FastAddedToken t;
      t.content = content;
      t.id = vocab_size_++;
      t.special = true;
      added_by_content_[t.content] = added_.size();
      added_by_id_[t.id] = added_.size();
      added_.push_back(t);
      id = t.id;
    }
    for (const auto& [name, slot] : slots)
      if (role == name) *slot = id;
  }
  if (spec.roberta_template) {
    EMOE_CHECK(special_.cls && special_.sep, InputError,
               "{}: RobertaTokenizer needs a cls_token and a sep_token", source_);
    using K = TemplateItem::Kind;
    const int64_t cls = *special_.cls, sep = *special_.sep;
    post_.single = {{K::kSpecial, cls, 0}, {K::kSequenceA, -1, 0}, {K::kSpecial, sep, 0}};
    post_.pair = {{K::kSpecial, cls, 0}, {K::kSequenceA, -1, 0}, {K::kSpecial, sep, 0},
                  {K::kSpecial, sep, 0}, {K::kSequenceB, -1, 0}, {K::kSpecial, sep, 0}};
  }
  for (int which = 0; which < 2; ++which) added_by_first_byte_[which].assign(256, {});
  for (size_t i = 0; i < added_.size(); ++i) {
    int which = added_[i].normalized ? 1 : 0;
    added_by_first_byte_[which][static_cast<unsigned char>(added_[i].content[0])].push_back(i);
    has_added_[which] = true;
  }
  for (auto& table : added_by_first_byte_)
    for (auto& list : table)
      std::stable_sort(list.begin(), list.end(), [&](size_t x, size_t y) {
        return added_[x].content.size() > added_[y].content.size();
      });
}

std::optional<int64_t> FastBpeTokenizer::token_to_id(const std::string& token) const {
  auto a = added_by_content_.find(token);
  if (a != added_by_content_.end()) return added_[a->second].id;
  auto it = vocab_.find(token);
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

std::string FastBpeTokenizer::id_to_token(int64_t id) const {
  auto a = added_by_id_.find(id);
  if (a != added_by_id_.end()) return added_[a->second].content;
  EMOE_CHECK(id >= 0 && id < static_cast<int64_t>(id_to_vocab_.size()) &&
                 !id_to_vocab_[static_cast<size_t>(id)].empty(),
             InputError, "token id {} is out of range for a vocabulary of {} tokens", id,
             vocab_size_);
  return id_to_vocab_[static_cast<size_t>(id)];
}

// The Rust AddedVocabulary::find_matches: leftmost-longest matches; single_word rejects a match
// inside a word; lstrip/rstrip widen it over the white space beside it.
void FastBpeTokenizer::split_added(std::string_view text, bool which,
                                   std::vector<Piece>& out) const {
  const auto& table = added_by_first_byte_[which ? 1 : 0];
  size_t start_offset = 0, pos = 0;
  while (pos < text.size()) {
    const auto& candidates = table[static_cast<unsigned char>(text[pos])];
    const FastAddedToken* hit = nullptr;
    for (size_t i : candidates) {
      const std::string& c = added_[i].content;
      if (text.compare(pos, c.size(), c) == 0) {
        hit = &added_[i];
        break;
      }
    }
    if (!hit) {
      ++pos;
      continue;
    }
    size_t start = pos, stop = pos + hit->content.size();
    pos = stop;  // the search goes on after this match, kept or not
    if (hit->single_word) {
      bool start_ok = start == 0 || !is_word_char(last_char(text.substr(0, start)));
      bool stop_ok = stop == text.size() || !is_word_char(first_char(text.substr(stop)));
      if (!start_ok || !stop_ok) continue;
    }
    if (hit->lstrip) start = std::max(start - trailing_space(text.substr(0, start)), start_offset);
    if (hit->rstrip) stop += leading_space(text.substr(stop));
    if (start_offset < start) out.push_back({-1, text.substr(start_offset, start - start_offset)});
    out.push_back({hit->id, text.substr(start, stop - start)});
    start_offset = stop;
    pos = std::max(pos, stop);
  }
  if (start_offset < text.size()) out.push_back({-1, text.substr(start_offset)});
}

void FastBpeTokenizer::split_step(const PreTokenizerStep& step, std::string_view text,
                                  std::vector<std::string_view>& out) const {
  // (span, is_delimiter) covering the whole text, as Rust's Pattern::find_matches
  std::vector<std::pair<std::string_view, bool>> parts;
  size_t prev = 0;
  for (const auto& [b, e] : step.regex->find_all(text)) {
    if (b > prev) parts.emplace_back(text.substr(prev, b - prev), false);
    parts.emplace_back(text.substr(b, e - b), true);
    prev = e;
  }
  if (prev < text.size()) parts.emplace_back(text.substr(prev), false);
  if (step.invert)
    for (auto& p : parts) p.second = !p.second;
  auto join = [&](std::string_view a, std::string_view b) {
    return std::string_view(a.data(), static_cast<size_t>(b.data() + b.size() - a.data()));
  };
  switch (step.behavior) {
    case SplitBehavior::kIsolated:
      for (const auto& p : parts) out.push_back(p.first);
      break;
    case SplitBehavior::kRemoved:
      for (const auto& p : parts)
        if (!p.second) out.push_back(p.first);
      break;
    case SplitBehavior::kMergedWithPrevious: {
      size_t first = out.size();
      bool previous_match = false;
      for (const auto& p : parts) {
        if (p.second && !previous_match && out.size() > first)
          out.back() = join(out.back(), p.first);
        else
          out.push_back(p.first);
        previous_match = p.second;
      }
      break;
    }
    case SplitBehavior::kMergedWithNext: {
      std::vector<std::string_view> rev;
      bool previous_match = false;
      for (auto it = parts.rbegin(); it != parts.rend(); ++it) {
        if (it->second && !previous_match && !rev.empty())
          rev.back() = join(it->first, rev.back());
        else
          rev.push_back(it->first);
        previous_match = it->second;
      }
      out.insert(out.end(), rev.rbegin(), rev.rend());
      break;
    }
    case SplitBehavior::kContiguous: {
      size_t first = out.size();
      bool previous_match = false;
      for (const auto& p : parts) {
        if (p.second == previous_match && out.size() > first)
          out.back() = join(out.back(), p.first);
        else
          out.push_back(p.first);
        previous_match = p.second;
      }
      break;
    }
  }
}

void FastBpeTokenizer::pre_tokenize(std::string_view segment, std::vector<Piece>& out,
                                    std::vector<std::unique_ptr<std::string>>& storage) const {
  std::vector<std::string_view> current{segment}, next;
  for (const PreTokenizerStep& step : pre_) {
    next.clear();
    for (std::string_view piece : current) {
      if (piece.empty()) continue;
      if (step.kind == PreTokenizerStep::Kind::kByteLevel) {
        if (step.add_prefix_space && piece.front() != ' ') {
          storage.push_back(std::make_unique<std::string>(" " + std::string(piece)));
          piece = *storage.back();
        }
        if (!step.regex) {
          next.push_back(piece);
          continue;
        }
      }
      split_step(step, piece, next);
    }
    current.swap(next);
  }
  for (std::string_view piece : current)
    if (!piece.empty()) out.push_back({-1, piece});
}

std::vector<FastBpeTokenizer::Piece> FastBpeTokenizer::pieces(
    const std::string& text, std::vector<std::unique_ptr<std::string>>& storage) const {
  std::vector<Piece> raw, out;
  if (has_added_[0])
    split_added(text, false, raw);
  else if (!text.empty())
    raw.push_back({-1, text});
  std::vector<Piece> normal;
  for (const Piece& p : raw) {
    if (p.added_id >= 0) {
      out.push_back(p);
      continue;
    }
    std::string_view seg = p.text;
    if (normalizer_ != FastNormalizer::kNone && !is_ascii(seg)) {
      std::u32string cps = unicode::decode_utf8(seg);
      storage.push_back(std::make_unique<std::string>(unicode::encode_utf8(
          normalizer_ == FastNormalizer::kNfc ? unicode::nfc(cps) : unicode::nfd(cps))));
      seg = *storage.back();
    }
    normal.clear();
    if (has_added_[1])
      split_added(seg, true, normal);
    else
      normal.push_back({-1, seg});
    for (const Piece& q : normal) {
      if (q.added_id >= 0)
        out.push_back(q);
      else
        pre_tokenize(q.text, out, storage);
    }
  }
  return out;
}

void FastBpeTokenizer::merge_symbols(std::vector<int32_t>& symbols) const {
  const size_t n = symbols.size();
  if (n < 2) return;
  std::vector<int32_t> prev(n), next(n);
  std::vector<bool> alive(n, true);
  for (size_t i = 0; i < n; ++i) {
    prev[i] = static_cast<int32_t>(i) - 1;
    next[i] = i + 1 < n ? static_cast<int32_t>(i + 1) : -1;
  }
  // (rank, position, new id): the lowest rank first, then the leftmost.
  using Entry = std::tuple<int32_t, int32_t, int32_t>;
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> queue;
  auto push = [&](int32_t at) {
    int32_t right = next[static_cast<size_t>(at)];
    if (right < 0) return;
    auto it = merges_.find(
        pair_key(symbols[static_cast<size_t>(at)], symbols[static_cast<size_t>(right)]));
    if (it != merges_.end()) queue.emplace(it->second.rank, at, it->second.new_id);
  };
  for (size_t i = 0; i + 1 < n; ++i) push(static_cast<int32_t>(i));
  while (!queue.empty()) {
    auto [rank, at, new_id] = queue.top();
    queue.pop();
    const auto a = static_cast<size_t>(at);
    if (!alive[a] || next[a] < 0) continue;
    const auto b = static_cast<size_t>(next[a]);
    // an entry made stale by an earlier merge at this position or its right neighbour
    auto it = merges_.find(pair_key(symbols[a], symbols[b]));
    if (it == merges_.end() || it->second.new_id != new_id) continue;
    symbols[a] = new_id;
    alive[b] = false;
    next[a] = next[b];
    if (next[b] >= 0) prev[static_cast<size_t>(next[b])] = at;
    if (prev[a] >= 0) push(prev[a]);
    push(at);
  }
  size_t w = 0;
  for (size_t i = 0; i < n; ++i)
    if (alive[i]) symbols[w++] = symbols[i];
  symbols.resize(w);
}

void FastBpeTokenizer::bpe_word(std::string_view word, std::vector<int64_t>& out) const {
  std::string key(word);
  {
    std::lock_guard<std::mutex> lock(cache_mutex_);
    auto hit = cache_.find(key);
    if (hit != cache_.end()) {
      out.insert(out.end(), hit->second.begin(), hit->second.end());
      return;
    }
  }
  std::vector<int32_t> symbols;
  auto whole = ignore_merges_ ? raw_vocab_.find(key) : raw_vocab_.end();
  if (whole != raw_vocab_.end()) {
    symbols.push_back(whole->second);
  } else {
    symbols.reserve(word.size());
    for (char c : word) {
      int32_t id = byte_ids_[static_cast<unsigned char>(c)];
      EMOE_CHECK(id >= 0, InputError,
                 "{}: the byte 0x{:02x} has no token in the vocabulary (a byte-level BPE needs "
                 "all 256)",
                 source_, static_cast<unsigned char>(c));
      symbols.push_back(id);
    }
    merge_symbols(symbols);
  }
  out.insert(out.end(), symbols.begin(), symbols.end());
  std::lock_guard<std::mutex> lock(cache_mutex_);
  if (cache_.size() >= kWordCacheEntries) cache_.clear();
  cache_.emplace(std::move(key), std::move(symbols));
}

std::vector<int64_t> FastBpeTokenizer::encode_plain(const std::string& input) const {
  const std::string* text = &input;
  std::string clean;
  if (!unicode::is_valid_utf8(input)) {  // a Python or Rust string cannot hold invalid UTF-8
    clean = unicode::sanitize_utf8(input);
    text = &clean;
  }
  std::vector<std::unique_ptr<std::string>> storage;
  std::vector<int64_t> ids;
  for (const Piece& p : pieces(*text, storage)) {
    if (p.added_id >= 0)
      ids.push_back(p.added_id);
    else
      bpe_word(p.text, ids);
  }
  return ids;
}

std::vector<std::string> FastBpeTokenizer::tokens(const std::string& input) const {
  std::string text = unicode::is_valid_utf8(input) ? input : unicode::sanitize_utf8(input);
  std::vector<std::unique_ptr<std::string>> storage;
  std::vector<std::string> out;
  std::vector<int64_t> ids;
  for (const Piece& p : pieces(text, storage)) {
    if (p.added_id >= 0) {
      out.emplace_back(p.text);  // the matched span, white space taken by lstrip/rstrip included
      continue;
    }
    ids.clear();
    bpe_word(p.text, ids);
    for (int64_t id : ids) out.push_back(id_to_vocab_[static_cast<size_t>(id)]);
  }
  return out;
}

Encoding FastBpeTokenizer::encode(const std::string& text, bool add_special_tokens,
                                  int64_t max_length) const {
  return post_.encode(encode_plain(text), nullptr, add_special_tokens, max_length);
}

Encoding FastBpeTokenizer::encode_pair(const std::string& a, const std::string& b,
                                       bool add_special_tokens, int64_t max_length) const {
  std::vector<int64_t> pair = encode_plain(b);
  return post_.encode(encode_plain(a), &pair, add_special_tokens, max_length);
}

std::string FastBpeTokenizer::decode(const std::vector<int64_t>& ids,
                                     bool skip_special_tokens) const {
  std::string bytes, piece;
  for (int64_t id : ids) {
    auto a = added_by_id_.find(id);
    if (a != added_by_id_.end() && skip_special_tokens && added_[a->second].special) continue;
    std::string token = id_to_token(id);
    // ByteLevel decoder: a token with a character outside the byte map is kept as it is
    piece.clear();
    if (byte_level_to_bytes(token, piece))
      bytes += piece;
    else
      bytes += token;
  }
  std::string text = unicode::sanitize_utf8(bytes);  // String::from_utf8_lossy
  return clean_up_ ? clean_up_tokenization(std::move(text)) : text;
}

std::unique_ptr<FastBpeTokenizer> load_roberta_bpe(const std::string& dir,
                                                   const TokenizerConfig& config) {
  namespace fs = std::filesystem;
  FastBpeSpec spec;
  spec.source = (fs::path(dir) / "vocab.json").string();
  spec.vocab = read_vocab_json(spec.source);
  spec.merges = read_merges_txt((fs::path(dir) / "merges.txt").string());
  for (const AddedToken& a : config.added_tokens()) {
    FastAddedToken t = to_fast_added_token(a);
    if (t.id < 0) {  // added_tokens.json-style entries always carry ids; keep the vocabulary's
      auto it = std::find_if(spec.vocab.begin(), spec.vocab.end(),
                             [&](const auto& v) { return v.first == t.content; });
      if (it == spec.vocab.end()) continue;
      t.id = it->second;
    }
    spec.added.push_back(t);
  }
  // RobertaTokenizer's defaults; the vocabulary's own entries become special added tokens
  const std::pair<const char*, const char*> roles[] = {
      {"bos_token", "<s>"},   {"eos_token", "</s>"}, {"unk_token", "<unk>"},  {"sep_token", "</s>"},
      {"pad_token", "<pad>"}, {"cls_token", "<s>"},  {"mask_token", "<mask>"}};
  for (const auto& [role, fallback] : roles) {
    std::optional<AddedToken> t = config.special_token(role, std::string(fallback), true);
    if (!t) continue;
    spec.roles.emplace_back(role, t->content);
    bool known = std::any_of(spec.added.begin(), spec.added.end(),
                             [&](const FastAddedToken& a) { return a.content == t->content; });
    if (known) continue;
    auto it = std::find_if(spec.vocab.begin(), spec.vocab.end(),
                           [&](const auto& v) { return v.first == t->content; });
    if (it == spec.vocab.end()) continue;  // added with a new id by the constructor
    FastAddedToken a;
    a.content = t->content;
    a.id = it->second;
    a.special = true;
    a.lstrip = std::string(role) == "mask_token" || t->lstrip;
    a.rstrip = t->rstrip;
    spec.added.push_back(a);
  }
  PreTokenizerStep byte_level;
  byte_level.kind = PreTokenizerStep::Kind::kByteLevel;
  byte_level.add_prefix_space = config.get_bool("add_prefix_space").value_or(false);
  byte_level.regex = std::make_shared<Regex>(gpt2_split_pattern(), spec.source);
  spec.pre_tokenizer.push_back(byte_level);
  spec.clean_up_tokenization_spaces =
      config.get_bool("clean_up_tokenization_spaces").value_or(true);
  spec.roberta_template = true;
  return std::make_unique<FastBpeTokenizer>(std::move(spec));
}

}  // namespace emoe
