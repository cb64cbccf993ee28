// Parses tokenizer.json and builds the equivalent slow-tokenizer pipeline, or refuses clearly.
#include "emoe/tokenizer/tokenizer_json.h"

#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>

#include "emoe/core/error.h"
#include "emoe/tokenizer/bpe.h"
#include "emoe/tokenizer/fast_bpe.h"
#include "emoe/tokenizer/sentencepiece.h"
#include "emoe/tokenizer/tokenizer_config.h"
#include "emoe/tokenizer/wordpiece.h"

namespace emoe {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// tokenizer.json plus its path, so that every error names the file and the field.
class JsonFile {
 public:
  JsonFile(json root, std::string path) : root_(std::move(root)), path_(std::move(path)) {}

  [[noreturn]] void fail(const std::string& field, const std::string& what) const {
    EMOE_THROW(InputError, "{}: field '{}': {}", path_, field, what);
  }
  // The value at a dotted path ("model.vocab"); nullptr when absent or null.
  const json* find(const json& obj, const std::string& key) const {
    if (!obj.is_object() || !obj.contains(key) || obj.at(key).is_null()) return nullptr;
    return &obj.at(key);
  }
  const json& object(const json& obj, const std::string& key, const std::string& field) const {
    const json* v = find(obj, key);
    if (!v) fail(field, "required but missing");
    if (!v->is_object()) fail(field, fmt::format("expected an object, got {}", v->type_name()));
    return *v;
  }
  std::string string(const json& obj, const std::string& key, const std::string& field) const {
    const json* v = find(obj, key);
    if (!v) fail(field, "required but missing");
    if (!v->is_string()) fail(field, fmt::format("expected a string, got {}", v->dump()));
    return v->get<std::string>();
  }
  bool boolean(const json& obj, const std::string& key, const std::string& field,
               bool fallback) const {
    const json* v = find(obj, key);
    if (!v) return fallback;
    if (!v->is_boolean()) fail(field, fmt::format("expected true or false, got {}", v->dump()));
    return v->get<bool>();
  }
  const json& root() const { return root_; }
  const std::string& path() const { return path_; }

 private:
  json root_;
  std::string path_;
};

std::string type_of(const JsonFile& f, const json& component, const std::string& field) {
  if (!component.is_object())
    f.fail(field, fmt::format("expected an object, got {}", component.type_name()));
  return f.string(component, "type", field + ".type");
}

std::vector<std::pair<std::string, int64_t>> read_vocab(const JsonFile& f, const json& model) {
  const json& vocab = f.object(model, "vocab", "model.vocab");
  std::vector<std::pair<std::string, int64_t>> out;
  out.reserve(vocab.size());
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    if (!it.value().is_number_integer() || it.value().get<int64_t>() < 0)
      f.fail("model.vocab", fmt::format("entry '{}': expected a non-negative integer id, got {}",
                                        it.key(), it.value().dump()));
    out.emplace_back(it.key(), it.value().get<int64_t>());
  }
  if (out.empty()) f.fail("model.vocab", "the vocabulary is empty");
  return out;
}

std::vector<AddedToken> read_added_tokens(const JsonFile& f) {
  std::vector<AddedToken> out;
  const json* list = f.find(f.root(), "added_tokens");
  if (!list) return out;
  if (!list->is_array()) f.fail("added_tokens", "expected a list");
  for (size_t i = 0; i < list->size(); ++i) {
    const json& t = list->at(i);
    std::string field = fmt::format("added_tokens[{}]", i);
    if (!t.is_object()) f.fail(field, "expected an object");
    AddedToken a;
    a.content = f.string(t, "content", field + ".content");
    const json* id = f.find(t, "id");
    if (!id || !id->is_number_integer() || id->get<int64_t>() < 0)
      f.fail(field + ".id", "expected a non-negative integer");
    a.id = id->get<int64_t>();
    a.lstrip = f.boolean(t, "lstrip", field + ".lstrip", false);
    a.rstrip = f.boolean(t, "rstrip", field + ".rstrip", false);
    a.single_word = f.boolean(t, "single_word", field + ".single_word", false);
    a.special = f.boolean(t, "special", field + ".special", false);
    out.push_back(a);
  }
  return out;
}

