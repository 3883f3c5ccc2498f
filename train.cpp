// lingtrain: the command-line front end. Every stage of training is a subcommand of this one binary;
// the layers below know nothing of flags or output formats.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <unistd.h>

#include "autograd/ops.h"
#include "bench/bench.h"
#include "data/batch_sampler.h"
#include "data/corpus.h"
#include "tensor/derive_seed.h"
#include "data/shard.h"
#include "data/text_to_shards.h"
#include "data/tokenizer.h"
#include "io/metrics.h"
#include "model/gradcheck_cases.h"
#include "model/ling.h"
#include "optim/adamw.h"
#include "optim/checkpoint.h"
#include "optim/schedule.h"
#include "tensor/kernels.h"
#include "tensor/threadpool.h"

namespace {

using lt::fail;
using lt::Json;

// Flags of the form --name value or --name=value; every flag a command reads must be declared, so a
// typo is an error instead of a silently ignored option.
class Flags {
 public:
  Flags(std::vector<std::string> args, std::map<std::string, std::string> defaults) : values_(std::move(defaults)) {
    for (size_t i = 0; i < args.size(); ++i) {
      const std::string& arg = args[i];
      if (arg.rfind("--", 0) != 0) fail("unexpected argument '", arg, "'");
      std::string name = arg.substr(2), value;
      if (const size_t eq = name.find('='); eq != std::string::npos) {
        value = name.substr(eq + 1);
        name = name.substr(0, eq);
      } else {
        if (i + 1 >= args.size()) fail("flag --", name, " needs a value");
        value = args[++i];
      }
      if (!values_.count(name)) fail("unknown flag --", name);
      values_[name] = value;
      set_.insert(name);
    }
  }
  bool was_set(const std::string& name) const { return set_.count(name) > 0; }
  const std::string& str(const std::string& name) const { return values_.at(name); }
  void set_default(const std::string& name, const std::string& value) {
    if (!was_set(name)) values_[name] = value;
  }
  long long integer(const std::string& name) const {
    const std::string& v = str(name);
    char* end = nullptr;
    const long long parsed = std::strtoll(v.c_str(), &end, 10);
    if (v.empty() || *end != '\0') fail("flag --", name, " needs an integer, got '", v, "'");
    return parsed;
  }
  long long positive(const std::string& name) const {
    const long long v = integer(name);
    if (v <= 0) fail("flag --", name, " must be > 0, got ", v);
    return v;
  }
  double number(const std::string& name) const {
    const std::string& v = str(name);
    char* end = nullptr;
    const double parsed = std::strtod(v.c_str(), &end);
    if (v.empty() || *end != '\0' || !std::isfinite(parsed)) fail("flag --", name, " needs a number, got '", v, "'");
    return parsed;
  }
  const std::map<std::string, std::string>& all() const { return values_; }

