// Data-parallel training on c10d (Gloo over loopback): 2 processes give the losses and weights of
// 1 process with the same global batch (dense, LoRA, EMoE); a worker that dies or hangs stops the
// job with a clear message within the timeout, and --resume then finishes the run.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <thread>

#include "emoe/io/safetensors.h"
#include "support/test_support.h"

namespace fs = std::filesystem;

namespace {

// bert-mini with dropout off (so that 1 and 2 processes compute the same function): the
// config rewritten, every other file linked.
std::string deterministic_bert(const std::string& bert, const std::string& dir) {
  fs::create_directories(dir);
  for (const auto& e : fs::directory_iterator(bert))
    if (e.path().filename() != "config.json")
      fs::create_symlink(e.path(), fs::path(dir) / e.path().filename());
  std::ifstream in(bert + "/config.json");
  auto cfg = nlohmann::json::parse(in);
  cfg["hidden_dropout_prob"] = 0.0;
  cfg["attention_probs_dropout_prob"] = 0.0;
  std::ofstream(dir + "/config.json") << cfg.dump(2);
  return dir;
}

std::string train_args(const std::string& model, const std::string& method, const std::string& out,
                       int64_t steps, const std::string& extra = "") {
  return fmt::format(
      "train --set model={} --set task=sst2 --set data_dir={} --set method={} -o {} --set ood=[] "
      "--set train.batch_size=8 --set train.max_steps={} --set train.max_length=32 "
      "--set train.max_train_examples=400 --set train.max_eval_examples=32 --set train.log_every=1 "
      "--set train.lr=1e-4 --set train.warmup_steps=2 --set peft.dropout=0 --set moe.experts=4 "
      "--set moe.topk=2 "
      "--set moe.kmeans.restarts=1 --set save_best=false {}",
      model, emoe::test::shared_path("data"), method, out, steps, extra);
}

std::map<std::string, torch::Tensor> latest_weights(const std::string& run) {
  std::ifstream in(run + "/checkpoints/latest");
  std::string name;
  std::getline(in, name);
  return emoe::load_safetensors(run + "/checkpoints/" + name + "/model.safetensors");
}

std::vector<pid_t> children_of(pid_t parent) {
  std::vector<pid_t> out;
  std::ifstream in(fmt::format("/proc/{}/task/{}/children", parent, parent));
  for (pid_t p; in >> p;) out.push_back(p);
  return out;
}

}  // namespace

TEST(Distributed, TwoProcessesMatchOneProcess) {
  EMOE_REQUIRE_SHARED(bert, "models/bert-mini");
  EMOE_REQUIRE_SHARED(data, "data/glue/SST-2");
  emoe::test::TempDir tmp;
  const auto model = deterministic_bert(bert, tmp.file("bert"));
  // (method, extra settings): the last one accumulates 2 micro-batches of 4 per step, which
  // all-reduces once per step
  const std::vector<std::pair<std::string, std::string>> runs = {
      {"full", ""},
      {"lora", ""},
      {"emoe", ""},
      {"full", " --set train.batch_size=4 --set train.grad_accum=2"}};
  for (const auto& [method, extra] : runs) {
    SCOPED_TRACE(method + extra);
    auto one = tmp.file(method + "-1"), two = tmp.file(method + "-2");
    fs::remove_all(one), fs::remove_all(two);
    auto r1 = emoe::test::run_emoe(train_args(model, method, one, 20, "--set threads=1" + extra));
    ASSERT_EQ(r1.exit_code, 0) << r1.err;
    auto r2 = emoe::test::run_emoe(
        train_args(model, method, two, 20, "--set threads=1 --nproc 2" + extra));
    ASSERT_EQ(r2.exit_code, 0) << r2.err;
    EXPECT_NE(r2.err.find("data parallel: 2 ranks"), std::string::npos) << r2.err;
    // at the epoch's checkpoint rank 1 takes rank 0's timed kernel choices
    EXPECT_NE(r2.err.find("every rank computes on rank 0's timed kernels from step"),
              std::string::npos)
        << r2.err;
    auto l1 = emoe::test::train_losses(one), l2 = emoe::test::train_losses(two);
    ASSERT_EQ(l1.size(), 20u);
    ASSERT_EQ(l2.size(), 20u);
    double worst_loss = 0;
    for (size_t i = 0; i < l1.size(); ++i) {
      EXPECT_NEAR(l1[i], l2[i], 1e-5) << "step " << i + 1;
      worst_loss = std::max(worst_loss, std::abs(l1[i] - l2[i]));
    }
    auto w1 = latest_weights(one), w2 = latest_weights(two);
    ASSERT_EQ(w1.size(), w2.size());
    double worst = 0;
    for (auto& [k, t] : w1) worst = std::max(worst, emoe::test::max_abs_diff(t, w2.at(k)));
    EXPECT_LT(worst, 1e-5);
    std::cout << fmt::format(
        "[ dist     ] {}{}: 20 steps, max |loss diff| {:.2e}, max |weight diff| {:.2e}\n", method,
        extra, worst_loss, worst);
    // the dev metrics are those of the whole dev set, gathered from both ranks
    auto res1 = nlohmann::json::parse(std::ifstream(one + "/results.json"));
    auto res2 = nlohmann::json::parse(std::ifstream(two + "/results.json"));
    EXPECT_EQ(res1["best"]["dev"]["examples"], res2["best"]["dev"]["examples"]);
    EXPECT_NEAR(res1["best"]["dev"]["metrics"]["accuracy"].get<double>(),
                res2["best"]["dev"]["metrics"]["accuracy"].get<double>(), 1e-9);
    EXPECT_NEAR(res1["best"]["dev"]["loss"].get<double>(),
                res2["best"]["dev"]["loss"].get<double>(), 1e-5);
  }
}

