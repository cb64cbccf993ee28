// Analysis: FLOP counts against hand counts, balance statistics, usage records, pruning.
#include <filesystem>
#include <fstream>
#include <numeric>

#include "emoe/analysis/flops.h"
#include "emoe/analysis/plot.h"
#include "emoe/analysis/report.h"
#include "emoe/core/error.h"
#include "emoe/models/loader.h"
#include "emoe/moe/convert.h"
#include "emoe/moe/prune.h"
#include "emoe/moe/usage.h"
#include "support/test_support.h"

namespace {

emoe::ModelSummary analysis_summary(const std::string& type) {
  emoe::ModelSummary s;
  s.model_type = type;
  s.head = emoe::Head::kBase;
  s.num_layers = 2;
  s.hidden_size = 8;
  s.num_heads = 2;
  s.num_kv_heads = type == "llama" ? 1 : 2;
  s.gated_ffn = type == "llama";
  s.intermediate_size = 32;
  s.vocab_size = 50;
  return s;
}

emoe::ModelPtr analysis_bert() {
  return emoe::test::tiny_bert_classifier();
}

}  // namespace

TEST(Flops, MatchHandCounts) {
  // BERT-like, d 8, d_ff 32, 2 layers, T 10. Per layer: projections 4·64 = 256, scores 2·10·8 =
  // 160, FFN 2·8·32 = 512.
  auto s = analysis_summary("bert");
  emoe::MethodCost dense;
  auto c = emoe::count_flops(s, dense, 10);
  EXPECT_DOUBLE_EQ(c.forward.at("attention_proj"), 2 * 256.0);
  EXPECT_DOUBLE_EQ(c.forward.at("attention_scores"), 2 * 160.0);
  EXPECT_DOUBLE_EQ(c.forward.at("ffn"), 2 * 512.0);
  EXPECT_DOUBLE_EQ(c.forward_total, 2 * (256.0 + 160 + 512));
  // full fine-tuning: backward = input grads (one forward) + weight grads of every matmul
  EXPECT_DOUBLE_EQ(c.train_total, 2 * c.forward_total + 2 * (256.0 + 512));
  // EMoE masked costs the dense FFN plus the avg-k gate (d·E per layer); dispatched k/N of it
  emoe::MethodCost moe;
  moe.moe = true;
  moe.moe_layers = 2;
  moe.moe_config = emoe::MoeConfig::for_method(emoe::MoeMethod::kEmoe);
  moe.moe_config.experts = 4;
  moe.moe_config.topk = 1;
  auto m = emoe::count_flops(s, moe, 10);
  EXPECT_DOUBLE_EQ(m.forward.at("ffn"), c.forward.at("ffn"));
  EXPECT_DOUBLE_EQ(m.forward.at("gate"), 2 * 8.0 * 4);
  moe.moe_config.execution = emoe::Execution::kDispatched;
  auto d = emoe::count_flops(s, moe, 10);
  // dense - (1 - k/N) x FFN
  EXPECT_DOUBLE_EQ(d.forward.at("ffn"), c.forward.at("ffn") - (1 - 0.25) * c.forward.at("ffn"));
  // LoRA r 4 on query and value: 2 layers x 2 targets x 4·(8 + 8); only adapters train
  emoe::MethodCost lora;
  lora.peft.method = emoe::PeftMethod::kLora;
  lora.peft.r = 4;
  lora.trainable_body = false;
  auto l = emoe::count_flops(s, lora, 10);
  EXPECT_DOUBLE_EQ(l.forward.at("adapters"), 2 * 2 * 4 * 16.0);
  EXPECT_DOUBLE_EQ(l.train_total, 2 * l.forward_total + l.forward.at("adapters"));
  // gated FFN (Llama): 3·d·d_ff; grouped kv: projections d·d + 2·d·kv + d·d with kv = 4
  auto ll = emoe::count_flops(analysis_summary("llama"), dense, 10);
  EXPECT_DOUBLE_EQ(ll.forward.at("ffn"), 2 * 3 * 8.0 * 32);
  EXPECT_DOUBLE_EQ(ll.forward.at("attention_proj"), 2 * (64.0 + 2 * 8 * 4 + 64));
}

