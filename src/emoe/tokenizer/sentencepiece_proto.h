// Writes a SentencePiece ModelProto (the bytes of a tokenizer.model) from a piece list.
#pragma once
#include <string>
#include <vector>

namespace emoe {

// The fields of sentencepiece_model.proto that encoding and decoding depend on.
struct SpmModelSpec {
  struct Piece {
    std::string piece;
    float score = 0.0f;
    int type = 1;  // 1 normal, 2 unknown, 3 control, 4 user defined, 5 unused, 6 byte
  };
  std::vector<Piece> pieces;
  int model_type = 2;  // TrainerSpec.ModelType: 1 unigram, 2 BPE
  bool byte_fallback = false;
  int unk_id = 0, bos_id = 1, eos_id = 2, pad_id = -1;
  std::string normalizer_name = "identity";
  bool add_dummy_prefix = true;
  bool remove_extra_whitespaces = true;
  bool escape_whitespaces = true;
};

// The serialized protobuf, loadable with SentencePieceProcessor::LoadFromSerializedProto.
std::string serialize_sentencepiece_model(const SpmModelSpec& spec);

}  // namespace emoe
