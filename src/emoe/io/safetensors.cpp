// safetensors reader/writer (format: u64 LE header length, JSON header, raw little-endian data).
#include "emoe/io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>

#include "emoe/core/error.h"
#include "emoe/core/json_depth.h"
#include "emoe/io/atomic_file.h"

namespace emoe {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

struct DtypeInfo {
  c10::ScalarType type;
  int size;
};

std::optional<DtypeInfo> dtype_info(const std::string& s) {
  static const std::map<std::string, DtypeInfo> table = {
      {"F64", {c10::kDouble, 8}},    {"F32", {c10::kFloat, 4}}, {"F16", {c10::kHalf, 2}},
      {"BF16", {c10::kBFloat16, 2}}, {"I64", {c10::kLong, 8}},  {"I32", {c10::kInt, 4}},
      {"I16", {c10::kShort, 2}},     {"I8", {c10::kChar, 1}},   {"U8", {c10::kByte, 1}},
      {"BOOL", {c10::kBool, 1}}};
  auto it = table.find(s);
  if (it == table.end()) return std::nullopt;
  return it->second;
}

std::string dtype_code(c10::ScalarType t) {
  switch (t) {
    case c10::kDouble:
      return "F64";
    case c10::kFloat:
      return "F32";
    case c10::kHalf:
      return "F16";
    case c10::kBFloat16:
      return "BF16";
    case c10::kLong:
      return "I64";
    case c10::kInt:
      return "I32";
    case c10::kShort:
      return "I16";
    case c10::kChar:
      return "I8";
    case c10::kByte:
      return "U8";
    case c10::kBool:
      return "BOOL";
    default:
      EMOE_THROW(InputError, "safetensors: cannot store dtype {}", c10::toString(t));
  }
}

}  // namespace

