// The tokenizer interface every model folder's tokenizer implements (ids equal Hugging Face's).
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace emoe {

struct Encoding {
  std::vector<int64_t> ids;
  std::vector<int64_t> token_type_ids;  // 0 for the first segment, 1 for the second (BERT)
};

struct SpecialTokens {
  std::optional<int64_t> bos, eos, pad, unk, cls, sep, mask;
};

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // "wordpiece", "bpe" or "sentencepiece".
  virtual std::string kind() const = 0;
  virtual int64_t vocab_size() const = 0;
  virtual std::optional<int64_t> token_to_id(const std::string& token) const = 0;
  virtual std::string id_to_token(int64_t id) const = 0;
  virtual const SpecialTokens& special() const = 0;

  // Ids of `text` without the template's special tokens; special-token strings written inside
  // the text (e.g. "[MASK]", "<|endoftext|>", "</s>") still become their ids, as in Hugging Face.
  virtual std::vector<int64_t> encode_plain(const std::string& text) const = 0;

  // Hugging Face's `encode` with its default template (BERT: [CLS] a [SEP] (b [SEP]);
  // GPT-2: none; Llama: <s> a (<s> b)). max_length > 0 truncates with the "longest_first"
  // strategy, keeping room for the special tokens.
  virtual Encoding encode(const std::string& text, bool add_special_tokens = true,
                          int64_t max_length = 0) const = 0;
  virtual Encoding encode_pair(const std::string& a, const std::string& b,
                               bool add_special_tokens = true, int64_t max_length = 0) const = 0;

  // Hugging Face's `decode` (clean_up_tokenization_spaces as the tokenizer's default).
  virtual std::string decode(const std::vector<int64_t>& ids,
                             bool skip_special_tokens = false) const = 0;
};

// Picks the tokenizer from a model or tokenizer folder: tokenizer.json if present, else
// vocab.txt (WordPiece), vocab.json + merges.txt (byte-level BPE), tokenizer.model
// (SentencePiece, LlamaTokenizer) or spiece.model (T5Tokenizer); tokenizer_config.json and
// special_tokens_map.json refine the settings. Throws InputError naming the folder and the files it
// looked for when none is usable.
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& dir);
// The files of a model folder that make up its tokenizer (vocabularies, models, configs), for
// copying a tokenizer along with a model.
const std::vector<std::string>& tokenizer_file_names();

}  // namespace emoe
