// LlamaTokenizer (transformers 4.33, legacy=True) on top of the sentencepiece shim.
#include "emoe/tokenizer/sentencepiece.h"

#include <filesystem>

#include "emoe/core/error.h"
#include "emoe/tokenizer/tokenizer_config.h"

namespace emoe {
namespace fs = std::filesystem;

SentencePieceTokenizer::SentencePieceTokenizer(std::shared_ptr<SpmModel> model,
                                               SentencePieceOptions options,
                                               const SpecialTokenRoles& roles,
                                               const std::vector<AddedToken>& added)
    : model_(std::move(model)), options_(options) {
  init_added_tokens(roles, added, false);
  EMOE_CHECK(!options_.add_bos_token || special().bos, InputError,
             "{}: add_bos_token is true but there is no bos_token", model_->source());
  EMOE_CHECK(!options_.add_eos_token || special().eos, InputError,
             "{}: add_eos_token is true but there is no eos_token", model_->source());
  set_template(PostTemplate::bos_eos(options_.add_bos_token ? special().bos : std::nullopt,
                                     options_.add_eos_token ? special().eos : std::nullopt));
  set_decode_options(options_.clean_up_tokenization_spaces, options_.spaces_between_special_tokens);
}

std::vector<int64_t> SentencePieceTokenizer::tokenize_text(const std::string& text) const {
  std::vector<int> ids = model_->encode(text);
  return std::vector<int64_t>(ids.begin(), ids.end());
}

std::optional<int64_t> SentencePieceTokenizer::model_token_to_id(const std::string& token) const {
  int id = model_->piece_to_id(token);
  if (id < 0) return std::nullopt;
  return id;
}

std::string SentencePieceTokenizer::model_id_to_token(int64_t id) const {
  return model_->id_to_piece(static_cast<int>(id));
}

std::string SentencePieceTokenizer::tokens_to_string(const std::vector<int64_t>& ids) const {
  std::string out;
  std::vector<int> run;
  bool prev_is_special = false;
  for (size_t i = 0; i < ids.size(); ++i) {
    std::string piece = model_->id_to_piece(static_cast<int>(ids[i]));
    if (is_special_token_string(piece)) {
      if (!prev_is_special && i != 0) out += ' ';
      out += model_->decode(run) + piece;
      prev_is_special = true;
      run.clear();
    } else {
      run.push_back(static_cast<int>(ids[i]));
      prev_is_special = false;
    }
  }
  out += model_->decode(run);
  return out;
}

SpecialTokenRoles llama_special_roles(const TokenizerConfig& config) {
  SpecialTokenRoles roles;
  roles.bos = config.special_token("bos_token", "<s>", true);
  roles.eos = config.special_token("eos_token", "</s>", true);
  roles.unk = config.special_token("unk_token", "<unk>", true);
  roles.pad = config.special_token("pad_token", std::nullopt, true);
  roles.sep = config.special_token("sep_token", std::nullopt, true);
  roles.cls = config.special_token("cls_token", std::nullopt, true);
  roles.mask = config.special_token("mask_token", std::nullopt, true);
  roles.additional = config.additional_special_tokens(true);
  return roles;
}

std::unique_ptr<SentencePieceTokenizer> load_sentencepiece(const std::string& dir,
                                                           const TokenizerConfig& config) {
  std::string path = (fs::path(dir) / "tokenizer.model").string();
  std::optional<bool> legacy = config.get_bool("legacy");
  EMOE_CHECK(legacy.value_or(true), InputError,
             "{}: field 'legacy': false is not supported; emoe implements LlamaTokenizer with "
             "legacy=true (the transformers 4.33 default)",
             config.config_file());
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
