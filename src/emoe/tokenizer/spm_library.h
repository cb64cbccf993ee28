// Run-time access to sentencepiece through the libemoe_spm.so shim (dlopen, never linked).
#pragma once
#include <memory>
#include <string>
#include <vector>

struct emoe_spm;

namespace emoe {

class SpmLibrary;

// One loaded sentencepiece model. Every failure throws: a bad model is an InputError naming
// `source`; a missing or broken shim is a RuntimeError saying where it was looked for.
class SpmModel {
 public:
  static std::shared_ptr<SpmModel> from_file(const std::string& path);
  // `source` names the model in error messages (e.g. the GGUF file it was built from).
  static std::shared_ptr<SpmModel> from_serialized(const std::string& bytes,
                                                   const std::string& source);
  ~SpmModel();
  SpmModel(const SpmModel&) = delete;
  SpmModel& operator=(const SpmModel&) = delete;

  std::vector<int> encode(const std::string& text) const;
  std::string decode(const std::vector<int>& ids) const;
  int piece_size() const { return piece_size_; }
  std::string id_to_piece(int id) const;
  int piece_to_id(const std::string& piece) const;  // -1 when absent
  float score(int id) const;
  int piece_type(int id) const;  // see spm_shim.h
  int unk_id() const;
  int bos_id() const;
  int eos_id() const;
  int pad_id() const;
  const std::string& source() const { return source_; }

 private:
  SpmModel(const SpmLibrary& lib, emoe_spm* handle, std::string source);
  const SpmLibrary& lib_;
  emoe_spm* handle_;
  std::string source_;
  int piece_size_ = 0;
};

// Where the shim is looked for, in order: $EMOE_SPM_SHIM, the path compiled in by CMake, then
// the directory of the running executable.
std::vector<std::string> spm_shim_candidates();

}  // namespace emoe
