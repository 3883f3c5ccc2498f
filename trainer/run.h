// A whole training run: the stages of a recipe in order on one Trainer, with periodic held-out
// evaluation, metrics, checkpoints, a time limit and resumption from any checkpoint, then the
// held-out figures over the whole held-out data and a sample. Pre-training, SFT and DPO are stages of
// different kinds (trainer/stage_batches.h) run by this one loop, with the same spike guard, --dist,
// checkpoints and metrics.
//
// The run is a few parts with one job each, handed what they need from above:
//   run_setup.h      the recipe (a resume's own), the world of processes, the device, the tokenizer,
//                    the model and each stage's data
//   strategy.h       how the ranks train together (data parallel, EDiT, A-EDiT): the shape of the loop
//   run_control.h    one guarded step, and the decisions after a step or round (held-out figures,
//                    metrics, checkpoint, stop), written once for every strategy
//   checkpointer.h   save and restore, every rank's state included
//   evaluator.h      the held-out figures
//   metrics_sink.h   metrics.jsonl, the progress line and its events
//   fault_injection.h  the test-only faults of --inject
#pragma once
#include <cstdio>
#include <string>
#include <vector>

#include "dist/edit.h"
#include "io/json.h"
#include "optim/spike_guard.h"
#include "tensor/kernel_types.h"
#include "trainer/fault_injection.h"
#include "trainer/recipe.h"