// The id of a token named by the post-processor, from the vocabulary or the added tokens.
int64_t token_id(const JsonFile& f, const std::vector<std::pair<std::string, int64_t>>& vocab,
                 const std::vector<AddedToken>& added, const std::string& token,
                 const std::string& field) {
  for (const AddedToken& a : added)
    if (a.content == token) return a.id;
  for (const auto& [t, id] : vocab)
    if (t == token) return id;
  f.fail(field, fmt::format("token '{}' is neither in the vocabulary nor an added token", token));
}

std::vector<TemplateItem> read_template_side(const JsonFile& f, const json& proc,
                                             const std::string& side) {
  std::string field = "post_processor." + side;
  const json* items = f.find(proc, side);
  if (!items || !items->is_array()) f.fail(field, "expected a list of template pieces");
  const json* specials = f.find(proc, "special_tokens");
  std::vector<TemplateItem> out;
  for (size_t i = 0; i < items->size(); ++i) {
    const json& piece = items->at(i);
    std::string pfield = fmt::format("{}[{}]", field, i);
    if (const json* seq = f.find(piece, "Sequence")) {
      std::string which = f.string(*seq, "id", pfield + ".Sequence.id");
      if (which != "A" && which != "B") f.fail(pfield, "Sequence id must be \"A\" or \"B\"");
      const json* type_id = f.find(*seq, "type_id");
      TemplateItem item;
      item.kind = which == "A" ? TemplateItem::Kind::kSequenceA : TemplateItem::Kind::kSequenceB;
      item.type_id = type_id && type_id->is_number_integer() ? type_id->get<int64_t>() : 0;
      out.push_back(item);
    } else if (const json* sp = f.find(piece, "SpecialToken")) {
      std::string name = f.string(*sp, "id", pfield + ".SpecialToken.id");
      const json* type_id = f.find(*sp, "type_id");
      const json* entry = specials ? f.find(*specials, name) : nullptr;
      const json* ids = entry ? f.find(*entry, "ids") : nullptr;
      if (!ids || !ids->is_array() || ids->empty())
        f.fail("post_processor.special_tokens",
               fmt::format("no ids for the special token '{}' used in {}", name, pfield));
      for (const json& id : *ids) {
        if (!id.is_number_integer()) f.fail("post_processor.special_tokens." + name, "bad id");
        TemplateItem item;
        item.kind = TemplateItem::Kind::kSpecial;
        item.id = id.get<int64_t>();
        item.type_id = type_id && type_id->is_number_integer() ? type_id->get<int64_t>() : 0;
        out.push_back(item);
      }
    } else {
      f.fail(pfield, "expected a Sequence or a SpecialToken");
    }
  }
  return out;
}

// The post-processor as a template; nullopt for none/ByteLevel (no special tokens added).
PostTemplate read_post_processor(const JsonFile& f,
                                 const std::vector<std::pair<std::string, int64_t>>& vocab,
                                 const std::vector<AddedToken>& added) {
  const json* proc = f.find(f.root(), "post_processor");
  if (!proc) return PostTemplate::bos_eos(std::nullopt, std::nullopt);
  std::string type = type_of(f, *proc, "post_processor");
  if (type == "ByteLevel") return PostTemplate::bos_eos(std::nullopt, std::nullopt);
  if (type == "TemplateProcessing") {
    PostTemplate t;
    t.single = read_template_side(f, *proc, "single");
    t.pair = read_template_side(f, *proc, "pair");
    return t;
  }
  if (type == "BertProcessing") {
    auto pair_id = [&](const char* key) {
      const json* v = f.find(*proc, key);
      std::string field = std::string("post_processor.") + key;
      if (!v || !v->is_array() || v->size() != 2 || !v->at(0).is_string() ||
          !v->at(1).is_number_integer())
        f.fail(field, "expected [token, id]");
      int64_t id = v->at(1).get<int64_t>();
      if (token_id(f, vocab, added, v->at(0).get<std::string>(), field) != id)
        f.fail(field, "the id does not match the vocabulary");
      return id;
    };
    return PostTemplate::bert(pair_id("cls"), pair_id("sep"));
  }
  f.fail("post_processor.type",
         fmt::format("'{}' is not supported (expected TemplateProcessing, BertProcessing or "
                     "ByteLevel)",
                     type));
}

