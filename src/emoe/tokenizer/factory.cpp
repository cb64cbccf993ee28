// load_tokenizer: picks the tokenizer implementation from the files a model folder holds.
#include <filesystem>
#include <map>
#include <set>

#include "emoe/core/error.h"
#include "emoe/tokenizer/bpe.h"
#include "emoe/tokenizer/fast_bpe.h"
#include "emoe/tokenizer/sentencepiece.h"
#include "emoe/tokenizer/tokenizer.h"
#include "emoe/tokenizer/tokenizer_config.h"
#include "emoe/tokenizer/tokenizer_json.h"
#include "emoe/tokenizer/wordpiece.h"

namespace emoe {
namespace fs = std::filesystem;

namespace {

// The Hugging Face classes whose ids each implementation reproduces. A folder that names another
// class (RoBERTa's BPE template, T5's SentencePiece, ...) is refused rather than mis-tokenized.
void check_tokenizer_class(const TokenizerConfig& config, const Tokenizer& tok) {
  std::optional<std::string> cls = config.get_string("tokenizer_class");
  if (!cls) return;
  static const std::map<std::string, std::set<std::string>> kReproduced = {
      {"wordpiece", {"BertTokenizer", "DistilBertTokenizer", "ElectraTokenizer"}},
      {"bpe", {"GPT2Tokenizer"}},
      {"bpe-rust",
       {"GPT2Tokenizer", "Qwen2Tokenizer", "RobertaTokenizer", "LlamaTokenizer",
        "CodeGenTokenizer"}},
      {"sentencepiece", {"LlamaTokenizer"}},
      {"sentencepiece-t5", {"T5Tokenizer"}}};
  std::string kind = tok.kind();
  if (auto* spm = dynamic_cast<const SentencePieceTokenizer*>(&tok);
      spm && spm->flavor() == SpmFlavor::kT5)
    kind = "sentencepiece-t5";
  if (dynamic_cast<const FastBpeTokenizer*>(&tok)) kind = "bpe-rust";
  std::string base = *cls;
  const std::string fast = "Fast";
  if (base.size() > fast.size() && base.compare(base.size() - fast.size(), fast.size(), fast) == 0)
    base.resize(base.size() - fast.size());
  const std::set<std::string>& allowed = kReproduced.at(kind);
  if (base == "PreTrainedTokenizer" || allowed.count(base)) return;
  EMOE_THROW(InputError,
             "{}: field 'tokenizer_class': '{}' is not supported with these files; the {} "
             "tokenizer reproduces {}",
             config.config_file(), *cls, kind, fmt::join(allowed, ", "));
}

std::unique_ptr<Tokenizer> load_by_files(const std::string& dir, const TokenizerConfig& config) {
  auto has = [&](const char* name) { return fs::is_regular_file(fs::path(dir) / name); };
  if (has("tokenizer.json")) return load_tokenizer_json(dir, config);
  if (has("vocab.txt")) return load_wordpiece(dir, config);
  if (has("vocab.json") || has("merges.txt")) {
    EMOE_CHECK(has("vocab.json") && has("merges.txt"), InputError,
               "{}: found {} but not {} (a byte-level BPE tokenizer needs both files)", dir,
               has("vocab.json") ? "vocab.json" : "merges.txt",
               has("vocab.json") ? "merges.txt" : "vocab.json");
    std::optional<std::string> cls = config.get_string("tokenizer_class");
    if (cls && (*cls == "RobertaTokenizer" || *cls == "RobertaTokenizerFast"))
      return load_roberta_bpe(dir, config);
    return load_bpe(dir, config);
  }
  if (has("tokenizer.model")) return load_sentencepiece(dir, config);
  if (has("spiece.model")) return load_t5_sentencepiece(dir, config);
  EMOE_THROW(InputError,
             "{}: no tokenizer files found (looked for tokenizer.json, vocab.txt, "
             "vocab.json+merges.txt, tokenizer.model, spiece.model)",
             dir);
}

}  // namespace

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& dir) {
  EMOE_CHECK(fs::is_directory(dir), InputError,
             "{}: not a directory (expected a model or tokenizer folder)", dir);
  TokenizerConfig config = TokenizerConfig::read(dir);
  std::unique_ptr<Tokenizer> tok = load_by_files(dir, config);
  check_tokenizer_class(config, *tok);
  return tok;
}

const std::vector<std::string>& tokenizer_file_names() {
  static const std::vector<std::string> names = {"tokenizer.json",
                                                 "tokenizer.model",
                                                 "spiece.model",
                                                 "vocab.txt",
                                                 "vocab.json",
                                                 "merges.txt",
                                                 "tokenizer_config.json",
                                                 "special_tokens_map.json",
                                                 "added_tokens.json",
                                                 "generation_config.json"};
  return names;
}

}  // namespace emoe
