// The five document generators behind data/corpus.h (internal to data/). Each draws everything from
// the Rng it is given, so a document is a function of that generator's seed alone.
#pragma once
#include <string>

#include "tensor/random.h"

namespace lt::corpus_domains {

std::string prose_document(Rng& rng);
std::string arithmetic_document(Rng& rng);
std::string code_document(Rng& rng);
std::string records_document(Rng& rng);
std::string conlang_document(Rng& rng);

}  // namespace lt::corpus_domains