std::unique_ptr<Tokenizer> build_wordpiece(const JsonFile& f, const json& model,
                                           const TokenizerConfig& config) {
  auto vocab_pairs = read_vocab(f, model);
  std::vector<std::string> vocab(vocab_pairs.size());
  std::vector<bool> seen(vocab_pairs.size(), false);
  for (const auto& [token, id] : vocab_pairs) {
    if (id >= static_cast<int64_t>(vocab.size()) || seen[static_cast<size_t>(id)])
      f.fail("model.vocab", fmt::format("ids must be 0..{} with each used once; token '{}' has "
                                        "id {}",
                                        vocab.size() - 1, token, id));
    seen[static_cast<size_t>(id)] = true;
    vocab[static_cast<size_t>(id)] = token;
  }
  WordPieceOptions opt;
  opt.unk_token = f.string(model, "unk_token", "model.unk_token");
  if (const json* p = f.find(model, "continuing_subword_prefix")) {
    if (!p->is_string()) f.fail("model.continuing_subword_prefix", "expected a string");
    opt.continuing_prefix = p->get<std::string>();
  }
  if (const json* m = f.find(model, "max_input_chars_per_word")) {
    if (!m->is_number_integer()) f.fail("model.max_input_chars_per_word", "expected an integer");
    opt.max_input_chars_per_word = m->get<int64_t>();
  }
  const json* norm = f.find(f.root(), "normalizer");
  if (!norm || type_of(f, *norm, "normalizer") != "BertNormalizer")
    f.fail("normalizer", "a WordPiece model is supported with the BertNormalizer only");
  if (!f.boolean(*norm, "clean_text", "normalizer.clean_text", true))
    f.fail("normalizer.clean_text", "false is not supported (BERT always cleans the text)");
  opt.basic.do_lower_case = f.boolean(*norm, "lowercase", "normalizer.lowercase", true);
  opt.basic.tokenize_chinese_chars =
      f.boolean(*norm, "handle_chinese_chars", "normalizer.handle_chinese_chars", true);
  if (f.find(*norm, "strip_accents"))
    opt.basic.strip_accents = f.boolean(*norm, "strip_accents", "normalizer.strip_accents", false);
  const json* pre = f.find(f.root(), "pre_tokenizer");
  if (!pre || type_of(f, *pre, "pre_tokenizer") != "BertPreTokenizer")
    f.fail("pre_tokenizer", "a WordPiece model is supported with the BertPreTokenizer only");
  std::vector<AddedToken> added = read_added_tokens(f);
  opt.post_template = read_post_processor(f, vocab_pairs, added);
  bool cleanup = true;
  if (const json* dec = f.find(f.root(), "decoder"))
    cleanup = f.boolean(*dec, "cleanup", "decoder.cleanup", true);
  opt.clean_up_tokenization_spaces =
      config.get_bool("clean_up_tokenization_spaces").value_or(cleanup);
  SpecialTokenRoles roles = bert_special_roles(config);
  return std::make_unique<WordPieceTokenizer>(std::move(vocab), opt, roles, added);
}

std::vector<BpeMerge> read_merges(const JsonFile& f, const json& model) {
  const json* merges = f.find(model, "merges");
  if (!merges || !merges->is_array()) f.fail("model.merges", "expected a list of merges");
  std::vector<BpeMerge> out;
  out.reserve(merges->size());
  for (size_t i = 0; i < merges->size(); ++i) {
    const json& m = merges->at(i);
    std::string field = fmt::format("model.merges[{}]", i);
    if (m.is_string()) {
      std::string s = m.get<std::string>();
      size_t space = s.find(' ');
      if (space == std::string::npos || space == 0 || space + 1 >= s.size() ||
          s.find(' ', space + 1) != std::string::npos)
        f.fail(field, fmt::format("expected two tokens separated by a space, got '{}'", s));
      out.emplace_back(s.substr(0, space), s.substr(space + 1));
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      out.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
    } else {
      f.fail(field, fmt::format("expected \"a b\" or [\"a\", \"b\"], got {}", m.dump()));
    }
  }
  return out;
}

