// EDiT's synchronisation across real ranks (dist/edit.h), against hand computations in double: plain
// averaging leaves every replica at the mean of the replicas, the outer optimizer is Nesterov SGD on the
// averaged pseudo-gradient, the norm weights and the clip act per layer, and an anomalous replica is
// left out. Each case runs with one rank per replica and, on 4 ranks, with shard groups of 2 (every
// layer's norm then spans two ranks' shards).
#include <gtest/gtest.h>

#include <cmath>

#include "dist/edit.h"
#include "nn/module.h"
#include "tensor/derive_seed.h"
#include "tensor/random.h"
#include "tests/mpi/mpi_world.h"

namespace lt {
namespace {

using mpi_test::world;

// Three layers of uneven sizes, so layer and shard boundaries fall at different places, and a buffer.
class ThreeLayers : public Module {
 public:
  ThreeLayers() {
    add_parameter("layers.0.w", Tensor::zeros({37}), true);
    add_parameter("layers.0.b", Tensor::zeros({5}), false);
    add_parameter("layers.1.w", Tensor::zeros({70}), true);
    add_parameter("head.w", Tensor::zeros({20}), true);
    add_buffer("layers.0.stats", Tensor::zeros({3}, DType::F64));
  }
};

// A full flat buffer of random parameter values (padding zero) from `seed`, scaled.
std::vector<float> make_values(const FlatParameters& p, uint64_t seed, double scale = 1.0) {
  Rng rng(seed);
  Tensor t = Tensor::zeros({p.numel()});
  for (const FlatParameters::ParameterRange& param : p.parameters())
    t.narrow(param.range.begin, param.range.size()).copy_from(Tensor::randn({param.range.size()}, rng, scale));
  return t.to_vector<float>();
}
void load(FlatParameters& p, const std::vector<float>& v) {
  p.values().copy_from(Tensor::from_vector<float>({p.numel()}, v));
}

// The world as a mesh of replicas of `shards` ranks, with its model, flat parameters and Edit.
struct Mesh {
  ThreeLayers model;
  std::unique_ptr<FlatParameters> params;
  std::unique_ptr<Edit> edit;
  Mesh(int shards, EditSettings settings) {
    settings.shard_group = shards;
    EditMesh edit_mesh = EditMesh::build(*world, shards);
    params = std::make_unique<FlatParameters>(model.parameters(), shards);
    edit = std::make_unique<Edit>(std::move(edit_mesh), settings, *params, model);
  }
  int replicas() const { return edit->mesh().replicas(); }
  int replica() const { return edit->mesh().replica(); }
};

std::vector<int> shard_group_sizes() {
  std::vector<int> sizes = {1};
  if (world->size() == 4) sizes.push_back(2);
  return sizes;
}

// Every element within a relative 1e-5 of the hand computation.
void expect_close(const std::vector<float>& got, const std::vector<double>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], want[i], 1e-5 * (1 + std::abs(want[i]))) << what << ", element " << i;
}

// Every rank's full buffer bit-identical: the replicas left the sync as one model.
void expect_same_on_every_rank(FlatParameters& p) {
  Tensor all = Tensor::empty({p.numel() * world->size()});
  world->all_gather(p.values(), all);
  const std::vector<float> v = all.to_vector<float>();
  for (int r = 1; r < world->size(); ++r)
    for (int64_t i = 0; i < p.numel(); ++i)
      ASSERT_EQ(v[static_cast<size_t>(r * p.numel() + i)], v[static_cast<size_t>(i)]) << "rank " << r << " element " << i;
}

TEST(EditSync, PlainAveragingLeavesEveryReplicaAtTheMean) {
  for (int shards : shard_group_sizes()) {
    Mesh s(shards, EditSettings{});
    const std::vector<float> start = make_values(*s.params, 100);
    load(*s.params, start);
    s.edit->sync(0);  // takes the anchor
    EXPECT_TRUE(s.edit->has_anchor());
    load(*s.params, make_values(*s.params, 200 + s.replica()));
    const SyncReport report = s.edit->sync(3);
    EXPECT_EQ(report.layers, 3);
    std::vector<double> mean(start.size(), 0.0);
    for (int m = 0; m < s.replicas(); ++m) {
      const std::vector<float> theta = make_values(*s.params, 200 + m);
      for (size_t i = 0; i < mean.size(); ++i) mean[i] += theta[i] / s.replicas();
    }
    expect_close(s.params->values().to_vector<float>(), mean, "shard group " + std::to_string(shards));
    expect_same_on_every_rank(*s.params);
  }
}

