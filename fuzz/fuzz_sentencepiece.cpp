// Fuzzes SentencePiece models. The first byte picks the mode:
//   0: the rest is a tokenizer.model [, "\n\x01\n", tokenizer_config.json], loaded from a model
//      folder with load_tokenizer (LlamaTokenizer through libsentencepiece and the shim);
//   1: the rest describes a piece list (flags, special ids, then one piece per line: a type byte,
//      a score byte, the piece), written with serialize_sentencepiece_model
//      (sentencepiece_proto.cpp, as for GGUF vocabularies) and loaded with
//      SpmModel::from_serialized.
// A model that loads then encodes and decodes a few hostile texts and out-of-range ids. Our
// typed errors (InputError, RuntimeError) are the expected outcome of bad models; anything else
// escaping, or a crash inside libsentencepiece, is a finding.
#include <cstdint>
#include <string>
#include <vector>

#include "emoe/core/error.h"
#include "emoe/tokenizer/sentencepiece_proto.h"
#include "emoe/tokenizer/spm_library.h"
#include "emoe/tokenizer/tokenizer.h"
#include "fuzz_util.h"

namespace {

const char* const kTexts[] = {"Hello, world! It's 2026.",
                              "naïve café 東京 \xF0\x9F\x98\x80",
                              " ",
                              "",
                              "<unk> <s> </s> <pad>  two  spaces\n\ttab",
                              "\xC3\x28 broken utf-8 \xFF"};

void from_model_file(const std::string& rest) {
  auto parts = emoe_fuzz::split_parts(rest);
  emoe_fuzz::clear();
  emoe_fuzz::put("tokenizer.model", parts[0]);
  if (parts.size() > 1) emoe_fuzz::put("tokenizer_config.json", parts[1]);
  auto tok = emoe::load_tokenizer(emoe_fuzz::folder());
  emoe_fuzz::exercise_tokenizer(*tok, kTexts);
}

void from_piece_list(const std::string& rest) {
  if (rest.size() < 6) return;
  emoe::SpmModelSpec spec;
  const auto flags = static_cast<uint8_t>(rest[0]);
  spec.model_type = (flags & 1) ? 1 : 2;
  spec.byte_fallback = flags & 2;
  spec.add_dummy_prefix = flags & 4;
  spec.remove_extra_whitespaces = flags & 8;
  spec.escape_whitespaces = flags & 16;
  static const char* const kNormalizers[] = {"identity", "nmt_nfkc", "nfkc", "nmt_nfkc_cf"};
  spec.normalizer_name = kNormalizers[(flags >> 5) & 3];
  spec.unk_id = static_cast<int8_t>(rest[1]);
  spec.bos_id = static_cast<int8_t>(rest[2]);
  spec.eos_id = static_cast<int8_t>(rest[3]);
  spec.pad_id = static_cast<int8_t>(rest[4]);
  size_t at = 5;
  while (at < rest.size()) {
    size_t end = rest.find('\n', at);
    if (end == std::string::npos) end = rest.size();
    std::string line = rest.substr(at, end - at);
    at = end + 1;
    if (line.size() < 2) continue;
    emoe::SpmModelSpec::Piece p;
    p.type = static_cast<uint8_t>(line[0]) % 8;
    p.score = static_cast<int8_t>(line[1]) / 4.0f;
    p.piece = line.substr(2);
    spec.pieces.push_back(std::move(p));
  }
  auto model = emoe::SpmModel::from_serialized(emoe::serialize_sentencepiece_model(spec), "fuzz");
  for (const std::string text : kTexts) {
    auto ids = model->encode(text);
    (void)model->decode(ids);
    for (int id : ids) (void)model->id_to_piece(id);
  }
  const int n = model->piece_size();
  for (int id : {-1, 0, n - 1, n, n + 5}) {
    (void)model->score(id);
    (void)model->piece_type(id);
    if (id >= 0 && id < n) (void)model->piece_to_id(model->id_to_piece(id));
  }
  (void)model->decode({-1, 0, n, n + 7});
  (void)model->unk_id();
  (void)model->bos_id();
  (void)model->eos_id();
  (void)model->pad_id();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const std::string rest(reinterpret_cast<const char*>(data + 1), size - 1);
  try {
    if (data[0] % 2 == 0)
      from_model_file(rest);
    else
      from_piece_list(rest);
  } catch (const emoe::InputError&) {
  } catch (const emoe::RuntimeError&) {
  }
  return 0;
}