std::unique_ptr<Tokenizer> build_byte_level_bpe(const JsonFile& f, const json& model,
                                                const json& pre, const TokenizerConfig& config) {
  if (f.find(model, "dropout")) f.fail("model.dropout", "BPE dropout is not supported");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    const json* v = f.find(model, key);
    if (v && (!v->is_string() || !v->get<std::string>().empty()))
      f.fail(std::string("model.") + key, "only an empty value is supported for GPT-2's BPE");
  }
  if (f.boolean(model, "byte_fallback", "model.byte_fallback", false))
    f.fail("model.byte_fallback", "true is not supported with a ByteLevel pre-tokenizer");
  if (f.boolean(model, "ignore_merges", "model.ignore_merges", false))
    f.fail("model.ignore_merges", "true is not supported (GPT2Tokenizer always merges)");
  if (f.find(f.root(), "normalizer"))
    f.fail("normalizer", "a byte-level BPE is supported without a normalizer only");
  if (!f.boolean(pre, "use_regex", "pre_tokenizer.use_regex", true))
    f.fail("pre_tokenizer.use_regex", "false is not supported (GPT-2 splits with its regex)");
  BpeOptions opt;
  opt.add_prefix_space =
      config.get_bool("add_prefix_space")
          .value_or(f.boolean(pre, "add_prefix_space", "pre_tokenizer.add_prefix_space", false));
  opt.clean_up_tokenization_spaces = config.get_bool("clean_up_tokenization_spaces").value_or(true);
  opt.spaces_between_special_tokens =
      config.get_bool("spaces_between_special_tokens").value_or(true);
  auto vocab = read_vocab(f, model);
  std::vector<AddedToken> added = read_added_tokens(f);
  opt.post_template = read_post_processor(f, vocab, added);
  return std::make_unique<BpeTokenizer>(vocab, read_merges(f, model), opt,
                                        gpt2_special_roles(config), added, f.path());
}

// --- the Rust pipeline (FastBpeTokenizer) --------------------------------------------------

std::vector<FastAddedToken> read_fast_added_tokens(const JsonFile& f) {
  std::vector<FastAddedToken> out;
  for (const AddedToken& a : read_added_tokens(f)) out.push_back(to_fast_added_token(a));
  // "normalized" (the Rust default: true for a non-special token)
  const json& list = f.root().at("added_tokens");
  for (size_t i = 0; i < out.size(); ++i)
    out[i].normalized = f.boolean(list.at(i), "normalized",
                                  fmt::format("added_tokens[{}].normalized", i), !out[i].special);
  return out;
}

FastNormalizer read_fast_normalizer(const JsonFile& f) {
  const json* norm = f.find(f.root(), "normalizer");
  if (!norm) return FastNormalizer::kNone;
  std::string type = type_of(f, *norm, "normalizer");
  if (type == "Sequence") {  // a Sequence of at most one NFC/NFD
    const json* list = f.find(*norm, "normalizers");
    if (!list || !list->is_array()) f.fail("normalizer.normalizers", "expected a list");
    if (list->empty()) return FastNormalizer::kNone;
    if (list->size() == 1) type = type_of(f, list->at(0), "normalizer.normalizers[0]");
  }
  if (type == "NFC") return FastNormalizer::kNfc;
  if (type == "NFD") return FastNormalizer::kNfd;
  f.fail(
      "normalizer.type",
      fmt::format("'{}' is not supported with a byte-level BPE (expected none, NFC or NFD)", type));
}

