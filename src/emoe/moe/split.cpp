// Expert construction: balanced k-means with an exact min-cost-flow assignment, and the
// random, contiguous and co-activation (METIS) baselines.
#include "emoe/moe/split.h"

#include <lemon/network_simplex.h>
#include <lemon/smart_graph.h>
#include <metis.h>
#include <torch/torch.h>

#include <chrono>
#include <numeric>
#include <random>

#include "emoe/core/error.h"

namespace emoe {

namespace {

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

at::Tensor normalized(const at::Tensor& keys) {
  auto k = keys.detach().to(torch::kCPU).to(torch::kDouble);
  return k / k.norm(2, 1, true).clamp_min(1e-12);
}

// Greedy k-means++ (scikit-learn's _kmeans_plusplus with 2 + log(k) local trials). Sampling
// needs one pass over the data per centre, so it runs in float32 with the row norms computed once.
at::Tensor kmeans_pp(const at::Tensor& x, int64_t k, std::mt19937_64& rng) {
  const int64_t n = x.size(0);
  const int64_t trials = 2 + static_cast<int64_t>(std::log(static_cast<double>(k)));
  auto xf = x.to(torch::kFloat);
  auto xnorm = xf.pow(2).sum(1);               // [n]
  auto dist_to = [&](const at::Tensor& idx) {  // [m, n] squared distances to rows idx
    auto c = xf.index_select(0, idx);
    return (xnorm.index_select(0, idx).unsqueeze(1) + xnorm.unsqueeze(0) - 2.0 * c.matmul(xf.t()))
        .clamp_min(0.0)
        .to(torch::kDouble);
  };
  std::uniform_int_distribution<int64_t> first(0, n - 1);
  std::uniform_real_distribution<double> unif(0.0, 1.0);
  std::vector<int64_t> chosen = {first(rng)};
  auto closest = dist_to(torch::tensor({chosen[0]}, torch::kLong)).squeeze(0);  // [n]
  double pot = closest.sum().item<double>();
  for (int64_t c = 1; c < k; ++c) {
    auto cum = closest.cumsum(0);
    auto* cp = cum.data_ptr<double>();
    std::vector<int64_t> cand;
    for (int64_t t = 0; t < trials; ++t) {
      double r = unif(rng) * pot;
      int64_t idx = std::lower_bound(cp, cp + n, r) - cp;
      cand.push_back(std::min(idx, n - 1));
    }
    auto d = dist_to(torch::tensor(cand, torch::kLong));         // [trials, n]
    auto new_closest = torch::minimum(d, closest.unsqueeze(0));  // [trials, n]
    auto pots = new_closest.sum(1);
    int64_t best = pots.argmin().item<int64_t>();
    chosen.push_back(cand[best]);
    closest = new_closest[best];
    pot = pots[best].item<double>();
  }
  return x.index_select(0, torch::tensor(chosen, torch::kLong)).clone();
}

at::Tensor centres_of(const at::Tensor& x, const std::vector<int64_t>& assign, int64_t k) {
  auto idx = torch::tensor(assign, torch::kLong);
  auto sums = torch::zeros({k, x.size(1)}, x.options()).index_add_(0, idx, x);
  auto counts =
      torch::zeros({k}, x.options()).index_add_(0, idx, torch::ones({x.size(0)}, x.options()));
  return sums / counts.clamp_min(1.0).unsqueeze(1);
}

}  // namespace

void check_expert_count(int64_t d_ff, int64_t experts, const std::string& what) {
  if (experts > 0 && experts <= d_ff && d_ff % experts == 0) return;
  std::vector<int64_t> valid;
  for (int64_t n = 1; n <= d_ff; ++n)
    if (d_ff % n == 0) valid.push_back(n);
  EMOE_THROW(InputError, "{}: d_ff {} is not divisible by N = {} experts; valid N: {}", what, d_ff,
             experts, fmt::join(valid, " "));
}

// GCC 12 warns that a LEMON node or arc "may be used uninitialized" when SmartDigraph's
// addNode/addArc are inlined here (std::vector<NodeT>::emplace_back of LEMON's own types): a
// false positive inside the library, silenced for this function alone.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
std::vector<int64_t> balanced_assignment(const at::Tensor& cost, int64_t capacity) {
  const int64_t p = cost.size(0), k = cost.size(1);
  EMOE_CHECK(p == k * capacity, InputError, "balanced assignment: {} points for {} x {} slots", p,
             k, capacity);
  auto c = cost.to(torch::kCPU).to(torch::kDouble);
  // Integer costs keep the network simplex exact; the scale keeps ~9 significant digits.
  double maxc = c.abs().max().item<double>();
  double scale = maxc > 0 ? 1e9 / maxc : 1.0;
  auto ci = (c * scale).round().to(torch::kLong).contiguous();
  const int64_t* cp = ci.data_ptr<int64_t>();

  // Column generation: solve on a sparse set of arcs (each point's nearest clusters plus a
  // greedy feasible assignment), then add every arc whose reduced cost under the optimal
  // potentials is negative, until none is. The result is optimal for the full bipartite graph.
  const int64_t near = std::min<int64_t>(k, 8);
  auto arcs = torch::zeros({p, k}, torch::kBool);
  arcs.scatter_(1, std::get<1>(ci.topk(near, 1, /*largest=*/false)), true);
  {
    auto order = ci.view({-1}).argsort();
    const int64_t* op = order.data_ptr<int64_t>();
    std::vector<int64_t> fill(k, 0);
    std::vector<char> done(p, 0);
    auto* ap = arcs.data_ptr<bool>();
    for (int64_t n = 0, placed = 0; n < p * k && placed < p; ++n) {
      int64_t i = op[n] / k, j = op[n] % k;
      if (done[i] || fill[j] == capacity) continue;
      done[i] = 1, fill[j]++, placed++;
      ap[i * k + j] = true;
    }
  }
  using Simplex = lemon::NetworkSimplex<lemon::SmartDigraph, int64_t, int64_t>;
  for (int round = 0;; ++round) {
    lemon::SmartDigraph g;
    const int64_t narcs = arcs.sum().item<int64_t>();
    g.reserveNode(static_cast<int>(p + k));
    g.reserveArc(static_cast<int>(narcs));
    std::vector<lemon::SmartDigraph::Node> pts(p), cls(k);
    for (auto& n : pts) n = g.addNode();
    for (auto& n : cls) n = g.addNode();
    lemon::SmartDigraph::ArcMap<int64_t> arc_cost(g);
    lemon::SmartDigraph::NodeMap<int64_t> supply(g);
    for (int64_t i = 0; i < p; ++i) supply[pts[i]] = 1;
    for (int64_t j = 0; j < k; ++j) supply[cls[j]] = -capacity;
    const bool* ap = arcs.data_ptr<bool>();
    for (int64_t i = 0; i < p; ++i)
      for (int64_t j = 0; j < k; ++j)
        if (ap[i * k + j]) arc_cost[g.addArc(pts[i], cls[j])] = cp[i * k + j];
    Simplex ns(g);
    ns.costMap(arc_cost).supplyMap(supply);
    const bool optimal = ns.run() == Simplex::OPTIMAL;
    EMOE_CHECK(optimal, RuntimeError, "balanced assignment: min-cost flow did not find an optimum");
    // reduced cost of arc (i -> j): cost + pi(i) - pi(j); optimal when >= 0 for every arc
    auto pi_p = torch::empty({p}, torch::kLong), pi_c = torch::empty({k}, torch::kLong);
    for (int64_t i = 0; i < p; ++i) pi_p[i] = ns.potential(pts[i]);
    for (int64_t j = 0; j < k; ++j) pi_c[j] = ns.potential(cls[j]);
    auto reduced = ci + pi_p.unsqueeze(1) - pi_c.unsqueeze(0);
    auto violating = torch::logical_and(reduced < 0, arcs.logical_not());
    if (!violating.any().item<bool>()) {
      std::vector<int64_t> assign(p, -1);
      for (int64_t i = 0; i < p; ++i)
        for (lemon::SmartDigraph::OutArcIt a(g, pts[i]); a != lemon::INVALID; ++a)
          if (ns.flow(a) > 0) assign[i] = g.id(g.target(a)) - p;
      return assign;
    }
    arcs = torch::logical_or(arcs, violating);
  }
}
#pragma GCC diagnostic pop

double split_inertia(const at::Tensor& keys, const std::vector<int64_t>& assignment,
                     int64_t experts) {
  auto x = normalized(keys);
  auto c = centres_of(x, assignment, experts);
  auto idx = torch::tensor(assignment, torch::kLong);
  return (x - c.index_select(0, idx)).pow(2).sum().item<double>();
}

SplitResult split_from_assignment(const std::vector<int64_t>& assignment, int64_t experts,
                                  const at::Tensor& keys, const std::string& method) {
  SplitResult r;
  r.method = method;
  r.experts = experts;
  r.assignment = assignment;
  r.cluster_sizes.assign(experts, 0);
  for (auto a : assignment) r.cluster_sizes.at(a)++;
  std::vector<int64_t> order(assignment.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return assignment[a] < assignment[b]; });
  r.permutation = order;
  if (keys.defined()) r.inertia = split_inertia(keys, assignment, experts);
  return r;
}

