// Loads libemoe_spm.so with dlopen(RTLD_LOCAL | RTLD_DEEPBIND) so that sentencepiece binds to
// its own bundled protobuf, not to the libprotobuf that libtorch brings into the process.
#include "emoe/tokenizer/spm_library.h"

#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <mutex>

#include "emoe/core/error.h"
#include "emoe/tokenizer/spm_shim/spm_shim.h"

namespace emoe {
namespace fs = std::filesystem;

// The shim's entry points, resolved once per process.
class SpmLibrary {
 public:
  static const SpmLibrary& get() {
    static std::once_flag once;
    static std::unique_ptr<SpmLibrary> lib;
    static std::string failure;
    std::call_once(once, [] {
      try {
        lib.reset(new SpmLibrary());
      } catch (const RuntimeError& e) {
        failure = e.what();
      }
    });
    if (!lib) throw RuntimeError(failure);
    return *lib;
  }

  decltype(&emoe_spm_load_file) load_file = nullptr;
  decltype(&emoe_spm_load_serialized) load_serialized = nullptr;
  decltype(&emoe_spm_free) free_model = nullptr;
  decltype(&emoe_spm_last_error) last_error = nullptr;
  decltype(&emoe_spm_encode) encode = nullptr;
  decltype(&emoe_spm_decode) decode = nullptr;
  decltype(&emoe_spm_free_buffer) free_buffer = nullptr;
  decltype(&emoe_spm_piece_size) piece_size = nullptr;
  decltype(&emoe_spm_id_to_piece) id_to_piece = nullptr;
  decltype(&emoe_spm_piece_to_id) piece_to_id = nullptr;
  decltype(&emoe_spm_score) score = nullptr;
  decltype(&emoe_spm_piece_type) piece_type = nullptr;
  decltype(&emoe_spm_unk_id) unk_id = nullptr;
  decltype(&emoe_spm_bos_id) bos_id = nullptr;
  decltype(&emoe_spm_eos_id) eos_id = nullptr;
  decltype(&emoe_spm_pad_id) pad_id = nullptr;

 private:
#ifdef EMOE_SPM_DIRECT
  // Fuzzing and sanitizer builds without libtorch: the shim is linked into the program (ASan's
  // runtime refuses RTLD_DEEPBIND), so its functions are called directly.
  SpmLibrary() {
    load_file = &emoe_spm_load_file;
    load_serialized = &emoe_spm_load_serialized;
    free_model = &emoe_spm_free;
    last_error = &emoe_spm_last_error;
    encode = &emoe_spm_encode;
    decode = &emoe_spm_decode;
    free_buffer = &emoe_spm_free_buffer;
    piece_size = &emoe_spm_piece_size;
    id_to_piece = &emoe_spm_id_to_piece;
    piece_to_id = &emoe_spm_piece_to_id;
    score = &emoe_spm_score;
    piece_type = &emoe_spm_piece_type;
    unk_id = &emoe_spm_unk_id;
    bos_id = &emoe_spm_bos_id;
    eos_id = &emoe_spm_eos_id;
    pad_id = &emoe_spm_pad_id;
  }
#else
  SpmLibrary() {
    std::string tried;
    for (const std::string& path : spm_shim_candidates()) {
      if (!fs::exists(path)) {
        tried += fmt::format("{}{} (not there)", tried.empty() ? "" : "; ", path);
        continue;
      }
#if defined(__SANITIZE_ADDRESS__)
      // AddressSanitizer refuses RTLD_DEEPBIND: the (uninstrumented) shim goes into a link
      // namespace of its own instead, with its own libstdc++ and protobuf, apart from libtorch's
      handle_ = dlmopen(LM_ID_NEWLM, path.c_str(), RTLD_NOW | RTLD_LOCAL);
#else
      handle_ = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
#endif
      if (handle_) {
        path_ = path;
        break;
      }
      const char* why = dlerror();
      tried +=
          fmt::format("{}{} ({})", tried.empty() ? "" : "; ", path, why ? why : "dlopen failed");
    }
    EMOE_CHECK(handle_, RuntimeError,
               "cannot load the sentencepiece shim libemoe_spm.so, needed for tokenizer.model; "
               "build the emoe_spm target or set EMOE_SPM_SHIM to its path (tried: {})",
               tried);
    bind(load_file, "emoe_spm_load_file");
    bind(load_serialized, "emoe_spm_load_serialized");
    bind(free_model, "emoe_spm_free");
    bind(last_error, "emoe_spm_last_error");
    bind(encode, "emoe_spm_encode");
    bind(decode, "emoe_spm_decode");
    bind(free_buffer, "emoe_spm_free_buffer");
    bind(piece_size, "emoe_spm_piece_size");
    bind(id_to_piece, "emoe_spm_id_to_piece");
    bind(piece_to_id, "emoe_spm_piece_to_id");
    bind(score, "emoe_spm_score");
    bind(piece_type, "emoe_spm_piece_type");
    bind(unk_id, "emoe_spm_unk_id");
    bind(bos_id, "emoe_spm_bos_id");
    bind(eos_id, "emoe_spm_eos_id");
    bind(pad_id, "emoe_spm_pad_id");
    decltype(&emoe_spm_abi_version) abi = nullptr;
    bind(abi, "emoe_spm_abi_version");
    EMOE_CHECK(abi() == EMOE_SPM_ABI_VERSION, RuntimeError,
               "{}: sentencepiece shim interface version {}, expected {} (rebuild emoe_spm)", path_,
               abi(), EMOE_SPM_ABI_VERSION);
  }

