// libemoe_spm.so: sentencepiece behind a C interface (built as its own module, never linked in).
#include "emoe/tokenizer/spm_shim/spm_shim.h"

#include <sentencepiece_processor.h>

#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#define EMOE_SPM_EXPORT extern "C" __attribute__((visibility("default")))

struct emoe_spm {
  sentencepiece::SentencePieceProcessor processor;
};

namespace {

thread_local std::string g_last_error;

void set_error(std::string message) {
  g_last_error = std::move(message);
}

bool valid_id(const emoe_spm* model, int id) {
  return model && id >= 0 && id < model->processor.GetPieceSize();
}

emoe_spm* finish_load(std::unique_ptr<emoe_spm> model, const sentencepiece::util::Status& status) {
  if (!status.ok()) {
    set_error(status.ToString());
    return nullptr;
  }
  return model.release();
}

}  // namespace

EMOE_SPM_EXPORT int emoe_spm_abi_version(void) {
  return EMOE_SPM_ABI_VERSION;
}

EMOE_SPM_EXPORT emoe_spm* emoe_spm_load_file(const char* path) {
  try {
    auto model = std::make_unique<emoe_spm>();
    auto status = model->processor.Load(path);
    return finish_load(std::move(model), status);
  } catch (const std::exception& e) {
    set_error(e.what());
    return nullptr;
  }
}

EMOE_SPM_EXPORT emoe_spm* emoe_spm_load_serialized(const char* data, size_t size) {
  try {
    auto model = std::make_unique<emoe_spm>();
    auto status = model->processor.LoadFromSerializedProto(std::string_view(data, size));
    return finish_load(std::move(model), status);
  } catch (const std::exception& e) {
    set_error(e.what());
    return nullptr;
  }
}

EMOE_SPM_EXPORT void emoe_spm_free(emoe_spm* model) {
  delete model;
}

EMOE_SPM_EXPORT const char* emoe_spm_last_error(void) {
  return g_last_error.c_str();
}

EMOE_SPM_EXPORT int emoe_spm_encode(const emoe_spm* model, const char* text, size_t size, int** ids,
                                    size_t* count) {
  try {
    std::vector<int> out;
    auto status = model->processor.Encode(std::string_view(text, size), &out);
    if (!status.ok()) {
      set_error(status.ToString());
      return -1;
    }
    *count = out.size();
    *ids = static_cast<int*>(std::malloc(out.size() * sizeof(int) + 1));
    if (!*ids) {
      set_error("out of memory");
      return -1;
    }
    if (!out.empty()) std::memcpy(*ids, out.data(), out.size() * sizeof(int));
    return 0;
  } catch (const std::exception& e) {
    set_error(e.what());
    return -1;
  }
}

EMOE_SPM_EXPORT int emoe_spm_decode(const emoe_spm* model, const int* ids, size_t count,
                                    char** text, size_t* size) {
  try {
    std::vector<int> in(ids, ids + count);
    std::string out;
    auto status = model->processor.Decode(in, &out);
    if (!status.ok()) {
      set_error(status.ToString());
      return -1;
    }
    *size = out.size();
    *text = static_cast<char*>(std::malloc(out.size() + 1));
    if (!*text) {
      set_error("out of memory");
      return -1;
    }
    std::memcpy(*text, out.c_str(), out.size() + 1);
    return 0;
  } catch (const std::exception& e) {
    set_error(e.what());
    return -1;
  }
}

EMOE_SPM_EXPORT void emoe_spm_free_buffer(void* buffer) {
  std::free(buffer);
}

EMOE_SPM_EXPORT int emoe_spm_piece_size(const emoe_spm* model) {
  return model->processor.GetPieceSize();
}

EMOE_SPM_EXPORT const char* emoe_spm_id_to_piece(const emoe_spm* model, int id) {
  if (!valid_id(model, id)) return nullptr;
  return model->processor.IdToPiece(id).c_str();
}

EMOE_SPM_EXPORT int emoe_spm_piece_to_id(const emoe_spm* model, const char* piece, size_t size) {
  std::string_view p(piece, size);
  int id = model->processor.PieceToId(p);
  // PieceToId answers unk_id for unknown pieces; tell them apart from the unk piece itself.
  if (id == model->processor.unk_id() && model->processor.IdToPiece(id) != p) return -1;
  return id;
}

EMOE_SPM_EXPORT float emoe_spm_score(const emoe_spm* model, int id) {
  return valid_id(model, id) ? model->processor.GetScore(id) : 0.0f;
}

EMOE_SPM_EXPORT int emoe_spm_piece_type(const emoe_spm* model, int id) {
  if (!valid_id(model, id)) return 0;
  const auto& p = model->processor;
  if (p.IsUnknown(id)) return 2;
  if (p.IsControl(id)) return 3;
  if (p.IsUnused(id)) return 5;
  if (p.IsByte(id)) return 6;
  return 1;
}

EMOE_SPM_EXPORT int emoe_spm_unk_id(const emoe_spm* model) {
  return model->processor.unk_id();
}
EMOE_SPM_EXPORT int emoe_spm_bos_id(const emoe_spm* model) {
  return model->processor.bos_id();
}
EMOE_SPM_EXPORT int emoe_spm_eos_id(const emoe_spm* model) {
  return model->processor.eos_id();
}
EMOE_SPM_EXPORT int emoe_spm_pad_id(const emoe_spm* model) {
  return model->processor.pad_id();
}
