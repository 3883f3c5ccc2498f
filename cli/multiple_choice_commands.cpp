// eval-mc and mc-data: multiple-choice accuracy of a checkpoint (trainer/multiple_choice.h), and the
// embedded multiple-choice task made from the corpus's held-out documents (data/corpus_multiple_choice.h).
#include <unistd.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/flags.h"
#include "data/corpus_multiple_choice.h"
#include "data/jsonl.h"
#include "data/multiple_choice.h"
#include "data/tokenizer.h"
#include "io/format_text.h"
#include "model/ling.h"
#include "tensor/error.h"
#include "trainer/checkpoint.h"
#include "trainer/multiple_choice.h"

namespace lt::cli {

namespace {

// Items done and the running accuracy on stderr: rewritten in place on a terminal, else a line at every
// tenth of the items (a log keeps about ten).
class McProgress {
 public:
  explicit McProgress(int64_t total) : total_(total), terminal_(isatty(fileno(stderr)) != 0) {}
  void update(int64_t done, int64_t correct) {
    const double acc = static_cast<double>(correct) / static_cast<double>(done);
    const std::string line = format_text("eval-mc: %lld/%lld items, acc %.4f", static_cast<long long>(done),
                                         static_cast<long long>(total_), acc);
    if (terminal_) {
      std::fprintf(stderr, "\r%s\x1b[K%s", line.c_str(), done == total_ ? "\n" : "");
    } else if (done * 10 / total_ > printed_tenths_ || done == total_) {
      printed_tenths_ = done * 10 / total_;
      std::fprintf(stderr, "%s\n", line.c_str());
    }
  }

 private:
  int64_t total_;
  bool terminal_;
  int64_t printed_tenths_ = 0;
};

}  // namespace

int cmd_eval_mc(const Args& args) {
  const Flags flags(
      "lingtrain eval-mc --ckpt DIR --data F.jsonl: multiple-choice accuracy, each choice scored by the summed\n"
      "log-prob of its tokens after the context (docs/evaluation.md); last line JSON: acc, acc_norm, n,\n"
      "truncated, shots, chance. Items: {\"context\", \"choices\", \"label\"} or HellaSwag's\n"
      "{\"ctx\", \"endings\", \"label\"}",
      {{"ckpt", "", "the checkpoint (required)"},
       {"data", "", "the items, JSONL (required)"},
       {"shots", "0", "solved examples before each item (few-shot)"},
       {"fewshot", "", "the examples' items, JSONL (default: the other items of --data)"},
       {"limit", "0", "the first N items (0: all)"},
       {"batch", "8", "packed rows per forward"},
       {"seed", "1234", "the few-shot examples' draw"},
       {"scores", "", "write each item's per-choice log-probs here, JSONL"},
       {"tokenizer", "", "a tokenizer.json (default: the checkpoint's)"},
       threads_flag(),
       {"device", "cpu", "cpu, cuda or cuda:N"}},
      args);
  apply_threads(flags);
  if (flags.str("ckpt").empty() || flags.str("data").empty()) fail("eval-mc needs --ckpt DIR and --data FILE.jsonl");
  const int64_t limit = flags.integer("limit"), shots = flags.integer("shots");
  if (limit < 0) fail("flag --limit must be >= 0, got ", limit);
  if (shots < 0) fail("flag --shots must be >= 0, got ", shots);
  const std::vector<MultipleChoiceItem> items = read_multiple_choice_file(flags.str("data"), limit);
  if (items.empty()) fail(flags.str("data"), ": no items");
  std::vector<MultipleChoiceItem> fewshot;
  if (!flags.str("fewshot").empty()) {
    fewshot = read_multiple_choice_file(flags.str("fewshot"));
    if (static_cast<int64_t>(fewshot.size()) < shots)
      fail(flags.str("fewshot"), ": ", count_of(static_cast<long long>(fewshot.size()), "item"),
           ", fewer than --shots ", shots);
  } else if (static_cast<int64_t>(items.size()) <= shots && shots > 0) {
    fail(flags.str("data"), ": ", count_of(static_cast<long long>(items.size()), "item"), ", too few to draw ", shots,
         " examples from the others (pass --fewshot F.jsonl)");
  }
  const std::string ckpt = flags.str("ckpt");
  LingForCausalLM model(load_checkpoint_config(ckpt), 0);
  load_checkpoint_weights(ckpt, model);
  model.to(parse_device(flags.str("device")));
  const std::unique_ptr<Tokenizer> tokenizer =
      resolve_tokenizer(flags.str("tokenizer"), ckpt, model.config().vocab_size);

  McProgress progress(static_cast<int64_t>(items.size()));
  MultipleChoiceSettings settings;
  settings.shots = shots;
  settings.fewshot_pool = flags.str("fewshot").empty() ? nullptr : &fewshot;
  settings.seed = static_cast<uint64_t>(flags.integer("seed"));
  settings.batch = flags.positive("batch");
  settings.on_progress = [&](int64_t done, int64_t correct) { progress.update(done, correct); };
  const MultipleChoiceResult result = evaluate_multiple_choice(model, *tokenizer, items, settings);
  if (!flags.str("scores").empty()) {
    std::vector<Json> records;
    for (size_t i = 0; i < items.size(); ++i) {
      const MultipleChoiceScore& score = result.items[i];
      records.push_back({{"logprobs", score.logprobs}, {"label", items[i].label}, {"predicted", score.predicted},
                         {"predicted_norm", score.predicted_norm}, {"truncated", score.truncated}});
    }
    write_jsonl_file(flags.str("scores"), records);
  }
  std::printf("%s\n", result.summary().dump().c_str());
  return 0;
}

int cmd_mc_data(const Args& args) {
  const Flags flags("lingtrain mc-data --out F.jsonl: the embedded multiple-choice task (which continuation belongs\n"
                    "to this held-out corpus document; 4 choices), {\"context\", \"choices\", \"label\"} per line",
                    {{"out", "", "the JSONL file to write (required)"},
                     {"items", "1000", "how many items"},
                     {"seed", std::to_string(kDefaultCorpusMultipleChoiceSeed), "the items' seed"}},
                    args);
  if (flags.str("out").empty()) fail("mc-data needs --out F.jsonl");
  const std::vector<MultipleChoiceItem> items =
      make_corpus_multiple_choice_items(static_cast<uint64_t>(flags.integer("seed")), flags.positive("items"));
  std::vector<Json> records;
  for (const MultipleChoiceItem& item : items) records.push_back(multiple_choice_item_to_json(item));
  write_jsonl_file(flags.str("out"), records);
  std::printf("%s\n", Json{{"items", items.size()}, {"out", flags.str("out")}}.dump().c_str());
  return 0;
}

}  // namespace lt::cli
