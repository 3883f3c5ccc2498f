#include "trainer/plan.h"

#include <algorithm>
#include <initializer_list>
#include <vector>

#include "nn/normhead.h"
#include "tensor/allocator.h"
#include "tensor/error.h"

namespace lt {
namespace {

constexpr int64_t kF32 = 4, kI32 = 4;

// The tensors a step keeps from the forward to the backward, per token: elements and bytes per element.
// Activations in the dtype they are kept in (bf16 under mixed precision: autograd/saved.h); the
// statistics that stay f32 (RMSNorm's rstd, attention's log-sum-exp, the router's probabilities); 32-bit
// ids. Each is one allocation of the caching allocator, which hands out its size class.
struct Kept {
  int64_t per_token, element_bytes;
};

std::vector<Kept> kept_tensors(const LingConfig& c, int64_t act) {
  const int64_t H = c.hidden_size, D = c.resolved_head_dim(), Hq = c.num_attention_heads,
                Hkv = c.num_key_value_heads, E = c.num_experts, k = c.num_experts_per_tok,
                I = c.moe_intermediate_size, shared = c.moe_intermediate_size * c.num_shared_experts;
  std::vector<Kept> kept = {{1, kI32}};  // the token ids (the embedding's backward)
  for (int64_t layer = 0; layer < c.num_hidden_layers; ++layer) {
    // Attention: the layer's input and its norm (the QKV projection's input) with the norm's rstd, q k v,
    // the output (the dense projection's input) and the log-sum-exp per head, then the residual sum and
    // its norm (the MLP's input).
    for (const Kept& t : std::initializer_list<Kept>{{H, act}, {1, kF32}, {H, act}, {(Hq + 2 * Hkv) * D, act},
                                                      {Hq * D, act}, {Hq, kF32}, {H, act}, {1, kF32}, {H, act}})
      kept.push_back(t);
    if (c.is_moe_layer(layer)) {
      // The router's probabilities, lse and k weights; the k expert ids and the dispatch's two orders; the
      // experts' gate_up rows (the SwiGLU's input); the shared experts' gate_up and SwiGLU output.
      for (const Kept& t : std::initializer_list<Kept>{{E, kF32}, {1, kF32}, {k, kF32}, {k, kI32}, {k, kI32},
                                                        {k, kI32}, {k * 2 * I, act}})
        kept.push_back(t);
      if (shared > 0) {
        kept.push_back({2 * shared, act});
        kept.push_back({shared, act});
      }
    } else {
      kept.push_back({2 * c.intermediate_size, act});  // the dense MLP's gate_up and SwiGLU output
      kept.push_back({c.intermediate_size, act});
    }
  }
  // The final norm's input, rstd and output (the head's input); the loss's log-sum-exp per token.
  for (const Kept& t : std::initializer_list<Kept>{{H, act}, {1, kF32}, {H, act}, {1, kF32}}) kept.push_back(t);
  return kept;
}

// What the caching allocator holds for a tensor of `bytes` (tensor/allocator.h: its size class).
int64_t allocated(int64_t bytes) {
  return static_cast<int64_t>(CachingAllocator::size_class(static_cast<size_t>(bytes)));
}

int64_t moe_layers(const LingConfig& c) { return static_cast<int64_t>(c.moe_layer_indices().size()); }

int64_t routed_expert_params(const LingConfig& c) {
  return moe_layers(c) * c.num_experts * 3 * c.moe_intermediate_size * c.hidden_size;  // gate_up [2I, H], down [H, I]
}

// What an all-reduce of n elements sends from one rank of `ranks` (dist/communicator.cpp: every element
// it does not own once, its owned part to each other rank).
int64_t all_reduce_bytes(int64_t n, int64_t ranks, int64_t element) {
  if (ranks <= 1) return 0;
  const int64_t mine = n / ranks;
  return ((n - mine) + mine * (ranks - 1)) * element;
}

void check_layout(const LingConfig& c, const PlanLayout& l) {
  LT_CHECK(l.ranks >= 1 && l.expert_parallel >= 1 && l.shard_group >= 1 && l.sync_interval >= 1,
           "plan: --ranks, --expert-parallel, --shard-group and --sync-interval must be >= 1");
  LT_CHECK(l.ranks % l.expert_parallel == 0, "plan: --expert-parallel ", l.expert_parallel,
           " does not divide the ranks (", l.ranks, ")");
  if (l.expert_parallel > 1) {
    LT_CHECK(c.num_experts > 0, "plan: ", c.name, " has no routed experts to split (--expert-parallel ",
             l.expert_parallel, ")");
    LT_CHECK(c.num_experts % l.expert_parallel == 0, "plan: ", c.name, "'s ", c.num_experts,
             " experts per layer do not split over --expert-parallel ", l.expert_parallel);
  }
  if (l.edit) {
    LT_CHECK(l.ranks % l.shard_group == 0, "plan: --shard-group ", l.shard_group, " does not divide the ranks (",
             l.ranks, ")");
    LT_CHECK(l.expert_parallel == 1 || l.shard_group == 1, "plan: under EDiT an expert-parallel group is one "
             "replica, not sharded further: --shard-group stays 1 with --expert-parallel");
  } else {
    LT_CHECK(l.shard_group == 1, "plan: --shard-group belongs to --dist edit");
  }
}

}  // namespace

Plan plan_training(const LingConfig& c, const PlanLayout& l, const PlanShape& s) {
  check_layout(c, l);
  Plan plan;
  plan.total_params = count_parameters(c).total;
  plan.routed_expert_params = routed_expert_params(c);
  const int64_t replicated = plan.total_params - plan.routed_expert_params;
  const int64_t ep = l.expert_parallel;
  // The ranks that hold one copy of the model: a data-parallel group (every rank of dp) or an EDiT replica
  // (its shard group, or its expert-parallel group).
  const int64_t group = !l.edit ? l.ranks : ep > 1 ? ep : l.shard_group;
  const int64_t expert_copies = group / ep;  // the ranks of the group holding one expert shard
  const int64_t experts_held = plan.routed_expert_params / ep;
  const int64_t params_held = replicated + experts_held;  // before parameter sharding
  const int64_t params_sharded = replicated / group + experts_held / expert_copies;

  // The weights, the gradients and AdamW's two moments are one flat buffer each (optim/flat_parameters.h).
  RankMemory& m = plan.memory;
  m.params = l.shard_params ? params_sharded : params_held;
  m.weights = allocated(kF32 * m.params);
  // ZeRO-2 (EDiT's replicas) shards the AdamW state but keeps a whole gradient buffer; ZeRO-3 shards all.
  m.gradients = allocated(kF32 * m.params);
  m.adamw = 2 * allocated(kF32 * (l.edit && ep == 1 && !l.shard_params ? params_sharded : m.params));
  // Under mixed precision a GPU keeps the weights' bf16 copy (Trainer::step); both devices keep the
  // activations in bf16 (a CPU with a bf16 GEMM, which --dtype bf16 needs there to take effect).
  const bool mixed = s.matmul_dtype == DType::BF16 && s.on_gpu;
  m.bf16_copy = mixed ? allocated(2 * m.params) : 0;
  const int64_t head_params = c.vocab_size * c.hidden_size;
  if (l.shard_params) {
    // The largest layer whole for its backward: its values and gradients (and its bf16 copy), a decoder layer
    // or the embeddings or the head.
    const int64_t layer_params = (replicated - 2 * head_params) / c.num_hidden_layers +
                                 plan.routed_expert_params / std::max<int64_t>(1, c.num_hidden_layers) / ep;
    m.gathered = (2 * kF32 + (mixed ? 2 : 0)) * std::max(layer_params, head_params);
  }
  const int64_t tokens = s.batch * s.seq, act_bytes = s.matmul_dtype == DType::BF16 ? 2 : kF32;
  for (const Kept& t : kept_tensors(c, act_bytes)) m.activations += allocated(tokens * t.per_token * t.element_bytes);
  // At the head: one chunk of logits (and of the normalised h) at a time; from there back the gradient of
  // the residual stream and the one being formed, [tokens, H] each in f32.
  const int64_t chunk_rows = std::min(tokens, head_rows_per_chunk(c.vocab_size, DType::F32, s.on_gpu));
  m.transient = allocated(kF32 * chunk_rows * c.vocab_size) + allocated(kF32 * chunk_rows * c.hidden_size) +
                2 * allocated(kF32 * tokens * c.hidden_size);

  StepTraffic& t = plan.traffic;
  // Parameter sharding, per micro-batch: each rank's part to the others of its group for the forward's and
  // the backward's gathers (the head once: it stays whole from its forward to its backward), the gradients
  // reduce-scattered back.
  auto sharded_traffic = [&] {
    const int64_t sent_per_pass =
        kF32 * (replicated / group * (group - 1) + experts_held / expert_copies * (expert_copies - 1));
    t.parameter_all_gather = 2 * sent_per_pass - kF32 * head_params / group * (group - 1);
    t.gradient_reduce_scatter = sent_per_pass;
  };
  if (!l.edit) {
    if (l.shard_params) {
      sharded_traffic();
    } else {
      t.gradient_all_reduce =
          all_reduce_bytes(replicated, l.ranks, kF32) + all_reduce_bytes(experts_held, expert_copies, kF32);
    }
  } else if (ep > 1) {
    // A replica is an expert-parallel group: its replicated parameters' gradients averaged over it every
    // step (or, sharded, its parts gathered and reduced); across replicas each rank's flat buffer goes with
    // its counterparts' (the ranks holding the same experts), every step of the warmup and at every sync
    // after it.
    const int64_t replicas = l.ranks / ep;
    if (l.shard_params) sharded_traffic();
    else t.replica_all_reduce = all_reduce_bytes(replicated, ep, kF32);
    t.gradient_all_reduce = all_reduce_bytes(m.params, replicas, kF32);
    t.edit_sync = t.gradient_all_reduce / l.sync_interval;
  } else {
    const int64_t replicas = l.ranks / l.shard_group;
    if (l.shard_params) {
      sharded_traffic();
    } else {
      // Inside a replica every step: the gradients reduce-scattered, the updated shards gathered.
      t.gradient_reduce_scatter = kF32 * params_sharded * (l.shard_group - 1);
      t.parameter_all_gather = t.gradient_reduce_scatter;
    }
    // Across replicas: the gradient shards averaged every step of the warmup, the pseudo-gradient shards
    // at every sync after it (the layer norms and weights are a few numbers per layer).
    t.gradient_all_reduce = all_reduce_bytes(params_sharded, replicas, kF32);
    t.edit_sync = t.gradient_all_reduce / l.sync_interval;
  }
  if (ep > 1) {
    // Per MoE layer: the row counts (E / ep integers to each other rank); k rows of H per token to their
    // experts and back, forward and backward, and each row's routing weight there and its gradient back
    // in the backward: f32, but for the rows of x going out, x's kept copy (bf16 under mixed precision);
    // (ep - 1) / ep of the rows leave the rank when the experts are evenly loaded.
    const int64_t bytes_per_row = (3 * c.hidden_size + 2) * kF32 + c.hidden_size * act_bytes;
    t.expert_all_to_all = moe_layers(c) * (c.num_experts / ep * 8 * (ep - 1) +
                                           tokens * c.num_experts_per_tok * bytes_per_row * (ep - 1) / ep);
  }
  return plan;
}

Json Plan::to_json() const {
  const RankMemory& m = memory;
  const StepTraffic& t = traffic;
  Json j{{"total_params", total_params},
         {"routed_expert_params", routed_expert_params},
         {"rank",
          {{"params", m.params},
           {"weights_bytes", m.weights},
           {"gradients_bytes", m.gradients},
           {"adamw_bytes", m.adamw},
           {"bf16_copy_bytes", m.bf16_copy},
           {"gathered_bytes", m.gathered},
           {"activations_bytes", m.activations},
           {"transient_bytes", m.transient},
           {"held_bytes", m.held()},
           {"peak_bytes", m.peak()}}},
         {"bytes_sent_per_step",
          {{"gradient_all_reduce", t.gradient_all_reduce},
           {"parameter_all_gather", t.parameter_all_gather},
           {"gradient_reduce_scatter", t.gradient_reduce_scatter},
           {"expert_all_to_all", t.expert_all_to_all},
           {"edit_sync", t.edit_sync},
           {"replica_all_reduce", t.replica_all_reduce}}}};
  return j;
}

}  // namespace lt