// Starts `emoe train --nproc 2` in the background, waits until it has logged `steps` steps,
// applies `sig` to worker 1, and returns the launcher's exit code, stderr and the seconds it
// took to stop after the signal.
struct Interrupted {
  int code = -1;
  std::string err;
  double seconds = 0;
};
Interrupted interrupt_worker(const std::string& args, const std::string& run, size_t steps,
                             int sig) {
  const auto err_file = run + ".err";
  pid_t launcher = fork();
  if (launcher == 0) {
    const auto cmd =
        fmt::format("exec {} {} 2>{} >/dev/null", emoe::test::emoe_binary(), args, err_file);
    execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  Interrupted r;
  const auto t_start = std::chrono::steady_clock::now();
  while (emoe::test::train_losses(run).size() < steps) {
    if (std::chrono::steady_clock::now() - t_start > std::chrono::seconds(120)) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  auto workers = children_of(launcher);
  EXPECT_EQ(workers.size(), 2u);
  // the launcher starts rank 0 first; the highest pid is rank 1
  if (!workers.empty()) kill(*std::max_element(workers.begin(), workers.end()), sig);
  const auto t_sig = std::chrono::steady_clock::now();
  int status = 0;
  waitpid(launcher, &status, 0);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_sig).count();
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  std::ifstream in(err_file);
  r.err.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  return r;
}

TEST(Distributed, DeadOrHungWorkerStopsTheJobAndResumeFinishes) {
  EMOE_REQUIRE_SHARED(bert, "models/bert-mini");
  EMOE_REQUIRE_SHARED(data, "data/glue/SST-2");
  emoe::test::TempDir tmp;
  const auto model = deterministic_bert(bert, tmp.file("bert"));
  const std::string dist = "--set threads=1 --set train.save_every=2 --nproc 2 --dist-timeout 10";
  {
    SCOPED_TRACE("SIGKILL");
    const auto run = tmp.file("killed");
    auto r = interrupt_worker(train_args(model, "full", run, 40, dist), run, 5, SIGKILL);
    EXPECT_EQ(r.code, 1) << r.err;
    EXPECT_NE(r.err.find("worker 1 of 2"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("killed by signal 9"), std::string::npos) << r.err;
    EXPECT_LT(r.seconds, 30.0);
    auto again = emoe::test::run_emoe(train_args(model, "full", run, 40, dist + " --resume"));
    ASSERT_EQ(again.exit_code, 0) << again.err;
    EXPECT_EQ(emoe::test::train_losses(run).size(), 40u);
    EXPECT_TRUE(fs::exists(run + "/results.json"));
  }
  {
    SCOPED_TRACE("SIGSTOP");
    const auto run = tmp.file("hung");
    auto r = interrupt_worker(train_args(model, "full", run, 40, dist), run, 5, SIGSTOP);
    EXPECT_EQ(r.code, 1) << r.err;
    // rank 0 gives up after the 10 s timeout; the launcher then stops the hung worker
    EXPECT_NE(r.err.find("rank 0 of 2"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("worker 0 of 2"), std::string::npos) << r.err;
    EXPECT_LT(r.seconds, 40.0);
    auto again = emoe::test::run_emoe(
        train_args(model, "full", run, 40, "--set threads=1 --set train.save_every=2 --resume"));
    ASSERT_EQ(again.exit_code, 0) << again.err;
    EXPECT_EQ(emoe::test::train_losses(run).size(), 40u);
  }
}

namespace {

// The largest difference between two runs' final weights, and between their logged losses.
std::pair<double, double> run_difference(const std::string& a, const std::string& b) {
  auto la = emoe::test::train_losses(a), lb = emoe::test::train_losses(b);
  EXPECT_EQ(la.size(), lb.size());
  double loss = 0;
  for (size_t i = 0; i < std::min(la.size(), lb.size()); ++i)
    loss = std::max(loss, std::abs(la[i] - lb[i]));
  auto wa = latest_weights(a), wb = latest_weights(b);
  EXPECT_EQ(wa.size(), wb.size());
  double weight = 0;
  for (auto& [k, t] : wa) weight = std::max(weight, emoe::test::max_abs_diff(t, wb.at(k)));
  return {loss, weight};
}

nlohmann::json run_memory(const std::string& run) {
  return nlohmann::json::parse(std::ifstream(run + "/results.json")).at("memory");
}

}  // namespace

// ZeRO stages 1, 2 and 3 on 2 ranks reach the weights of one unsharded process, while each rank
// keeps only its share of the AdamW state.
TEST(Distributed, ShardedLevelsMatchOneProcess) {
  EMOE_REQUIRE_SHARED(bert, "models/bert-mini");
  EMOE_REQUIRE_SHARED(data, "data/glue/SST-2");
  emoe::test::TempDir tmp;
  const auto model = deterministic_bert(bert, tmp.file("bert"));
  // (method, extra): EMoE, and full fine-tuning accumulating 2 micro-batches per step
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"emoe", ""}, {"full", " --set train.batch_size=4 --set train.grad_accum=2"}};
  for (const auto& [method, extra] : cases) {
    const auto one = tmp.file(method + "-one");
    auto r1 = emoe::test::run_emoe(train_args(model, method, one, 20, "--set threads=1" + extra));
    ASSERT_EQ(r1.exit_code, 0) << r1.err;
    const double whole = run_memory(one)["optimizer_state_mib_per_rank"][0].get<double>();
    for (const std::string level : {"optimizer", "gradients", "full"}) {
      SCOPED_TRACE(method + extra + " sharding " + level);
      const auto two = tmp.file(method + "-" + level);
      auto r2 = emoe::test::run_emoe(train_args(
          model, method, two, 20, "--set threads=1 --nproc 2 --sharding " + level + extra));
      ASSERT_EQ(r2.exit_code, 0) << r2.err;
      EXPECT_NE(r2.err.find("sharding " + level + " (ZeRO stage"), std::string::npos) << r2.err;
      const auto [loss, weight] = run_difference(one, two);
      EXPECT_LT(loss, 1e-5);
      EXPECT_LT(weight, 1e-5);
      const auto mem = run_memory(two);
      EXPECT_EQ(mem["sharding"], level);
      ASSERT_EQ(mem["optimizer_state_mib_per_rank"].size(), 2u);
      double sum = 0;
      for (const auto& s : mem["optimizer_state_mib_per_rank"]) {
        EXPECT_LT(s.get<double>(), 0.8 * whole) << mem.dump();
        sum += s.get<double>();
      }
      EXPECT_NEAR(sum, whole, 0.01 * whole) << mem.dump();
      std::cout << fmt::format(
          "[ sharded  ] {}{} {}: 20 steps, max |loss diff| {:.2e}, max |weight diff| {:.2e}, "
          "AdamW state per rank {} MiB of {:.1f}\n",
          method, extra, level, loss, weight, mem["optimizer_state_mib_per_rank"].dump(), whole);
    }
    // activation checkpointing under ZeRO 3: a block recomputed in backward gathers its weights
    // again first (the hook on its output's gradient), and the gradients reduce as they come
    SCOPED_TRACE(method + extra + " sharding full, gradient checkpointing");
    const auto ckpt = tmp.file(method + "-full-checkpointed");
    auto r3 = emoe::test::run_emoe(train_args(model, method, ckpt, 20,
                                              "--set threads=1 --nproc 2 --sharding full --set "
                                              "train.gradient_checkpointing=true" +
                                                  extra));
    ASSERT_EQ(r3.exit_code, 0) << r3.err;
    EXPECT_NE(r3.err.find("gradient checkpointing: each of the"), std::string::npos) << r3.err;
    const auto [loss, weight] = run_difference(one, ckpt);
    EXPECT_LT(loss, 1e-5);
    EXPECT_LT(weight, 1e-5);
  }
}

// A checkpoint holds the whole optimiser state (gathered on rank 0): a 2-rank sharded run
// resumes in one process, and a one-process run resumes on 2 sharded ranks, each finishing with
// the weights of the uninterrupted run.
TEST(Distributed, ShardedCheckpointsResumeAtAnotherWorldSize) {
  EMOE_REQUIRE_SHARED(bert, "models/bert-mini");
  EMOE_REQUIRE_SHARED(data, "data/glue/SST-2");
  emoe::test::TempDir tmp;
  const auto model = deterministic_bert(bert, tmp.file("bert"));
  const auto whole = tmp.file("whole");
  auto r = emoe::test::run_emoe(train_args(model, "emoe", whole, 20, "--set threads=1"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // (first half, second half)
  const std::vector<std::pair<std::string, std::string>> halves = {
      {"--nproc 2 --sharding gradients", ""},
      {"", "--nproc 2 --sharding optimizer"},
      {"--nproc 2 --sharding full", ""},
      {"", "--nproc 2 --sharding full"}};
  for (const auto& [first, second] : halves) {
    SCOPED_TRACE("'" + first + "' then '" + second + "'");
    const auto run =
        tmp.file("resumed" + std::to_string(first.size()) + "-" + std::to_string(second.size()));
    auto a = emoe::test::run_emoe(train_args(
        model, "emoe", run, 20, "--set threads=1 --set train.stop_after_steps=10 " + first));
    ASSERT_EQ(a.exit_code, 0) << a.err;
    auto b = emoe::test::run_emoe(
        train_args(model, "emoe", run, 20, "--set threads=1 --resume " + second));
    ASSERT_EQ(b.exit_code, 0) << b.err;
    const auto [loss, weight] = run_difference(whole, run);
    EXPECT_LT(loss, 1e-5);
    EXPECT_LT(weight, 1e-5);
  }
}

// Sharding on the other architectures' block loops: a Llama (stories260K) with EMoE layers at
// every level on 2 and on 4 ranks against one process (no dropout there), and a T5 (encoder and
// decoder blocks, the position bias read outside its block) with LoRA — frozen weights sharded too
// — at full against plain data parallel (T5's dropout draws per rank).
TEST(Distributed, ShardingOnLlamaAt2And4RanksAndFullOnT5) {
  EMOE_REQUIRE_SHARED(llama, "models/stories260K/hf");
  EMOE_REQUIRE_SHARED(tok, "fixtures/tokenizers/llama-tok512");
  EMOE_REQUIRE_SHARED(data, "data/glue/SST-2");
  emoe::test::TempDir tmp;
  const auto one = tmp.file("llama-one");
  auto r1 = emoe::test::run_emoe(
      train_args(llama, "emoe", one, 12, "--set threads=1 --set train.lr=1e-3"));
  ASSERT_EQ(r1.exit_code, 0) << r1.err;
  // 2 ranks at every level, and 4 ranks (2 examples each) at every level
  for (const int ranks : {2, 4})
    for (const std::string level : {"optimizer", "gradients", "full"}) {
      SCOPED_TRACE(fmt::format("stories260K emoe, {} ranks, sharding {}", ranks, level));
      const auto many = tmp.file(fmt::format("llama-{}-{}", ranks, level));
      auto r2 = emoe::test::run_emoe(
          train_args(llama, "emoe", many, 12,
                     fmt::format("--set threads=1 --set train.lr=1e-3 --nproc {} --sharding {}",
                                 ranks, level)));
      ASSERT_EQ(r2.exit_code, 0) << r2.err;
      const auto [loss, weight] = run_difference(one, many);
      EXPECT_LT(loss, 1e-5);
      EXPECT_LT(weight, 1e-5);
    }
  {
    std::ofstream corpus(tmp.file("corpus.txt"));
    corpus << "a small corpus line for the tiny model\nanother line of text\n";
  }
  const auto t5 = tmp.file("t5");
  auto p = emoe::test::run_emoe(
      "pretrain --set arch=t5 --set hidden=64 --set layers=2 --set heads=4 --set intermediate=128 "
      "--set tokenizer=" +
      tok + " --set corpus=" + tmp.file("corpus.txt") +
      " --set steps=1 --set batch_size=2 --set max_length=16 --set threads=1 --set output=" + t5);
  ASSERT_EQ(p.exit_code, 0) << p.err;
  const auto s2s = [&](const std::string& out, const std::string& level) {
    return emoe::test::run_emoe(
        "train --set model=" + t5 + " --set objective=seq2seq --set method=lora --set data_dir=" +
        emoe::test::shared_path("data") +
        " --set 'mixture={tasks: [sst2, mrpc], rate: temperature, cap: 40}' --set 'heldout=[rte]'"
        " --set train.batch_size=8 --set train.max_steps=8 --set train.max_train_examples=40"
        " --set train.max_eval_examples=6 --set train.max_length=48 --set train.lr=3e-3"
        " --set train.log_every=1 --set threads=1 --set save_best=false --nproc 2 --sharding " +
        level + " -o " + out);
  };
  auto a = s2s(tmp.file("t5-none"), "none");
  ASSERT_EQ(a.exit_code, 0) << a.err;
  auto b = s2s(tmp.file("t5-full"), "full");
  ASSERT_EQ(b.exit_code, 0) << b.err;
  // encoder 2 + decoder 2 blocks, the relative position tables left whole
  EXPECT_NE(b.err.find("of the 4 blocks'"), std::string::npos) << b.err;
  const auto [loss, weight] = run_difference(tmp.file("t5-none"), tmp.file("t5-full"));
  EXPECT_LT(loss, 1e-5);
  EXPECT_LT(weight, 1e-5);
}

namespace {

// Two network namespaces of the test's own joined by a veth pair, 10.231.7.1 and 10.231.7.2:
// two hosts as far as the sockets can tell. Removed (with the pair) when it goes.
class TwoHosts {
 public:
  TwoHosts() {
    const std::string tag = std::to_string(getpid() % 100000);
    ns_ = {"emoe-a" + tag, "emoe-b" + tag};
    const std::string va = "eva" + tag, vb = "evb" + tag;
    const std::vector<std::string> steps = {"ip netns add " + ns_[0],
                                            "ip netns add " + ns_[1],
                                            "ip link add " + va + " type veth peer name " + vb,
                                            "ip link set " + va + " netns " + ns_[0],
                                            "ip link set " + vb + " netns " + ns_[1],
                                            "ip -n " + ns_[0] + " addr add 10.231.7.1/24 dev " + va,
                                            "ip -n " + ns_[1] + " addr add 10.231.7.2/24 dev " + vb,
                                            "ip -n " + ns_[0] + " link set " + va + " up",
                                            "ip -n " + ns_[1] + " link set " + vb + " up",
                                            "ip -n " + ns_[0] + " link set lo up",
                                            "ip -n " + ns_[1] + " link set lo up"};
    for (const auto& s : steps)
      if (std::system((s + " 2>/dev/null").c_str()) != 0) {
        why_ = "'" + s + "' failed (network namespaces need root or CAP_NET_ADMIN, and iproute2)";
        return;
      }
    ok_ = true;
  }
  ~TwoHosts() {
    for (const auto& n : ns_) std::system(("ip netns del " + n + " 2>/dev/null").c_str());
  }
  bool ok() const { return ok_; }
  const std::string& why() const { return why_; }
  // Starts `emoe ARGS` as rank `rank` of 2 in its namespace; stderr goes to err_file.
  pid_t start(int rank, const std::string& args, const std::string& err_file) const {
    pid_t pid = fork();
    if (pid == 0) {
      const auto cmd = fmt::format(
          "exec ip netns exec {} {} {} --rank {} --world-size 2 --master-addr 10.231.7.1 "
          "--master-port 29611 2>{} >/dev/null",
          ns_[static_cast<size_t>(rank)], emoe::test::emoe_binary(), args, rank, err_file);
      execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    return pid;
  }

 private:
  std::vector<std::string> ns_;
  bool ok_ = false;
  std::string why_;
};

int wait_exit_code(pid_t pid) {
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

std::string read_file_text(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

}  // namespace

// Two ranks on two network hosts (rendezvous by address and port, as on two machines), sharded
// at gradients: rank 1 is killed mid-run; rank 0 stops within the timeout naming the rank it
// lost; --resume on both hosts finishes with the weights of an uninterrupted one-process run.
TEST(Distributed, TwoHostsLoseARankAndResume) {
  EMOE_REQUIRE_SHARED(bert, "models/bert-mini");
  EMOE_REQUIRE_SHARED(data, "data/glue/SST-2");
  TwoHosts hosts;
  if (!hosts.ok()) GTEST_SKIP() << "two hosts not made here: " << hosts.why();
  emoe::test::TempDir tmp;
  const auto model = deterministic_bert(bert, tmp.file("bert"));
  const auto whole = tmp.file("whole"), run = tmp.file("two-hosts");
  auto r = emoe::test::run_emoe(train_args(model, "emoe", whole, 30, "--set threads=1"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string args =
      train_args(model, "emoe", run, 30,
                 "--set threads=1 --set train.save_every=2 --sharding gradients --dist-timeout 10");
  const pid_t r0 = hosts.start(0, args, run + ".err0");
  const pid_t r1 = hosts.start(1, args, run + ".err1");
  const auto t_start = std::chrono::steady_clock::now();
  while (emoe::test::train_losses(run).size() < 6 &&
         std::chrono::steady_clock::now() - t_start < std::chrono::seconds(120))
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ASSERT_GE(emoe::test::train_losses(run).size(), 6u) << read_file_text(run + ".err0");
  kill(r1, SIGKILL);
  const auto t_kill = std::chrono::steady_clock::now();
  wait_exit_code(r1);
  const int code0 = wait_exit_code(r0);
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t_kill).count();
  const std::string err0 = read_file_text(run + ".err0");
  EXPECT_EQ(code0, 1) << err0;
  EXPECT_NE(err0.find("rank 0 of 2"), std::string::npos) << err0;
  EXPECT_NE(err0.find("lost: rank 1 at 10.231.7.2"), std::string::npos) << err0;
  EXPECT_LT(secs, 30.0);
  std::cout << fmt::format("[ 2 hosts  ] rank 0 stopped {:.1f} s after rank 1 was killed: {}\n",
                           secs, err0.substr(err0.find("distributed:")).substr(0, 200));
  // both hosts again, from the last checkpoint
  const pid_t a0 = hosts.start(0, args + " --resume", run + ".err0");
  const pid_t a1 = hosts.start(1, args + " --resume", run + ".err1");
  const int c1 = wait_exit_code(a1), c0 = wait_exit_code(a0);
  ASSERT_EQ(c0, 0) << read_file_text(run + ".err0");
  ASSERT_EQ(c1, 0) << read_file_text(run + ".err1");
  const auto [loss, weight] = run_difference(whole, run);
  EXPECT_LT(loss, 1e-5);
  EXPECT_LT(weight, 1e-5);
}
