// Pretraining a small model from scratch.
#include "emoe/train/pretrain.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <random>
#include <set>
#include <sstream>

#include "emoe/core/error.h"
#include "emoe/core/runtime.h"
#include "emoe/io/atomic_file.h"
#include "emoe/io/hf_config.h"
#include "emoe/methods/model_folder.h"
#include "emoe/models/architecture.h"
#include "emoe/models/loader.h"
#include "emoe/tokenizer/tokenizer.h"
#include "emoe/tokenizer/wordpiece_trainer.h"
#include "emoe/train/optim.h"
#include "emoe/train/precision.h"
#include "emoe/train/progress.h"
#include "emoe/train/run_config.h"

namespace emoe {
namespace fs = std::filesystem;

nlohmann::json PretrainConfig::to_json() const {
  return {{"arch", arch},
          {"hidden", hidden},
          {"layers", layers},
          {"heads", heads},
          {"kv_heads", kv_heads},
          {"intermediate", intermediate},
          {"max_positions", max_positions},
          {"corpus", corpus},
          {"tokenizer", tokenizer},
          {"vocab_size", vocab_size},
          {"lr", lr},
          {"warmup_ratio", warmup_ratio},
          {"weight_decay", weight_decay},
          {"mask_prob", mask_prob},
          {"batch_size", batch_size},
          {"steps", steps},
          {"max_length", max_length},
          {"log_every", log_every},
          {"seed", seed},
          {"output", output},
          {"device", device},
          {"dtype", dtype},
          {"threads", threads},
          {"t5_objective", t5_objective},
          {"mean_span_length", mean_span_length},
          {"precision", precision},
          {"gradient_checkpointing", gradient_checkpointing},
          {"dev_corpus", dev_corpus},
          {"dev_every", dev_every},
          {"max_dev_sequences", max_dev_sequences},
          {"init", init}};
}

PretrainConfig PretrainConfig::from_json(const nlohmann::json& j, const std::string& where) {
  PretrainConfig c;
  const nlohmann::json defaults = c.to_json();
  EMOE_CHECK(j.is_object(), InputError, "{}: expected a mapping", where);
  for (auto it = j.begin(); it != j.end(); ++it)
    EMOE_CHECK(defaults.contains(it.key()), InputError, "{}: unknown key '{}'", where, it.key());
  auto get = [&](const char* key, auto& out) {
    if (!j.contains(key) || j[key].is_null()) return;
    try {
      out = j[key].get<std::decay_t<decltype(out)>>();
    } catch (const nlohmann::json::exception&) {
      EMOE_THROW(InputError, "{}.{}: expected a {} value, got {}", where, key,
                 defaults[key].type_name(), j[key].dump());
    }
  };
  get("arch", c.arch);
  get("hidden", c.hidden);
  get("layers", c.layers);
  get("heads", c.heads);
  get("kv_heads", c.kv_heads);
  get("intermediate", c.intermediate);
  get("max_positions", c.max_positions);
  get("corpus", c.corpus);
  get("tokenizer", c.tokenizer);
  get("vocab_size", c.vocab_size);
  get("lr", c.lr);
  get("warmup_ratio", c.warmup_ratio);
  get("weight_decay", c.weight_decay);
  get("mask_prob", c.mask_prob);
  get("batch_size", c.batch_size);
  get("steps", c.steps);
  get("max_length", c.max_length);
  get("log_every", c.log_every);
  get("seed", c.seed);
  get("output", c.output);
  get("device", c.device);
  get("dtype", c.dtype);
  get("threads", c.threads);
  get("t5_objective", c.t5_objective);
  get("mean_span_length", c.mean_span_length);
  get("precision", c.precision);
  get("gradient_checkpointing", c.gradient_checkpointing);
  get("dev_corpus", c.dev_corpus);
  get("dev_every", c.dev_every);
  get("max_dev_sequences", c.max_dev_sequences);
  get("init", c.init);
  return c;
}

void PretrainConfig::validate() const {
  auto bad = [](const std::string& k, const std::string& w) {
    EMOE_THROW(InputError, "pretrain config: {}: {}", k, w);
  };
  const Architecture* a = find_architecture(arch);
  if (!a) bad("arch", fmt::format("expected {}, got '{}'", known_model_types(" or "), arch));
  if (corpus.empty()) bad("corpus", "required (a text file, one document per line)");
  if (hidden < 8 || layers < 1 || heads < 1 || intermediate < 1)
    bad("hidden/layers/heads/intermediate", "expected positive sizes");
  if (hidden % heads != 0)
    bad("hidden", fmt::format("hidden {} is not a multiple of heads {}", hidden, heads));
  if (tokenizer == "train" && init.empty() && a->pretrain_objective != PretrainObjective::kMaskedLM)
    bad("tokenizer", fmt::format("vocabulary training makes WordPiece (BERT) vocabularies; give a "
                                 "tokenizer folder for {}",
                                 arch));
  if (batch_size < 1) bad("batch_size", "expected >= 1");
  if (steps < 0 || (steps == 0 && (init.empty() || dev_corpus.empty())))
    bad("steps", fmt::format("expected >= 1 (0 only to measure an init model's dev_corpus loss), "
                             "got {}",
                             steps));
  if (precision != "fp32" && precision != "bf16-mixed")
    bad("precision", fmt::format("expected fp32 or bf16-mixed, got '{}'", precision));
  if (precision == "bf16-mixed" && dtype != "float32")
    bad("precision", fmt::format("bf16-mixed needs float32 weights (dtype), got '{}'", dtype));
  if (dev_every < 0) bad("dev_every", fmt::format("expected >= 0, got {}", dev_every));
  if (max_dev_sequences < 1)
    bad("max_dev_sequences", fmt::format("expected >= 1, got {}", max_dev_sequences));
  if (max_length < 4 || max_length > max_positions)
    bad("max_length",
        fmt::format("expected 4..max_positions ({}), got {}", max_positions, max_length));
  if (mask_prob <= 0 || mask_prob >= 1) bad("mask_prob", "expected (0, 1)");
  if (lr <= 0) bad("lr", "expected > 0");
  if (t5_objective != "span-corruption" && t5_objective != "autoencoder")
    bad("t5_objective",
        fmt::format("expected span-corruption or autoencoder, got '{}'", t5_objective));
  if (!(mean_span_length >= 1 && mean_span_length <= 1000))
    bad("mean_span_length", fmt::format("expected 1 to 1000, got {}", mean_span_length));
}

PretrainConfig load_pretrain_config(const std::string& path,
                                    const std::vector<std::string>& overrides) {
  std::string where = "pretrain config";
  auto j = load_layered_config(path, overrides, where);
  auto c = PretrainConfig::from_json(j, where);
  c.validate();
  return c;
}

namespace {

std::vector<std::string> pretrain_read_lines(const std::string& path) {
  std::ifstream in(path);
  EMOE_CHECK(in.good(), InputError, "{}: cannot open the corpus", path);
  std::vector<std::string> out;
  std::string line;
  while (std::getline(in, line))
    if (line.find_first_not_of(" \t\r") != std::string::npos) out.push_back(line);
  EMOE_CHECK(!out.empty(), InputError, "{}: the corpus has no text", path);
  return out;
}

nlohmann::json pretrain_model_config(const PretrainConfig& c, const Tokenizer& tok) {
  const auto& sp = tok.special();
  PretrainShape shape;
  shape.vocab_size = tok.vocab_size();
  shape.hidden = c.hidden;
  shape.layers = c.layers;
  shape.heads = c.heads;
  shape.kv_heads = c.kv_heads;
  shape.intermediate = c.intermediate;
  shape.max_positions = c.max_positions;
  shape.pad = sp.pad;
  shape.bos = sp.bos;
  shape.eos = sp.eos;
  return find_architecture(c.arch)->pretrain_config(shape);
}

// BERT's masking: mask_prob of the non-special tokens; 80 % [MASK], 10 % random, 10 % kept.
void pretrain_mask(torch::Tensor& ids, torch::Tensor& labels, const torch::Tensor& special,
                   int64_t mask_id, int64_t vocab, double p, at::Generator& gen) {
  auto prob = torch::full(ids.sizes(), p).masked_fill(special, 0.0);
  auto chosen = torch::bernoulli(prob, gen).to(torch::kBool);
  labels = ids.masked_fill(chosen.logical_not(), -100);
  auto r = torch::rand(ids.sizes(), gen);
  ids = ids.masked_fill(chosen.logical_and(r < 0.8), mask_id);
  auto random_ids = torch::randint(vocab, ids.sizes(), gen, torch::kLong);
  auto replace = chosen.logical_and(r >= 0.8).logical_and(r < 0.9);
  ids = torch::where(replace, random_ids, ids);
}

// `n` items cut into `k` non-empty runs at k - 1 distinct points drawn uniformly: run lengths.
std::vector<int64_t> pretrain_random_runs(int64_t n, int64_t k, std::mt19937_64& rng) {
  std::vector<int64_t> cuts(static_cast<size_t>(n - 1));
  std::iota(cuts.begin(), cuts.end(), int64_t{1});
  std::shuffle(cuts.begin(), cuts.end(), rng);
  cuts.resize(static_cast<size_t>(k - 1));
  std::sort(cuts.begin(), cuts.end());
  std::vector<int64_t> runs;
  int64_t prev = 0;
  for (int64_t c : cuts) runs.push_back(c - prev), prev = c;
  runs.push_back(n - prev);
  return runs;
}

// A SentencePiece tokenizer given for a T5 is saved as T5Tokenizer (spiece.model, 100 sentinels,
// eos appended, no bos), so that the model can be trained with span corruption.
void pretrain_write_t5_tokenizer(const std::string& out, int64_t max_positions) {
  const fs::path dir(out);
  std::error_code ec;
  if (fs::exists(dir / "tokenizer.model")) {
    fs::rename(dir / "tokenizer.model", dir / "spiece.model", ec);
    EMOE_CHECK(!ec, RuntimeError, "{}: cannot rename tokenizer.model to spiece.model: {}", out,
               ec.message());
  }
  for (const char* f : {"tokenizer.json", "special_tokens_map.json", "added_tokens.json"})
    fs::remove(dir / f, ec);
  nlohmann::json j = {{"tokenizer_class", "T5Tokenizer"},
                      {"extra_ids", 100},
                      {"eos_token", "</s>"},
                      {"unk_token", "<unk>"},
                      {"pad_token", "<pad>"},
                      {"model_max_length", max_positions}};
  write_text_atomic((dir / "tokenizer_config.json").string(), j.dump(2) + "\n");
}

}  // namespace

SpanCorruption span_corrupt(const std::vector<int64_t>& ids, double density, double mean_span,
                            const std::vector<int64_t>& sentinels, int64_t eos,
                            std::mt19937_64& rng) {
  const auto n = static_cast<int64_t>(ids.size());
  EMOE_CHECK(n >= 2, InputError, "span corruption needs at least 2 tokens, got {}", n);
  EMOE_CHECK(!sentinels.empty(), InputError, "span corruption needs sentinel tokens");
  const int64_t noise =
      std::clamp<int64_t>(std::llround(static_cast<double>(n) * density), 1, n - 1);
  const int64_t spans = std::clamp<int64_t>(
      std::llround(static_cast<double>(noise) / mean_span), 1,
      std::min<int64_t>({noise, n - noise, static_cast<int64_t>(sentinels.size())}));
  const auto noise_runs = pretrain_random_runs(noise, spans, rng);
  const auto kept_runs = pretrain_random_runs(n - noise, spans, rng);
  SpanCorruption out;
  int64_t pos = 0;
  for (int64_t s = 0; s < spans; ++s) {
    const auto sentinel = sentinels[static_cast<size_t>(s)];
    out.inputs.insert(out.inputs.end(), ids.begin() + pos, ids.begin() + pos + kept_runs[s]);
    pos += kept_runs[s];
    out.inputs.push_back(sentinel);
    out.targets.push_back(sentinel);
    out.targets.insert(out.targets.end(), ids.begin() + pos, ids.begin() + pos + noise_runs[s]);
    pos += noise_runs[s];
  }
  out.inputs.push_back(eos);
  out.targets.push_back(eos);
  return out;
}

namespace {

// One batch of an objective: the model's inputs on `device`.
struct PretrainBatcher {
  const Tokenizer& tok;
  const PretrainConfig& cfg;
  bool mlm = false, span = false;
  int64_t pad = 0, mask_id = 0;
  std::vector<int64_t> sentinels;
  std::set<int64_t> special_ids;

