// MoE settings: defaults per method, parity switch, validation and JSON form.
#include "emoe/moe/moe_config.h"

#include <set>
#include <sstream>

#include "emoe/core/error.h"

namespace emoe {

std::string to_string(MoeMethod m) {
  switch (m) {
    case MoeMethod::kEmoe:
      return "emoe";
    case MoeMethod::kEmoeLearn:
      return "emoe-learn";
    case MoeMethod::kGmoe:
      return "gmoe";
    case MoeMethod::kMoefication:
      return "moefication";
  }
  return "?";
}
std::string to_string(GateKind g) {
  switch (g) {
    case GateKind::kAvgK:
      return "avgk";
    case GateKind::kLinear:
      return "linear";
    case GateKind::kCosine:
      return "cosine";
    case GateKind::kMlp:
      return "mlp";
  }
  return "?";
}
std::string to_string(Execution e) {
  return e == Execution::kMasked ? "masked" : "dispatched";
}
std::string to_string(BalanceLoss b) {
  switch (b) {
    case BalanceLoss::kNone:
      return "none";
    case BalanceLoss::kImportanceLoad:
      return "importance-load";
    case BalanceLoss::kSwitch:
      return "switch";
    case BalanceLoss::kZLoss:
      return "zloss";
  }
  return "?";
}

MoeMethod parse_moe_method(const std::string& s) {
  if (s == "emoe") return MoeMethod::kEmoe;
  if (s == "emoe-learn") return MoeMethod::kEmoeLearn;
  if (s == "gmoe") return MoeMethod::kGmoe;
  if (s == "moefication") return MoeMethod::kMoefication;
  EMOE_THROW(UsageError, "method: expected emoe, emoe-learn, gmoe or moefication, got '{}'", s);
}
GateKind parse_gate_kind(const std::string& s) {
  if (s == "avgk") return GateKind::kAvgK;
  if (s == "linear") return GateKind::kLinear;
  if (s == "cosine") return GateKind::kCosine;
  if (s == "mlp") return GateKind::kMlp;
  EMOE_THROW(UsageError, "gate: expected avgk, linear, cosine or mlp, got '{}'", s);
}
Execution parse_execution(const std::string& s) {
  if (s == "masked") return Execution::kMasked;
  if (s == "dispatched") return Execution::kDispatched;
  EMOE_THROW(UsageError, "execution: expected masked or dispatched, got '{}'", s);
}
BalanceLoss parse_balance_loss(const std::string& s) {
  if (s == "none") return BalanceLoss::kNone;
  if (s == "importance-load" || s == "gshard") return BalanceLoss::kImportanceLoad;
  if (s == "switch") return BalanceLoss::kSwitch;
  if (s == "zloss" || s == "z-loss") return BalanceLoss::kZLoss;
  EMOE_THROW(UsageError, "balance loss: expected none, importance-load, switch or zloss, got '{}'",
             s);
}

MoeConfig MoeConfig::for_method(MoeMethod m) {
  MoeConfig c;
  c.method = m;
  switch (m) {
    case MoeMethod::kEmoe:
      c.gate = GateKind::kAvgK;
      break;
    case MoeMethod::kEmoeLearn:
      // As the authors ran it (README: --gate_type cosine_top --num_experts 64 --top_k 16): the
      // GMoE cosine router, randomly initialised; the top-k probabilities renormalised weight
      // the experts. for_method_name("emoe-learn-init") is the linear gate started at avg-k.
      c.gate = GateKind::kCosine;
      c.gate_init = "random";
      c.weighted = true;
      break;
    case MoeMethod::kGmoe:
      c.gate = GateKind::kCosine;
      c.weighted = true;
      c.experts = 8;
      c.topk = 2;
      c.balance = BalanceLoss::kImportanceLoad;
      c.gate_noise = 1.0;
      c.execution = Execution::kDispatched;
      break;
    case MoeMethod::kMoefication:
      c.gate = GateKind::kMlp;
      c.execution = Execution::kDispatched;
      break;
  }
  return c;
}

MoeConfig MoeConfig::for_method_name(const std::string& name) {
  if (name == kEmoeLearnInit) {
    // The rebuttal's EMoE-learn-init: the authors' `--gate_type top` without --random_init_gate,
    // a linear gate (E x d, no bias) whose rows start as the experts' mean keys (avg-k), so
    // that it routes as EMoE does before the first step.
    MoeConfig c = for_method(MoeMethod::kEmoeLearn);
    c.gate = GateKind::kLinear;
    c.gate_init = "avgk";
    return c;
  }
  return for_method(parse_moe_method(name));
}

void MoeConfig::enable_tutel_parity() {
  tutel = true;
  gate_noise = 1.0;
  softmax_before_topk = true;
  capacity_factor = 1.5;
  batch_prioritized = true;
  balance = BalanceLoss::kImportanceLoad;
  balance_weight = 0.01;
  preact_dropout = 0.1;
}

void MoeConfig::validate(int64_t num_layers, int64_t d_ff) const {
  auto name = [&](const char* key, const char* flag) {
    return origin.empty() ? std::string(flag) : origin + key;
  };
  EMOE_CHECK(experts >= 1, UsageError, "{}: expected >= 1, got {}", name("experts", "--experts"),
             experts);
  EMOE_CHECK(topk >= 1 && topk <= experts, UsageError, "{}: expected 1 <= k <= N = {}, got {}",
             name("topk", "--topk"), experts, topk);
  if (method != MoeMethod::kGmoe) check_expert_count(d_ff, experts, name("experts", "--experts"));
  EMOE_CHECK(!layers.empty(), UsageError, "{}: no layer selected", name("layers", "--layers"));
  for (auto l : layers)
    EMOE_CHECK(l >= 0 && l < num_layers, UsageError,
               "{}: layer {} does not exist (the model has layers 0..{})",
               name("layers", "--layers"), l, num_layers - 1);
  EMOE_CHECK(split == "balanced-kmeans" || split == "random" || split == "contiguous" ||
                 split == "coactivation",
             UsageError,
             "{}: expected balanced-kmeans, random, contiguous or coactivation, got '{}'",
             name("split", "--split"), split);
  EMOE_CHECK(gate_init == "avgk" || gate_init == "random", UsageError,
             "{}: expected avgk or random, got '{}'", name("gate_init", "--gate-init"), gate_init);
  EMOE_CHECK(capacity_factor >= 0, UsageError, "{}: expected >= 0, got {}",
             name("capacity_factor", "--capacity-factor"), capacity_factor);
  EMOE_CHECK(gate_noise >= 0, UsageError, "{}: expected >= 0, got {}",
             name("gate_noise", "--gate-noise"), gate_noise);
  EMOE_CHECK(preact_dropout >= 0 && preact_dropout < 1, UsageError, "{}: expected [0, 1), got {}",
             name("preact_dropout", "--preact-dropout"), preact_dropout);
  if (method == MoeMethod::kEmoe)
    EMOE_CHECK(gate == GateKind::kAvgK, UsageError,
               "{}: emoe uses the avg-k gate; for a learned gate use the method emoe-learn",
               name("gate", "--gate"));
  if (method == MoeMethod::kEmoeLearn || method == MoeMethod::kGmoe)
    EMOE_CHECK(gate == GateKind::kLinear || gate == GateKind::kCosine, UsageError,
               "{}: {} needs a learned gate: linear or cosine", name("gate", "--gate"),
               to_string(method));
}

nlohmann::json MoeConfig::to_json() const {
  return {{"method", to_string(method)},
          {"experts", experts},
          {"topk", topk},
          {"layers", layers},
          {"encoder_layers", encoder_layers},
          {"decoder_layers", decoder_layers},
          {"split", split},
          {"seed", seed},
          {"kmeans",
           {{"restarts", kmeans.restarts}, {"max_iter", kmeans.max_iter}, {"tol", kmeans.tol}}},
          {"gate", to_string(gate)},
          {"gate_init", gate_init},
          {"execution", to_string(execution)},
          {"weighted", weighted},
          {"tutel", tutel},
          {"gate_noise", gate_noise},
          {"softmax_before_topk", softmax_before_topk},
          {"capacity_factor", capacity_factor},
          {"batch_prioritized", batch_prioritized},
          {"balance_loss", to_string(balance)},
          {"balance_weight", balance_weight},
          {"preact_dropout", preact_dropout},
          {"cosine_dim", cosine_dim},
          {"sample_tokens", sample_tokens}};
}

MoeConfig MoeConfig::from_json(const JsonFields& j) {
  auto wrap = [&](auto f) {
    try {
      return f();
    } catch (const UsageError& e) {
      throw InputError(j.file() + ": " + e.what());
    }
  };
  MoeConfig c =
      MoeConfig::for_method(wrap([&] { return parse_moe_method(j.get_string("method")); }));
  c.experts = j.get_int("experts");
  c.topk = j.get_int("topk");
  c.layers = j.get_int_list("layers");
  if (j.has("encoder_layers")) c.encoder_layers = j.get_int_list("encoder_layers");
  if (j.has("decoder_layers")) c.decoder_layers = j.get_int_list("decoder_layers");
  c.split = j.get_string("split", c.split);
  c.seed = static_cast<uint64_t>(j.get_int("seed", 0));
  if (j.has("kmeans")) {
    JsonFields km(j.raw()["kmeans"], j.file() + " kmeans");
    c.kmeans.restarts = km.get_int("restarts", c.kmeans.restarts);
    c.kmeans.max_iter = km.get_int("max_iter", c.kmeans.max_iter);
    c.kmeans.tol = km.get_double("tol", c.kmeans.tol);
  }
  c.gate = wrap([&] { return parse_gate_kind(j.get_string("gate", to_string(c.gate))); });
  c.gate_init = j.get_string("gate_init", c.gate_init);
  c.execution =
      wrap([&] { return parse_execution(j.get_string("execution", to_string(c.execution))); });
  c.weighted = j.get_bool("weighted", c.weighted);
  c.tutel = j.get_bool("tutel", false);
  c.gate_noise = j.get_double("gate_noise", c.gate_noise);
  c.softmax_before_topk = j.get_bool("softmax_before_topk", c.softmax_before_topk);
  c.capacity_factor = j.get_double("capacity_factor", c.capacity_factor);
  c.batch_prioritized = j.get_bool("batch_prioritized", c.batch_prioritized);
  c.balance =
      wrap([&] { return parse_balance_loss(j.get_string("balance_loss", to_string(c.balance))); });
  c.balance_weight = j.get_double("balance_weight", c.balance_weight);
  c.preact_dropout = j.get_double("preact_dropout", c.preact_dropout);
  c.cosine_dim = j.get_int("cosine_dim", c.cosine_dim);
  c.sample_tokens = j.get_int("sample_tokens", c.sample_tokens);
  return c;
}

std::vector<int64_t> default_moe_layers(int64_t num_layers) {
  std::vector<int64_t> out;
  for (int64_t l = std::max<int64_t>(0, num_layers - 4); l < num_layers; l += 2) out.push_back(l);
  return out;
}

std::vector<int64_t> default_moe_layers(int64_t num_layers, int64_t num_decoder_layers) {
  std::vector<int64_t> out = default_moe_layers(num_layers);
  if (num_decoder_layers > 0)
    for (auto l : default_moe_layers(num_decoder_layers)) out.push_back(num_layers + l);
  return out;
}

void resolve_moe_layers(MoeConfig& cfg, int64_t num_layers, int64_t num_decoder_layers) {
  if (!cfg.layers.empty()) return;
  if (cfg.encoder_layers.empty() && cfg.decoder_layers.empty()) {
    cfg.layers = default_moe_layers(num_layers, num_decoder_layers);
    return;
  }
  const std::string where = cfg.origin.empty() ? "--layers" : cfg.origin + "layers";
  EMOE_CHECK(num_decoder_layers > 0, UsageError,
             "{}: encoder and decoder layers are named for an encoder-decoder model; this one "
             "has one stack of {} layers (give plain layer indices)",
             where, num_layers);
  std::set<int64_t> out;
  auto add = [&](const std::vector<int64_t>& ls, int64_t n, int64_t offset, const char* stack) {
    for (auto l : ls) {
      EMOE_CHECK(l >= 0 && l < n, UsageError, "{}: {}.{} does not exist (the {} has layers 0..{})",
                 where, stack, l, stack, n - 1);
      EMOE_CHECK(out.insert(offset + l).second, UsageError, "{}: {}.{} is listed twice", where,
                 stack, l);
    }
  };
  add(cfg.encoder_layers, num_layers, 0, "encoder");
  add(cfg.decoder_layers, num_decoder_layers, num_layers, "decoder");
  cfg.layers.assign(out.begin(), out.end());
}

std::vector<int64_t> parse_layer_list(const std::string& text, int64_t num_layers,
                                      int64_t num_decoder_layers) {
  const int64_t encoder = num_layers - num_decoder_layers;
  if (text.empty() || text == "default")
    return num_decoder_layers > 0 ? default_moe_layers(encoder, num_decoder_layers)
                                  : default_moe_layers(num_layers);
  std::set<int64_t> out;
  if (text == "all") {
    for (int64_t l = 0; l < num_layers; ++l) out.insert(l);
    return {out.begin(), out.end()};
  }
  std::stringstream ss(text);
  std::string part;
  while (std::getline(ss, part, ',')) {
    const bool enc = part.rfind("encoder.", 0) == 0, dec = part.rfind("decoder.", 0) == 0;
    if (enc || dec) {
      EMOE_CHECK(num_decoder_layers > 0, UsageError,
                 "--layers {}: encoder and decoder layers are named for an encoder-decoder model; "
                 "this one has one stack of {} layers",
                 part, num_layers);
      const std::string digits = part.substr(8);
      EMOE_CHECK(!digits.empty() && digits.size() <= 9 &&
                     digits.find_first_not_of("0123456789") == std::string::npos,
                 UsageError, "--layers: expected encoder.N or decoder.N, got '{}'", part);
      const int64_t l = std::stoll(digits), n = enc ? encoder : num_decoder_layers;
      EMOE_CHECK(l < n, UsageError, "--layers: {} does not exist (the {} has layers 0..{})", part,
                 enc ? "encoder" : "decoder", n - 1);
      out.insert(enc ? l : encoder + l);
      continue;
    }
    try {
      size_t dash = part.find('-', 1);
      if (dash == std::string::npos) {
        size_t used = 0;
        int64_t v = std::stoll(part, &used);
        if (used != part.size()) throw std::invalid_argument(part);
        out.insert(v < 0 ? num_layers + v : v);
      } else {
        int64_t a = std::stoll(part.substr(0, dash)), b = std::stoll(part.substr(dash + 1));
        for (int64_t l = a; l <= b; ++l) out.insert(l);
      }
    } catch (const std::exception&) {
      EMOE_THROW(UsageError, "--layers: expected a list like 8,10 or 8-11 or all, got '{}'", text);
    }
  }
  for (auto l : out)
    EMOE_CHECK(l >= 0 && l < num_layers, UsageError,
               "--layers: layer {} does not exist (the model has layers 0..{})", l, num_layers - 1);
  return {out.begin(), out.end()};
}

}  // namespace emoe