 private:
  std::map<std::string, std::string> values_;
  std::set<std::string> set_;
};

void apply_threads(const Flags& flags) {
  const long long threads = flags.integer("threads");
  if (threads < 0) fail("flag --threads must be >= 0, got ", threads);
  lt::set_num_threads(static_cast<int>(threads));
}

int cmd_version(const std::vector<std::string>& args) {
  Flags flags(args, {{"threads", "0"}});
  apply_threads(flags);
  std::printf("lingtrain %s\n", LINGTRAIN_VERSION);
  std::printf("cpu kernels: Highway %s\n", lt::cpu_kernel_target());
  std::printf("threads: %d\n", lt::num_threads());
  if (lt::cuda_compiled()) std::printf("cuda: compiled in, %d device(s) found\n", lt::cuda_device_count());
  else std::printf("cuda: not compiled in\n");
  return 0;
}

// Runs every gradient check and prints one line per op (the worst case of its variants).
int cmd_gradcheck(const std::vector<std::string>& args) {
  Flags flags(args, {{"threads", "0"}, {"op", ""}, {"verbose", "0"}});
  apply_threads(flags);
  const std::string only = flags.str("op");
  const bool verbose = flags.integer("verbose") != 0;
  std::vector<std::string> order;
  std::map<std::string, lt::GradCheckResult> worst;
  for (const lt::GradCase& c : lt::all_gradcheck_cases()) {
    if (!only.empty() && c.op != only) continue;
    const lt::GradCheckResult r = lt::gradcheck(c);
    if (verbose)
      std::printf("  %s [%s] max_abs=%.3e max_rel=%.3e %s\n", r.op.c_str(), r.variant.c_str(), r.max_abs, r.max_rel,
                  r.pass ? "PASS" : "FAIL");
    auto [it, inserted] = worst.try_emplace(c.op, r);
    if (inserted) {
      order.push_back(c.op);
      continue;
    }
    lt::GradCheckResult& w = it->second;
    w.max_abs = std::max(w.max_abs, r.max_abs);
    w.max_rel = std::max(w.max_rel, r.max_rel);
    w.pass = w.pass && r.pass;
  }
  if (order.empty()) fail("gradcheck: no op named '", only, "'");
  int failed = 0;
  for (const std::string& op : order) {
    const lt::GradCheckResult& r = worst[op];
    std::printf("%s max_abs=%.3e max_rel=%.3e %s\n", op.c_str(), r.max_abs, r.max_rel, r.pass ? "PASS" : "FAIL");
    failed += r.pass ? 0 : 1;
  }
  std::fflush(stdout);
  return failed == 0 ? 0 : 1;
}

// ---- shared by the training commands ----------------------------------------------------------

const lt::ByteTokenizer& byte_tokenizer() {
  static const lt::ByteTokenizer tokenizer;
  return tokenizer;
}

// The embedded default corpus, generated into `dir` the first time it is needed.
constexpr uint64_t kDefaultCorpusSeed = 20250310;
std::string ensure_default_corpus(const std::string& dir) {
  const std::string manifest = dir + "/corpus.json";
  if (!std::filesystem::exists(manifest)) {
    std::fprintf(stderr, "generating the default corpus into %s ...\n", dir.c_str());
    std::filesystem::create_directories(dir);
    lt::write_corpus_shards(dir, kDefaultCorpusSeed, lt::kDefaultCorpusBytes, byte_tokenizer());
  }
  return dir;
}

struct LossSum {
  double sum = 0;  // nats, summed over predicted tokens
  int64_t tokens = 0;
  double mean() const { return tokens ? sum / static_cast<double>(tokens) : 0; }
};

// Mean next-token cross-entropy over a whole token array: windows of T + 1 tokens start at 0, T, 2T,
// ..., so every token after the first is predicted exactly once; a final shorter window counts when
// it holds at least 2 tokens. Language-model loss only (no auxiliary losses), no gradients.
LossSum evaluate(lt::LingForCausalLM& model, const lt::Tensor& tokens, int64_t T, int64_t batch) {
  lt::NoGradGuard no_grad;
  LossSum total;
  auto add_batch = [&](const lt::Tensor& inputs, const lt::Tensor& targets) {
    lt::MoEContext context;
    const lt::LossBreakdown loss = model.loss(inputs, targets, context);
    total.sum += loss.lm.value().item() * static_cast<double>(inputs.numel());
    total.tokens += inputs.numel();
  };
  lt::HeldoutBatches windows(tokens, batch, T);
  while (std::optional<lt::TokenBatch> b = windows.next()) add_batch(b->inputs, b->targets);
  const int64_t start = windows.num_windows() * T, remaining = tokens.numel() - start;
  if (remaining >= 2) {
    const lt::Tensor tail = tokens.narrow(start, remaining);
    add_batch(tail.narrow(0, remaining - 1).clone().reshape({1, remaining - 1}),
              tail.narrow(1, remaining - 1).clone().reshape({1, remaining - 1}));
  }
  return total;
}

std::string format_duration(double seconds) {
  const long s = std::lround(std::max(0.0, seconds));
  char buffer[32];
  if (s >= 3600) std::snprintf(buffer, sizeof buffer, "%ldh%02ldm", s / 3600, (s / 60) % 60);
  else std::snprintf(buffer, sizeof buffer, "%ldm%02lds", s / 60, s % 60);
  return buffer;
}

// Generation with a KV cache: the prompt fills the caches in one forward, then one token per step.
// Only ids below `sample_vocab` are drawn: the model's vocabulary may be padded past the tokenizer's,
// and those padding rows were never trained on.
std::vector<uint32_t> generate(lt::LingForCausalLM& model, const std::vector<uint32_t>& prompt, int64_t max_new,
                               double temperature, int64_t top_k, double top_p, int64_t sample_vocab, lt::Rng& rng) {
  lt::NoGradGuard no_grad;
  const int64_t model_vocab = model.config().vocab_size;
  LT_CHECK(sample_vocab <= model_vocab, "the tokenizer's vocabulary (", sample_vocab, ") exceeds the model's (",
           model_vocab, ")");
  const int64_t V = sample_vocab;
  const int64_t capacity = static_cast<int64_t>(prompt.size()) + max_new;
  std::vector<lt::KVCache> caches = model.make_kv_caches(1, capacity);
  std::vector<uint32_t> out;
  std::vector<int32_t> step_ids(prompt.begin(), prompt.end());
  int64_t position = 0;
  for (int64_t n = 0; n < max_new; ++n) {
    const int64_t T = static_cast<int64_t>(step_ids.size());
    lt::MoEContext context;
    const lt::Variable logits =
        model.logits(lt::Tensor::from_vector<int32_t>({1, T}, step_ids), context, position, &caches);
    position += T;
    const std::vector<float> all = logits.value().to_vector<float>();
    std::vector<double> scores(all.end() - model_vocab, all.end() - model_vocab + V);
    uint32_t next = 0;
    if (temperature <= 0) {
      next = static_cast<uint32_t>(std::max_element(scores.begin(), scores.end()) - scores.begin());
    } else {
      std::vector<int64_t> order(static_cast<size_t>(V));
      for (int64_t i = 0; i < V; ++i) order[i] = i;
      std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return scores[a] > scores[b]; });
      const int64_t keep_k = top_k > 0 ? std::min(top_k, V) : V;
      std::vector<double> probs;
      double max_score = scores[order[0]], total = 0;
      for (int64_t i = 0; i < keep_k; ++i) total += std::exp((scores[order[i]] - max_score) / temperature);
      double cumulative = 0;
      for (int64_t i = 0; i < keep_k; ++i) {  // nucleus: the smallest prefix whose mass reaches top_p
        const double p = std::exp((scores[order[i]] - max_score) / temperature) / total;
        probs.push_back(p);
        cumulative += p;
        if (cumulative >= top_p) break;
      }
      double u = rng.uniform() * cumulative;
      size_t pick = 0;
      while (pick + 1 < probs.size() && u >= probs[pick]) u -= probs[pick++];
      next = static_cast<uint32_t>(order[pick]);
    }
    out.push_back(next);
    step_ids.assign(1, static_cast<int32_t>(next));
  }
  return out;
}