void read_pre_steps(const JsonFile& f, const json& pre, const std::string& field,
                    std::vector<PreTokenizerStep>& out) {
  std::string type = type_of(f, pre, field);
  if (type == "Sequence") {
    const json* list = f.find(pre, "pretokenizers");
    if (!list || !list->is_array()) f.fail(field + ".pretokenizers", "expected a list");
    for (size_t i = 0; i < list->size(); ++i)
      read_pre_steps(f, list->at(i), fmt::format("{}.pretokenizers[{}]", field, i), out);
    return;
  }
  if (!out.empty() && out.back().kind == PreTokenizerStep::Kind::kByteLevel)
    f.fail(field,
           fmt::format("'{}' after ByteLevel is not supported (ByteLevel must come last)", type));
  PreTokenizerStep step;
  if (type == "ByteLevel") {
    step.kind = PreTokenizerStep::Kind::kByteLevel;
    step.add_prefix_space = f.boolean(pre, "add_prefix_space", field + ".add_prefix_space", true);
    if (f.boolean(pre, "use_regex", field + ".use_regex", true))
      step.regex = std::make_shared<Regex>(gpt2_split_pattern(), f.path());
  } else if (type == "Split") {
    const json& pattern = f.object(pre, "pattern", field + ".pattern");
    std::string regex;
    if (const json* r = f.find(pattern, "Regex")) {
      if (!r->is_string()) f.fail(field + ".pattern.Regex", "expected a string");
      regex = r->get<std::string>();
    } else if (const json* s = f.find(pattern, "String")) {
      if (!s->is_string()) f.fail(field + ".pattern.String", "expected a string");
      std::string literal = s->get<std::string>();
      if (literal.find("\\E") != std::string::npos)
        f.fail(field + ".pattern.String", "a literal containing \\E is not supported");
      regex = "\\Q" + literal + "\\E";
    } else {
      f.fail(field + ".pattern", "expected {\"Regex\": ...} or {\"String\": ...}");
    }
    step.regex = std::make_shared<Regex>(regex, f.path() + ": field '" + field + ".pattern'");
    static const std::map<std::string, SplitBehavior> kBehaviors = {
        {"Isolated", SplitBehavior::kIsolated},
        {"Removed", SplitBehavior::kRemoved},
        {"MergedWithPrevious", SplitBehavior::kMergedWithPrevious},
        {"MergedWithNext", SplitBehavior::kMergedWithNext},
        {"Contiguous", SplitBehavior::kContiguous}};
    std::string behavior = f.string(pre, "behavior", field + ".behavior");
    auto it = kBehaviors.find(behavior);
    if (it == kBehaviors.end())
      f.fail(field + ".behavior",
             fmt::format("expected Isolated, Removed, MergedWithPrevious, MergedWithNext or "
                         "Contiguous, got '{}'",
                         behavior));
    step.behavior = it->second;
    step.invert = f.boolean(pre, "invert", field + ".invert", false);
  } else {
    f.fail(field + ".type", fmt::format("'{}' is not supported with a byte-level BPE (expected "
                                        "Sequence, Split or ByteLevel)",
                                        type));
  }
  out.push_back(std::move(step));
}

// The post-processor of the Rust pipeline; ByteLevel (or none) adds nothing and gives every token
// type id 0.
PostTemplate read_fast_post_processor(const JsonFile& f, const json* proc,
                                      const std::vector<std::pair<std::string, int64_t>>& vocab,
                                      const std::vector<AddedToken>& added,
                                      const std::string& field) {
  using K = TemplateItem::Kind;
  PostTemplate plain;
  plain.single = {{K::kSequenceA, -1, 0}};
  plain.pair = {{K::kSequenceA, -1, 0}, {K::kSequenceB, -1, 0}};
  if (!proc) return plain;
  std::string type = type_of(f, *proc, field);
  if (type == "ByteLevel") return plain;
  if (type == "Sequence") {  // e.g. [ByteLevel, TemplateProcessing] as Llama 3.1 ships
    const json* list = f.find(*proc, "processors");
    if (!list || !list->is_array()) f.fail(field + ".processors", "expected a list");
    PostTemplate out = plain;
    bool have = false;
    for (size_t i = 0; i < list->size(); ++i) {
      std::string sub = fmt::format("{}.processors[{}]", field, i);
      if (type_of(f, list->at(i), sub) == "ByteLevel") continue;
      if (have) f.fail(sub, "only one processor besides ByteLevel is supported");
      out = read_fast_post_processor(f, &list->at(i), vocab, added, sub);
      have = true;
    }
    return out;
  }
  if (type == "RobertaProcessing") {
    auto token = [&](const char* key) {
      const json* v = f.find(*proc, key);
      std::string sub = field + "." + key;
      if (!v || !v->is_array() || v->size() != 2 || !v->at(0).is_string() ||
          !v->at(1).is_number_integer())
        f.fail(sub, "expected [token, id]");
      return v->at(1).get<int64_t>();
    };
    int64_t cls = token("cls"), sep = token("sep");
    PostTemplate t;
    t.single = {{K::kSpecial, cls, 0}, {K::kSequenceA, -1, 0}, {K::kSpecial, sep, 0}};
    t.pair = {{K::kSpecial, cls, 0}, {K::kSequenceA, -1, 0}, {K::kSpecial, sep, 0},
              {K::kSpecial, sep, 0}, {K::kSequenceB, -1, 0}, {K::kSpecial, sep, 0}};
    return t;
  }
  return read_post_processor(f, vocab, added);
}

