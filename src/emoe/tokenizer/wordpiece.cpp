// WordPiece tokenizer equal to transformers 4.33 BertTokenizer (slow).
#include "emoe/tokenizer/wordpiece.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "emoe/core/error.h"
#include "emoe/tokenizer/tokenizer_config.h"
#include "emoe/tokenizer/unicode.h"

namespace emoe {
namespace fs = std::filesystem;

WordPieceTokenizer::WordPieceTokenizer(std::vector<std::string> vocab, WordPieceOptions options,
                                       const SpecialTokenRoles& roles,
                                       const std::vector<AddedToken>& added)
    : vocab_(std::move(vocab)), options_(std::move(options)), basic_(options_.basic) {
  EMOE_CHECK(!vocab_.empty(), InputError, "WordPiece vocabulary is empty");
  ids_.reserve(vocab_.size());
  for (size_t i = 0; i < vocab_.size(); ++i) ids_[vocab_[i]] = static_cast<int64_t>(i);
  auto unk = ids_.find(options_.unk_token);
  EMOE_CHECK(unk != ids_.end(), InputError,
             "WordPiece vocabulary has no unk_token '{}' (needed for unknown words)",
             options_.unk_token);
  unk_id_ = unk->second;
  init_added_tokens(roles, added, options_.basic.do_lower_case);
  for (const AddedToken& t : splitter().tokens())
    if (is_special_token_string(t.content)) never_split_.insert(t.content);
  if (options_.post_template) {
    set_template(*options_.post_template);
  } else {
    EMOE_CHECK(special().cls && special().sep, InputError,
               "a WordPiece (BERT) tokenizer needs cls_token and sep_token for its template");
    set_template(PostTemplate::bert(*special().cls, *special().sep));
  }
  set_decode_options(options_.clean_up_tokenization_spaces, true);
}

std::optional<int64_t> WordPieceTokenizer::model_token_to_id(const std::string& token) const {
  auto it = ids_.find(token);
  if (it == ids_.end()) return std::nullopt;
  return it->second;
}

std::string WordPieceTokenizer::model_id_to_token(int64_t id) const {
  return vocab_[static_cast<size_t>(id)];
}

void WordPieceTokenizer::wordpiece(const std::u32string& word, std::vector<int64_t>& out) const {
  if (static_cast<int64_t>(word.size()) > options_.max_input_chars_per_word) {
    out.push_back(unk_id_);
    return;
  }
  std::vector<int64_t> pieces;
  size_t start = 0;
  while (start < word.size()) {
    size_t end = word.size();
    int64_t found = -1;
    while (start < end) {
      std::string sub = start > 0 ? options_.continuing_prefix : std::string();
      sub += unicode::encode_utf8(std::u32string_view(word).substr(start, end - start));
      auto it = ids_.find(sub);
      if (it != ids_.end()) {
        found = it->second;
        break;
      }
      --end;
    }
    if (found < 0) {
      out.push_back(unk_id_);
      return;
    }
    pieces.push_back(found);
    start = end;
  }
  out.insert(out.end(), pieces.begin(), pieces.end());
}

std::vector<int64_t> WordPieceTokenizer::tokenize_text(const std::string& text) const {
  std::vector<int64_t> ids;
  if (!options_.do_basic_tokenize) {
    std::u32string cur;
    for (char32_t cp : unicode::decode_utf8(text) + U" ") {
      if (!unicode::is_py_space(cp)) {
        cur.push_back(cp);
      } else if (!cur.empty()) {
        wordpiece(cur, ids);
        cur.clear();
      }
    }
    return ids;
  }
  for (const std::u32string& token : basic_.tokenize(text, never_split_)) {
    // BertTokenizer only bypasses WordPiece for the BasicTokenizer's own never_split list.
    std::string utf8 = unicode::encode_utf8(token);
    if (options_.basic.never_split.count(utf8)) {
      auto it = ids_.find(utf8);
      ids.push_back(it != ids_.end() ? it->second : unk_id_);
    } else {
      wordpiece(token, ids);
    }
  }
  return ids;
}

std::string WordPieceTokenizer::tokens_to_string(const std::vector<int64_t>& ids) const {
  // " ".join(tokens).replace(" ##", "").strip()
  std::string joined;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i > 0) joined += ' ';
    joined += id_to_token(ids[i]);
  }
  std::string out;
  const std::string marker = " " + options_.continuing_prefix;
  size_t pos = 0;
  while (true) {
    size_t hit = joined.find(marker, pos);
    out.append(joined, pos, hit == std::string::npos ? std::string::npos : hit - pos);
    if (hit == std::string::npos) break;
    pos = hit + marker.size();
  }
  return unicode::py_rstrip(unicode::py_lstrip(out));
}

std::vector<std::string> read_vocab_txt(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EMOE_CHECK(in.good(), InputError, "{}: cannot open the file", path);
  std::stringstream buf;
  buf << in.rdbuf();
  std::string data = buf.str();
  std::vector<std::string> vocab;
  std::string line;
  for (size_t i = 0; i < data.size(); ++i) {
    char c = data[i];
    if (c == '\n' || c == '\r') {
      if (c == '\r' && i + 1 < data.size() && data[i + 1] == '\n') ++i;
      vocab.push_back(std::move(line));
      line.clear();
    } else {
      line.push_back(c);
    }
  }
  if (!line.empty()) vocab.push_back(std::move(line));
  EMOE_CHECK(!vocab.empty(), InputError, "{}: expected one token per line, the file is empty",
             path);
  for (size_t i = 0; i < vocab.size(); ++i)
    EMOE_CHECK(unicode::sanitize_utf8(vocab[i]) == vocab[i], InputError,
               "{} line {}: expected UTF-8 text", path, i + 1);
  return vocab;
}

SpecialTokenRoles bert_special_roles(const TokenizerConfig& config) {
  SpecialTokenRoles roles;
  roles.unk = config.special_token("unk_token", "[UNK]", false);
  roles.sep = config.special_token("sep_token", "[SEP]", false);
  roles.pad = config.special_token("pad_token", "[PAD]", false);
  roles.cls = config.special_token("cls_token", "[CLS]", false);
  roles.mask = config.special_token("mask_token", "[MASK]", false);
  roles.additional = config.additional_special_tokens(false);
  return roles;
}

std::unique_ptr<WordPieceTokenizer> load_wordpiece(const std::string& dir,
                                                   const TokenizerConfig& config) {
  std::string path = (fs::path(dir) / "vocab.txt").string();
  WordPieceOptions opt;
  opt.basic.do_lower_case = config.get_bool("do_lower_case").value_or(true);
  opt.basic.strip_accents = config.get_bool("strip_accents");
  opt.basic.tokenize_chinese_chars = config.get_bool("tokenize_chinese_chars").value_or(true);
  for (const std::string& s : config.get_string_list("never_split"))
    opt.basic.never_split.insert(s);
  opt.do_basic_tokenize = config.get_bool("do_basic_tokenize").value_or(true);
  opt.clean_up_tokenization_spaces = config.get_bool("clean_up_tokenization_spaces").value_or(true);
  SpecialTokenRoles roles = bert_special_roles(config);
  if (roles.unk) opt.unk_token = roles.unk->content;
  try {
    return std::make_unique<WordPieceTokenizer>(read_vocab_txt(path), opt, roles,
                                                config.added_tokens());
  } catch (const InputError& e) {
    std::string what = e.what();
    if (what.rfind(path, 0) == 0) throw;
    EMOE_THROW(InputError, "{}: {}", path, what);
  }
}

}  // namespace emoe