std::string sample_text(lt::LingForCausalLM& model, const std::string& prompt, int64_t max_new, double temperature,
                        int64_t top_k, double top_p, uint64_t seed) {
  const lt::Tokenizer& tokenizer = byte_tokenizer();
  std::vector<uint32_t> ids;
  lt::append_document_tokens(ids, prompt, tokenizer);  // eos first, as every training document starts
  lt::Rng rng(seed);
  const std::vector<uint32_t> generated = generate(model, ids, max_new, temperature, top_k, top_p, tokenizer.vocab_size(), rng);
  return tokenizer.decode(generated);
}

Json layer_metrics(const std::vector<std::vector<int64_t>>& loads, const std::vector<double>& entropy) {
  Json layers = Json::array();
  for (size_t i = 0; i < loads.size(); ++i) {
    const lt::LoadSummary s = lt::summarize_load(loads[i]);
    layers.push_back({{"layer", i},
                      {"max_over_mean", s.max_over_mean},
                      {"min_load", s.min_load},
                      {"dead_experts", s.dead_experts},
                      {"load_cv", s.load_cv},
                      {"routing_entropy", entropy[i]},
                      {"tokens_per_expert", loads[i]}});
  }
  return layers;
}

// ---- pretrain ---------------------------------------------------------------------------------