SplitResult balanced_kmeans(const at::Tensor& keys, int64_t experts, const KMeansOptions& o) {
  const double t0 = now_seconds();
  const int64_t n = keys.size(0);
  check_expert_count(n, experts, "balanced k-means");
  EMOE_CHECK(o.restarts >= 1 && o.max_iter >= 1 && o.tol >= 0, UsageError,
             "balanced k-means: restarts and max_iter must be >= 1 and tol >= 0");
  const int64_t cap = n / experts;
  auto x = normalized(keys);
  const double tol = x.var(0, /*unbiased=*/false).mean().item<double>() * o.tol;
  const auto xnorm = x.pow(2).sum(1);
  SplitResult best;
  double best_inertia = std::numeric_limits<double>::infinity();
  for (int64_t r = 0; r < o.restarts; ++r) {
    std::mt19937_64 rng(o.seed * 1000003ull + static_cast<uint64_t>(r));
    double ti = now_seconds();
    auto centres = kmeans_pp(x, experts, rng);
    spdlog::debug("balanced k-means restart {}: k-means++ init {:.2f} s", r, now_seconds() - ti);
    std::vector<int64_t> assign;
    int64_t it = 0;
    for (; it < o.max_iter; ++it) {
      double ta = now_seconds();
      auto dist =
          (xnorm.unsqueeze(1) + centres.pow(2).sum(1).unsqueeze(0) - 2.0 * x.matmul(centres.t()))
              .clamp_min(0.0);
      double tb = now_seconds();
      auto next = balanced_assignment(dist, cap);
      spdlog::debug("  iteration {}: distances {:.2f} s, assignment {:.2f} s", it, tb - ta,
                    now_seconds() - tb);
      auto new_centres = centres_of(x, next, experts);
      double shift = (new_centres - centres).pow(2).sum().item<double>();
      bool same = next == assign;
      assign = std::move(next);
      centres = new_centres;
      if (same || shift <= tol) {
        ++it;
        break;
      }
    }
    auto idx = torch::tensor(assign, torch::kLong);
    double inertia = (x - centres.index_select(0, idx)).pow(2).sum().item<double>();
    if (inertia < best_inertia) {
      best_inertia = inertia;
      best = split_from_assignment(assign, experts, at::Tensor(), "balanced-kmeans");
      best.inertia = inertia;
      best.iterations = it;
    }
  }
  best.restarts = o.restarts;
  best.seconds = now_seconds() - t0;
  return best;
}