TEST(Flops, EncoderDecoderMatchesHandCounts) {
  // T5-like: d 8, 2 heads of d_kv 3 (inner width 6), d_ff 32, 2 encoder + 1 decoder blocks,
  // vocabulary 10; 10 source and 5 target tokens (15 in all).
  emoe::ModelSummary s;
  s.model_type = "t5";
  s.head = emoe::Head::kSeq2SeqLM;
  s.num_layers = 2;
  s.num_decoder_layers = 1;
  s.hidden_size = 8;
  s.num_heads = 2;
  s.num_kv_heads = 2;
  s.head_dim = 3;
  s.intermediate_size = 32;
  s.vocab_size = 10;
  s.activation = "relu";
  emoe::MethodCost dense;
  auto c = emoe::count_flops(s, dense, 10, 5);
  // projections: encoder 2·10·(4·8·6) = 3840; decoder self q,k,v,o 5·192 = 960, cross q,o
  // 5·96 = 480, cross k,v on the source 10·96 = 960
  EXPECT_DOUBLE_EQ(c.forward.at("attention_proj"), (3840.0 + 960 + 480 + 960) / 15);
  // scores: encoder 2·10·(2·10·6) = 2400; decoder self 5·(2·5·6) = 300, cross 5·(2·10·6) = 600
  EXPECT_DOUBLE_EQ(c.forward.at("attention_scores"), (2400.0 + 300 + 600) / 15);
  // FFN 2·8·32 = 512 on 2·10 + 5 token-blocks; LM head 5·8·10
  EXPECT_DOUBLE_EQ(c.forward.at("ffn"), 25 * 512.0 / 15);
  EXPECT_DOUBLE_EQ(c.forward.at("head"), 400.0 / 15);
  EXPECT_DOUBLE_EQ(c.train_total, 2 * c.forward_total + (6240.0 + 25 * 512 + 400) / 15);
  // target_len 0 means as long as the source
  EXPECT_DOUBLE_EQ(emoe::count_flops(s, dense, 10).forward.at("ffn"), 30 * 512.0 / 20);
  // gated-GELU (v1.1): 3·d·d_ff
  s.activation = "gated-gelu";
  s.gated_ffn = true;
  EXPECT_DOUBLE_EQ(emoe::count_flops(s, dense, 10, 5).forward.at("ffn"), 25 * 768.0 / 15);
  s.activation = "relu";
  s.gated_ffn = false;
  // EMoE dispatched (N 4, k 1) on the decoder's FFN only: its 5 tokens run 1/4 of it, plus the
  // avg-k gate d·N
  emoe::MethodCost moe;
  moe.moe = true;
  moe.moe_layers = 1;
  moe.moe_decoder_layers = 1;
  moe.moe_config = emoe::MoeConfig::for_method(emoe::MoeMethod::kEmoe);
  moe.moe_config.experts = 4;
  moe.moe_config.topk = 1;
  moe.moe_config.execution = emoe::Execution::kDispatched;
  auto m = emoe::count_flops(s, moe, 10, 5);
  EXPECT_DOUBLE_EQ(m.forward.at("ffn"), (25 * 512.0 - 5 * 0.75 * 512) / 15);
  EXPECT_DOUBLE_EQ(m.forward.at("gate"), 5 * 32.0 / 15);
  // MoV, 10 experts: k and v (router + mixture, 2·6·10 each) on 2·10 encoder tokens, 5 decoder
  // self and 10 cross-attention source tokens; the FFN intermediate (2·32·10) on 2·10 + 5 tokens
  emoe::MethodCost mov;
  mov.peft.method = emoe::PeftMethod::kMov;
  mov.peft.experts = 10;
  mov.trainable_body = false;
  auto v = emoe::count_flops(s, mov, 10, 5);
  EXPECT_DOUBLE_EQ(v.forward.at("adapters"), (240.0 * 35 + 640.0 * 25) / 15);
  EXPECT_DOUBLE_EQ(v.train_total, 2 * v.forward_total + v.forward.at("adapters"));
  // LoRA r 2 on q, v: 2·(8 + 6) per token and target; 2·10·2 + 5·2 + 5 + 10 of them
  emoe::MethodCost lora;
  lora.peft.method = emoe::PeftMethod::kLora;
  lora.peft.r = 2;
  lora.trainable_body = false;
  EXPECT_DOUBLE_EQ(emoe::count_flops(s, lora, 10, 5).forward.at("adapters"), 28.0 * 65 / 15);
  // MoLoRA r 2, 3 experts on every linear: a site (a -> b) costs 3·2·(a + b) + 3a: q, k, v 108,
  // o 102, wi 264, wo 336. Encoder 20 token-blocks of 1026; decoder 5 target tokens of self q, k,
  // v, o (426), cross q, o (210) and the FFN (600), 10 source tokens of cross k, v (216)
  emoe::MethodCost molora;
  molora.peft.method = emoe::PeftMethod::kMolora;
  molora.peft.r = 2;
  molora.peft.experts = 3;
  molora.trainable_body = false;
  EXPECT_DOUBLE_EQ(emoe::count_flops(s, molora, 10, 5).forward.at("adapters"),
                   (20 * 1026.0 + 5 * (426.0 + 210 + 600) + 10 * 216.0) / 15);
}

TEST(Balance, StatsOfUniformSkewedAndEmpty) {
  auto u = emoe::balance_stats({5, 5, 5, 5});
  EXPECT_NEAR(u.entropy_bits, 2.0, 1e-12);
  EXPECT_NEAR(u.entropy_ratio, 1.0, 1e-12);
  EXPECT_NEAR(u.cv, 0.0, 1e-12);
  EXPECT_TRUE(u.unused.empty());
  auto s = emoe::balance_stats({6, 2, 0, 0});
  EXPECT_NEAR(s.entropy_bits, -(0.75 * std::log2(0.75) + 0.25 * std::log2(0.25)), 1e-12);
  EXPECT_EQ(s.unused, (std::vector<int64_t>{2, 3}));
  // counts 6 2 0 0: mean 2, population std sqrt((16+0+4+4)/4) = sqrt(6)
  EXPECT_NEAR(s.cv, std::sqrt(6.0) / 2.0, 1e-12);
  EXPECT_EQ(emoe::balance_stats({0, 0}).unused.size(), 2u);
}