  template <typename Fn>
  void bind(Fn& fn, const char* name) {
    fn = reinterpret_cast<Fn>(dlsym(handle_, name));
    EMOE_CHECK(fn, RuntimeError, "{}: sentencepiece shim lacks the symbol {}", path_, name);
  }

  void* handle_ = nullptr;  // never closed: models may live until exit
  std::string path_;
#endif  // EMOE_SPM_DIRECT
};

std::vector<std::string> spm_shim_candidates() {
  std::vector<std::string> out;
  if (const char* env = std::getenv("EMOE_SPM_SHIM"); env && *env) out.push_back(env);
#ifdef EMOE_SPM_SHIM_PATH
  out.push_back(EMOE_SPM_SHIM_PATH);
#endif
  std::error_code ec;
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) out.push_back((exe.parent_path() / "libemoe_spm.so").string());
  return out;
}

SpmModel::SpmModel(const SpmLibrary& lib, emoe_spm* handle, std::string source)
    : lib_(lib), handle_(handle), source_(std::move(source)) {
  piece_size_ = lib_.piece_size(handle_);
}

SpmModel::~SpmModel() {
  lib_.free_model(handle_);
}

std::shared_ptr<SpmModel> SpmModel::from_file(const std::string& path) {
  const SpmLibrary& lib = SpmLibrary::get();
  EMOE_CHECK(fs::exists(path), InputError, "{}: no such file", path);
  emoe_spm* handle = lib.load_file(path.c_str());
  EMOE_CHECK(handle, InputError, "{}: not a valid SentencePiece model ({})", path,
             lib.last_error());
  return std::shared_ptr<SpmModel>(new SpmModel(lib, handle, path));
}

std::shared_ptr<SpmModel> SpmModel::from_serialized(const std::string& bytes,
                                                    const std::string& source) {
  const SpmLibrary& lib = SpmLibrary::get();
  emoe_spm* handle = lib.load_serialized(bytes.data(), bytes.size());
  EMOE_CHECK(handle, InputError, "{}: not a valid SentencePiece model ({})", source,
             lib.last_error());
  return std::shared_ptr<SpmModel>(new SpmModel(lib, handle, source));
}

std::vector<int> SpmModel::encode(const std::string& text) const {
  int* ids = nullptr;
  size_t n = 0;
  EMOE_CHECK(lib_.encode(handle_, text.data(), text.size(), &ids, &n) == 0, InputError,
             "{}: sentencepiece cannot encode the text: {}", source_, lib_.last_error());
  std::vector<int> out(ids, ids + n);
  lib_.free_buffer(ids);
  return out;
}

std::string SpmModel::decode(const std::vector<int>& ids) const {
  char* text = nullptr;
  size_t n = 0;
  EMOE_CHECK(lib_.decode(handle_, ids.data(), ids.size(), &text, &n) == 0, InputError,
             "{}: sentencepiece cannot decode the ids: {}", source_, lib_.last_error());
  std::string out(text, n);
  lib_.free_buffer(text);
  return out;
}

std::string SpmModel::id_to_piece(int id) const {
  const char* p = lib_.id_to_piece(handle_, id);
  EMOE_CHECK(p, InputError, "{}: token id {} is out of range for {} pieces", source_, id,
             piece_size_);
  return p;
}

int SpmModel::piece_to_id(const std::string& piece) const {
  return lib_.piece_to_id(handle_, piece.data(), piece.size());
}

float SpmModel::score(int id) const {
  return lib_.score(handle_, id);
}
int SpmModel::piece_type(int id) const {
  return lib_.piece_type(handle_, id);
}
int SpmModel::unk_id() const {
  return lib_.unk_id(handle_);
}
int SpmModel::bos_id() const {
  return lib_.bos_id(handle_);
}
int SpmModel::eos_id() const {
  return lib_.eos_id(handle_);
}
int SpmModel::pad_id() const {
  return lib_.pad_id(handle_);
}

}  // namespace emoe