  ModelInputs make(std::vector<const std::vector<int64_t>*> batch, at::Generator& gen,
                   std::mt19937_64& rng, const c10::Device& device) const {
    const auto rows = static_cast<int64_t>(batch.size());
    std::vector<SpanCorruption> corrupted;
    corrupted.reserve(batch.size());  // `batch` points into it
    if (span) {
      for (auto*& s : batch) {
        corrupted.push_back(span_corrupt(*s, cfg.mask_prob, cfg.mean_span_length, sentinels,
                                         *tok.special().eos, rng));
        s = &corrupted.back().inputs;
      }
    }
    size_t len = 0;
    for (auto* s : batch) len = std::max(len, s->size());
    auto ids = torch::full({rows, static_cast<int64_t>(len)}, pad, torch::kLong);
    auto mask = torch::zeros_like(ids);
    for (int64_t i = 0; i < rows; ++i) {
      auto n = static_cast<int64_t>(batch[static_cast<size_t>(i)]->size());
      ids[i].narrow(0, 0, n).copy_(torch::tensor(*batch[static_cast<size_t>(i)], torch::kLong));
      mask[i].narrow(0, 0, n).fill_(1);
    }
    torch::Tensor labels;
    if (mlm) {
      auto special = mask == 0;
      for (auto s : special_ids) special = special.logical_or(ids == s);
      pretrain_mask(ids, labels, special, mask_id, tok.vocab_size(), cfg.mask_prob, gen);
    } else if (span) {
      size_t tlen = 0;
      for (const auto& sc : corrupted) tlen = std::max(tlen, sc.targets.size());
      labels = torch::full({rows, static_cast<int64_t>(tlen)}, -100, torch::kLong);
      for (int64_t i = 0; i < rows; ++i) {
        const auto& t = corrupted[static_cast<size_t>(i)].targets;
        labels[i]
            .narrow(0, 0, static_cast<int64_t>(t.size()))
            .copy_(torch::tensor(t, torch::kLong));
      }
    } else {
      // causal LM: the text itself; T5 autoencoder: the encoder reads the text, the decoder writes
      // it
      labels = ids.masked_fill(mask == 0, -100);
    }
    ModelInputs in;
    in.input_ids = ids.to(device);
    in.attention_mask = mask.to(device);
    in.labels = labels.to(device);
    in.output_logits = false;  // the loss only (causal LMs: the chunked LM head, lm_loss.h)
    return in;
  }

