// The activation-clustering picture: firing correlation and block contrast of known patterns,
// and the files written for a real (tiny) model.
#include "emoe/analysis/coactivation.h"

#include <torch/torch.h>

#include <filesystem>

#include "emoe/core/error.h"
#include "emoe/models/ffn_slot.h"
#include "support/test_support.h"

namespace fs = std::filesystem;

TEST(Coactivation, CorrelationAndBlockContrastOfKnownFiring) {
  // neurons 0, 1 fire on tokens 0, 1; neurons 2, 3 on tokens 2, 3; neuron 4 always (no variance)
  auto active = torch::tensor({{1, 1, 0, 0, 1}, {1, 1, 0, 0, 1}, {0, 0, 1, 1, 1}, {0, 0, 1, 1, 1}},
                              torch::kLong);
  auto c = emoe::firing_correlation(active);
  ASSERT_EQ(c.sizes(), (std::vector<int64_t>{5, 5}));
  EXPECT_NEAR(c[0][1].item<double>(), 1.0, 1e-6);
  EXPECT_NEAR(c[0][2].item<double>(), -1.0, 1e-6);
  EXPECT_NEAR(c[0][4].item<double>(), 0.0, 1e-12);
  auto four = c.narrow(0, 0, 4).narrow(1, 0, 4);
  auto grouped = emoe::block_contrast(four, {0, 0, 1, 1}, 2);
  EXPECT_NEAR(grouped.within, 1.0, 1e-6);
  EXPECT_NEAR(grouped.between, -1.0, 1e-6);
  auto mixed = emoe::block_contrast(four, {0, 1, 0, 1}, 2);  // pairs (0,2), (1,3): -1
  EXPECT_NEAR(mixed.within, -1.0, 1e-6);
  EXPECT_NEAR(mixed.between, 0.0, 1e-6);  // (0,1), (2,3) at 1; (0,3), (1,2) at -1
  EXPECT_THROW(emoe::block_contrast(four, {0, 0, 1}, 2), emoe::InputError);
  EXPECT_THROW(emoe::block_contrast(four, {0, 0, 1, 2}, 2), emoe::InputError);
}

TEST(Coactivation, WritesTheFigureAndNoteForAModelLayer) {
  emoe::test::TempDir tmp;
  auto model = emoe::test::tiny_bert_classifier();
  torch::manual_seed(0);
  emoe::ModelInputs in;
  in.input_ids = torch::randint(1, 50, {4, 12}, torch::kLong);
  in.attention_mask = torch::ones({4, 12}, torch::kLong);
  const auto before = model->ffn_slots()[1]->ffn_view().w_in.detach().clone();
  emoe::CoactivationOptions o;
  o.layer = 1;
  o.experts = 4;
  auto r = emoe::write_coactivation(*model, {in}, o, tmp.file("co"));
  EXPECT_EQ(r.tokens, 48);
  EXPECT_GT(r.firing_rate, 0.0);
  EXPECT_LT(r.firing_rate, 1.0);
  EXPECT_TRUE(fs::exists(tmp.file("co/coactivation_layer1.png")));
  EXPECT_TRUE(fs::exists(tmp.file("co/coactivation_layer1.md")));
  // the model is analysed, not converted
  EXPECT_TRUE(torch::equal(before, model->ffn_slots()[1]->ffn_view().w_in.detach()));
  o.layer = 2;
  EXPECT_THROW(emoe::write_coactivation(*model, {in}, o, tmp.file("co")), emoe::InputError);
  o.layer = 1;
  o.experts = 5;  // 32 neurons
  EXPECT_THROW(emoe::write_coactivation(*model, {in}, o, tmp.file("co")), emoe::InputError);
}