int64_t TensorEntry::numel() const {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  EMOE_CHECK(fd >= 0, InputError, "{}: cannot open: {}", path, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    EMOE_THROW(InputError, "{}: not a regular file", path);
  }
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size < 8) {
    ::close(fd);
    EMOE_THROW(InputError, "{}: file is {} bytes, too short for a safetensors header (8 bytes)",
               path, size);
  }
  map_size_ = size;
  map_ = ::mmap(nullptr, map_size_, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (map_ == MAP_FAILED) {
    map_ = nullptr;
    EMOE_THROW(InputError, "{}: mmap failed: {}", path, std::strerror(errno));
  }
  try {
    const auto* bytes = static_cast<const uint8_t*>(map_);
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | bytes[i];
    EMOE_CHECK(n <= kMaxSafetensorsHeader, InputError,
               "{}: header length {} exceeds the {} byte limit (corrupt or not safetensors)", path,
               n, kMaxSafetensorsHeader);
    EMOE_CHECK(8 + n <= size, InputError,
               "{}: header length {} runs past the end of the file ({} bytes; truncated?)", path, n,
               size);
    data_ = bytes + 8 + n;
    const uint64_t data_size = size - 8 - n;
    json header;
    try {
      header = parse_json_limited(path, bytes + 8, bytes + 8 + n);
    } catch (const json::exception& e) {
      EMOE_THROW(InputError, "{}: header is not valid JSON: {}", path, e.what());
    }
    EMOE_CHECK(header.is_object(), InputError, "{}: header: expected a JSON object, got {}", path,
               header.type_name());
    for (auto it = header.begin(); it != header.end(); ++it) {
      const std::string& name = it.key();
      const json& v = it.value();
      if (name == "__metadata__") {
        EMOE_CHECK(v.is_object(), InputError, "{}: __metadata__: expected an object, got {}", path,
                   v.type_name());
        for (auto m = v.begin(); m != v.end(); ++m) {
          EMOE_CHECK(m.value().is_string(), InputError,
                     "{}: __metadata__.{}: expected a string value, got {}", path, m.key(),
                     m.value().type_name());
          metadata_[m.key()] = m.value().get<std::string>();
        }
        continue;
      }
      EMOE_CHECK(v.is_object(), InputError, "{}: tensor '{}': expected an object, got {}", path,
                 name, v.type_name());
      TensorEntry e;
      e.name = name;
      EMOE_CHECK(v.contains("dtype") && v["dtype"].is_string(), InputError,
                 "{}: tensor '{}': field 'dtype': expected a string", path, name);
      e.dtype = v["dtype"].get<std::string>();
      auto info = dtype_info(e.dtype);
      EMOE_CHECK(info.has_value(), InputError,
                 "{}: tensor '{}': field 'dtype': unknown or unsupported dtype '{}' (expected one "
                 "of F64 F32 F16 BF16 I64 I32 I16 I8 U8 BOOL)",
                 path, name, e.dtype);
      EMOE_CHECK(v.contains("shape") && v["shape"].is_array(), InputError,
                 "{}: tensor '{}': field 'shape': expected an array of integers", path, name);
      // numel is bounded by the data size below; guard the product against overflow first.
      uint64_t numel = 1;
      for (const auto& d : v["shape"]) {
        EMOE_CHECK(d.is_number_unsigned(), InputError,
                   "{}: tensor '{}': field 'shape': expected non-negative integers, got {}", path,
                   name, d.dump());
        uint64_t dim = d.get<uint64_t>();
        EMOE_CHECK(dim == 0 || numel <= std::numeric_limits<int64_t>::max() / dim, InputError,
                   "{}: tensor '{}': shape {} has too many elements", path, name,
                   v["shape"].dump());
        numel *= dim;
        e.shape.push_back(static_cast<int64_t>(dim));
      }
      const json& off = v.contains("data_offsets") ? v["data_offsets"] : json();
      EMOE_CHECK(off.is_array() && off.size() == 2 && off[0].is_number_unsigned() &&
                     off[1].is_number_unsigned(),
                 InputError,
                 "{}: tensor '{}': field 'data_offsets': expected [begin, end] non-negative "
                 "integers, got {}",
                 path, name, off.dump());
      e.begin = off[0].get<uint64_t>();
      e.end = off[1].get<uint64_t>();
      EMOE_CHECK(e.begin <= e.end, InputError,
                 "{}: tensor '{}': data_offsets [{}, {}] end before begin", path, name, e.begin,
                 e.end);
      EMOE_CHECK(e.end <= data_size, InputError,
                 "{}: tensor '{}': data_offsets [{}, {}] out of range (data section is {} bytes; "
                 "truncated file?)",
                 path, name, e.begin, e.end, data_size);
      const uint64_t want = numel * static_cast<uint64_t>(info->size);
      EMOE_CHECK(
          numel <= std::numeric_limits<uint64_t>::max() / info->size && e.end - e.begin == want,
          InputError, "{}: tensor '{}': {} bytes in data_offsets, expected {} for {} of shape {}",
          path, name, e.end - e.begin, want, e.dtype, v["shape"].dump());
      index_[name] = entries_.size();
      entries_.push_back(std::move(e));
    }
    std::vector<const TensorEntry*> by_offset;
    for (const auto& e : entries_)
      if (e.end > e.begin) by_offset.push_back(&e);
    std::sort(by_offset.begin(), by_offset.end(),
              [](const TensorEntry* a, const TensorEntry* b) { return a->begin < b->begin; });
    for (size_t i = 1; i < by_offset.size(); ++i) {
      EMOE_CHECK(by_offset[i]->begin >= by_offset[i - 1]->end, InputError,
                 "{}: tensors '{}' [{}, {}] and '{}' [{}, {}] overlap", path,
                 by_offset[i - 1]->name, by_offset[i - 1]->begin, by_offset[i - 1]->end,
                 by_offset[i]->name, by_offset[i]->begin, by_offset[i]->end);
    }
  } catch (...) {
    ::munmap(map_, map_size_);
    map_ = nullptr;
    throw;
  }
}

SafetensorsFile::~SafetensorsFile() {
  if (map_) ::munmap(map_, map_size_);
}

const TensorEntry& SafetensorsFile::entry(const std::string& name) const {
  auto it = index_.find(name);
  EMOE_CHECK(it != index_.end(), InputError, "{}: no tensor named '{}'", path_, name);
  return entries_[it->second];
}

at::Tensor SafetensorsFile::load(const std::string& name, std::optional<c10::ScalarType> dtype,
                                 c10::Device device) const {
  const TensorEntry& e = entry(name);
  auto info = dtype_info(e.dtype);
  auto options = at::TensorOptions().dtype(info->type);
  // from_blob never owns the mapping; the .to(..., copy=true) below makes an owned tensor.
  at::Tensor view = at::from_blob(const_cast<uint8_t*>(data_ + e.begin), e.shape, options);
  c10::ScalarType target = info->type;
  if (dtype && at::isFloatingType(info->type) && at::isFloatingType(*dtype)) target = *dtype;
  at::Tensor out = view.to(device, target, /*non_blocking=*/false, /*copy=*/true);
  release_pages(e.begin, e.end);
  return out;
}

