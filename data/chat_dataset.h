// The post-training data sets: TRL-style JSONL rendered with Ling's chat template (data/chat_template.h)
// into labelled sequences ready for packing (data/packing.h).
//
//   SFT: one conversation per line ({"messages": [...]}, or {"prompt", "completion"}); every assistant
//        reply and its <|endoftext|> are labelled.
//   DPO: one pair per line, {"prompt", "chosen", "rejected"} (strings, or message lists), optionally
//        "format_only": true. Each pair gives two sequences, prompt + chosen and prompt + rejected, in
//        which only the response is labelled (an assistant turn inside the prompt is not). A
//        format-only pair (Ling's format-recovery DPO) counts in its DPO log-probs just the tokens where
//        the two responses differ: each response without the longest common prefix and suffix of the
//        two (the suffix shortened so that neither response is left with no token).
// Records that cannot be trained on are skipped and counted, never fatal: a sequence (a pair: the two
// together, as they share a packed row) longer than max_tokens, and a pair whose two responses render
// the same. Malformed records are errors naming file and line.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "data/packing.h"
#include "data/tokenizer.h"

namespace lt {

struct ChatDataset {
  std::vector<LabeledSequence> sequences;  // SFT: one per conversation; DPO: 2 per pair (chosen, rejected)
  int64_t records = 0;      // read from the file
  int64_t too_long = 0;     // skipped: longer than max_tokens
  int64_t identical = 0;    // DPO, skipped: chosen and rejected render to the same tokens
  int64_t format_only = 0;  // DPO: pairs whose DPO log-probs count only the tokens that differ
  int64_t examples() const { return records - too_long - identical; }
};

ChatDataset load_conversations(const std::string& path, const Tokenizer& tokenizer, int64_t max_tokens);
ChatDataset load_preference_pairs(const std::string& path, const Tokenizer& tokenizer, int64_t max_tokens);

}  // namespace lt
