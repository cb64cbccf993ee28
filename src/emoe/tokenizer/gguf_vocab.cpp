// A streaming reader for the metadata section of GGUF files, keeping the tokenizer.ggml.* keys.
#include "emoe/tokenizer/gguf_vocab.h"

#include <cstring>
#include <fstream>

#include "emoe/core/error.h"

namespace emoe {

namespace {

enum GgufType : uint32_t {
  kU8 = 0,
  kI8 = 1,
  kU16 = 2,
  kI16 = 3,
  kU32 = 4,
  kI32 = 5,
  kF32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kU64 = 10,
  kI64 = 11,
  kF64 = 12,
};

size_t scalar_size(uint32_t type) {
  switch (type) {
    case kU8:
    case kI8:
    case kBool:
      return 1;
    case kU16:
    case kI16:
      return 2;
    case kU32:
    case kI32:
    case kF32:
      return 4;
    case kU64:
    case kI64:
    case kF64:
      return 8;
    default:
      return 0;
  }
}

class GgufReader {
 public:
  explicit GgufReader(const std::string& path) : path_(path), in_(path, std::ios::binary) {
    EMOE_CHECK(in_.good(), InputError, "{}: cannot open the file", path);
    in_.seekg(0, std::ios::end);
    size_ = static_cast<uint64_t>(in_.tellg());
    in_.seekg(0);
  }