std::unique_ptr<Tokenizer> build_fast_bpe(const JsonFile& f, const json& model, const json& pre,
                                          const TokenizerConfig& config) {
  if (f.find(model, "dropout")) f.fail("model.dropout", "BPE dropout is not supported");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    const json* v = f.find(model, key);
    if (v && (!v->is_string() || !v->get<std::string>().empty()))
      f.fail(std::string("model.") + key, "only an empty value is supported for a byte-level BPE");
  }
  if (f.boolean(model, "byte_fallback", "model.byte_fallback", false))
    f.fail("model.byte_fallback", "true is not supported with a ByteLevel pre-tokenizer");
  if (const json* dec = f.find(f.root(), "decoder");
      !dec || type_of(f, *dec, "decoder") != "ByteLevel")
    f.fail("decoder", "a byte-level BPE is supported with the ByteLevel decoder only");
  FastBpeSpec spec;
  spec.source = f.path();
  spec.vocab = read_vocab(f, model);
  spec.merges = read_merges(f, model);
  spec.ignore_merges = f.boolean(model, "ignore_merges", "model.ignore_merges", false);
  spec.added = read_fast_added_tokens(f);
  spec.normalizer = read_fast_normalizer(f);
  read_pre_steps(f, pre, "pre_tokenizer", spec.pre_tokenizer);
  if (spec.pre_tokenizer.empty() ||
      spec.pre_tokenizer.back().kind != PreTokenizerStep::Kind::kByteLevel)
    f.fail("pre_tokenizer", "a byte-level BPE needs a ByteLevel pre-tokenizer (last)");
  std::vector<AddedToken> added = read_added_tokens(f);
  spec.post = read_fast_post_processor(f, f.find(f.root(), "post_processor"), spec.vocab, added,
                                       "post_processor");
  // The roles as configured, else the class's own defaults (transformers' __init__ arguments).
  std::optional<std::string> cls = config.get_string("tokenizer_class");
  std::string base = cls.value_or("");
  if (base.size() > 4 && base.compare(base.size() - 4, 4, "Fast") == 0)
    base.resize(base.size() - 4);
  std::map<std::string, std::string> defaults;
  if (base == "RobertaTokenizer")
    defaults = {{"bos_token", "<s>"},    {"eos_token", "</s>"}, {"unk_token", "<unk>"},
                {"sep_token", "</s>"},   {"cls_token", "<s>"},  {"pad_token", "<pad>"},
                {"mask_token", "<mask>"}};
  else if (base == "GPT2Tokenizer")
    defaults = {{"bos_token", "<|endoftext|>"},
                {"eos_token", "<|endoftext|>"},
                {"unk_token", "<|endoftext|>"}};
  else if (base == "Qwen2Tokenizer")
    defaults = {{"eos_token", "<|endoftext|>"},
                {"unk_token", "<|endoftext|>"},
                {"pad_token", "<|endoftext|>"}};
  for (const char* role : {"bos_token", "eos_token", "unk_token", "sep_token", "pad_token",
                           "cls_token", "mask_token"}) {
    std::optional<std::string> fallback;
    if (auto it = defaults.find(role); it != defaults.end()) fallback = it->second;
    if (std::optional<AddedToken> t = config.special_token(role, fallback, true))
      spec.roles.emplace_back(role, t->content);
  }
  // LlamaTokenizerFast replaces the file's post-processor with bos/eos by add_bos/eos_token.
  if (cls && (*cls == "LlamaTokenizerFast" || *cls == "LlamaTokenizer")) {
    auto role_id = [&](const char* role) -> std::optional<int64_t> {
      for (const auto& [name, content] : spec.roles)
        if (name == role) return token_id(f, spec.vocab, added, content, config.config_file());
      return std::nullopt;
    };
    bool add_bos = config.get_bool("add_bos_token").value_or(true);
    bool add_eos = config.get_bool("add_eos_token").value_or(false);
    std::optional<int64_t> bos = add_bos ? role_id("bos_token") : std::nullopt;
    std::optional<int64_t> eos = add_eos ? role_id("eos_token") : std::nullopt;
    if (add_bos && !bos)
      f.fail("post_processor", "add_bos_token is true but there is no bos_token");
    if (add_eos && !eos)
      f.fail("post_processor", "add_eos_token is true but there is no eos_token");
    spec.post = PostTemplate::bos_eos(bos, eos);
  }
  spec.clean_up_tokenization_spaces =
      config.get_bool("clean_up_tokenization_spaces").value_or(true);
  return std::make_unique<FastBpeTokenizer>(std::move(spec));
}

