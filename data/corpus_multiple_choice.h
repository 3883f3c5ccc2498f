// A multiple-choice task made from the embedded corpus (data/corpus.h), so that a fresh checkout measures
// one with nothing downloaded: "which continuation belongs to this document".
//
// Every document comes from the held-out split of the default corpus (kDefaultCorpusSeed), which a run
// on that corpus never trains on. An item's context is the start of a document, cut where a run of
// whitespace begins 96 to 160 bytes in (plus the word that straddles that point); its correct choice is the
// next kCorpusChoiceBytes bytes of the same document (starting with that whitespace). The three distractors
// are chunks of the same size from other held-out documents, cut the same way at a similar offset, each
// from the item's own domain with probability 1/2 and from another domain otherwise: a distractor from
// another domain is given away by the switch of domain, one from the same domain only by following the
// document itself. Chance is 0.25. Contexts and choices total at most 248 bytes, so items fit the tiny
// preset's 256 positions under the byte tokenizer.
//
// The documents are the held-out ones long enough for a cut, in index order; the seed draws where each is
// cut, the distractors and the correct choice's position.
#pragma once
#include <cstdint>
#include <vector>

#include "data/multiple_choice.h"

namespace lt {

inline constexpr size_t kCorpusChoiceBytes = 48;
inline constexpr uint64_t kDefaultCorpusMultipleChoiceSeed = 1;

std::vector<MultipleChoiceItem> make_corpus_multiple_choice_items(uint64_t seed, int64_t n);

}  // namespace lt