  void read_bytes(void* dst, uint64_t n, const std::string& what) {
    EMOE_CHECK(n <= size_ - pos_, InputError, "{}: truncated while reading {} (offset {})", path_,
               what, pos_);
    in_.read(static_cast<char*>(dst), static_cast<std::streamsize>(n));
    EMOE_CHECK(in_.good(), InputError, "{}: read error in {}", path_, what);
    pos_ += n;
  }
  template <typename T>
  T read(const std::string& what) {
    T v{};
    read_bytes(&v, sizeof(T), what);  // GGUF is little-endian, like every host we build for
    return v;
  }
  std::string read_string(const std::string& what) {
    uint64_t n = read<uint64_t>(what);
    EMOE_CHECK(n <= size_ - pos_, InputError, "{}: {}: string of {} bytes runs past the end", path_,
               what, n);
    std::string s(n, '\0');
    read_bytes(s.data(), n, what);
    return s;
  }
  void skip(uint64_t n, const std::string& what) {
    EMOE_CHECK(n <= size_ - pos_, InputError, "{}: truncated in {}", path_, what);
    in_.seekg(static_cast<std::streamoff>(n), std::ios::cur);
    pos_ += n;
  }
  // Skips one value of `type` (arrays included).
  void skip_value(uint32_t type, const std::string& what) {
    if (type == kString) {
      read_string(what);
    } else if (type == kArray) {
      uint32_t elem = read<uint32_t>(what);
      uint64_t count = read<uint64_t>(what);
      if (size_t s = scalar_size(elem)) {
        EMOE_CHECK(count <= (size_ - pos_) / s, InputError, "{}: {}: array runs past the end",
                   path_, what);
        skip(count * s, what);
      } else {
        for (uint64_t i = 0; i < count; ++i) skip_value(elem, what);
      }
    } else {
      size_t s = scalar_size(type);
      EMOE_CHECK(s > 0, InputError, "{}: {}: unknown value type {}", path_, what, type);
      skip(s, what);
    }
  }
  // An array header of the expected element type; returns the count.
  uint64_t array_of(uint32_t type, uint32_t want, const std::string& key) {
    EMOE_CHECK(type == kArray, InputError, "{}: key '{}': expected an array, got type {}", path_,
               key, type);
    uint32_t elem = read<uint32_t>(key);
    EMOE_CHECK(elem == want, InputError, "{}: key '{}': expected array elements of type {}, got {}",
               path_, key, want, elem);
    uint64_t count = read<uint64_t>(key);
    uint64_t min_size = elem == kString ? 8 : scalar_size(elem);
    EMOE_CHECK(count <= (size_ - pos_) / min_size, InputError,
               "{}: key '{}': array of {} elements runs past the end", path_, key, count);
    return count;
  }
  // An integer-typed scalar of any width (ids are u32 in practice).
  int64_t read_int(uint32_t type, const std::string& key) {
    switch (type) {
      case kU8:
        return read<uint8_t>(key);
      case kI8:
        return read<int8_t>(key);
      case kU16:
        return read<uint16_t>(key);
      case kI16:
        return read<int16_t>(key);
      case kU32:
        return read<uint32_t>(key);
      case kI32:
        return read<int32_t>(key);
      case kU64:
        return static_cast<int64_t>(read<uint64_t>(key));
      case kI64:
        return read<int64_t>(key);
      default:
        EMOE_THROW(InputError, "{}: key '{}': expected an integer, got type {}", path_, key, type);
    }
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::ifstream in_;
  uint64_t size_ = 0;
  uint64_t pos_ = 0;
};

}  // namespace

GgufVocab read_gguf_vocab(const std::string& path) {
  GgufReader r(path);
  GgufVocab v;
  v.path = path;
  char magic[4];
  r.read_bytes(magic, 4, "the magic");
  EMOE_CHECK(std::memcmp(magic, "GGUF", 4) == 0, InputError,
             "{}: not a GGUF file (expected the magic \"GGUF\")", path);
  uint32_t version = r.read<uint32_t>("the version");
  EMOE_CHECK(version == 2 || version == 3, InputError,
             "{}: GGUF version {} is not supported (expected 2 or 3)", path, version);
  r.read<uint64_t>("the tensor count");
  uint64_t kv_count = r.read<uint64_t>("the metadata count");
  const std::string prefix = "tokenizer.ggml.";
  for (uint64_t i = 0; i < kv_count; ++i) {
    std::string key = r.read_string(fmt::format("metadata key #{}", i));
    uint32_t type = r.read<uint32_t>(key);
    if (key.rfind(prefix, 0) != 0) {
      r.skip_value(type, key);
      continue;
    }
    std::string name = key.substr(prefix.size());
    auto id = [&](std::optional<int64_t>& out) {
      int64_t value = r.read_int(type, key);
      // llama.cpp writes -1 (or its u32 image) for "no such token".
      if (value >= 0 && value != 0xFFFFFFFFll) out = value;
    };
    auto flag = [&](std::optional<bool>& out) {
      EMOE_CHECK(type == kBool, InputError, "{}: key '{}': expected a bool, got type {}", path, key,
                 type);
      out = r.read<uint8_t>(key) != 0;
    };
    auto string = [&](std::string& out) {
      EMOE_CHECK(type == kString, InputError, "{}: key '{}': expected a string, got type {}", path,
                 key, type);
      out = r.read_string(key);
    };
    if (name == "model") {
      string(v.model);
    } else if (name == "pre") {
      string(v.pre);
    } else if (name == "tokens" || name == "merges") {
      uint64_t n = r.array_of(type, kString, key);
      auto& out = name == "tokens" ? v.tokens : v.merges;
      out.reserve(n);
      for (uint64_t k = 0; k < n; ++k) out.push_back(r.read_string(key));
    } else if (name == "scores") {
      uint64_t n = r.array_of(type, kF32, key);
      v.scores.resize(n);
      r.read_bytes(v.scores.data(), n * sizeof(float), key);
    } else if (name == "token_type") {
      uint64_t n = r.array_of(type, kI32, key);
      v.token_types.resize(n);
      r.read_bytes(v.token_types.data(), n * sizeof(int32_t), key);
    } else if (name == "bos_token_id") {
      id(v.bos);
    } else if (name == "eos_token_id") {
      id(v.eos);
    } else if (name == "unknown_token_id") {
      id(v.unk);
    } else if (name == "seperator_token_id" || name == "separator_token_id") {
      id(v.sep);
    } else if (name == "padding_token_id") {
      id(v.pad);
    } else if (name == "cls_token_id") {
      id(v.cls);
    } else if (name == "mask_token_id") {
      id(v.mask);
    } else if (name == "add_bos_token") {
      flag(v.add_bos);
    } else if (name == "add_eos_token") {
      flag(v.add_eos);
    } else if (name == "add_space_prefix") {
      flag(v.add_space_prefix);
    } else {
      r.skip_value(type, key);
    }
  }
  EMOE_CHECK(!v.tokens.empty(), InputError, "{}: key 'tokenizer.ggml.tokens' is missing or empty",
             path);
  EMOE_CHECK(v.scores.empty() || v.scores.size() == v.tokens.size(), InputError,
             "{}: key 'tokenizer.ggml.scores': expected {} scores (one per token), got {}", path,
             v.tokens.size(), v.scores.size());
  EMOE_CHECK(v.token_types.empty() || v.token_types.size() == v.tokens.size(), InputError,
             "{}: key 'tokenizer.ggml.token_type': expected {} types (one per token), got {}", path,
             v.tokens.size(), v.token_types.size());
  for (const auto* special : {&v.bos, &v.eos, &v.unk, &v.sep, &v.pad, &v.cls, &v.mask})
    EMOE_CHECK(!*special || (**special >= 0 && **special < static_cast<int64_t>(v.tokens.size())),
               InputError, "{}: a tokenizer.ggml.*_token_id is {}, outside the {} tokens", path,
               special->value_or(-1), v.tokens.size());
  return v;
}

}  // namespace emoe
