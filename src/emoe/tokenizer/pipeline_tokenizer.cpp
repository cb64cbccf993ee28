// Shared slow-tokenizer pipeline: added tokens, templates, truncation and decoding as HF 4.33.
#include "emoe/tokenizer/pipeline_tokenizer.h"

#include "emoe/core/error.h"
#include "emoe/tokenizer/tokenizer_config.h"

namespace emoe {

namespace {

void replace_all(std::string& s, const std::string& from, const std::string& to) {
  size_t pos = 0;
  while ((pos = s.find(from, pos)) != std::string::npos) {
    s.replace(pos, from.size(), to);
    pos += to.size();
  }
}

}  // namespace

std::string clean_up_tokenization(std::string text) {
  static const std::pair<const char*, const char*> kRules[] = {
      {" .", "."},     {" ?", "?"},   {" !", "!"},   {" ,", ","},     {" ' ", "'"},
      {" n't", "n't"}, {" 'm", "'m"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}};
  for (const auto& [from, to] : kRules) replace_all(text, from, to);
  return text;
}

int64_t PipelineTokenizer::register_token(AddedToken t, bool special) {
  auto known = added_by_content_.find(t.content);
  if (known != added_by_content_.end()) {
    if (special) {
      special_ids_.insert(known->second);
      special_strings_.insert(t.content);
    }
    return known->second;
  }
  std::optional<int64_t> in_model = model_token_to_id(t.content);
  if (t.id < 0) t.id = in_model ? *in_model : next_id_;
  if (!in_model || *in_model != t.id) added_only_[t.id] = t.content;
  next_id_ = std::max(next_id_, t.id + 1);
  t.special = t.special || special;
  if (t.special) {
    special_ids_.insert(t.id);
    special_strings_.insert(t.content);
  }
  added_by_content_[t.content] = t.id;
  added_.push_back(t);
  return t.id;
}

void PipelineTokenizer::init_added_tokens(const SpecialTokenRoles& roles,
                                          const std::vector<AddedToken>& added,
                                          bool lowercase_outside) {
  next_id_ = model_vocab_size();
  for (const AddedToken& t : added) register_token(t, false);
  // transformers' SPECIAL_TOKENS_ATTRIBUTES order, which also orders the ids of new tokens.
  const std::pair<const std::optional<AddedToken>*, std::optional<int64_t>*> slots[] = {
      {&roles.bos, &special_.bos},  {&roles.eos, &special_.eos}, {&roles.unk, &special_.unk},
      {&roles.sep, &special_.sep},  {&roles.pad, &special_.pad}, {&roles.cls, &special_.cls},
      {&roles.mask, &special_.mask}};
  for (const auto& [token, id] : slots)
    if (*token) *id = register_token(**token, true);
  for (const AddedToken& t : roles.additional) register_token(t, true);
  splitter_ = AddedTokenSplitter(added_, lowercase_outside);
}

// Like len(tokenizer): one past the largest id, counting tokens added beyond the model's.
int64_t PipelineTokenizer::vocab_size() const {
  return next_id_;
}

bool PipelineTokenizer::has_id(int64_t id) const {
  return (id >= 0 && id < model_vocab_size()) || added_only_.count(id) > 0;
}

std::optional<int64_t> PipelineTokenizer::token_to_id(const std::string& token) const {
  auto it = added_by_content_.find(token);
  if (it != added_by_content_.end()) return it->second;
  return model_token_to_id(token);
}

std::string PipelineTokenizer::id_to_token(int64_t id) const {
  auto it = added_only_.find(id);
  if (it != added_only_.end()) return it->second;
  EMOE_CHECK(has_id(id), InputError, "token id {} is out of range for a vocabulary of {} tokens",
             id, vocab_size());
  return model_id_to_token(id);
}

std::vector<int64_t> PipelineTokenizer::encode_plain(const std::string& text) const {
  std::vector<int64_t> ids;
  for (const TextSegment& seg : splitter_.split(prepare_text(text))) {
    if (seg.id >= 0) {
      ids.push_back(seg.id);
    } else {
      std::vector<int64_t> part = tokenize_text(seg.text);
      ids.insert(ids.end(), part.begin(), part.end());
    }
  }
  return ids;
}

Encoding PipelineTokenizer::encode(const std::string& text, bool add_special_tokens,
                                   int64_t max_length) const {
  return template_.encode(encode_plain(text), nullptr, add_special_tokens, max_length);
}

Encoding PipelineTokenizer::encode_pair(const std::string& a, const std::string& b,
                                        bool add_special_tokens, int64_t max_length) const {
  std::vector<int64_t> pair = encode_plain(b);
  return template_.encode(encode_plain(a), &pair, add_special_tokens, max_length);
}

std::string PipelineTokenizer::decode(const std::vector<int64_t>& ids,
                                      bool skip_special_tokens) const {
  std::vector<std::string> sub_texts;
  std::vector<int64_t> run;
  auto flush = [&] {
    if (run.empty()) return;
    sub_texts.push_back(tokens_to_string(run));
    run.clear();
  };
  for (int64_t id : ids) {
    EMOE_CHECK(has_id(id), InputError,
               "cannot decode token id {}: out of range for a vocabulary of {} tokens", id,
               vocab_size());
    if (skip_special_tokens && special_ids_.count(id)) continue;
    auto added = added_only_.find(id);
    if (added != added_only_.end()) {
      flush();
      sub_texts.push_back(added->second);
    } else {
      run.push_back(id);
    }
  }
  flush();
  std::string text;
  for (size_t i = 0; i < sub_texts.size(); ++i) {
    if (i > 0 && spaces_between_special_) text += ' ';
    text += sub_texts[i];
  }
  return clean_up_ ? clean_up_tokenization(std::move(text)) : text;
}

SpecialTokenRoles wrapped_special_roles(const TokenizerConfig& config, const std::string& bos,
                                        const std::string& eos, const std::string& unk) {
  SpecialTokenRoles roles;
  roles.bos = config.special_token("bos_token", bos, true);
  roles.eos = config.special_token("eos_token", eos, true);
  roles.unk = config.special_token("unk_token", unk, true);
  roles.pad = config.special_token("pad_token", std::nullopt, true);
  roles.sep = config.special_token("sep_token", std::nullopt, true);
  roles.cls = config.special_token("cls_token", std::nullopt, true);
  roles.mask = config.special_token("mask_token", std::nullopt, true);
  roles.additional = config.additional_special_tokens(true);
  return roles;
}

}  // namespace emoe