TEST(Usage, RecorderCountsRealTokensAndRoundTrips) {
  auto model = analysis_bert();
  auto cfg = emoe::MoeConfig::for_method(emoe::MoeMethod::kEmoe);
  cfg.experts = 4;
  cfg.topk = 2;
  cfg.layers = {0, 1};
  emoe::convert_to_moe(*model, cfg);
  emoe::UsageRecorder usage(*model);
  ASSERT_EQ(usage.sources().size(), 2u);
  emoe::ModelInputs in;
  in.input_ids = torch::randint(1, 50, {2, 6}, torch::kLong);
  in.attention_mask = torch::tensor({{1, 1, 1, 1, 1, 1}, {1, 1, 0, 0, 0, 0}});
  model->train();
  model->forward(in);
  usage.snapshot(1, "train", true);
  model->eval();
  model->forward(in);
  usage.snapshot(1, "dev", false);
  for (const auto& snap : usage.snapshots())
    for (const auto& c : snap.counts)
      EXPECT_DOUBLE_EQ(std::accumulate(c.begin(), c.end(), 0.0), 8 * 2);
  emoe::test::TempDir tmp;
  usage.save(tmp.path());
  auto back = emoe::UsageRecorder::load(tmp.file("usage.json"));
  EXPECT_EQ(back.to_json(), usage.to_json());
  EXPECT_TRUE(std::filesystem::exists(tmp.file("usage.csv")));
  // pruning: keep = N changes nothing; keep = 1 routes every token to that expert
  auto top1 = emoe::most_used_experts(usage, 1);
  ASSERT_EQ(top1.size(), 2u);
  torch::NoGradGuard g;
  auto full = model->forward(in).logits;
  emoe::apply_expert_pruning(*model, emoe::most_used_experts(usage, 4));
  EXPECT_TRUE(torch::equal(model->forward(in).logits, full));
  emoe::apply_expert_pruning(*model, top1);
  usage.discard(false);
  model->forward(in);
  usage.snapshot(2, "pruned", false);
  const auto& last = usage.snapshots().back();
  for (size_t i = 0; i < last.counts.size(); ++i)
    for (size_t e = 0; e < last.counts[i].size(); ++e)
      EXPECT_DOUBLE_EQ(last.counts[i][e], static_cast<int64_t>(e) == top1[i][0] ? 8.0 : 0.0);
  EXPECT_EQ(emoe::halving_schedule(16), (std::vector<int64_t>{16, 8, 4, 2, 1}));
  EXPECT_EQ(emoe::halving_schedule(6), (std::vector<int64_t>{6, 3, 1}));
  EXPECT_THROW(emoe::most_used_experts(usage, 9), emoe::UsageError);
}

// The training heatmap's step axis: round, evenly spaced ticks whatever the snapshots' steps
// (interval snapshots plus epoch ends used to label unequal columns 20, 40, 42, 62, ...).
TEST(Plots, StepAxisTicksAreRoundAndEvenlySpaced) {
  for (double hi : {125.0, 42.0, 7.0, 1000.0, 3.0, 1.0}) {
    const auto t = emoe::axis_ticks(hi);
    ASSERT_GE(t.size(), 2u) << hi;
    EXPECT_EQ(t[0], 0.0);
    EXPECT_LE(t.back(), hi);
    for (size_t i = 2; i < t.size(); ++i) EXPECT_DOUBLE_EQ(t[i] - t[i - 1], t[1] - t[0]) << hi;
  }
  EXPECT_EQ(emoe::axis_ticks(125), (std::vector<double>{0, 50, 100}));
  emoe::test::TempDir tmp;
  emoe::HeatmapSpec h;
  h.values = {{0.5, 0.25, 1}, {0.5, 0.75, 0}};
  h.column_labels = {"20", "40", "42"};
  h.column_ends = {20, 40, 42};
  emoe::write_heatmap_png(tmp.file("steps.png"), h);
  EXPECT_TRUE(std::filesystem::exists(tmp.file("steps.png")));
}

TEST(Plots, HeatmapAndBarChartArePngFiles) {
  emoe::test::TempDir tmp;
  emoe::HeatmapSpec h;
  h.title = "t";
  h.values = {{0, 1, 2}, {3, 4, 5}};
  h.row_labels = {"a", "b"};
  h.column_labels = {"1", "2", "3"};
  emoe::write_heatmap_png(tmp.file("h.png"), h);
  emoe::BarChartSpec b;
  b.title = "bars";
  b.categories = {"x", "y"};
  b.series = {{"s1", {1, 2}}, {"s2", {2, 1}}};
  emoe::write_bar_chart_png(tmp.file("b.png"), b);
  for (const char* f : {"h.png", "b.png"}) {
    std::ifstream in(tmp.file(f), std::ios::binary);
    char magic[8];
    in.read(magic, 8);
    EXPECT_EQ(std::string(magic + 1, 3), "PNG") << f;
  }
}
