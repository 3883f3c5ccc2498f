// eval, sample, score, eval-tools, compare: what a checkpoint does with held-out data, prompts, conversations
// and tool calls, and how far it is from another.
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cli/commands.h"
#include "cli/flags.h"
#include "data/chat_template.h"
#include "data/jsonl.h"
#include "data/token_shards.h"
#include "data/tokenizer.h"
#include "data/tool_data.h"
#include "io/format_text.h"
#include "model/ling.h"
#include "tensor/error.h"
#include "trainer/checkpoint.h"
#include "trainer/evaluate.h"
#include "trainer/generate.h"
#include "trainer/tool_eval.h"

namespace lt::cli {

int cmd_compare(const Args& args) {
  const Flags flags("lingtrain compare --ckpt A --vs B: how far apart two checkpoints' weights are (per tensor\n"
                    "||A - B|| / ||B||: the largest and its tensor, and the largest |A - B|; last line JSON)",
                    {{"ckpt", "", "checkpoint A (required)"}, {"vs", "", "checkpoint B (required)"}}, args);
  if (flags.str("ckpt").empty() || flags.str("vs").empty()) fail("compare needs --ckpt A and --vs B");
  const WeightsDifference d = compare_checkpoint_weights(flags.str("ckpt"), flags.str("vs"));
  std::printf("%s\n", Json{{"tensors", d.tensors}, {"max_relative", d.max_relative}, {"worst", d.worst},
                           {"max_abs", d.max_abs}}
                          .dump()
                          .c_str());
  return 0;
}

int cmd_eval(const Args& args) {
  const Flags flags("lingtrain eval --ckpt DIR --data FILES: the mean next-token loss over all of the shards",
                    {{"ckpt", "", "the checkpoint (required)"},
                     {"data", "", "llm.c token shards: files and globs separated by commas (required)"},
                     {"seq", "0", "tokens per window (0: the checkpoint's training seq)"},
                     {"batch", "8", "windows per forward"},
                     threads_flag(),
                     {"device", "cpu", "cpu, cuda or cuda:N"}},
                    args);
  apply_threads(flags);
  if (flags.str("ckpt").empty() || flags.str("data").empty()) fail("eval needs --ckpt DIR and --data FILE.bin");
  const std::string ckpt = flags.str("ckpt");
  const Device device = parse_device(flags.str("device"));
  LingForCausalLM model(load_checkpoint_config(ckpt), 0);
  load_checkpoint_weights(ckpt, model);
  model.to(device);
  int64_t T = flags.integer("seq");
  if (T <= 0) {
    const Json state = load_trainer_state(ckpt);
    LT_CHECK(state.contains("seq_len"), ckpt, ": trainer_state.json has no seq_len; pass --seq");
    T = state.at("seq_len").get<int64_t>();
  }
  LT_CHECK(T <= model.config().max_position_embeddings, "flag --seq ", T, " exceeds max_position_embeddings ",
           model.config().max_position_embeddings, " of ", ckpt);
  const TokenShards tokens = TokenShards::open(flags.str("data"), model.config().vocab_size);
  LT_CHECK(tokens.num_tokens() >= 2, flags.str("data"), ": fewer than 2 tokens, nothing to predict");
  const LossSum loss = evaluate(model, tokens, T, flags.positive("batch"));
  LT_CHECK(std::isfinite(loss.mean()), ckpt, ": the loss is not finite (weights of a diverged run?)");
  std::printf("%s\n", Json{{"loss", loss.mean()}, {"tokens", loss.tokens}, {"seq", T}}.dump().c_str());
  return 0;
}

int cmd_sample(const Args& args) {
  const Flags flags("lingtrain sample --ckpt DIR --prompt TEXT: the prompt and a continuation the model samples",
                    {{"ckpt", "", "the checkpoint (required)"},
                     {"prompt", "", "the text to continue"},
                     {"tokens", "200", "new tokens"},
                     {"temperature", "0.8", "sampling temperature"},
                     {"top-k", "40", "sample among the K likeliest tokens (0: all)"},
                     {"top-p", "0.95", "... and within the smallest set of probability P"},
                     {"seed", "1", "sampling seed"},
                     {"n", "1", "continuations, decoded together, each from its own stream of the seed"},
                     threads_flag(),
                     {"tokenizer", "", "a tokenizer.json (default: the checkpoint's)"},
                     {"device", "cpu", "cpu, cuda or cuda:N"}},
                    args);
  apply_threads(flags);
  if (flags.str("ckpt").empty()) fail("sample needs --ckpt DIR");
  const std::string ckpt = flags.str("ckpt");
  const Device device = parse_device(flags.str("device"));
  LingForCausalLM model(load_checkpoint_config(ckpt), 0);
  load_checkpoint_weights(ckpt, model);
  model.to(device);
  SamplingSettings sampling;
  sampling.max_new_tokens = flags.positive("tokens");
  sampling.temperature = flags.number("temperature");
  sampling.top_k = flags.integer("top-k");
  sampling.top_p = flags.number("top-p");
  sampling.seed = static_cast<uint64_t>(flags.integer("seed"));
  const std::unique_ptr<Tokenizer> tokenizer = resolve_tokenizer(flags.str("tokenizer"), ckpt, model.config().vocab_size);
  const long long count = flags.positive("n");
  const std::vector<std::string> texts = sample_texts(model, *tokenizer, flags.str("prompt"), sampling, count);
  for (long long c = 0; c < count; ++c) {
    if (count > 1) std::printf("=== sample %lld of %lld ===\n", c + 1, count);
    std::printf("%s%s\n", flags.str("prompt").c_str(), texts[c].c_str());
  }
  return 0;
}

// Per record, the summed log-probability of the tokens chat-template marks in loss_mask (the replies
// and their end tokens) and their count. A record longer than --seq + 1 tokens is skipped and counted,
// as sft's packing does: its line says so, so the lines stay one per record.
int cmd_score(const Args& args) {
  const Flags flags(
      "lingtrain score --ckpt DIR --data F.jsonl: per record, the summed log-prob of the tokens chat-template\n"
      "trains on (logp, tokens), JSON lines; a record longer than --seq + 1 tokens gets {\"length\", \"skipped\"}",
      {{"ckpt", "", "the checkpoint (required)"},
       {"data", "", "conversations, JSONL (required)"},
       {"tokenizer", "", "a tokenizer.json (default: the checkpoint's)"},
       {"seq", "0", "the longest record scored is seq + 1 tokens (0: the model's max_position_embeddings)"},
       threads_flag()},
      args);
  apply_threads(flags);
  if (flags.str("ckpt").empty() || flags.str("data").empty()) fail("score needs --ckpt DIR and --data FILE.jsonl");
  const std::string ckpt = flags.str("ckpt");
  LingForCausalLM model(load_checkpoint_config(ckpt), 0);
  load_checkpoint_weights(ckpt, model);
  const int64_t max_positions = model.config().max_position_embeddings;
  const int64_t T = flags.integer("seq") > 0 ? flags.positive("seq") : max_positions;
  LT_CHECK(T <= max_positions, "flag --seq ", T, " exceeds max_position_embeddings ", max_positions, " of ", ckpt);
  const std::unique_ptr<Tokenizer> tokenizer = resolve_tokenizer(flags.str("tokenizer"), ckpt, model.config().vocab_size);
  int64_t records = 0, too_long = 0;
  for_each_jsonl_record(flags.str("data"), [&](const Json& record, const std::string& where) {
    const RenderedChat chat = render_chat(conversation_from_json(record, where), *tokenizer);
    ++records;
    const auto length = static_cast<int64_t>(chat.ids.size());
    if (length > T + 1) {
      ++too_long;
      std::printf("%s\n", Json{{"length", length}, {"skipped", format_text("longer than --seq %lld + 1", static_cast<long long>(T))}}.dump().c_str());
      return;
    }
    const SequenceLogprob scored = masked_logprob(model, chat.ids, chat.loss_mask, where);
    std::printf("%s\n", Json{{"logp", scored.logp}, {"tokens", scored.tokens}}.dump().c_str());
  });
  if (too_long > 0)
    std::fprintf(stderr, "%s: %lld of %s longer than --seq %lld + 1 skipped\n", flags.str("data").c_str(),
                 static_cast<long long>(too_long), count_of(records, "record").c_str(), static_cast<long long>(T));
  return 0;
}

// The model plays the tool conversations (trainer/tool_eval.h).
int cmd_eval_tools(const Args& args) {
  const Flags flags(
      "lingtrain eval-tools --ckpt DIR --data F.jsonl: the model plays tool conversations: call exact match,\n"
      "format validity, final-answer accuracy (last line JSON)",
      {{"ckpt", "", "the checkpoint (required)"},
       {"data", "", "held-out tool conversations, JSONL (required; tool-data's sft_val.jsonl)"},
       {"graph", "", "the knowledge graph the tools answer from (default: knowledge_graph.json next to --data)"},
       {"tokenizer", "", "a tokenizer.json (default: the checkpoint's)"},
       {"max-tokens", "160", "new tokens per model turn"},
       {"limit", "0", "conversations played (0: all)"},
       {"batch", "16", "conversations whose next replies are decoded together (the figures do not depend on it)"},
       threads_flag()},
      args);
  apply_threads(flags);
  if (flags.str("ckpt").empty() || flags.str("data").empty()) fail("eval-tools needs --ckpt DIR and --data FILE.jsonl");
  const std::string data = flags.str("data"), ckpt = flags.str("ckpt");
  const bool graph_given = !flags.str("graph").empty();
  const std::string graph_path =
      graph_given ? flags.str("graph") : (std::filesystem::path(data).parent_path() / "knowledge_graph.json").string();
  if (!graph_given && !std::filesystem::exists(graph_path))
    fail("eval-tools: no knowledge graph at ", graph_path, " (looked next to --data); pass --graph knowledge_graph.json");
  const int64_t limit = flags.integer("limit");
  if (limit < 0) fail("flag --limit must be >= 0, got ", limit);
  const KnowledgeGraph graph = KnowledgeGraph::from_json(read_json_file(graph_path), graph_path);
  std::vector<std::pair<Json, std::string>> records;
  for_each_jsonl_record(data, [&](const Json& record, const std::string& where) {
    if (limit == 0 || static_cast<int64_t>(records.size()) < limit) records.emplace_back(record, where);
  });
  LingForCausalLM model(load_checkpoint_config(ckpt), 0);
  load_checkpoint_weights(ckpt, model);
  const std::unique_ptr<Tokenizer> tokenizer = resolve_tokenizer(flags.str("tokenizer"), ckpt, model.config().vocab_size);
  const ToolEvalResult result =
      evaluate_tool_use(model, *tokenizer, graph, records, flags.positive("max-tokens"), flags.positive("batch"));
  std::printf("%s\n", result.to_json().dump().c_str());
  return 0;
}

}  // namespace lt::cli
