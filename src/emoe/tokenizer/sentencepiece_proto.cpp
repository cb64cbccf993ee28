// Minimal protobuf (proto2 wire format) writer for SentencePiece's ModelProto.
#include "emoe/tokenizer/sentencepiece_proto.h"

#include <cstdint>
#include <cstring>

namespace emoe {

namespace {

// Field numbers from sentencepiece_model.proto.
constexpr int kModelPieces = 1, kModelTrainerSpec = 2, kModelNormalizerSpec = 3;
constexpr int kPiecePiece = 1, kPieceScore = 2, kPieceType = 3;
constexpr int kTrainerModelType = 3, kTrainerVocabSize = 4, kTrainerByteFallback = 35,
              kTrainerUnkId = 40, kTrainerBosId = 41, kTrainerEosId = 42, kTrainerPadId = 43;
constexpr int kNormName = 1, kNormAddDummyPrefix = 3, kNormRemoveExtraWhitespaces = 4,
              kNormEscapeWhitespaces = 5;

void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

void put_tag(std::string& out, int field, int wire_type) {
  put_varint(out, (static_cast<uint64_t>(field) << 3) | static_cast<uint64_t>(wire_type));
}

// int32 fields are written sign-extended to 64 bits, as protobuf does for negative values.
void put_int(std::string& out, int field, int64_t v) {
  put_tag(out, field, 0);
  put_varint(out, static_cast<uint64_t>(v));
}

void put_bytes(std::string& out, int field, const std::string& bytes) {
  put_tag(out, field, 2);
  put_varint(out, bytes.size());
  out += bytes;
}

void put_float(std::string& out, int field, float v) {
  put_tag(out, field, 5);
  uint32_t bits = 0;
  std::memcpy(&bits, &v, sizeof bits);
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((bits >> (8 * i)) & 0xFF));
}

}  // namespace

std::string serialize_sentencepiece_model(const SpmModelSpec& spec) {
  std::string out;
  for (const SpmModelSpec::Piece& p : spec.pieces) {
    std::string piece;
    put_bytes(piece, kPiecePiece, p.piece);
    put_float(piece, kPieceScore, p.score);
    put_int(piece, kPieceType, p.type);
    put_bytes(out, kModelPieces, piece);
  }
  std::string trainer;
  put_int(trainer, kTrainerModelType, spec.model_type);
  put_int(trainer, kTrainerVocabSize, static_cast<int64_t>(spec.pieces.size()));
  put_int(trainer, kTrainerByteFallback, spec.byte_fallback ? 1 : 0);
  put_int(trainer, kTrainerUnkId, spec.unk_id);
  put_int(trainer, kTrainerBosId, spec.bos_id);
  put_int(trainer, kTrainerEosId, spec.eos_id);
  put_int(trainer, kTrainerPadId, spec.pad_id);
  put_bytes(out, kModelTrainerSpec, trainer);
  std::string normalizer;
  put_bytes(normalizer, kNormName, spec.normalizer_name);
  put_int(normalizer, kNormAddDummyPrefix, spec.add_dummy_prefix ? 1 : 0);
  put_int(normalizer, kNormRemoveExtraWhitespaces, spec.remove_extra_whitespaces ? 1 : 0);
  put_int(normalizer, kNormEscapeWhitespaces, spec.escape_whitespaces ? 1 : 0);
  put_bytes(out, kModelNormalizerSpec, normalizer);
  return out;
}

}  // namespace emoe
