// safetensors: a validating, memory-mapped reader and an atomic writer; sharded model folders.
#pragma once
#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace emoe {

struct TensorEntry {
  std::string name;
  std::string dtype;  // as spelled in the file: F32, F16, BF16, I64, ...
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // byte offsets relative to the end of the header
  uint64_t end = 0;
  int64_t numel() const;
};

// Largest header we accept (the reference implementation's limit).
constexpr uint64_t kMaxSafetensorsHeader = 100ull * 1000 * 1000;

// A memory-mapped .safetensors file whose header has been validated completely on open:
// header size, JSON shape, known dtypes, offsets in range, sizes equal to numel x dtype size,
// no overlapping tensors. Any violation throws InputError naming the file and the tensor.
class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::vector<TensorEntry>& entries() const { return entries_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  bool contains(const std::string& name) const { return index_.count(name) > 0; }
  const TensorEntry& entry(const std::string& name) const;

  // Copies the tensor out of the mapping; floating tensors are converted to `dtype` when given.
  at::Tensor load(const std::string& name, std::optional<c10::ScalarType> dtype = std::nullopt,
                  c10::Device device = c10::Device(c10::kCPU)) const;
  // Copies the tensor straight from the mapping into `dst` (same shape; converted to dst's dtype
  // and device on the way), with no intermediate tensor, in blocks of rows whose mapped pages
  // are released as soon as they are copied: loading a whole model holds the model plus a few
  // MiB of the file, not the model twice.
  void load_into(const std::string& name, at::Tensor& dst) const;

 private:
  void release_pages(uint64_t begin, uint64_t end) const;  // offsets in the data section
  std::string path_;
  void* map_ = nullptr;
  size_t map_size_ = 0;
  const uint8_t* data_ = nullptr;  // start of the data section
  std::vector<TensorEntry> entries_;
  std::map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

// Writes tensors (any device; moved to CPU) to `path` atomically; tensors are stored sorted by
// name, header padded to 8 bytes. Metadata defaults to {"format": "pt"}.
void save_safetensors(const std::string& path,
                      const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                      std::map<std::string, std::string> metadata = {});

// "500MB", "2GB", "10KB", "1.5GiB", "5Gb" or a plain number of bytes, as Hugging Face's
// max_shard_size reads them (KB/MB/GB/TB are powers of 1000, KiB/MiB/GiB/TiB of 1024, a lower-case
// "b" means bits). Anything else, or 0, is an InputError "<what>: expected ..., got '<text>'".
uint64_t parse_byte_size(const std::string& text, const std::string& what);

// True for the names a model folder's weights take: model.safetensors, its index, and
// model-NNNNN-of-NNNNN.safetensors shards.
bool is_weights_file_name(const std::string& name);

// Writes a model's weights into the folder `dir` (which must exist): model.safetensors, or, when
// max_shard_bytes > 0 and the tensors exceed it, model-0000i-of-0000n.safetensors shards plus
// model.safetensors.index.json ({"metadata": {"total_size": N}, "weight_map": {name: file}}), as
// Hugging Face's save_pretrained does. Tensors fill shards in the given order; one larger than
// the limit gets a shard of its own. Each file is written atomically; the whole folder's
// atomicity is the caller's (write_folder_atomic). Returns the names of the files written.
std::vector<std::string> save_safetensors_folder(
    const std::string& dir, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
    const std::map<std::string, std::string>& metadata, uint64_t max_shard_bytes = 0);

// Reads every tensor of a file into a name -> tensor map (for fixtures and small files).
std::map<std::string, at::Tensor> load_safetensors(const std::string& path);

// The weights of a Hugging Face model folder: model.safetensors, or shards listed in
// model.safetensors.index.json, or one .safetensors file given directly. Pickle checkpoints
// (pytorch_model.bin, *.pt) are refused: loading them could execute code.
class CheckpointReader {
 public:
  explicit CheckpointReader(const std::string& dir_or_file);
  std::vector<std::string> names() const;  // sorted
  bool contains(const std::string& name) const { return where_.count(name) > 0; }
  const TensorEntry& entry(const std::string& name) const;
  const std::string& file_of(const std::string& name) const;
  at::Tensor load(const std::string& name, std::optional<c10::ScalarType> dtype = std::nullopt,
                  c10::Device device = c10::Device(c10::kCPU)) const;
  void load_into(const std::string& name, at::Tensor& dst) const;  // as SafetensorsFile's
  const std::string& source() const { return source_; }

 private:
  std::string source_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, size_t> where_;
};

// Where a model's weights live in a folder, or throws InputError explaining what is missing.
std::string find_weights(const std::string& dir);

}  // namespace emoe