// Whether a byte-level BPE file needs the Rust pipeline: anything beyond GPT-2's own tokenizer.json
// (ByteLevel with its regex, no normalizer, all merges), which the GPT2Tokenizer path reproduces.
bool needs_rust_pipeline(const JsonFile& f, const json& model, const json& pre) {
  if (type_of(f, pre, "pre_tokenizer") != "ByteLevel") return true;
  if (!f.boolean(pre, "use_regex", "pre_tokenizer.use_regex", true)) return true;
  if (f.boolean(model, "ignore_merges", "model.ignore_merges", false)) return true;
  if (f.find(f.root(), "normalizer")) return true;
  const json* proc = f.find(f.root(), "post_processor");
  if (proc && type_of(f, *proc, "post_processor") != "ByteLevel" &&
      type_of(f, *proc, "post_processor") != "TemplateProcessing" &&
      type_of(f, *proc, "post_processor") != "BertProcessing")
    return true;
  return false;
}

// Whether `pre` is a byte-level pre-tokenizer: ByteLevel, or a Sequence that holds one.
bool is_byte_level(const JsonFile& f, const json& pre) {
  std::string type = type_of(f, pre, "pre_tokenizer");
  if (type == "ByteLevel") return true;
  if (type != "Sequence") return false;
  const json* list = f.find(pre, "pretokenizers");
  if (!list || !list->is_array()) return false;
  for (const json& step : *list) {
    const json* t = step.is_object() ? f.find(step, "type") : nullptr;
    if (t && t->is_string() && t->get<std::string>() == "ByteLevel") return true;
  }
  return false;
}

}  // namespace

std::unique_ptr<Tokenizer> load_tokenizer_json(const std::string& dir,
                                               const TokenizerConfig& config) {
  std::string path = (fs::path(dir) / "tokenizer.json").string();
  JsonFile f(read_json_object(path), path);
  const json& model = f.object(f.root(), "model", "model");
  std::string type = f.find(model, "type") ? f.string(model, "type", "model.type") : "";
  const json* pre = f.find(f.root(), "pre_tokenizer");
  bool byte_level = pre && is_byte_level(f, *pre);
  if (type == "WordPiece") return build_wordpiece(f, model, config);
  if (type == "BPE" && byte_level)
    return needs_rust_pipeline(f, model, *pre) ? build_fast_bpe(f, model, *pre, config)
                                               : build_byte_level_bpe(f, model, *pre, config);
  if (type == "BPE" || type == "Unigram") {
    // SentencePiece-style: the slow tokenizer (what ids must equal) reads tokenizer.model.
    if (fs::is_regular_file(fs::path(dir) / "tokenizer.model"))
      return load_sentencepiece(dir, config);
    if (fs::is_regular_file(fs::path(dir) / "spiece.model"))
      return load_t5_sentencepiece(dir, config);
    f.fail("model.type",
           fmt::format("a SentencePiece-style '{}' model (no ByteLevel pre-tokenizer) cannot be "
                       "reproduced exactly from tokenizer.json alone; put the SentencePiece "
                       "tokenizer.model (or T5's spiece.model) beside it",
                       type));
  }
  f.fail("model.type", fmt::format("expected WordPiece, BPE or Unigram, got '{}'", type));
}

}  // namespace emoe
