// Byte-level BPE equal to transformers 4.33 GPT2Tokenizer (slow).
#include "emoe/tokenizer/bpe.h"

#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include "emoe/core/error.h"
#include "emoe/tokenizer/byte_level.h"
#include "emoe/tokenizer/tokenizer_config.h"
#include "emoe/tokenizer/unicode.h"

namespace emoe {
namespace fs = std::filesystem;

namespace {
constexpr size_t kMaxCacheEntries = 1 << 18;
}  // namespace

BpeTokenizer::BpeTokenizer(const std::vector<std::pair<std::string, int64_t>>& vocab,
                           const std::vector<BpeMerge>& merges, BpeOptions options,
                           const SpecialTokenRoles& roles, const std::vector<AddedToken>& added,
                           std::string source)
    : options_(options), source_(std::move(source)) {
  EMOE_CHECK(!vocab.empty(), InputError, "{}: the BPE vocabulary is empty", source_);
  int64_t max_id = -1;
  for (const auto& [token, id] : vocab) max_id = std::max(max_id, id);
  // ids index a table: ones far beyond the number of entries would allocate for nothing (a
  // fuzzed vocab.json asked for 3.8 GB)
  const auto dense_limit = static_cast<int64_t>(2 * vocab.size() + 65536);
  EMOE_CHECK(max_id < dense_limit, InputError,
             "{}: token ids reach {} but the vocabulary has {} entries (expected ids below {})",
             source_, max_id, vocab.size(), dense_limit);
  decoder_.resize(static_cast<size_t>(max_id + 1));
  encoder_.reserve(vocab.size());
  for (const auto& [token, id] : vocab) {
    encoder_[token] = id;
    decoder_[static_cast<size_t>(id)] = token;  // a repeated id keeps its last token, as HF
  }
  ranks_.reserve(merges.size());
  for (size_t r = 0; r < merges.size(); ++r)  // a repeated merge keeps its last rank, as HF
    ranks_[merges[r].first + " " + merges[r].second] = static_cast<int64_t>(r);
  init_added_tokens(roles, added, false);
  EMOE_CHECK(!options_.add_bos_token || special().bos, InputError,
             "{}: add_bos_token is true but there is no bos_token", source_);
  if (options_.post_template)
    set_template(*options_.post_template);
  else
    set_template(
        PostTemplate::bos_eos(options_.add_bos_token ? special().bos : std::nullopt, std::nullopt));
  set_decode_options(options_.clean_up_tokenization_spaces, options_.spaces_between_special_tokens);
}

std::vector<std::string> BpeTokenizer::bpe(const std::string& token) const {
  std::vector<std::string> word;
  for (char32_t cp : unicode::decode_utf8(token)) {
    word.emplace_back();
    unicode::append_utf8(word.back(), cp);
  }
  auto rank = [&](const std::string& a, const std::string& b) {
    auto it = ranks_.find(a + " " + b);
    return it == ranks_.end() ? std::numeric_limits<int64_t>::max() : it->second;
  };
  while (word.size() > 1) {
    // The lowest-ranked adjacent pair (the first one listed on ties, like Python's min()).
    int64_t best = std::numeric_limits<int64_t>::max();
    size_t best_at = 0;
    for (size_t i = 0; i + 1 < word.size(); ++i) {
      int64_t r = rank(word[i], word[i + 1]);
      if (r < best) {
        best = r;
        best_at = i;
      }
    }
    if (best == std::numeric_limits<int64_t>::max()) break;
    const std::string first = word[best_at], second = word[best_at + 1];
    // Merge every occurrence, left to right, without overlaps.
    std::vector<std::string> merged;
    merged.reserve(word.size());
    for (size_t i = 0; i < word.size();) {
      if (i + 1 < word.size() && word[i] == first && word[i + 1] == second) {
        merged.push_back(first + second);
        i += 2;
      } else {
        merged.push_back(word[i]);
        i += 1;
      }
    }
    word = std::move(merged);
  }
  return word;
}

std::string BpeTokenizer::prepare_text(const std::string& text) const {
  return options_.add_prefix_space ? " " + text : text;
}

std::vector<int64_t> BpeTokenizer::tokenize_text(const std::string& text) const {
  std::vector<int64_t> ids;
  for (const std::string& word : gpt2_pretokenize(text)) {
    std::string mapped = bytes_to_byte_level(word);
    {
      std::lock_guard<std::mutex> lock(cache_mutex_);
      auto hit = cache_.find(mapped);
      if (hit != cache_.end()) {
        ids.insert(ids.end(), hit->second.begin(), hit->second.end());
        continue;
      }
    }
    std::vector<int64_t> word_ids;
    for (const std::string& piece : bpe(mapped)) {
      auto it = encoder_.find(piece);
      if (it != encoder_.end()) {
        word_ids.push_back(it->second);
      } else {
        EMOE_CHECK(special().unk, InputError,
                   "{}: BPE piece '{}' is not in the vocabulary and there is no unk_token", source_,
                   piece);
        word_ids.push_back(*special().unk);
      }
    }
    ids.insert(ids.end(), word_ids.begin(), word_ids.end());
    std::lock_guard<std::mutex> lock(cache_mutex_);
    if (cache_.size() >= kMaxCacheEntries) cache_.clear();
    cache_.emplace(std::move(mapped), std::move(word_ids));
  }
  return ids;
}

std::optional<int64_t> BpeTokenizer::model_token_to_id(const std::string& token) const {
  auto it = encoder_.find(token);
  if (it == encoder_.end()) return std::nullopt;
  return it->second;
}

std::string BpeTokenizer::model_id_to_token(int64_t id) const {
  const auto& token = decoder_[static_cast<size_t>(id)];
  EMOE_CHECK(token.has_value(), InputError, "{}: no token has id {}", source_, id);
  return *token;
}

std::string BpeTokenizer::tokens_to_string(const std::vector<int64_t>& ids) const {
  std::string bytes;
  for (int64_t id : ids) {
    std::string token = model_id_to_token(id);
    EMOE_CHECK(byte_level_to_bytes(token, bytes), InputError,
               "{}: token '{}' (id {}) is not byte-level text and cannot be decoded", source_,
               token, id);
  }
  return unicode::sanitize_utf8(bytes);  // errors="replace"
}

std::vector<std::pair<std::string, int64_t>> read_vocab_json(const std::string& path) {
  nlohmann::json j = read_json_object(path);
  std::vector<std::pair<std::string, int64_t>> vocab;
  vocab.reserve(j.size());
  for (auto it = j.begin(); it != j.end(); ++it) {
    EMOE_CHECK(it.value().is_number_integer() && it.value().get<int64_t>() >= 0, InputError,
               "{}: entry '{}': expected a non-negative integer id, got {}", path, it.key(),
               it.value().dump());
    vocab.emplace_back(it.key(), it.value().get<int64_t>());
  }
  EMOE_CHECK(!vocab.empty(), InputError, "{}: expected a token -> id object, got an empty one",
             path);
  return vocab;
}

std::vector<BpeMerge> read_merges_txt(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EMOE_CHECK(in.good(), InputError, "{}: cannot open the file", path);
  std::vector<BpeMerge> merges;
  std::string line;
  size_t line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line_no == 1 && line.rfind("#version", 0) == 0) continue;
    if (line.empty()) continue;
    EMOE_CHECK(unicode::sanitize_utf8(line) == line, InputError, "{} line {}: expected UTF-8 text",
               path, line_no);
    std::istringstream fields(line);
    std::string a, b, extra;
    fields >> a >> b;
    EMOE_CHECK(!a.empty() && !b.empty() && !(fields >> extra), InputError,
               "{} line {}: expected two tokens separated by a space, got '{}'", path, line_no,
               line);
    merges.emplace_back(std::move(a), std::move(b));
  }
  return merges;
}