TEST(EditSync, OuterSgdIsNesterovMomentumOnTheMeanPseudoGradient) {
  for (int shards : shard_group_sizes()) {
    EditSettings settings;
    settings.outer_sgd = true;
    settings.outer = {0.7, 0.8, true};
    Mesh s(shards, settings);
    const std::vector<float> start = make_values(*s.params, 300);
    load(*s.params, start);
    s.edit->sync(0);
    std::vector<double> anchor(start.begin(), start.end()), momentum(start.size(), 0.0);
    for (int round = 0; round < 2; ++round) {
      load(*s.params, make_values(*s.params, 400 + 10 * round + s.replica()));
      s.edit->sync(5);
      std::vector<double> delta(anchor.size(), 0.0);
      for (int m = 0; m < s.replicas(); ++m) {
        const std::vector<float> theta = make_values(*s.params, 400 + 10 * round + m);
        for (size_t i = 0; i < delta.size(); ++i) delta[i] += (anchor[i] - theta[i]) / s.replicas();
      }
      // torch.optim.SGD(nesterov=True): buf = g on the first step, then momentum buf + g; step g + momentum buf.
      for (size_t i = 0; i < anchor.size(); ++i) {
        momentum[i] = round == 0 ? delta[i] : 0.8 * momentum[i] + delta[i];
        anchor[i] -= 0.7 * (delta[i] + 0.8 * momentum[i]);
      }
      expect_close(s.params->values().to_vector<float>(), anchor,
                   "shard group " + std::to_string(shards) + ", round " + std::to_string(round));
      expect_same_on_every_rank(*s.params);
    }
  }
}

TEST(EditSync, NormWeightsAndTheClipActPerLayer) {
  for (int shards : shard_group_sizes()) {
    EditSettings settings;
    settings.weight_by_norm = true;
    settings.temperature = 2.0;
    settings.clip_pseudo_grad = 1.5;
    Mesh s(shards, settings);
    const std::vector<float> start = make_values(*s.params, 500);
    load(*s.params, start);
    s.edit->sync(0);
    // Replicas move by different amounts, so their weights differ.
    auto theta_of = [&](int m) {
      std::vector<float> theta = make_values(*s.params, 600 + m, 0.1 * (m + 1));
      for (size_t i = 0; i < theta.size(); ++i) theta[i] += start[i];
      return theta;
    };
    load(*s.params, theta_of(s.replica()));
    s.edit->sync(1);
    std::vector<double> want(start.begin(), start.end());
    for (const FlatParameters::Range& layer : s.params->layers()) {
      std::vector<std::vector<double>> deltas;
      std::vector<double> norms;
      for (int m = 0; m < s.replicas(); ++m) {
        const std::vector<float> theta = theta_of(m);
        std::vector<double> d;
        double sq = 0;
        for (int64_t i = layer.begin; i < layer.end; ++i) {
          d.push_back(static_cast<double>(start[static_cast<size_t>(i)]) - theta[static_cast<size_t>(i)]);
          sq += d.back() * d.back();
        }
        deltas.push_back(d);
        norms.push_back(std::sqrt(sq));
      }
      double weight_sum = 0;
      std::vector<double> w;
      for (double g : norms) weight_sum += w.emplace_back(std::exp(-g / 2.0));
      std::vector<double> reduced(static_cast<size_t>(layer.size()), 0.0);
      double reduced_sq = 0;
      for (size_t i = 0; i < reduced.size(); ++i) {
        for (int m = 0; m < s.replicas(); ++m) reduced[i] += w[static_cast<size_t>(m)] / weight_sum * deltas[static_cast<size_t>(m)][i];
        reduced_sq += reduced[i] * reduced[i];
      }
      const double clip = std::min(1.0, 1.5 / (std::sqrt(reduced_sq) + 1e-6));
      for (size_t i = 0; i < reduced.size(); ++i) want[static_cast<size_t>(layer.begin) + i] -= clip * reduced[i];
    }
    expect_close(s.params->values().to_vector<float>(), want, "shard group " + std::to_string(shards));
    expect_same_on_every_rank(*s.params);
  }
}

TEST(EditSync, AnOutlyingReplicaIsLeftOut) {
  for (int shards : shard_group_sizes()) {
    EditSettings settings;
    settings.skip_anomaly = true;
    settings.detector = {0.5, 3, 3.0};  // a fast EWMA, judging from the fourth sync on
    Mesh s(shards, settings);
    load(*s.params, make_values(*s.params, 700));
    s.edit->sync(0);
    SyncReport report;
    // Four quiet rounds, then replica 0 jumps 300 times as far.
    for (int round = 0; round < 5; ++round) {
      const std::vector<float> anchor = s.params->values().to_vector<float>();
      auto theta_of = [&](int m) {
        const double scale = (round == 4 && m == 0) ? 3.0 : 0.01;
        std::vector<float> theta = make_values(*s.params, 800 + 10 * round + m, scale);
        for (size_t i = 0; i < theta.size(); ++i) theta[i] += anchor[i];
        return theta;
      };
      load(*s.params, theta_of(s.replica()));
      report = s.edit->sync(1);
      if (round < 4) continue;
      std::vector<double> want(anchor.begin(), anchor.end());
      for (int m = 1; m < s.replicas(); ++m) {
        const std::vector<float> theta = theta_of(m);
        for (size_t i = 0; i < want.size(); ++i) want[i] -= (static_cast<double>(anchor[i]) - theta[i]) / (s.replicas() - 1);
      }
      expect_close(s.params->values().to_vector<float>(), want, "shard group " + std::to_string(shards));
    }
    EXPECT_EQ(report.dropped, 3) << "replica 0 dropped in each of the 3 layers, no other";
    EXPECT_EQ(report.skipped_layers, 0);
    expect_same_on_every_rank(*s.params);
  }
}