void SafetensorsFile::load_into(const std::string& name, at::Tensor& dst) const {
  const TensorEntry& e = entry(name);
  EMOE_CHECK(at::IntArrayRef(e.shape) == dst.sizes(), InputError,
             "{}: tensor '{}': shape [{}] does not fit the destination [{}]", path_, name,
             fmt::join(e.shape, ", "), fmt::join(dst.sizes(), ", "));
  auto info = dtype_info(e.dtype);
  at::Tensor view = at::from_blob(const_cast<uint8_t*>(data_ + e.begin), e.shape,
                                  at::TensorOptions().dtype(info->type));
  // copy_ converts dtype (and device) element by element: no whole-tensor temporary
  constexpr uint64_t kBlockBytes = 16ull << 20;
  const uint64_t bytes = e.end - e.begin;
  const int64_t rows = e.shape.empty() ? 0 : e.shape[0];
  if (rows < 2 || bytes <= kBlockBytes) {
    dst.copy_(view);
    release_pages(e.begin, e.end);
    return;
  }
  const uint64_t row_bytes = bytes / static_cast<uint64_t>(rows);
  const int64_t step = std::max<int64_t>(1, static_cast<int64_t>(kBlockBytes / row_bytes));
  for (int64_t r = 0; r < rows; r += step) {
    const int64_t n = std::min(step, rows - r);
    dst.narrow(0, r, n).copy_(view.narrow(0, r, n));
    release_pages(e.begin + static_cast<uint64_t>(r) * row_bytes,
                  e.begin + static_cast<uint64_t>(r + n) * row_bytes);
  }
}

// The mapping is private and read-only, so its pages can be dropped at any time (a later read
// faults them in again from the file): the resident set then holds the copies, not the file too.
void SafetensorsFile::release_pages(uint64_t begin, uint64_t end) const {
  if (end <= begin) return;
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto first = reinterpret_cast<uintptr_t>(data_ + begin) & ~(page - 1);
  const auto last = (reinterpret_cast<uintptr_t>(data_ + end) + page - 1) & ~(page - 1);
  ::madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED);
}

std::map<std::string, at::Tensor> load_safetensors(const std::string& path) {
  SafetensorsFile f(path);
  std::map<std::string, at::Tensor> out;
  for (const auto& e : f.entries()) out[e.name] = f.load(e.name);
  return out;
}

