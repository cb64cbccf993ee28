// LlamaTokenizer and T5Tokenizer (transformers 4.33, legacy=True) on the sentencepiece shim.
#include "emoe/tokenizer/sentencepiece.h"

#include <filesystem>

#include "emoe/core/error.h"
#include "emoe/tokenizer/tokenizer_config.h"
#include "emoe/tokenizer/truncation.h"

namespace emoe {
namespace fs = std::filesystem;

SentencePieceTokenizer::SentencePieceTokenizer(std::shared_ptr<SpmModel> model,
                                               SentencePieceOptions options,
                                               const SpecialTokenRoles& roles,
                                               const std::vector<AddedToken>& added)
    : model_(std::move(model)), options_(options) {
  EMOE_CHECK(options_.extra_ids >= 0 && options_.extra_ids <= (1 << 20), InputError,
             "{}: field 'extra_ids': expected 0 to {}, got {}", model_->source(), 1 << 20,
             options_.extra_ids);
  init_added_tokens(roles, added, false);
  EMOE_CHECK(!options_.add_bos_token || special().bos, InputError,
             "{}: add_bos_token is true but there is no bos_token", model_->source());
  EMOE_CHECK(!options_.add_eos_token || special().eos, InputError,
             "{}: add_eos_token is true but there is no eos_token", model_->source());
  if (options_.flavor == SpmFlavor::kT5) {
    EMOE_CHECK(special().eos, InputError, "{}: a T5 tokenizer needs an eos_token",
               model_->source());
    // the template's shape, for the count of special tokens truncation leaves room for; encode()
    // applies it without adding an eos a sequence already ends with
    PostTemplate t;
    const TemplateItem a{TemplateItem::Kind::kSequenceA, -1, 0};
    const TemplateItem b{TemplateItem::Kind::kSequenceB, -1, 0};
    const TemplateItem eos{TemplateItem::Kind::kSpecial, *special().eos, 0};
    t.single = {a, eos};
    t.pair = {a, eos, b, eos};
    set_template(t);
  } else {
    set_template(PostTemplate::bos_eos(options_.add_bos_token ? special().bos : std::nullopt,
                                       options_.add_eos_token ? special().eos : std::nullopt));
  }
  set_decode_options(options_.clean_up_tokenization_spaces, options_.spaces_between_special_tokens);
}

namespace {

// T5Tokenizer._add_eos_if_not_present
void append_eos_once(std::vector<int64_t>& ids, int64_t eos) {
  if (ids.empty() || ids.back() != eos) ids.push_back(eos);
}

}  // namespace

Encoding SentencePieceTokenizer::encode(const std::string& text, bool add_special_tokens,
                                        int64_t max_length) const {
  if (options_.flavor != SpmFlavor::kT5 || !add_special_tokens)
    return PipelineTokenizer::encode(text, add_special_tokens, max_length);
  Encoding enc;
  enc.ids = encode_plain(text);
  if (max_length > 0) truncate_longest_first(enc.ids, nullptr, 1, max_length);
  append_eos_once(enc.ids, *special().eos);
  enc.token_type_ids.assign(enc.ids.size(), 0);
  return enc;
}

Encoding SentencePieceTokenizer::encode_pair(const std::string& a, const std::string& b,
                                             bool add_special_tokens, int64_t max_length) const {
  if (options_.flavor != SpmFlavor::kT5 || !add_special_tokens)
    return PipelineTokenizer::encode_pair(a, b, add_special_tokens, max_length);
  Encoding enc;
  enc.ids = encode_plain(a);
  std::vector<int64_t> second = encode_plain(b);
  if (max_length > 0) truncate_longest_first(enc.ids, &second, 2, max_length);
  append_eos_once(enc.ids, *special().eos);
  append_eos_once(second, *special().eos);
  enc.ids.insert(enc.ids.end(), second.begin(), second.end());
  enc.token_type_ids.assign(enc.ids.size(), 0);
  return enc;
}

std::vector<int64_t> SentencePieceTokenizer::tokenize_text(const std::string& text) const {
  std::vector<int> ids = model_->encode(text);
  return std::vector<int64_t>(ids.begin(), ids.end());
}

namespace {

// N of "<extra_id_N>" (decimal digits only), or -1.
int64_t sentinel_number(const std::string& token) {
  const std::string head = "<extra_id_";
  if (token.size() < head.size() + 2 || token.compare(0, head.size(), head) != 0 ||
      token.back() != '>' || token.size() > head.size() + 10)
    return -1;
  int64_t n = 0;
  for (size_t i = head.size(); i + 1 < token.size(); ++i) {
    if (token[i] < '0' || token[i] > '9') return -1;
    n = n * 10 + (token[i] - '0');
  }
  return n;
}

}  // namespace

std::optional<int64_t> SentencePieceTokenizer::model_token_to_id(const std::string& token) const {
  if (options_.extra_ids > 0) {
    const int64_t n = sentinel_number(token);
    if (n >= 0 && n < options_.extra_ids) return model_vocab_size() - 1 - n;
  }
  int id = model_->piece_to_id(token);
  if (id < 0) return std::nullopt;
  return id;
}

std::string SentencePieceTokenizer::model_id_to_token(int64_t id) const {
  if (id >= model_->piece_size()) return fmt::format("<extra_id_{}>", model_vocab_size() - 1 - id);
  return model_->id_to_piece(static_cast<int>(id));
}

std::string SentencePieceTokenizer::tokens_to_string(const std::vector<int64_t>& ids) const {
  std::string out;
  std::vector<int> run;
  bool prev_is_special = false;
  const bool t5 = options_.flavor == SpmFlavor::kT5;
  for (size_t i = 0; i < ids.size(); ++i) {
    std::string piece = model_id_to_token(ids[i]);
    // a sentinel is never handed to sentencepiece, special or not
    if (is_special_token_string(piece) || ids[i] >= model_->piece_size()) {
      if (!prev_is_special && (i != 0 || t5)) out += ' ';
      out += model_->decode(run) + piece;
      prev_is_special = true;
      run.clear();
    } else {
      run.push_back(static_cast<int>(ids[i]));
      prev_is_special = false;
    }
  }
  out += model_->decode(run);
  if (t5) {  // Python's str.strip(): ASCII whitespace at both ends
    const char* ws = " \t\n\r\f\v";
    const size_t first = out.find_first_not_of(ws);
    if (first == std::string::npos) return "";
    out = out.substr(first, out.find_last_not_of(ws) - first + 1);
  }
  return out;
}

SpecialTokenRoles llama_special_roles(const TokenizerConfig& config) {
  return wrapped_special_roles(config, "<s>", "</s>", "<unk>");
}

namespace {

void require_legacy(const TokenizerConfig& config, const char* cls) {
  std::optional<bool> legacy = config.get_bool("legacy");
  EMOE_CHECK(legacy.value_or(true), InputError,
             "{}: field 'legacy': false is not supported; emoe implements {} with legacy=true "
             "(the transformers 4.33 default)",
             config.config_file(), cls);
}

}  // namespace

std::unique_ptr<SentencePieceTokenizer> load_sentencepiece(const std::string& dir,
                                                           const TokenizerConfig& config) {
  std::string path = (fs::path(dir) / "tokenizer.model").string();
  require_legacy(config, "LlamaTokenizer");
  SentencePieceOptions opt;
  opt.add_bos_token = config.get_bool("add_bos_token").value_or(true);
  opt.add_eos_token = config.get_bool("add_eos_token").value_or(false);
  opt.clean_up_tokenization_spaces =
      config.get_bool("clean_up_tokenization_spaces").value_or(false);
  opt.spaces_between_special_tokens =
      config.get_bool("spaces_between_special_tokens").value_or(true);
  return std::make_unique<SentencePieceTokenizer>(
      SpmModel::from_file(path), opt, llama_special_roles(config), config.added_tokens());
}

}  // namespace emoe