// Replicas that are expert-parallel groups (4 ranks: 2 replicas of 2): layers.0.w stands for the routed
// experts, different on the two ranks of a replica; the rest is replicated. A layer's pseudo-gradient
// norm, for its weight and for the clip, is the whole layer's: its replicated part once and every rank's
// experts, so layer 0 (experts and a replicated bias) weighs alike on both ranks of a replica, whose
// replicated values stay one.
TEST(EditSync, ExpertParallelReplicasWeighWholeLayers) {
  if (world->size() != 4) GTEST_SKIP() << "2 replicas of 2 expert-parallel ranks need 4 ranks";
  const int G = 2, g = world->rank() % G;
  EditSettings settings;
  settings.weight_by_norm = true;
  settings.temperature = 2.0;
  settings.clip_pseudo_grad = 1.5;
  ThreeLayers model;
  FlatParameters params(model.parameters(), 1);
  const FlatParameters::Range experts = params.parameters()[0].range;  // layers.0.w
  Edit edit(EditMesh::build(*world, 1, G), settings, params, model, {experts});
  ASSERT_EQ(edit.mesh().replicas(), 2);
  auto in_experts = [&](int64_t i) { return i >= experts.begin && i < experts.end; };
  // Replica m's rank k of the group: replicated values of replica m, experts of (m, k).
  auto values_of = [&](uint64_t seed, int m, int k, double scale) {
    const std::vector<float> shared = make_values(params, seed + static_cast<uint64_t>(m), scale);
    const std::vector<float> own = make_values(params, seed + 100 + static_cast<uint64_t>(2 * m + k), scale);
    std::vector<float> v = shared;
    for (int64_t i = experts.begin; i < experts.end; ++i) v[static_cast<size_t>(i)] = own[static_cast<size_t>(i)];
    return v;
  };
  // The start: the replicas agree, each rank of a replica its own experts.
  const std::vector<float> start = values_of(500, 0, g, 1.0);
  load(params, start);
  edit.sync(0);
  auto theta_of = [&](int m, int k) {
    std::vector<float> theta = values_of(600, m, k, 0.1 * (m + 1));
    const std::vector<float> base = values_of(500, 0, k, 1.0);
    for (size_t i = 0; i < theta.size(); ++i) theta[i] += base[i];
    return theta;
  };
  load(params, theta_of(edit.mesh().replica(), g));
  edit.sync(1);

  std::vector<double> want(start.begin(), start.end());
  for (const FlatParameters::Range& layer : params.layers()) {
    // Per replica m, the deltas of both ranks (the replicated elements the same on both).
    std::vector<std::vector<std::vector<double>>> deltas(2, std::vector<std::vector<double>>(G));
    std::vector<double> norms;
    for (int m = 0; m < 2; ++m) {
      double sq = 0;
      for (int k = 0; k < G; ++k) {
        const std::vector<float> base = values_of(500, 0, k, 1.0), theta = theta_of(m, k);
        for (int64_t i = layer.begin; i < layer.end; ++i) {
          const double d = static_cast<double>(base[static_cast<size_t>(i)]) - theta[static_cast<size_t>(i)];
          deltas[m][k].push_back(d);
          if (in_experts(i) || k == 0) sq += d * d;
        }
      }
      norms.push_back(std::sqrt(sq));
    }
    const double w0 = std::exp(-norms[0] / 2.0), w1 = std::exp(-norms[1] / 2.0);
    std::vector<std::vector<double>> reduced(G);
    double reduced_sq = 0;
    for (int k = 0; k < G; ++k)
      for (int64_t i = layer.begin; i < layer.end; ++i) {
        const size_t at = static_cast<size_t>(i - layer.begin);
        reduced[k].push_back((w0 * deltas[0][k][at] + w1 * deltas[1][k][at]) / (w0 + w1));
        if (in_experts(i) || k == 0) reduced_sq += reduced[k].back() * reduced[k].back();
      }
    const double clip = std::min(1.0, 1.5 / (std::sqrt(reduced_sq) + 1e-6));
    for (int64_t i = layer.begin; i < layer.end; ++i)
      want[static_cast<size_t>(i)] -= clip * reduced[g][static_cast<size_t>(i - layer.begin)];
  }
  expect_close(params.values().to_vector<float>(), want, "expert-parallel replicas");
}

}  // namespace
}  // namespace lt