SpecialTokenRoles gpt2_special_roles(const TokenizerConfig& config) {
  return wrapped_special_roles(config, "<|endoftext|>", "<|endoftext|>", "<|endoftext|>");
}

std::unique_ptr<BpeTokenizer> load_bpe(const std::string& dir, const TokenizerConfig& config) {
  std::string vocab_path = (fs::path(dir) / "vocab.json").string();
  std::string merges_path = (fs::path(dir) / "merges.txt").string();
  std::optional<std::string> errors = config.get_string("errors");
  EMOE_CHECK(!errors || *errors == "replace", InputError,
             "{}: field 'errors': only \"replace\" is supported, got \"{}\"", config.config_file(),
             errors.value_or(""));
  BpeOptions opt;
  opt.add_prefix_space = config.get_bool("add_prefix_space").value_or(false);
  opt.add_bos_token = config.get_bool("add_bos_token").value_or(false);
  opt.clean_up_tokenization_spaces = config.get_bool("clean_up_tokenization_spaces").value_or(true);
  opt.spaces_between_special_tokens =
      config.get_bool("spaces_between_special_tokens").value_or(true);
  return std::make_unique<BpeTokenizer>(read_vocab_json(vocab_path), read_merges_txt(merges_path),
                                        opt, gpt2_special_roles(config), config.added_tokens(),
                                        vocab_path);
}

}  // namespace emoe
