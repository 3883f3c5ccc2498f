// shards, tokenizer, chat-template, tool-data: text to token shards, BPE tokenizers, Ling's chat
// template, and the embedded post-training data.
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cli/commands.h"
#include "cli/flags.h"
#include "data/bpe_tokenizer.h"
#include "data/bpe_trainer.h"
#include "data/chat_template.h"
#include "data/jsonl.h"
#include "data/text_to_shards.h"
#include "data/tokenizer.h"
#include "data/tool_data.h"
#include "io/input_file.h"
#include "tensor/error.h"

namespace lt::cli {

// lingtrain shards --out PREFIX [--tokenizer tokenizer.json] FILE... (files after the flags)
int cmd_shards(const Args& args) {
  const FlagsAndPositionals split = split_positionals(args);
  const std::vector<std::string>& files = split.positionals;
  const Flags flags("lingtrain shards --out PREFIX [flags] FILE...: text files to llm.c token shards",
                    {{"out", "", "the shards' path prefix (required)"},
                     {"tokenizer", "", "a byte-level BPE tokenizer.json (default: the byte tokenizer)"},
                     {"tokens-per-shard", std::to_string(kDefaultTokensPerShard), "tokens per shard"}},
                    split.flags);
  if (flags.str("out").empty() || files.empty()) fail("shards needs --out PREFIX and at least one text file");
  const std::unique_ptr<Tokenizer> tokenizer = load_tokenizer(flags.str("tokenizer"));
  const ShardsWritten written = text_files_to_shards(files, *tokenizer, flags.str("out"), flags.positive("tokens-per-shard"));
  for (const std::string& path : written.paths) std::printf("%s\n", path.c_str());
  std::printf("%s\n", Json{{"documents", written.documents}, {"tokens", written.tokens}}.dump().c_str());
  return 0;
}

namespace {

const char* kTokenizerTrainUsage =
    "lingtrain tokenizer train --vocab N --out tokenizer.json [flags] FILE...: train a byte-level BPE tokenizer on\n"
    "text files";
const std::vector<FlagSpec> kTokenizerTrainFlags = {
    {"vocab", "4096", "the vocabulary size"},
    {"out", "", "the tokenizer.json to write (required)"},
    {"pattern", "ling", "the pre-tokenizer pattern: ling, llama3 or gpt2"}};
const char* kTokenizerEncodeUsage = "lingtrain tokenizer encode [flags] TEXT...: the ids of each text, JSON lines";
const std::vector<FlagSpec> kTokenizerEncodeFlags = {
    {"tokenizer", "", "a tokenizer.json (default: the byte tokenizer)"},
    {"special", "0", "1: special tokens written in the text (<|endoftext|>) are their ids"}};

}  // namespace

// lingtrain tokenizer train --vocab N --out tokenizer.json [--pattern ling|llama3|gpt2] TEXT...
// lingtrain tokenizer encode [--tokenizer T] [--special 1] TEXT...   one JSON line per text
int cmd_tokenizer(const Args& args) {
  if (!args.empty() && is_help_flag(args[0]))
    throw HelpRequested{help_text(kTokenizerTrainUsage, kTokenizerTrainFlags) + "\n" +
                        help_text(kTokenizerEncodeUsage, kTokenizerEncodeFlags)};
  if (args.empty() || (args[0] != "train" && args[0] != "encode")) fail("tokenizer needs a subcommand: train or encode");
  const FlagsAndPositionals split = split_positionals({args.begin() + 1, args.end()});
  if (args[0] == "train") {
    const Flags flags(kTokenizerTrainUsage, kTokenizerTrainFlags, split.flags);
    if (flags.str("out").empty() || split.positionals.empty())
      fail("tokenizer train needs --out tokenizer.json and at least one text file");
    BpeTrainSettings settings;
    settings.vocab_size = flags.positive("vocab");
    settings.pattern = flags.str("pattern");
    std::vector<std::string> texts;
    for (const std::string& path : split.positionals) texts.push_back(read_file(path));
    const Json tokenizer = train_bpe({texts.begin(), texts.end()}, settings);
    write_json_file(flags.str("out"), tokenizer);
    std::printf("%s\n", Json{{"tokenizer", flags.str("out")},
                              {"vocab_size", BpeTokenizer::from_json(tokenizer, flags.str("out")).vocab_size()},
                              {"merges", tokenizer.at("model").at("merges").size()}}
                             .dump()
                             .c_str());
    return 0;
  }
  const Flags flags(kTokenizerEncodeUsage, kTokenizerEncodeFlags, split.flags);
  const std::unique_ptr<Tokenizer> tokenizer = load_tokenizer(flags.str("tokenizer"));
  const bool special = flags.integer("special") != 0;
  for (const std::string& text : split.positionals) {
    const std::vector<uint32_t> ids = special ? tokenizer->encode_with_special_tokens(text) : tokenizer->encode(text);
    std::printf("%s\n", Json{{"text", text}, {"ids", ids}}.dump().c_str());
  }
  return 0;
}

// Per record, the rendered text, its ids and the loss mask, as JSON lines.
int cmd_chat_template(const Args& args) {
  const Flags flags("lingtrain chat-template --data F.jsonl [flags]: Ling's chat template: text, ids, loss_mask per record",
                    {{"data", "", "conversations, JSONL (required)"},
                     {"tokenizer", "", "a tokenizer.json (default: the byte tokenizer)"},
                     {"generation-prompt", "0", "1: end with the assistant's turn opened (for sampling a reply)"}},
                    args);
  if (flags.str("data").empty()) fail("chat-template needs --data FILE.jsonl");
  const std::unique_ptr<Tokenizer> tokenizer = load_tokenizer(flags.str("tokenizer"));
  const bool generation_prompt = flags.integer("generation-prompt") != 0;
  for_each_jsonl_record(flags.str("data"), [&](const Json& record, const std::string& where) {
    const RenderedChat chat = render_chat(conversation_from_json(record, where), *tokenizer, generation_prompt);
    std::printf("%s\n", Json{{"text", chat.text}, {"ids", chat.ids}, {"loss_mask", chat.loss_mask}}.dump().c_str());
  });
  return 0;
}

// The embedded post-training data: a knowledge graph, tool-use conversations, preference pairs, copy
// instructions.
int cmd_tool_data(const Args& args) {
  const Flags flags("lingtrain tool-data --out DIR [flags]: the embedded post-training data: a knowledge graph,\n"
                    "tool-use SFT conversations, preference pairs, copy instructions",
                    {{"out", "", "the folder to write (required)"},
                     {"seed", "1", "the graph's and the records' seed"},
                     {"sft", "8000", "tool-use conversations"},
                     {"dpo", "2000", "preference pairs"},
                     {"copy", "20000", "copy instructions"}},
                    args);
  if (flags.str("out").empty()) fail("tool-data needs --out DIR");
  const std::string out = flags.str("out");
  const auto seed = static_cast<uint64_t>(flags.integer("seed"));
  const KnowledgeGraph graph = build_knowledge_graph(seed);
  const ToolDataSet set = synthesise_tool_data(graph, seed, flags.positive("sft"), flags.positive("dpo"), flags.positive("copy"));
  std::filesystem::create_directories(out);
  write_json_file(out + "/knowledge_graph.json", graph.to_json());
  const std::pair<const char*, const std::vector<Json>*> files[] = {{"sft_train.jsonl", &set.sft_train},
                                                                     {"sft_val.jsonl", &set.sft_val},
                                                                     {"dpo_train.jsonl", &set.dpo_train},
                                                                     {"dpo_val.jsonl", &set.dpo_val},
                                                                     {"copy_train.jsonl", &set.copy_train},
                                                                     {"copy_val.jsonl", &set.copy_val}};
  Json summary = {{"knowledge_graph", out + "/knowledge_graph.json"}, {"facts", graph.facts.size()}};
  for (const auto& [name, records] : files) {
    write_jsonl_file(out + "/" + name, *records);
    summary[name] = records->size();
  }
  std::printf("%s\n", summary.dump().c_str());
  return 0;
}

}  // namespace lt::cli