int cmd_pretrain(const std::vector<std::string>& args) {
  Flags flags(args, {{"model", "tiny"},        {"data", ""},          {"val", ""},
                     {"out", "out/tiny"},      {"steps", "1500"},      {"batch", "16"},
                     {"seq", "128"},           {"lr", "3e-3"},        {"min-lr", "3e-4"},
                     {"lr-schedule", "cosine"}, {"warmup-steps", "30"}, {"halve-at", "0.6"},
                     {"accum", "1"},           {"batch-warmup-start", "0"}, {"batch-warmup-steps", "0"},
                     {"routing-warmup", "50"}, {"clip", "1.0"},       {"weight-decay", "0.1"},
                     {"seed", "1"},            {"threads", "0"},      {"resume", ""},
                     {"eval-every", "200"},    {"eval-tokens", "65536"}, {"ckpt-every", "200"},
                     {"metrics", ""},          {"sample-prompt", "The "}, {"sample-tokens", "200"},
                     {"time-limit", "0"}});
  Json trainer_state;
  const std::string resume = flags.str("resume");
  if (!resume.empty()) {
    // A resumed run takes its settings from the checkpoint; flags given now override them.
    trainer_state = lt::load_trainer_state(resume);
    for (const auto& [name, value] : trainer_state.at("run").items())
      if (flags.all().count(name) && name != "resume" && name != "steps" && name != "time-limit")
        flags.set_default(name, value.get<std::string>());
  }
  apply_threads(flags);
  const std::string out_dir = flags.str("out");
  const int64_t steps = flags.positive("steps"), B = flags.positive("batch"), T = flags.positive("seq");
  const int64_t accum = flags.positive("accum");
  const uint64_t seed = static_cast<uint64_t>(flags.integer("seed"));

  // Model: a fresh one from a preset or config.json, or the checkpoint's.
  lt::LingConfig config = resume.empty() ? lt::resolve_config(flags.str("model")) : lt::load_checkpoint_config(resume);
  LT_CHECK(T <= config.max_position_embeddings, "--seq ", T, " exceeds max_position_embeddings ",
           config.max_position_embeddings, " of the model");
  lt::LingForCausalLM model(config, seed);
  if (!resume.empty()) lt::load_checkpoint_weights(resume, model);

  // Data: the embedded corpus unless --data names a shard (with --val for held-out loss).
  std::string train_path = flags.str("data"), val_path = flags.str("val");
  if (train_path.empty()) {
    const std::string corpus = ensure_default_corpus(out_dir + "/data");
    train_path = corpus + "/train.bin";
    if (val_path.empty()) val_path = corpus + "/val.bin";
  }
  const lt::Tensor train_tokens = lt::read_token_shard_tensor(train_path, config.vocab_size);
  const lt::Tensor val_tokens = val_path.empty() ? lt::Tensor() : lt::read_token_shard_tensor(val_path, config.vocab_size);
  LT_CHECK(train_tokens.numel() > T, train_path, ": ", train_tokens.numel(), " tokens, fewer than --seq + 1");
  lt::BatchSampler sampler(train_tokens, B, T, seed);

  lt::AdamWSettings adam;
  adam.weight_decay = flags.number("weight-decay");
  lt::AdamW optimizer(model.parameters(), adam);
  lt::LRSchedule schedule;
  schedule.kind = flags.str("lr-schedule");
  schedule.peak = flags.number("lr");
  schedule.min_lr = flags.number("min-lr");
  schedule.warmup_steps = flags.integer("warmup-steps");
  schedule.total_steps = steps;
  schedule.halve_at_fraction = flags.number("halve-at");
  schedule.validate();
  lt::BatchRamp ramp{flags.integer("batch-warmup-start"), B * accum, flags.integer("batch-warmup-steps")};
  const int64_t routing_warmup = flags.integer("routing-warmup");
  const double clip = flags.number("clip");
  std::vector<lt::MoEBlock*> moe = model.moe_blocks();

  lt::Rng rng(lt::derive_seed(seed, 1));  // routing-warmup noise
  int64_t step = 0, tokens_seen = 0;
  if (!resume.empty()) {
    step = trainer_state.at("step").get<int64_t>();
    tokens_seen = trainer_state.at("tokens_seen").get<int64_t>();
    lt::rng_from_json(trainer_state.at("rng"), rng, resume);
    sampler.restore({trainer_state.at("data_cursor").at("epoch").get<uint64_t>(),
                     trainer_state.at("data_cursor").at("position").get<uint64_t>()});
    const Json& warmups = trainer_state.at("routing_warmup");
    LT_CHECK(warmups.size() == moe.size(), resume, ": routing-warmup state for ", warmups.size(), " MoE layers, model has ",
             moe.size());
    for (size_t i = 0; i < moe.size(); ++i) {
      moe[i]->warmup().mean = warmups[i].at("mean").get<double>();
      moe[i]->warmup().std = warmups[i].at("std").get<double>();
      moe[i]->warmup().initialized = warmups[i].at("initialized").get<bool>();
    }
    lt::load_checkpoint_optimizer(resume, optimizer, step);
  }
  // The total token budget (for the wsd halving point) assumes the full batch from the start.
  const double total_tokens = static_cast<double>(steps) * static_cast<double>(B * accum * T);

  Json run;
  for (const auto& [name, value] : flags.all()) run[name] = value;
  auto save = [&](int64_t at_step) {
    Json warmups = Json::array();
    for (lt::MoEBlock* block : moe)
      warmups.push_back({{"mean", block->warmup().mean}, {"std", block->warmup().std},
                         {"initialized", block->warmup().initialized}});
    const lt::SamplerCursor cursor = sampler.cursor();
    const Json state = {{"step", at_step},
                        {"tokens_seen", tokens_seen},
                        {"seq_len", T},
                        {"rng", lt::rng_to_json(rng)},
                        {"data_cursor", {{"epoch", cursor.epoch}, {"position", cursor.position}}},
                        {"routing_warmup", warmups},
                        {"run", run}};
    lt::save_checkpoint(out_dir + "/checkpoint", model, &optimizer, state);
  };

  std::filesystem::create_directories(out_dir);
  lt::MetricsLog metrics(flags.str("metrics").empty() ? out_dir + "/metrics.jsonl" : flags.str("metrics"));
  const lt::ParameterCount counts = lt::count_parameters(config);
  std::fprintf(stderr, "model %s: %.2fM parameters (%.2fM active per token); data %s (%lld tokens); %d threads\n",
               config.name.c_str(), counts.total / 1e6, counts.active / 1e6, train_path.c_str(),
               static_cast<long long>(train_tokens.numel()), lt::num_threads());
  const bool interactive = isatty(fileno(stderr));
  const double time_limit = flags.number("time-limit");
  const auto run_start = std::chrono::steady_clock::now();
  const int64_t first_step = step;
  const int64_t eval_every = flags.integer("eval-every"), ckpt_every = flags.integer("ckpt-every");
  const int64_t eval_tokens = flags.integer("eval-tokens");
  // Periodic held-out loss on the first --eval-tokens tokens (all when 0); the whole file at the end.
  auto heldout_loss = [&](int64_t limit) -> double {
    if (!val_tokens.defined()) return NAN;
    const int64_t n = limit > 0 ? std::min(val_tokens.numel(), limit) : val_tokens.numel();
    return evaluate(model, val_tokens.narrow(0, n), T, B).mean();
  };

  double last_loss = NAN;
  for (; step < steps; ++step) {
    const auto t0 = std::chrono::steady_clock::now();
    const double lr = schedule.at(step, static_cast<double>(tokens_seen) / total_tokens);
    const int64_t micro_batches = std::max<int64_t>(1, (ramp.at(step) + B - 1) / B);
    double loss_sum = 0, lm_sum = 0, aux_sum = 0, balance_sum = 0, z_sum = 0;
    std::vector<std::vector<int64_t>> loads(moe.size());
    std::vector<double> entropy(moe.size(), 0.0);
    for (int64_t micro = 0; micro < micro_batches; ++micro) {
      const lt::TokenBatch batch = sampler.next();
      lt::MoEContext context;
      context.step = step;
      context.training = true;
      context.warmup_steps = routing_warmup;
      context.rng = &rng;
      const lt::LossBreakdown loss = model.loss(batch.inputs, batch.targets, context);
      lt::scale(loss.total, 1.0 / static_cast<double>(micro_batches)).backward();
      loss_sum += loss.total.value().item();
      lm_sum += loss.lm.value().item();
      aux_sum += loss.aux;
      balance_sum += loss.balance;
      z_sum += loss.z;
      for (size_t i = 0; i < context.stats.size(); ++i) {
        const std::vector<int64_t>& layer_load = context.stats[i].tokens_per_expert;
        if (loads[i].empty()) loads[i].assign(layer_load.size(), 0);
        for (size_t e = 0; e < layer_load.size(); ++e) loads[i][e] += layer_load[e];
        entropy[i] += context.stats[i].routing_entropy / static_cast<double>(micro_batches);
      }
      tokens_seen += batch.inputs.numel();
    }
    const double grad_norm = optimizer.clip_grad_norm(clip);
    optimizer.step(lr);
    optimizer.zero_grad();
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double m = static_cast<double>(micro_batches);
    last_loss = lm_sum / m;
    const double tokens_per_s = static_cast<double>(micro_batches * B * T) / seconds;
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - run_start).count();
    const double eta = elapsed / static_cast<double>(step + 1 - first_step) * static_cast<double>(steps - step - 1);
    Json record = {{"step", step + 1},        {"loss", loss_sum / m},       {"lm_loss", lm_sum / m},
                   {"aux_loss", aux_sum / m}, {"balance_loss", balance_sum / m}, {"z_loss", z_sum / m},
                   {"grad_norm", grad_norm},  {"lr", lr},                   {"tokens", tokens_seen},
                   {"batch_seqs", micro_batches * B}, {"tokens_per_s", tokens_per_s}, {"step_seconds", seconds}};
    if (!moe.empty()) record["moe_layers"] = layer_metrics(loads, entropy);
    const bool last = step + 1 == steps;
    if (eval_every > 0 && (step + 1) % eval_every == 0 && !last) {
      const double val = heldout_loss(eval_tokens);
      if (!std::isnan(val)) record["val_loss"] = val;
    }
    metrics.write(record);
    std::fprintf(stderr, "%sstep %lld/%lld | loss %.4f | lr %.2e | gnorm %.3f | %.0f tok/s | ETA %s%s",
                 interactive ? "\r" : "", static_cast<long long>(step + 1), static_cast<long long>(steps), lm_sum / m, lr,
                 grad_norm, tokens_per_s, format_duration(eta).c_str(), interactive ? "   " : "\n");
    if (record.contains("val_loss"))
      std::fprintf(stderr, "%sstep %lld: held-out loss %.4f\n", interactive ? "\n" : "",
                   static_cast<long long>(step + 1), record["val_loss"].get<double>());
    if (ckpt_every > 0 && (step + 1) % ckpt_every == 0 && !last) save(step + 1);
    if (time_limit > 0 && elapsed > time_limit && !last) {
      std::fprintf(stderr, "\ntime limit of %.0f s reached at step %lld\n", time_limit, static_cast<long long>(step + 1));
      ++step;
      break;
    }
  }
  save(step);
  const double val = heldout_loss(0);
  if (!std::isnan(val)) std::fprintf(stderr, "\nheld-out loss (whole %s): %.4f\n", val_path.c_str(), val);
  double unigram = NAN;
  if (val_tokens.defined()) {
    const std::vector<uint32_t> ids = lt::read_token_shard(val_path);
    unigram = lt::unigram_entropy_nats(ids, config.vocab_size);
  }
  std::fprintf(stderr, "\ncheckpoint written to %s/checkpoint\n", out_dir.c_str());
  const std::string sample = flags.str("sample-prompt").empty()
                                 ? ""
                                 : sample_text(model, flags.str("sample-prompt"), flags.integer("sample-tokens"), 0.8, 40,
                                               0.95, seed);
  if (!sample.empty()) std::printf("sample: %s%s\n", flags.str("sample-prompt").c_str(), sample.c_str());
  const Json summary = {{"steps", step},
                        {"tokens", tokens_seen},
                        {"train_loss", last_loss},
                        {"val_loss", std::isnan(val) ? Json(nullptr) : Json(val)},
                        {"val_unigram_entropy", std::isnan(unigram) ? Json(nullptr) : Json(unigram)},
                        {"checkpoint", out_dir + "/checkpoint"}};
  std::printf("%s\n", summary.dump().c_str());
  return 0;
}

