#include <cstdio>
#include <map>

#include "cli/commands.h"

namespace lt::cli {

Command find_command(const std::string& name) {
  static const std::map<std::string, Command> commands = {
      {"--version", cmd_version},
      {"version", cmd_version},
      {"gradcheck", cmd_gradcheck},
      {"params", cmd_params},
      {"plan", cmd_plan},
      {"bench", cmd_bench},
      {"pretrain", cmd_pretrain},
      {"sft", cmd_sft},
      {"dpo", cmd_dpo},
      {"eval", cmd_eval},
      {"compare", cmd_compare},
      {"sample", cmd_sample},
      {"score", cmd_score},
      {"eval-tools", cmd_eval_tools},
      {"eval-mc", cmd_eval_mc},
      {"mc-data", cmd_mc_data},
      {"shards", cmd_shards},
      {"tokenizer", cmd_tokenizer},
      {"chat-template", cmd_chat_template},
      {"tool-data", cmd_tool_data},
      {"inspect", cmd_inspect},
      {"report", cmd_report}};
  const auto it = commands.find(name);
  return it == commands.end() ? nullptr : it->second;
}

void print_usage(std::FILE* out) {
  std::fprintf(out,
               "usage: lingtrain <command> [flags]   (lingtrain <command> --help: its flags, defaults and help)\n"
               "  --version                      version, CPU kernel target and bf16 GEMM, threads, CUDA\n"
               "  gradcheck [--op NAME] [--verbose 1] [--threads N]\n"
               "                                 finite-difference check of every op's backward\n"
               "  pretrain [--model tiny|small|moe-s|...|config.json] [--data train.bin --val val.bin]\n"
               "           [--out DIR] [--steps N] [--batch B] [--seq T] [--lr X] [--accum N] [--routing-warmup W]\n"
               "           [--lr-schedule cosine (default) | wsd (Ling's: warmup, constant, halved after --halve-at\n"
               "           of the tokens) | inverse_sqrt | constant] [--seed S] [--threads N]\n"
               "           [--rope-theta X] [--resume DIR] [--tokenizer tokenizer.json (kept in checkpoints)]\n"
               "           [--device cpu|cuda|cuda:N (sft and dpo too; under mpirun one GPU per rank, --dist dp)]\n"
               "           [--dtype f32|bf16|tf32 (bf16: matmuls take bf16 operands with f32 accumulation on a GPU\n"
               "           or a CPU with AVX512_BF16; tf32: f32 matmuls on a GPU's tensor cores as TF32, plain f32\n"
               "           on a CPU; weights and checkpoints stay f32)]\n"
               "           [--save-dtype f32|bf16 (the checkpoints' weights)]\n"
               "           ...  pre-train (default: the embedded corpus, tokenised by the run's tokenizer)\n"
               "  pretrain --recipe tiny|R.json [--out DIR]   the stages of a recipe in order (resumable)\n"
               "  mpirun -n N lingtrain pretrain ... [--dist dp|edit|aedit] [--straggle RANK:FACTOR]\n"
               "           [--expert-parallel G (each MoE layer's routed experts split over G ranks)]\n"
               "           several processes: dp (default) averages gradients every step; edit is local SGD with\n"
               "           layer-wise sync [--shard-group S] [--local-sgd-warmup N] [--sync-interval N]\n"
               "           [--outer-optimizer average|sgd --outer-lr X --outer-momentum X --outer-nesterov on|off]\n"
               "           [--clip-pseudo-grad X] [--weight-by-norm on --weight-temperature T] [--skip-anomaly on\n"
               "           --ewma-alpha X --ewma-warmup N --ewma-threshold X]; aedit syncs by time instead\n"
               "           [--sync-seconds X] [--min-total-steps K] [--step-weight on --step-weight-ratio R]\n"
               "  pretrain ... [--spike-guard on|off] [--spike-threshold Z] [--spike-warmup N] [--spike-retries N]\n"
               "           [--spike-lr-cut X --spike-cut-after N --spike-cooldown N] [--nan-reload-after K]\n"
               "           [--max-reloads M]   the loss-spike guard and NaN recovery (docs/reliability.md)\n"
               "  sft --ckpt DIR --data train.jsonl [--val val.jsonl] [--out DIR (out/sft)] [--epochs E (2) | --steps N]\n"
               "      [--seq T (512)] [--batch B (8)] [--lr X (1e-3)] [--aux-loss-coef X] [--z-loss-coef X] ...\n"
               "                                 supervised fine-tuning on TRL-style conversations, assistant\n"
               "                                 tokens only, packed with document masking (docs/post_training.md)\n"
               "  dpo --ckpt DIR --data pairs.jsonl [--val val.jsonl] [--out DIR (out/dpo)] [--beta X (0.1)]\n"
               "      [--rpo-alpha X (0.05)] [--epochs E (1) | --steps N] [--seq T (1024)] [--batch B (4)] ...\n"
               "                                 sigmoid DPO against the --ckpt model (log-probs cached on disk);\n"
               "                                 sft and dpo take pretrain's run flags (--resume, --eval-every,\n"
               "                                 --dist, the spike guard ...)\n"
               "  eval --ckpt DIR --data FILE.bin [--seq T] [--device D]   mean next-token loss over the whole file\n"
               "  sample --ckpt DIR --prompt TEXT [--tokens N] [--temperature X] [--top-k K] [--top-p P] [--device D]\n"
               "         [--n K (continuations, decoded together)] [--tokenizer T (default: the checkpoint's)]\n"
               "  shards --out PREFIX [--tokenizer T] FILE... text files to llm.c token shards (byte tokenizer,\n"
               "                                 or a byte-level BPE tokenizer.json)\n"
               "  tokenizer train --vocab N --out tokenizer.json [--pattern ling|llama3|gpt2] FILE...\n"
               "                                 train a byte-level BPE tokenizer on text files\n"
               "  tokenizer encode [--tokenizer T] [--special 1] TEXT...   ids of each text, JSON lines\n"
               "  chat-template --data F.jsonl [--tokenizer T] [--generation-prompt 1]\n"
               "                                 Ling's chat template: text, ids, loss_mask per record\n"
               "  score --ckpt DIR --data F.jsonl [--tokenizer T] [--seq T]   per record, the summed log-prob\n"
               "                                 of the tokens chat-template trains on (logp, tokens), JSON\n"
               "                                 lines; records longer than --seq + 1 skipped and counted\n"
               "  tool-data --out DIR [--seed S] [--sft N] [--dpo N] [--copy N]   the embedded post-training\n"
               "                                 data: a knowledge graph, tool-use SFT conversations, preference\n"
               "                                 pairs, copy instructions\n"
               "  compare --ckpt A --vs B         how far apart two checkpoints' weights are: per tensor\n"
               "                                 ||A - B|| / ||B||, the largest and its tensor (last line JSON)\n"
               "  eval-tools --ckpt DIR --data F.jsonl [--graph knowledge_graph.json] [--limit N] [--batch B (16)]\n"
               "                                 the model plays tool conversations: call exact match, format\n"
               "                                 validity, final-answer accuracy (last line JSON)\n"
               "  eval-mc --ckpt DIR --data F.jsonl [--shots K [--fewshot F.jsonl]] [--limit N] [--batch B]\n"
               "          [--seed S] [--scores OUT.jsonl] [--device D]\n"
               "                                 multiple-choice accuracy (acc, acc_norm; last line JSON) on\n"
               "                                 {context, choices, label} or HellaSwag JSONL (docs/evaluation.md)\n"
               "  mc-data --out F.jsonl [--items N (1000)] [--seed S]   the embedded multiple-choice task: which\n"
               "                                 continuation belongs to a held-out corpus document (4 choices)\n"
               "  inspect --ckpt DIR (--text TEXT | --data SHARD.bin [--tokens N (64)] [--offset I]) [--vs DIR2]\n"
               "          [--json]               per token and MoE layer: chosen experts, gate weights, router\n"
               "                                 entropy and z; per layer: load, imbalance, top-1 changes vs DIR2\n"
               "  inspect --ckpt DIR --by-domain [--domain NAME=FILE ...] [--domain-tokens N (8192)] [--json]\n"
               "                                 domain x expert routing, mutual information, co-activation\n"
               "  report --run DIR [--out FILE (DIR/report.html)] [--domain NAME=FILE ...]\n"
               "                                 the training report: one self-contained HTML page\n"
               "  params [--model NAME|config.json]           parameter counts, nothing allocated\n"
               "  plan [--model M] [--ranks N] [--dist dp|edit --shard-group S] [--expert-parallel E]\n"
               "       [--shard-params on] [--batch B --seq T] [--dtype f32|bf16] [--device cpu|cuda]\n"
               "       [--device-memory GB]                   memory per rank and bytes per step, nothing allocated\n"
               "  bench [--config moe-s|moe-m|dense-124m] [--threads N] [--steps S] [--warmup W] [--profile 1]\n"
               "        [--device cuda|cuda:N (with --config; e.g. --config ling-lite --batch 1 --seq 2048)]\n"
               "        [--dtype bf16|tf32 (with --config: bf16 on a GPU or a CPU with AVX512_BF16; tf32 a GPU\n"
               "        mode, plain f32 on a CPU)]\n"
               "                                 training-step speed of one config, last line JSON; without\n"
               "                                 --config: FMA peak, GEMM and each config in its own process\n"
               "                                 (--part kernels|steps for one half); with --generate K [--tokens N]:\n"
               "                                 greedy generation of K prompts, one at a time vs together\n"
               "environment:\n"
               "  LINGTRAIN_CPU_TARGET=AVX2      cap the CPU kernels at an older Highway target (AVX3, AVX2,\n"
               "                                 SSE4, ...): an older CPU's code path on this one\n"
               "  LINGTRAIN_CPU_AMX=0            bf16 GEMMs without a Xeon's AMX tiles (VDPBF16PS instead)\n");
}

}  // namespace lt::cli