void save_safetensors(const std::string& path,
                      const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                      std::map<std::string, std::string> metadata) {
  if (metadata.empty()) metadata["format"] = "pt";
  std::vector<std::pair<std::string, at::Tensor>> sorted;
  std::set<std::string> seen;
  for (const auto& [name, t] : tensors) {
    EMOE_CHECK(seen.insert(name).second, InputError, "{}: tensor name '{}' given twice", path,
               name);
    EMOE_CHECK(t.defined(), InputError, "{}: tensor '{}' is undefined", path, name);
    sorted.emplace_back(name, t.detach().to(c10::kCPU).contiguous());
  }
  std::sort(sorted.begin(), sorted.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  nlohmann::ordered_json header;
  nlohmann::ordered_json meta(nlohmann::ordered_json::value_t::object);
  for (const auto& [k, v] : metadata) meta[k] = v;
  header["__metadata__"] = meta;
  uint64_t offset = 0;
  for (const auto& [name, t] : sorted) {
    uint64_t nbytes = static_cast<uint64_t>(t.numel()) * t.element_size();
    nlohmann::ordered_json e;
    e["dtype"] = dtype_code(t.scalar_type());
    e["shape"] = t.sizes().vec();
    e["data_offsets"] = {offset, offset + nbytes};
    header[name] = e;
    offset += nbytes;
  }
  std::string text = header.dump();
  while (text.size() % 8 != 0) text.push_back(' ');
  write_file_atomic(path, [&](std::ostream& out) {
    uint64_t n = text.size();
    char len[8];
    for (int i = 0; i < 8; ++i) len[i] = static_cast<char>((n >> (8 * i)) & 0xff);
    out.write(len, 8);
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
    for (const auto& [name, t] : sorted)
      out.write(static_cast<const char*>(t.data_ptr()),
                static_cast<std::streamsize>(t.numel() * t.element_size()));
  });
}

uint64_t parse_byte_size(const std::string& text, const std::string& what) {
  // a number, then an optional unit: B, KB..TB (powers of 1000), KiB..TiB (of 1024), kb..tb (bits)
  static const std::regex pattern(
      R"(^\s*([0-9]+(\.[0-9]+)?)\s*(([kKmMgGtT])([iI]?)([bB])|[bB])?\s*$)");
  std::smatch m;
  auto bad = [&]() {
    return InputError(fmt::format(
        "{}: expected a size such as 500MB, 2GB, 10KB, 1GiB or a number of bytes, got '{}'", what,
        text));
  };
  if (!std::regex_match(text, m, pattern)) throw bad();
  const double number = std::stod(m[1].str());
  double scale = 1;
  if (m[4].matched) {
    const int power = std::string("kmgt").find(static_cast<char>(std::tolower(m[4].str()[0]))) + 1;
    const bool binary = m[5].length() > 0;
    scale = std::pow(binary ? 1024.0 : 1000.0, power);
    if (!binary && m[6].str() == "b") scale /= 8;  // Hugging Face: "5Gb" is gigabits
  }
  const double bytes = std::floor(number * scale);
  if (!(bytes >= 1) || bytes > 9.0e18) throw bad();
  return static_cast<uint64_t>(bytes);
}

bool is_weights_file_name(const std::string& name) {
  static const std::regex shard(R"(^model-[0-9]{5}-of-[0-9]{5}\.safetensors$)");
  return name == "model.safetensors" || name == "model.safetensors.index.json" ||
         std::regex_match(name, shard);
}

std::vector<std::string> save_safetensors_folder(
    const std::string& dir, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
    const std::map<std::string, std::string>& metadata, uint64_t max_shard_bytes) {
  uint64_t total = 0;
  for (const auto& [name, t] : tensors)
    total += static_cast<uint64_t>(t.numel()) * static_cast<uint64_t>(t.element_size());
  if (max_shard_bytes == 0 || total <= max_shard_bytes) {
    save_safetensors((fs::path(dir) / "model.safetensors").string(), tensors, metadata);
    return {"model.safetensors"};
  }
  // fill shards in the model's order (a layer's tensors stay together), as save_pretrained does
  std::vector<std::vector<std::pair<std::string, at::Tensor>>> shards(1);
  uint64_t in_shard = 0;
  for (const auto& entry : tensors) {
    const uint64_t bytes = static_cast<uint64_t>(entry.second.numel()) *
                           static_cast<uint64_t>(entry.second.element_size());
    if (!shards.back().empty() && in_shard + bytes > max_shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(entry);
    in_shard += bytes;
  }
  EMOE_CHECK(shards.size() <= 99999, InputError,
             "{}: {} shards would be needed; the limit is 99999 (raise the maximum shard size)",
             dir, shards.size());
  nlohmann::ordered_json weight_map(nlohmann::ordered_json::value_t::object);
  std::vector<std::string> written;
  const size_t n = shards.size();
  for (size_t i = 0; i < n; ++i) {
    const std::string file = fmt::format("model-{:05d}-of-{:05d}.safetensors", i + 1, n);
    save_safetensors((fs::path(dir) / file).string(), shards[i], metadata);
    written.push_back(file);
    for (const auto& [name, t] : shards[i]) weight_map[name] = file;
  }
  // sorted by tensor name, as Hugging Face writes it
  nlohmann::ordered_json sorted_map(nlohmann::ordered_json::value_t::object);
  std::vector<std::string> names;
  for (auto it = weight_map.begin(); it != weight_map.end(); ++it) names.push_back(it.key());
  std::sort(names.begin(), names.end());
  for (const auto& k : names) sorted_map[k] = weight_map[k];
  nlohmann::ordered_json index;
  index["metadata"] = {{"total_size", total}};
  index["weight_map"] = sorted_map;
  write_text_atomic((fs::path(dir) / "model.safetensors.index.json").string(),
                    index.dump(2) + "\n");
  written.push_back("model.safetensors.index.json");
  return written;
}

std::string find_weights(const std::string& dir) {
  fs::path p(dir);
  EMOE_CHECK(fs::exists(p), InputError, "{}: no such file or directory", dir);
  if (fs::is_regular_file(p)) {
    auto ext = p.extension().string();
    EMOE_CHECK(ext != ".bin" && ext != ".pt" && ext != ".pth" && ext != ".ckpt", InputError,
               "{}: pickle checkpoints are refused (loading them can execute code); convert it "
               "to safetensors, e.g. with transformers' save_pretrained(safe_serialization=True)",
               dir);
    return p.string();
  }
  if (fs::exists(p / "model.safetensors.index.json"))
    return (p / "model.safetensors.index.json").string();
  if (fs::exists(p / "model.safetensors")) return (p / "model.safetensors").string();
  for (const char* pickle : {"pytorch_model.bin", "pytorch_model.bin.index.json", "model.pt"})
    EMOE_CHECK(!fs::exists(p / pickle), InputError,
               "{}: only {} was found; pickle checkpoints are refused (loading them can execute "
               "code); convert it to safetensors, e.g. with transformers' "
               "save_pretrained(safe_serialization=True)",
               dir, pickle);
  EMOE_THROW(InputError, "{}: no model.safetensors or model.safetensors.index.json in this folder",
             dir);
}

CheckpointReader::CheckpointReader(const std::string& dir_or_file) {
  source_ = find_weights(dir_or_file);
  fs::path src(source_);
  if (src.filename() == "model.safetensors.index.json" ||
      (src.string().size() > 11 &&
       src.string().substr(src.string().size() - 11) == ".index.json")) {
    std::ifstream in(source_);
    EMOE_CHECK(in.good(), InputError, "{}: cannot open", source_);
    nlohmann::json index;
    try {
      index = parse_json_limited(source_, in);
    } catch (const nlohmann::json::exception& e) {
      EMOE_THROW(InputError, "{}: not valid JSON: {}", source_, e.what());
    }
    EMOE_CHECK(index.is_object() && index.contains("weight_map") && index["weight_map"].is_object(),
               InputError, "{}: field 'weight_map': expected an object {{tensor: file}}", source_);
    std::map<std::string, size_t> file_index;
    for (auto it = index["weight_map"].begin(); it != index["weight_map"].end(); ++it) {
      EMOE_CHECK(it.value().is_string(), InputError,
                 "{}: weight_map.{}: expected a file name string, got {}", source_, it.key(),
                 it.value().type_name());
      std::string shard = it.value().get<std::string>();
      EMOE_CHECK(shard.find('/') == std::string::npos && shard != ".." && !shard.empty(),
                 InputError, "{}: weight_map.{}: shard '{}' must be a file name in this folder",
                 source_, it.key(), shard);
      if (!file_index.count(shard)) {
        file_index[shard] = files_.size();
        files_.push_back(std::make_unique<SafetensorsFile>((src.parent_path() / shard).string()));
      }
      const auto& f = *files_[file_index[shard]];
      EMOE_CHECK(f.contains(it.key()), InputError,
                 "{}: weight_map says '{}' is in {}, but that shard has no such tensor", source_,
                 it.key(), shard);
      where_[it.key()] = file_index[shard];
    }
  } else {
    files_.push_back(std::make_unique<SafetensorsFile>(source_));
    for (const auto& e : files_[0]->entries()) where_[e.name] = 0;
  }
}

std::vector<std::string> CheckpointReader::names() const {
  std::vector<std::string> out;
  for (const auto& [k, v] : where_) out.push_back(k);
  return out;
}

const TensorEntry& CheckpointReader::entry(const std::string& name) const {
  auto it = where_.find(name);
  EMOE_CHECK(it != where_.end(), InputError, "{}: no tensor named '{}'", source_, name);
  return files_[it->second]->entry(name);
}

const std::string& CheckpointReader::file_of(const std::string& name) const {
  auto it = where_.find(name);
  EMOE_CHECK(it != where_.end(), InputError, "{}: no tensor named '{}'", source_, name);
  return files_[it->second]->path();
}

at::Tensor CheckpointReader::load(const std::string& name, std::optional<c10::ScalarType> dtype,
                                  c10::Device device) const {
  auto it = where_.find(name);
  EMOE_CHECK(it != where_.end(), InputError, "{}: no tensor named '{}'", source_, name);
  return files_[it->second]->load(name, dtype, device);
}

void CheckpointReader::load_into(const std::string& name, at::Tensor& dst) const {
  auto it = where_.find(name);
  EMOE_CHECK(it != where_.end(), InputError, "{}: no tensor named '{}'", source_, name);
  files_[it->second]->load_into(name, dst);
}

}  // namespace emoe