// ---- eval, sample, shards, params --------------------------------------------------------------

int cmd_eval(const std::vector<std::string>& args) {
  Flags flags(args, {{"ckpt", ""}, {"data", ""}, {"seq", "0"}, {"batch", "8"}, {"threads", "0"}});
  apply_threads(flags);
  if (flags.str("ckpt").empty() || flags.str("data").empty()) fail("eval needs --ckpt DIR and --data FILE.bin");
  const std::string ckpt = flags.str("ckpt");
  lt::LingForCausalLM model(lt::load_checkpoint_config(ckpt), 0);
  lt::load_checkpoint_weights(ckpt, model);
  int64_t T = flags.integer("seq");
  if (T <= 0) {
    const Json state = lt::load_trainer_state(ckpt);
    LT_CHECK(state.contains("seq_len"), ckpt, ": trainer_state.json has no seq_len; pass --seq");
    T = state.at("seq_len").get<int64_t>();
  }
  const lt::Tensor tokens = lt::read_token_shard_tensor(flags.str("data"), model.config().vocab_size);
  LT_CHECK(tokens.numel() >= 2, flags.str("data"), ": fewer than 2 tokens, nothing to predict");
  const LossSum loss = evaluate(model, tokens, T, flags.positive("batch"));
  std::printf("%s\n", Json{{"loss", loss.mean()}, {"tokens", loss.tokens}, {"seq", T}}.dump().c_str());
  return 0;
}

