// GGUF vocabularies turned into WordPiece, byte-level BPE or SentencePiece tokenizers.
#include "emoe/tokenizer/gguf_tokenizer.h"

#include "emoe/core/error.h"
#include "emoe/tokenizer/bpe.h"
#include "emoe/tokenizer/sentencepiece.h"
#include "emoe/tokenizer/sentencepiece_proto.h"
#include "emoe/tokenizer/wordpiece.h"

namespace emoe {

namespace {

std::optional<AddedToken> role(const GgufVocab& v, const std::optional<int64_t>& id,
                               bool plain_string) {
  if (!id) return std::nullopt;
  AddedToken t;
  t.content = v.tokens[static_cast<size_t>(*id)];
  t.id = *id;
  t.plain_string = plain_string;
  return t;
}

// llama.cpp's converter stores WordPiece vocabularies in "phantom space" form: "[X]" tokens as
// they are, word-initial tokens with a "\u2581" prefix, "##" continuations without their "##".
std::string wordpiece_token(const std::string& gguf_token) {
  const std::string phantom = "\xE2\x96\x81";
  if (gguf_token.rfind(phantom, 0) == 0) return gguf_token.substr(phantom.size());
  if (gguf_token.size() >= 2 && gguf_token.front() == '[' && gguf_token.back() == ']')
    return gguf_token;
  return "##" + gguf_token;
}

std::unique_ptr<Tokenizer> wordpiece_from_gguf(GgufVocab v) {
  EMOE_CHECK(v.unk && v.cls && v.sep, InputError,
             "{}: a BERT vocabulary needs unknown, cls and separator token ids", v.path);
  for (std::string& t : v.tokens) t = wordpiece_token(t);
  SpecialTokenRoles roles;
  roles.unk = role(v, v.unk, true);
  roles.sep = role(v, v.sep, true);
  roles.pad = role(v, v.pad, true);
  roles.cls = role(v, v.cls, true);
  roles.mask = role(v, v.mask, true);
  WordPieceOptions opt;
  opt.unk_token = roles.unk->content;
  return std::make_unique<WordPieceTokenizer>(v.tokens, opt, roles, std::vector<AddedToken>{});
}

std::unique_ptr<Tokenizer> bpe_from_gguf(const GgufVocab& v) {
  std::vector<std::pair<std::string, int64_t>> vocab;
  vocab.reserve(v.tokens.size());
  for (size_t i = 0; i < v.tokens.size(); ++i)
    vocab.emplace_back(v.tokens[i], static_cast<int64_t>(i));
  std::vector<BpeMerge> merges;
  merges.reserve(v.merges.size());
  for (size_t i = 0; i < v.merges.size(); ++i) {
    const std::string& m = v.merges[i];
    size_t space = m.find(' ');
    EMOE_CHECK(space != std::string::npos && space > 0 && space + 1 < m.size() &&
                   m.find(' ', space + 1) == std::string::npos,
               InputError,
               "{}: key 'tokenizer.ggml.merges' entry {}: expected two tokens separated by a "
               "space, got '{}'",
               v.path, i, m);
    merges.emplace_back(m.substr(0, space), m.substr(space + 1));
  }
  SpecialTokenRoles roles;
  roles.bos = role(v, v.bos, false);
  roles.eos = role(v, v.eos, false);
  roles.unk = role(v, v.unk ? v.unk : v.eos, false);
  roles.pad = role(v, v.pad, false);
  return std::make_unique<BpeTokenizer>(vocab, merges, BpeOptions{}, roles,
                                        std::vector<AddedToken>{}, v.path);
}

std::unique_ptr<Tokenizer> sentencepiece_from_gguf(const GgufVocab& v) {
  EMOE_CHECK(v.scores.size() == v.tokens.size() && v.token_types.size() == v.tokens.size(),
             InputError, "{}: a SentencePiece vocabulary needs scores and token types", v.path);
  SpmModelSpec spec;
  spec.model_type = 2;  // llama.cpp's SPM merges by score, as SentencePiece's BPE does
  spec.pieces.reserve(v.tokens.size());
  for (size_t i = 0; i < v.tokens.size(); ++i) {
    spec.pieces.push_back({v.tokens[i], v.scores[i], v.token_types[i]});
    if (v.token_types[i] == 6) spec.byte_fallback = true;
  }
  spec.unk_id = static_cast<int>(v.unk.value_or(0));
  spec.bos_id = v.bos ? static_cast<int>(*v.bos) : -1;
  spec.eos_id = v.eos ? static_cast<int>(*v.eos) : -1;
  spec.add_dummy_prefix = v.add_space_prefix.value_or(true);
  spec.remove_extra_whitespaces = false;
  auto model = SpmModel::from_serialized(serialize_sentencepiece_model(spec), v.path);
  SpecialTokenRoles roles;
  roles.bos = role(v, v.bos, false);
  roles.eos = role(v, v.eos, false);
  roles.unk = role(v, spec.unk_id, false);
  SentencePieceOptions opt;
  opt.add_bos_token = v.add_bos.value_or(true) && v.bos;
  opt.add_eos_token = v.add_eos.value_or(false) && v.eos;
  return std::make_unique<SentencePieceTokenizer>(model, opt, roles, std::vector<AddedToken>{});
}

}  // namespace

std::unique_ptr<Tokenizer> tokenizer_from_gguf(const GgufVocab& vocab) {
  // tokenizer.ggml.model names llama.cpp's tokenizer kinds (WPM, BPE, SPM), not architectures
  using Builder = std::unique_ptr<Tokenizer> (*)(const GgufVocab&);
  static const std::pair<const char*, Builder> kBuilders[] = {
      {"bert", [](const GgufVocab& v) { return wordpiece_from_gguf(v); }},
      {"gpt2", bpe_from_gguf},
      {"llama", sentencepiece_from_gguf}};
  for (const auto& [kind, build] : kBuilders)
    if (vocab.model == kind) return build(vocab);
  EMOE_THROW(InputError,
             "{}: key 'tokenizer.ggml.model': '{}' is not supported (expected bert, gpt2 or "
             "llama)",
             vocab.path, vocab.model);
}

}  // namespace emoe
