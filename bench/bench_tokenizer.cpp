// Tokenizer throughput: encodes a JSON-lines file of text chunks on one thread, prints MB/s,
// the number of tokens and a hash of all ids (scripts/bench_tokenizer.sh compares both with
// Hugging Face's Rust library run on the same chunks in the same session).
#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "emoe/tokenizer/tokenizer.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: bench_tokenizer TOKENIZER_DIR CHUNKS.jsonl\n");
    return 2;
  }
  try {
    auto t_load = std::chrono::steady_clock::now();
    auto tok = emoe::load_tokenizer(argv[1]);
    double load_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t_load).count();
    std::ifstream in(argv[2]);
    if (!in) {
      std::fprintf(stderr, "%s: cannot open\n", argv[2]);
      return 2;
    }
    std::vector<std::string> chunks;
    size_t bytes = 0;
    for (std::string line; std::getline(in, line);) {
      if (line.empty()) continue;
      chunks.push_back(nlohmann::json::parse(line).get<std::string>());
      bytes += chunks.back().size();
    }
    // FNV-1a over the ids, in order, so both libraries' outputs can be compared exactly
    uint64_t hash = 1469598103934665603ull;
    size_t tokens = 0;
    auto t0 = std::chrono::steady_clock::now();
    for (const std::string& c : chunks) {
      std::vector<int64_t> ids = tok->encode_plain(c);
      tokens += ids.size();
      for (int64_t id : ids) hash = (hash ^ static_cast<uint64_t>(id)) * 1099511628211ull;
    }
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf(
        "{\"library\": \"emoe\", \"bytes\": %zu, \"chunks\": %zu, \"tokens\": %zu, \"seconds\": "
        "%.4f, \"mb_per_s\": %.3f, \"load_seconds\": %.3f, \"ids_fnv1a\": \"%016llx\"}\n",
        bytes, chunks.size(), tokens, s, bytes / 1e6 / s, load_s,
        static_cast<unsigned long long>(hash));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_tokenizer: %s\n", e.what());
    return 2;
  }
  return 0;
}