int cmd_sample(const std::vector<std::string>& args) {
  Flags flags(args, {{"ckpt", ""},        {"prompt", ""}, {"tokens", "200"}, {"temperature", "0.8"},
                     {"top-k", "40"},     {"top-p", "0.95"}, {"seed", "1"},   {"threads", "0"}});
  apply_threads(flags);
  if (flags.str("ckpt").empty()) fail("sample needs --ckpt DIR");
  const std::string ckpt = flags.str("ckpt");
  lt::LingForCausalLM model(lt::load_checkpoint_config(ckpt), 0);
  lt::load_checkpoint_weights(ckpt, model);
  const int64_t max_new = flags.positive("tokens");
  LT_CHECK(static_cast<int64_t>(flags.str("prompt").size()) + 1 + max_new <= model.config().max_position_embeddings,
           "prompt plus --tokens exceeds the model's max_position_embeddings (", model.config().max_position_embeddings,
           ")");
  const double top_p = flags.number("top-p");
  LT_CHECK(top_p > 0 && top_p <= 1, "--top-p must be in (0, 1]");
  std::printf("%s%s\n", flags.str("prompt").c_str(),
              sample_text(model, flags.str("prompt"), max_new, flags.number("temperature"), flags.integer("top-k"), top_p,
                          static_cast<uint64_t>(flags.integer("seed")))
                  .c_str());
  return 0;
}