  // The positions a batch's loss averages over (a dev batch's weight): the labelled ones; a causal
  // LM predicts every labelled position but the first of each row.
  int64_t labelled(const ModelInputs& in) const {
    const int64_t n = (in.labels != -100).sum().item<int64_t>();
    return std::max<int64_t>(n - (mlm || span ? 0 : in.labels.size(0)), 1);
  }
};

std::vector<std::vector<int64_t>> pretrain_sequences(const std::vector<std::string>& lines,
                                                     const Tokenizer& tok, bool mlm, bool span,
                                                     int64_t max_length) {
  std::vector<std::vector<int64_t>> seqs;
  for (const auto& l : lines) {
    auto ids = tok.encode(l, true, max_length).ids;
    if (!mlm && tok.special().eos && static_cast<int64_t>(ids.size()) < max_length &&
        (ids.empty() || ids.back() != *tok.special().eos))
      ids.push_back(*tok.special().eos);
    if (ids.size() >= 3) seqs.push_back(std::move(ids));
  }
  if (span) {  // span corruption draws from the text tokens; its own eos ends inputs and targets
    for (auto& s : seqs)
      if (s.back() == *tok.special().eos) s.pop_back();
  }
  return seqs;
}

// The dev set's batches, masked / corrupted once with a fixed seed (not the run's), so every
// measurement, of this run or of another model with the same tokenizer, sees the same inputs.
constexpr uint64_t kDevSeed = 20231;

}  // namespace

PretrainResult run_pretraining(const PretrainConfig& cfg) {
  cfg.validate();
  auto t0 = std::chrono::steady_clock::now();
  configure_threads(cfg.threads);
  const auto device = parse_device(cfg.device);
  const Precision precision = parse_precision(cfg.precision);
  // the architecture: the config's, or the init model's
  std::string arch = cfg.arch;
  if (!cfg.init.empty()) arch = read_model_config(cfg.init).get_string("model_type");
  const Architecture* architecture = find_architecture(arch);
  EMOE_CHECK(architecture != nullptr, InputError,
             "{}/config.json: model_type '{}' cannot be pretrained", cfg.init, arch);
  const PretrainObjective objective = architecture->pretrain_objective;
  // the encoder-decoder's objective: span corruption (or the autoencoder, t5_objective)
  const bool seq2seq = objective == PretrainObjective::kSpanCorruption;
  const bool mlm = objective == PretrainObjective::kMaskedLM;
  const Head head = mlm ? Head::kMaskedLM : seq2seq ? Head::kSeq2SeqLM : Head::kCausalLM;
  auto lines = pretrain_read_lines(cfg.corpus);  // before anything is written
  std::vector<std::string> dev_lines;
  if (!cfg.dev_corpus.empty()) dev_lines = pretrain_read_lines(cfg.dev_corpus);
  // the tokenizer: trained here (WordPiece), given, or the init model's
  std::string tok_dir = cfg.tokenizer == "train" && !cfg.init.empty() ? cfg.init : cfg.tokenizer;
  if (tok_dir != "train") {  // a bad folder fails here too, before anything is written
    auto given = load_tokenizer(tok_dir);
    EMOE_CHECK(objective != PretrainObjective::kSpanCorruption ||
                   cfg.t5_objective != "span-corruption" || given->kind() == "sentencepiece" ||
                   given->token_to_id("<extra_id_0>"),
               InputError,
               "{}: t5_objective span-corruption needs <extra_id_N> sentinels and an eos token (a "
               "SentencePiece tokenizer, saved as T5Tokenizer); use t5_objective=autoencoder",
               tok_dir);
  }
  LoadOptions lo;
  lo.device = device;
  lo.dtype = parse_dtype(cfg.dtype);
  lo.head = head;
  ModelPtr init_model;
  if (!cfg.init.empty()) init_model = load_model(cfg.init, lo);  // before anything is written
  std::error_code ec;
  fs::create_directories(cfg.output, ec);
  EMOE_CHECK(!ec, RuntimeError, "{}: cannot create: {}", cfg.output, ec.message());

  if (tok_dir == "train") {
    WordPieceTrainerOptions wo;
    wo.vocab_size = cfg.vocab_size;
    auto vocab = train_wordpiece_vocab(lines, wo);
    std::ostringstream v;
    for (const auto& t : vocab) v << t << "\n";
    write_text_atomic((fs::path(cfg.output) / "vocab.txt").string(), v.str());
    write_text_atomic(
        (fs::path(cfg.output) / "tokenizer_config.json").string(),
        "{\"tokenizer_class\": \"BertTokenizer\", \"do_lower_case\": true, \"model_max_length\": " +
            std::to_string(cfg.max_positions) + "}\n");
    write_text_atomic(
        (fs::path(cfg.output) / "special_tokens_map.json").string(),
        "{\"unk_token\": \"[UNK]\", \"sep_token\": \"[SEP]\", \"pad_token\": \"[PAD]\", "
        "\"cls_token\": \"[CLS]\", \"mask_token\": \"[MASK]\"}\n");
    tok_dir = cfg.output;
    spdlog::info("pretrain: WordPiece vocabulary of {} tokens from {} lines", vocab.size(),
                 lines.size());
  }
  auto tok = load_tokenizer(tok_dir);
  const bool save = cfg.steps > 0;  // steps 0: the init model's dev loss only
  if (save && tok_dir != cfg.output) copy_tokenizer_files(tok_dir, cfg.output);
  if (save && seq2seq && tok->kind() == "sentencepiece" && !tok->token_to_id("<extra_id_0>")) {
    pretrain_write_t5_tokenizer(cfg.output, cfg.max_positions);
    tok = load_tokenizer(cfg.output);
  }
  PretrainBatcher batcher{*tok, cfg, mlm, seq2seq && cfg.t5_objective == "span-corruption",
                          0,    0,   {},  {}};
  if (batcher.span) {
    for (int i = 0; i < 100; ++i) {
      auto id = tok->token_to_id(fmt::format("<extra_id_{}>", i));
      if (!id) break;
      batcher.sentinels.push_back(*id);
    }
    EMOE_CHECK(!batcher.sentinels.empty() && tok->special().eos, InputError,
               "{}: t5_objective span-corruption needs <extra_id_N> sentinels and an eos token (a "
               "SentencePiece tokenizer, saved as T5Tokenizer); use t5_objective=autoencoder",
               tok_dir);
  }
  if (mlm) {
    auto mask_id = tok->special().mask;
    EMOE_CHECK(mask_id.has_value(), InputError,
               "{}: the tokenizer has no [MASK] token for masked LM", tok_dir);
    batcher.mask_id = *mask_id;
  }
  batcher.pad = tok->special().pad.value_or(tok->special().eos.value_or(0));
  for (const auto& o :
       {tok->special().cls, tok->special().sep, tok->special().pad, tok->special().bos,
        tok->special().eos, tok->special().unk, tok->special().mask})
    if (o) batcher.special_ids.insert(*o);
  auto seqs = pretrain_sequences(lines, *tok, mlm, batcher.span, cfg.max_length);
  EMOE_CHECK(!seqs.empty(), InputError, "{}: no line has 3 tokens or more", cfg.corpus);

  // the dev batches, built once
  std::vector<std::pair<ModelInputs, int64_t>> dev;
  if (!dev_lines.empty()) {
    auto dev_seqs = pretrain_sequences(dev_lines, *tok, mlm, batcher.span, cfg.max_length);
    if (static_cast<int64_t>(dev_seqs.size()) > cfg.max_dev_sequences)
      dev_seqs.resize(static_cast<size_t>(cfg.max_dev_sequences));
    EMOE_CHECK(!dev_seqs.empty(), InputError, "{}: no line has 3 tokens or more", cfg.dev_corpus);
    auto dev_gen = at::make_generator<at::CPUGeneratorImpl>(kDevSeed);
    std::mt19937_64 dev_rng(kDevSeed);
    for (size_t b = 0; b < dev_seqs.size(); b += static_cast<size_t>(cfg.batch_size)) {
      std::vector<const std::vector<int64_t>*> batch;
      for (size_t i = b; i < std::min(dev_seqs.size(), b + static_cast<size_t>(cfg.batch_size));
           ++i)
        batch.push_back(&dev_seqs[i]);
      auto in = batcher.make(batch, dev_gen, dev_rng, device);
      const int64_t labelled = batcher.labelled(in);
      dev.emplace_back(std::move(in), labelled);
    }
    spdlog::info("pretrain: dev set of {} sequences from {}", dev_seqs.size(), cfg.dev_corpus);
  }

  torch::manual_seed(cfg.seed);
  auto model = init_model
                   ? init_model
                   : create_model(JsonFields(pretrain_model_config(cfg, *tok), "pretrain"), head);
  if (!init_model) model->to(device, parse_dtype(cfg.dtype));
  EMOE_CHECK(model->summary().vocab_size >= tok->vocab_size(), InputError,
             "{}: the tokenizer {} has {} tokens, the init model's vocab_size is {}", cfg.init,
             tok_dir, tok->vocab_size(), model->summary().vocab_size);
  // the dev loss per labelled position (each batch's mean weighted by its labelled positions)
  auto dev_loss = [&]() {
    torch::NoGradGuard no_grad;
    model->eval();
    double sum = 0;
    int64_t n = 0;
    for (const auto& [in, labelled] : dev) {
      PrecisionScope scope(precision, device);
      sum += model->forward(in).loss.item<double>() * static_cast<double>(labelled);
      n += labelled;
    }
    model->train();
    return sum / static_cast<double>(n);
  };
  model->train();
  model->set_gradient_checkpointing(cfg.gradient_checkpointing);
  TrainOptions to;
  to.lr = cfg.lr;
  to.weight_decay = cfg.weight_decay;
  Optimizer opt(*model, to);
  const int64_t warmup = static_cast<int64_t>(cfg.warmup_ratio * static_cast<double>(cfg.steps));
  auto gen = at::make_generator<at::CPUGeneratorImpl>(cfg.seed + 1);
  std::mt19937_64 rng(cfg.seed);
  Progress progress(cfg.steps, "pretrain", cfg.log_every);
  PretrainResult res;
  double window = 0;
  int64_t window_n = 0;
  std::ofstream log((fs::path(cfg.output) / "pretrain.jsonl").string(), std::ios::trunc);
  auto log_dev = [&](int64_t step) {
    res.dev_loss = dev_loss();
    log << nlohmann::json({{"step", step}, {"dev_loss", res.dev_loss}}).dump() << "\n";
    log.flush();
    spdlog::info("pretrain: step {}: dev loss {:.4f}", step, res.dev_loss);
  };
  for (int64_t step = 0; step < cfg.steps; ++step) {
    std::vector<const std::vector<int64_t>*> batch;
    for (int64_t i = 0; i < cfg.batch_size; ++i)
      batch.push_back(&seqs[std::uniform_int_distribution<size_t>(0, seqs.size() - 1)(rng)]);
    auto in = batcher.make(batch, gen, rng, device);
    torch::Tensor loss;
    {
      PrecisionScope scope(precision, device);  // forward and loss; backward follows the graph
      loss = model->forward(in).loss;
    }
    loss.backward();
    torch::nn::utils::clip_grad_norm_(opt.parameters(), 1.0);
    opt.set_lr_factor(schedule_factor("linear", step, cfg.steps, warmup));
    opt.step();
    opt.zero_grad();
    window += loss.item<double>();
    window_n += 1;
    progress.update(step + 1, fmt::format("loss {:.4f}", window / window_n));
    if ((step + 1) % cfg.log_every == 0 || step + 1 == cfg.steps) {
      double mean = window / window_n;
      if (res.first_loss == 0) res.first_loss = mean;
      res.final_loss = mean;
      log << nlohmann::json({{"step", step + 1}, {"loss", mean}, {"lr", opt.current_lr()}}).dump()
          << "\n";
      log.flush();
      window = 0, window_n = 0;
    }
    if (!dev.empty() && cfg.dev_every > 0 && (step + 1) % cfg.dev_every == 0 &&
        step + 1 < cfg.steps)
      log_dev(step + 1);
  }
  progress.finish();
  if (!dev.empty()) log_dev(cfg.steps);
  model->eval();
  if (save) {
    save_model(*model, cfg.output, {{"emoe_pretrain", arch}});
    write_text_atomic((fs::path(cfg.output) / "pretrain_config.json").string(),
                      cfg.to_json().dump(2) + "\n");
  }
  res.dir = cfg.output;
  res.steps = cfg.steps;
  res.parameters = count_parameters(*model).total;
  res.vocab_size = tok->vocab_size();
  res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  spdlog::info("pretrain: {} steps in {:.1f} s, loss {:.3f} -> {:.3f}{}; {} {}", res.steps,
               res.seconds, res.first_loss, res.final_loss,
               dev.empty() ? "" : fmt::format(", dev loss {:.4f}", res.dev_loss),
               save ? "saved" : "nothing saved (steps 0) in", res.dir);
  return res;
}

}  // namespace emoe