SplitResult random_split(const at::Tensor& keys, int64_t experts, uint64_t seed) {
  const double t0 = now_seconds();
  const int64_t n = keys.size(0);
  check_expert_count(n, experts, "random split");
  std::vector<int64_t> perm(n);
  std::iota(perm.begin(), perm.end(), 0);
  std::mt19937_64 rng(seed);
  std::shuffle(perm.begin(), perm.end(), rng);
  // contiguous chunks of a random permutation
  std::vector<int64_t> assign(n);
  for (int64_t pos = 0; pos < n; ++pos) assign[perm[pos]] = pos / (n / experts);
  auto r = split_from_assignment(assign, experts, keys, "random");
  r.seconds = now_seconds() - t0;
  return r;
}

SplitResult contiguous_split(const at::Tensor& keys, int64_t experts) {
  const int64_t n = keys.size(0);
  check_expert_count(n, experts, "contiguous split");
  std::vector<int64_t> assign(n);
  for (int64_t i = 0; i < n; ++i) assign[i] = i / (n / experts);
  return split_from_assignment(assign, experts, keys, "contiguous");
}

SplitResult coactivation_split(const at::Tensor& active, const at::Tensor& keys, int64_t experts,
                               uint64_t seed, int64_t neighbours) {
  const double t0 = now_seconds();
  const int64_t n = active.size(1);
  check_expert_count(n, experts, "co-activation split");
  EMOE_CHECK(active.size(0) > 0, InputError, "co-activation split: no sample activations");
  auto a = (active.detach().to(torch::kCPU) != 0).to(torch::kFloat);
  auto co = a.t().matmul(a);  // [n, n] co-activation counts
  co.fill_diagonal_(0.0);
  const int64_t m = std::min<int64_t>(neighbours, n - 1);
  // Keep each neuron's m strongest edges, symmetrised, so METIS sees a sparse graph.
  auto top = std::get<1>(co.topk(m, 1));
  auto keep = torch::zeros({n, n}, torch::kBool).scatter_(1, top, true);
  keep = torch::logical_or(keep, keep.t());
  auto w = (co * keep.to(torch::kFloat)).round().to(torch::kLong).contiguous();
  keep = torch::logical_and(keep, w > 0);
  std::vector<idx_t> xadj = {0}, adjncy, adjwgt;
  auto kp = keep.contiguous();
  const bool* kd = kp.data_ptr<bool>();
  const int64_t* wd = w.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < n; ++j)
      if (kd[i * n + j]) {
        adjncy.push_back(static_cast<idx_t>(j));
        adjwgt.push_back(static_cast<idx_t>(std::min<int64_t>(wd[i * n + j], 1 << 30)));
      }
    xadj.push_back(static_cast<idx_t>(adjncy.size()));
  }
  std::vector<idx_t> part(n, 0);
  if (experts > 1) {
    idx_t nv = static_cast<idx_t>(n), ncon = 1, nparts = static_cast<idx_t>(experts), objval = 0;
    idx_t options[METIS_NOPTIONS];
    METIS_SetDefaultOptions(options);
    options[METIS_OPTION_SEED] = static_cast<idx_t>(seed % 1000000);
    options[METIS_OPTION_UFACTOR] = 1;  // 0.1 % imbalance, the tightest METIS allows
    int rc = METIS_PartGraphKway(&nv, &ncon, xadj.data(), adjncy.data(), nullptr, nullptr,
                                 adjwgt.empty() ? nullptr : adjwgt.data(), &nparts, nullptr,
                                 nullptr, options, &objval, part.data());
    EMOE_CHECK(rc == METIS_OK, RuntimeError, "co-activation split: METIS failed with code {}", rc);
  }
  // Rebalance to exactly n/N: move the neurons least tied to their part out of oversized parts
  // into the undersized part they are most tied to.
  const int64_t cap = n / experts;
  std::vector<int64_t> assign(part.begin(), part.end()), sizes(experts, 0);
  for (auto p : assign) sizes[p]++;
  auto tie = [&](int64_t i, int64_t p) {
    double s = 0;
    for (idx_t e = xadj[i]; e < xadj[i + 1]; ++e)
      if (assign[adjncy[e]] == p) s += adjwgt[e];
    return s;
  };
  for (int64_t p = 0; p < experts; ++p) {
    while (sizes[p] > cap) {
      int64_t best_i = -1, best_q = -1;
      double best_gain = -std::numeric_limits<double>::infinity();
      for (int64_t i = 0; i < n; ++i) {
        if (assign[i] != p) continue;
        double own = tie(i, p);
        for (int64_t q = 0; q < experts; ++q) {
          if (sizes[q] >= cap) continue;
          double gain = tie(i, q) - own;
          if (gain > best_gain) best_gain = gain, best_i = i, best_q = q;
        }
      }
      assign[best_i] = best_q;
      sizes[p]--;
      sizes[best_q]++;
    }
  }
  auto r = split_from_assignment(assign, experts, keys, "coactivation");
  r.seconds = now_seconds() - t0;
  return r;
}

}  // namespace emoe