int cmd_shards(const std::vector<std::string>& args) {
  // lingtrain shards --out PREFIX FILE... (files after the flags)
  std::vector<std::string> flag_args, files;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i].rfind("--", 0) == 0) {
      flag_args.push_back(args[i]);
      if (args[i].find('=') == std::string::npos && i + 1 < args.size()) flag_args.push_back(args[++i]);
    } else {
      files.push_back(args[i]);
    }
  }
  Flags flags(flag_args, {{"out", ""}, {"tokens-per-shard", std::to_string(lt::kDefaultTokensPerShard)}});
  if (flags.str("out").empty() || files.empty()) fail("shards needs --out PREFIX and at least one text file");
  const lt::ShardsWritten written =
      lt::text_files_to_shards(files, byte_tokenizer(), flags.str("out"), flags.positive("tokens-per-shard"));
  for (const std::string& path : written.paths) std::printf("%s\n", path.c_str());
  std::printf("%s\n", Json{{"documents", written.documents}, {"tokens", written.tokens}}.dump().c_str());
  return 0;
}

int cmd_params(const std::vector<std::string>& args) {
  Flags flags(args, {{"model", "tiny"}});
  const lt::LingConfig config = lt::resolve_config(flags.str("model"));
  const lt::ParameterCount count = lt::count_parameters(config);
  std::printf("%s\n", Json{{"model", config.name}, {"total", count.total}, {"active", count.active},
                           {"total_billions", count.total / 1e9}, {"active_billions", count.active / 1e9}}
                          .dump()
                          .c_str());
  return 0;
}

