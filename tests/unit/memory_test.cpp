// `emoe info --memory`: weights, gradients and AdamW state per method, against hand counts.
#include "emoe/train/memory.h"

#include "emoe/core/error.h"
#include "emoe/train/method_table.h"
#include "support/test_support.h"

// fixtures/tiny/bert_seqcls: hidden 32, 2 layers, d_ff 64, vocab 100, 64 positions, 2 token
// types, 4 heads, 3 labels.
TEST(TrainingMemory, TinyBertMatchesHandCounts) {
  EMOE_REQUIRE_SHARED(dir, "fixtures/tiny/bert_seqcls");
  const int64_t h = 32, ff = 64, layers = 2, labels = 3;
  const int64_t embeddings = 100 * h + 64 * h + 2 * h + 2 * h;       // + LayerNorm
  const int64_t per_layer = 4 * (h * h + h) + 2 * h                  // attention + LayerNorm
                            + (h * ff + ff) + (ff * h + h) + 2 * h;  // FFN + LayerNorm
  const int64_t pooler = h * h + h, classifier = h * labels + labels;
  const int64_t total = embeddings + layers * per_layer + pooler + classifier;
  ASSERT_EQ(total, 23619);

  auto full = emoe::training_memory(dir, "full", 8, 32, torch::kFloat);
  EXPECT_EQ(full.parameters, total);
  EXPECT_EQ(full.trainable, total);
  EXPECT_EQ(full.weights, total * 4);
  EXPECT_EQ(full.gradients, total * 4);
  EXPECT_EQ(full.optimizer, total * 8);  // two float32 moments
  // Korthikanti et al.: s*b*h*(34 + 5*a*s/h) bytes per layer at 16 bits, x2 for float32
  const int64_t act = 2 * 32 * 8 * h * (34 + 5 * 4 * 32 / h) * 4 / 2;
  EXPECT_EQ(full.activations, act);
  // checkpointed: each layer's input (s*b*h float32 values) and one layer's activations
  EXPECT_EQ(full.checkpointed_activations, layers * 32 * 8 * h * 4 + act / layers);
  EXPECT_EQ(full.total(), total * 16 + act);

  // LoRA r 8 on query and value (A: r x h, B: h x r) + the classifier; the pooler stays frozen
  auto lora = emoe::training_memory(dir, "lora", 8, 32, torch::kFloat);
  const int64_t adapters = layers * 2 * (8 * h + h * 8);
  EXPECT_EQ(lora.parameters, total + adapters);
  EXPECT_EQ(lora.trainable, adapters + classifier);
  EXPECT_EQ(lora.weights, (total + adapters) * 4);
  EXPECT_EQ(lora.gradients, (adapters + classifier) * 4);
  EXPECT_EQ(lora.optimizer, (adapters + classifier) * 8);

  // bfloat16 weights: half the bytes for weights and gradients; AdamW moments stay float32
  auto bf16 = emoe::training_memory(dir, "full", 8, 32, torch::kBFloat16);
  EXPECT_EQ(bf16.weights, total * 2);
  EXPECT_EQ(bf16.gradients, total * 2);
  EXPECT_EQ(bf16.optimizer, total * 8);
  EXPECT_EQ(bf16.activations, act / 2);

  // every method of `emoe train` has a report; EMoE trains every parameter, emoe+lora does not
  for (const auto& m : emoe::method_names()) {
    SCOPED_TRACE(m);
    auto r = emoe::training_memory(dir, m, 8, 32, torch::kFloat);
    EXPECT_GT(r.trainable, 0);
    EXPECT_LE(r.trainable, r.parameters);
    EXPECT_EQ(r.weights, r.parameters * 4);
    EXPECT_EQ(r.optimizer, r.trainable * 8);
    if (m == "emoe") EXPECT_EQ(r.trainable, r.parameters);
    if (m == "emoe+lora") EXPECT_LT(r.trainable, r.parameters / 2);
    if (m == "gmoe+lora" || m == "emoe-learn+lora")  // + the converted layers / the routers
      EXPECT_GT(r.trainable, emoe::training_memory(dir, "lora", 8, 32, torch::kFloat).trainable);
  }
}

// Per rank in data parallel: the batch split (activations), the AdamW state divided at
// optimizer, the gradients too at gradients, the weights whole everywhere.
TEST(TrainingMemory, PerRankSharesFollowTheShardingLevel) {
  emoe::TrainingMemory m;
  m.weights = 4000, m.gradients = 4000, m.optimizer = 8000, m.activations = 3200;  // batch 32
  const auto none = emoe::per_rank_memory(m, 32, 4, "none");
  EXPECT_EQ(none.weights, 4000);
  EXPECT_EQ(none.gradients, 4000);
  EXPECT_EQ(none.optimizer, 8000);
  EXPECT_EQ(none.activations, 800);
  const auto opt = emoe::per_rank_memory(m, 32, 4, "optimizer");
  EXPECT_EQ(opt.optimizer, 2000);
  EXPECT_EQ(opt.gradients, 4000);
  const auto grad = emoe::per_rank_memory(m, 32, 4, "gradients");
  EXPECT_EQ(grad.optimizer, 2000);
  EXPECT_EQ(grad.gradients, 1000);
  EXPECT_EQ(grad.weights, 4000);
  EXPECT_EQ(grad.total(), 4000 + 1000 + 2000 + 800);
  // an uneven split: ceil(32 / 3) = 11 examples on the busiest rank
  EXPECT_EQ(emoe::per_rank_memory(m, 32, 3, "none").activations, 1100);  // 11 of 32
  EXPECT_EQ(emoe::per_rank_memory(m, 32, 1, "gradients").total(), m.total());
  const auto full = emoe::per_rank_memory(m, 32, 4, "full");  // the weights shared too
  EXPECT_EQ(full.weights, 1000);
  EXPECT_EQ(full.gradients, 1000);
  EXPECT_EQ(full.optimizer, 2000);
  EXPECT_EQ(full.total(), 1000 + 1000 + 2000 + 800);
  EXPECT_THROW(emoe::per_rank_memory(m, 32, 2, "zero3"), emoe::UsageError);
}