namespace lt {

// How the processes of an mpirun train together (dist/edit.h): data parallel averages the gradients
// every step; EDiT is local SGD with layer-wise syncs every sync_interval steps; A-EDiT syncs by time.
enum class DistMode { DataParallel, Edit, AEdit };
// "dp", "edit", "aedit"; anything else fails naming the valid ones.
DistMode parse_dist_mode(const std::string& name);
const char* dist_mode_name(DistMode mode);

struct RunOptions {
  std::string out_dir = "out/tiny";  // checkpoint/, metrics.jsonl and, for the embedded corpus, data/
  // Where the model trains (--device). Batches are made on the host and copied there; checkpoints are
  // written from host copies, so they move freely between CPU and GPU runs. Under mpirun a CUDA device
  // means one GPU per rank (rank r drives GPU r mod the GPUs it sees), the gradients averaged by NCCL.
  Device device = Device::cpu();
  // --dtype bf16: the matmuls take bf16 operands with f32 accumulation (mixed precision) on a GPU, or on
  // a CPU with AVX512_BF16 (elsewhere they stay f32); master weights, optimiser state and checkpoints
  // stay f32.
  kernels::MatmulPrecision matmul_precision = kernels::MatmulPrecision::F32;
  DType save_dtype = DType::F32;  // --save-dtype bf16: the checkpoints' weights in bf16 (smaller exports)
  std::string resume;                // a checkpoint to continue from (it brings its recipe and settings)
  // A byte-level BPE tokenizer.json ("": the byte tokenizer). It tokenises the embedded corpus when no
  // data is given and the sample, and is copied into every checkpoint; a resumed run keeps its own.
  std::string tokenizer;
  Json stage_overrides = Json::object();  // stage keys that replace the resumed stage's (e.g. more steps)
  // What the command line named that a resumed run keeps from its checkpoint: recipe keys ("model",
  // "seed", "routing_warmup", "init", or "recipe" for a whole recipe) with their values. A named value
  // equal to the checkpoint's is accepted; one that differs is refused, naming both.
  Json named_recipe_keys = Json::object();
  // The distribution settings the command line named: "mode" for --dist, "expert_parallel" for
  // --expert-parallel, "shard_params" for --shard-params, and EDiT's flags by their EditSettings::to_json
  // keys. A resumed run continues with its checkpoint's settings; a named one that differs from them is
  // refused, naming both values, except where the resume may change the layout (trainer/run_setup.h).
  Json named_dist_settings = Json::object();
  int64_t eval_every = 200;          // held-out loss every N steps (0: only at the end)
  int64_t eval_tokens = 65536;       // over the first N held-out tokens (0: all)
  // Multiple-choice accuracy as the run trains (trainer/multiple_choice.h): a JSONL file of items, or
  // "embedded", the task made from the embedded corpus's held-out documents (data/corpus_multiple_choice.h);
  // "": none. Every eval_mc_every steps (0: at the eval_every points) and at the end, over the first
  // eval_mc_items items (0: all of the file).
  std::string eval_mc;
  int64_t eval_mc_every = 0;
  int64_t eval_mc_items = 500;
  int64_t ckpt_every = 200;          // a checkpoint every N steps (0: only at the end)
  // --ckpt-async on: a checkpoint is copied to host memory at the step boundary and written by a
  // background thread while the next steps run (off: the run waits for the write).
  bool async_checkpoints = true;
  // The history (trainer/checkpoint.h): the last keep_checkpoints checkpoints stay (1: the latest only), and
  // every one whose step is a multiple of keep_every (0: none) stays for ever, in <out>/checkpoints/.
  int64_t keep_checkpoints = 1;
  int64_t keep_every = 0;
  std::string metrics_path;          // default: <out_dir>/metrics.jsonl
  std::string sample_prompt = "The ";  // empty: no sample at the end
  int64_t sample_tokens = 200;
  double time_limit_seconds = 0;     // stop (with a checkpoint) once exceeded; 0: none
  int64_t stop_at_step = 0;          // stop (with a checkpoint) after this global step; 0: run to the end
  std::FILE* progress = stderr;      // the live progress lines (rank 0's only)
  DistMode dist = DistMode::DataParallel;  // under mpirun
  // --overlap-grads: dp averages each bucket of gradients while the rest of the backward runs
  // (dist/data_parallel.h OverlappedAverage), or after it; the same bits either way.
  bool overlap_grads = true;
  // --expert-parallel G: each MoE layer's routed experts split over G consecutive ranks, data parallel
  // across those groups (moe/expert_parallel.h); 1: every rank holds every expert.
  int expert_parallel = 1;
  // --shard-params on: under mpirun each rank holds 1/N of every layer's values, gradients and AdamW state
  // (of an EDiT replica's, under edit and aedit), the layer gathered whole around its forward and its
  // backward (dist/parameter_shards.h).
  bool shard_params = false;
  EditSettings edit;                 // edit / aedit: the mesh, the sync and its penalties
  SpikeGuardSettings spike_guard;    // loss spikes and non-finite steps (optim/spike_guard.h)
  std::vector<Injection> injections;
  // The hang watchdog (dist/watchdog.h): a collective or a step that lasts longer ends the run on every rank
  // with one line (0: off). Far above any step or wait of a healthy run, as PyTorch's process groups' default.
  double collective_timeout_seconds = 1800;
  // A rank whose time per step exceeds the median rank's by this factor at several log points in a row is
  // named as slow (trainer/slow_ranks.h; 0: not judged).
  double slow_rank_factor = 1.5;
  // --profile-every N: the steps N, 2N, ... are profiled op by op, their collectives too, into the metrics
  // (trainer/step_profiler.h); 0: never.
  int64_t profile_every = 0;
  // For measuring uneven hardware: rank straggle_rank's steps take straggle_factor times as long (it
  // sleeps for the extra time after each step's compute). straggle_rank -1: none.
  int straggle_rank = -1;
  double straggle_factor = 1.0;
};

// Runs `recipe` (ignored when resuming: the checkpoint's recipe runs) and returns the summary: steps,
// tokens, last train loss, the held-out figures (and for pre-training the corpus's unigram entropy),
// checkpoint path, sample, world size. Under mpirun every rank runs it; ranks other than 0 return null.
Json run_training(const Recipe& recipe, const RunOptions& options);

}  // namespace lt
