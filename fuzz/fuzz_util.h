// Shared by the harnesses: a private folder per fuzzer process (in tmpfs when there is one), files
// written into it from the input, and splitting an input into parts at "\n\x01\n".
#pragma once
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace emoe_fuzz {

inline const std::string& folder() {
  static const std::string dir = [] {
    namespace fs = std::filesystem;
    fs::path base = fs::is_directory("/dev/shm") ? fs::path("/dev/shm") : fs::temp_directory_path();
    auto d = base / ("emoe-fuzz-" + std::to_string(::getpid()));
    fs::create_directories(d);
    return d.string();
  }();
  return dir;
}

// Writes `text` to folder()/name (creating parent folders) and returns the path.
inline std::string put(const std::string& name, const std::string& text) {
  std::string path = folder() + "/" + name;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
  return path;
}

// Empties folder() (between inputs that write different files).
inline void clear() {
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(folder(), ec))
    std::filesystem::remove_all(e.path(), ec);
}

inline std::vector<std::string> split_parts(const std::string& rest) {
  std::vector<std::string> parts;
  const std::string sep = "\n\x01\n";
  for (size_t at = 0;;) {
    size_t next = rest.find(sep, at);
    parts.push_back(rest.substr(at, next == std::string::npos ? std::string::npos : next - at));
    if (next == std::string::npos) break;
    at = next + sep.size();
  }
  return parts;
}

// What every tokenizer harness does with a tokenizer that loaded: encode, pair, truncate and
// decode hostile texts, look up the ids, and decode out-of-range ids.
template <typename Tok, size_t N>
void exercise_tokenizer(const Tok& tok, const char* const (&texts)[N]) {
  for (const std::string text : texts) {
    auto e = tok.encode(text, true, 16);
    auto p = tok.encode_pair(text, "second segment", true, 12);
    (void)tok.decode(e.ids, false);
    (void)tok.decode(p.ids, true);
    for (int64_t id : e.ids) (void)tok.id_to_token(id);
  }
  (void)tok.decode({-1, 0, tok.vocab_size(), tok.vocab_size() + 7}, false);
}

}  // namespace emoe_fuzz
