// A full disk while a checkpoint is written: the run stops with one clear error, the half-written
// checkpoint is removed, the previous one stays the latest and intact, and --resume finishes.
// The full disk is a file-size limit (ulimit -f, with SIGXFSZ ignored so that writes fail with
// EFBIG as they would with ENOSPC), which needs no privileges.
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "emoe/io/safetensors.h"
#include "support/test_support.h"

namespace fs = std::filesystem;

namespace {

std::string latest_name(const std::string& run) {
  std::ifstream in(run + "/checkpoints/latest");
  std::string name;
  std::getline(in, name);
  return name;
}

}  // namespace

TEST(DiskFull, CheckpointWriteFailsCleanlyAndTheRunResumes) {
  EMOE_REQUIRE_SHARED(stories, "models/stories260K/hf");
  EMOE_REQUIRE_SHARED(data, "data/glue/SST-2");
  emoe::test::TempDir tmp;
  const auto run = tmp.file("run");
  const std::string args = fmt::format(
      "train --set model={} --set task=sst2 --set data_dir={} --set method=full -o {} --set ood=[] "
      "--set train.batch_size=8 --set train.max_steps=6 --set train.max_length=32 "
      "--set train.max_train_examples=48 --set train.max_eval_examples=16 --set train.save_every=1 "
      "--set save_best=false",
      stories, emoe::test::shared_path("data"), run);
  auto first = emoe::test::run_emoe(args + " --set train.stop_after_steps=2");
  ASSERT_EQ(first.exit_code, 0) << first.err;
  ASSERT_EQ(latest_name(run), "step-00000002");
  const auto before = emoe::load_safetensors(run + "/checkpoints/step-00000002/model.safetensors");

  // resume with files limited to 64 KiB: the next checkpoint (about 1 MB of weights) cannot be
  // written
  const auto err_file = tmp.file("err.txt");
  const auto cmd =
      fmt::format("bash -c 'trap \"\" XFSZ; ulimit -f 64; exec {} -q {} --resume' 2> {}",
                  emoe::test::emoe_binary(), args, err_file);
  const int status = std::system(cmd.c_str());
  EXPECT_NE(status, 0);
  std::ifstream in(err_file);
  std::string err((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::cout << "[ disk full] " << err;
  EXPECT_NE(err.find("checkpoint not written"), std::string::npos) << err;
  EXPECT_NE(err.find("the previous checkpoint step-00000002 is intact"), std::string::npos) << err;
  EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << err;
  EXPECT_EQ(latest_name(run), "step-00000002");
  EXPECT_FALSE(fs::exists(run + "/checkpoints/step-00000003"));
  for (const auto& e : fs::recursive_directory_iterator(run + "/checkpoints"))
    EXPECT_EQ(e.path().filename().string().find(".tmp"), std::string::npos) << e.path();
  const auto after = emoe::load_safetensors(run + "/checkpoints/step-00000002/model.safetensors");
  for (const auto& [k, t] : before) EXPECT_TRUE(torch::equal(t, after.at(k))) << k;

  // with room again, --resume finishes the run
  auto again = emoe::test::run_emoe(args + " --resume");
  ASSERT_EQ(again.exit_code, 0) << again.err;
  EXPECT_TRUE(fs::exists(run + "/results.json"));
}