namespace emoe {

std::unique_ptr<SentencePieceTokenizer> load_t5_sentencepiece(const std::string& dir,
                                                              const TokenizerConfig& config) {
  const std::string path = (fs::path(dir) / "spiece.model").string();
  require_legacy(config, "T5Tokenizer");
  SentencePieceOptions opt;
  opt.flavor = SpmFlavor::kT5;
  opt.extra_ids = config.get_int("extra_ids", 0, 1 << 20).value_or(100);
  opt.add_bos_token = false;
  opt.clean_up_tokenization_spaces = config.get_bool("clean_up_tokenization_spaces").value_or(true);
  opt.spaces_between_special_tokens =
      config.get_bool("spaces_between_special_tokens").value_or(true);
  // T5Tokenizer keeps plain strings (they eat the whitespace around them when splitting)
  SpecialTokenRoles roles;
  roles.eos = config.special_token("eos_token", "</s>", false);
  roles.unk = config.special_token("unk_token", "<unk>", false);
  roles.pad = config.special_token("pad_token", "<pad>", false);
  roles.additional = config.additional_special_tokens(false);
  int64_t sentinels = 0;
  for (const AddedToken& t : roles.additional)
    if (t.content.find("extra_id") != std::string::npos) ++sentinels;
  if (opt.extra_ids > 0 && roles.additional.empty()) {
    for (int64_t i = 0; i < opt.extra_ids; ++i) {
      AddedToken t;
      t.content = fmt::format("<extra_id_{}>", i);
      t.plain_string = true;
      roles.additional.push_back(t);
    }
  } else if (opt.extra_ids > 0) {
    EMOE_CHECK(sentinels == opt.extra_ids, InputError,
               "{}: field 'additional_special_tokens': holds {} <extra_id_N> tokens but "
               "extra_ids is {} (T5Tokenizer needs them to agree)",
               config.config_file(), sentinels, opt.extra_ids);
  }
  return std::make_unique<SentencePieceTokenizer>(SpmModel::from_file(path), opt, roles,
                                                  config.added_tokens());
}

}  // namespace emoe