// ---- bench ------------------------------------------------------------------------------------

int cmd_bench(const std::vector<std::string>& args) {
  Flags flags(args, {{"config", ""}, {"threads", "0"}, {"steps", "10"}, {"warmup", "3"}, {"batch", "0"},
                     {"seq", "0"},   {"seed", "1"},    {"profile", "0"}, {"part", "all"}});
  apply_threads(flags);
  const int64_t steps = flags.positive("steps"), warmup = flags.integer("warmup");
  if (warmup < 0) fail("flag --warmup must be >= 0, got ", warmup);
  const int64_t batch = flags.integer("batch"), seq = flags.integer("seq");
  if (batch < 0 || seq < 0) fail("flags --batch and --seq must be >= 0 (0: the config's bench shape)");
  const bool profile = flags.integer("profile") != 0;
  Json result;
  if (flags.str("config").empty()) {
    if (batch != 0 || seq != 0) fail("bench: --batch and --seq need --config");
    const lt::bench::BenchPart part = lt::bench::parse_bench_part(flags.str("part"));
    result = lt::bench::run_all(part, lt::num_threads(), steps, warmup, profile);
  } else {
    if (flags.was_set("part")) fail("bench: --part applies without --config");
    lt::bench::StepBenchOptions options;
    options.config = flags.str("config");
    options.batch = batch;
    options.seq = seq;
    options.steps = steps;
    options.warmup = warmup;
    options.seed = static_cast<uint64_t>(flags.integer("seed"));
    options.profile = profile;
    result = lt::bench::run_step_bench(options);
  }
  std::printf("%s\n", result.dump().c_str());
  return 0;
}

void usage(FILE* out) {
  std::fprintf(out,
               "usage: lingtrain <command> [flags]\n"
               "  --version                      version, CPU kernel target, threads, CUDA\n"
               "  gradcheck [--op NAME] [--verbose 1] [--threads N]\n"
               "                                 finite-difference check of every op's backward\n"
               "  pretrain [--model tiny|small|moe-s|...|config.json] [--data train.bin --val val.bin]\n"
               "           [--out DIR] [--steps N] [--batch B] [--seq T] [--lr X] [--lr-schedule wsd|cosine|\n"
               "           inverse_sqrt|constant] [--accum N] [--routing-warmup W] [--seed S] [--threads N]\n"
               "           [--resume DIR] ...  pre-train (default: the embedded corpus)\n"
               "  eval --ckpt DIR --data FILE.bin [--seq T]   mean next-token loss over the whole file\n"
               "  sample --ckpt DIR --prompt TEXT [--tokens N] [--temperature X] [--top-k K] [--top-p P]\n"
               "  shards --out PREFIX FILE...                 text files to llm.c token shards\n"
               "  params [--model NAME|config.json]           parameter counts, nothing allocated\n"
               "  bench [--config moe-s|moe-m|dense-124m] [--threads N] [--steps S] [--warmup W] [--profile 1]\n"
               "                                 training-step speed of one config, last line JSON; without\n"
               "                                 --config: FMA peak, GEMM and each config in its own process\n"
               "                                 (--part kernels|steps for one half)\n");
}

}  // namespace

int main(int argc, char** argv) {
  const std::map<std::string, std::function<int(const std::vector<std::string>&)>> commands = {
      {"--version", cmd_version}, {"version", cmd_version}, {"gradcheck", cmd_gradcheck},
      {"pretrain", cmd_pretrain},  {"eval", cmd_eval},       {"sample", cmd_sample},
      {"shards", cmd_shards},      {"params", cmd_params},   {"bench", cmd_bench}};
  if (argc < 2) {
    usage(stderr);
    return 2;
  }
  const std::string name = argv[1];
  if (name == "--help" || name == "help" || name == "-h") {
    usage(stdout);
    return 0;
  }
  const auto command = commands.find(name);
  if (command == commands.end()) {
    std::fprintf(stderr, "lingtrain: error: unknown command '%s' (try lingtrain --help)\n", name.c_str());
    return 2;
  }
  try {
    return command->second(std::vector<std::string>(argv + 2, argv + argc));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "lingtrain: error: %s\n", e.what());
    return 1;
  }
}
