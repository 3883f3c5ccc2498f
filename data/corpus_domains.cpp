#include "data/corpus_domains.h"

#include <algorithm>
#include <cstdio>
#include <set>
#include <string_view>
#include <vector>

#include "data/random_text.h"

namespace lt::corpus_domains {

namespace {

using namespace random_text;

// Upper-cases the first letter after any opening quote; ä and ö are two UTF-8 bytes each.
void capitalize(std::string& text) {
  const size_t at = (!text.empty() && text[0] == '"') ? 1 : 0;
  if (at >= text.size()) return;
  if (text[at] >= 'a' && text[at] <= 'z') {
    text[at] = static_cast<char>(text[at] - 'a' + 'A');
  } else if (text.compare(at, 2, "ä") == 0) {
    text.replace(at, 2, "Ä");
  } else if (text.compare(at, 2, "ö") == 0) {
    text.replace(at, 2, "Ö");
  }
}

// ---------------------------------------------------------------------------------------------------
// Prose: a template grammar. Agreement (the cat sleeps / the cats sleep), one tense per document and
// a/an before vowels are the regularities a small model can pick up beyond word frequencies.

struct Noun {
  std::string_view one, many;
};
struct Verb {
  std::string_view base, third, past;
};

constexpr Noun kNouns[] = {
    {"cat", "cats"}, {"dog", "dogs"}, {"bird", "birds"}, {"horse", "horses"}, {"fox", "foxes"},
    {"wolf", "wolves"}, {"bear", "bears"}, {"fish", "fish"}, {"mouse", "mice"}, {"goose", "geese"},
    {"child", "children"}, {"man", "men"}, {"woman", "women"}, {"teacher", "teachers"}, {"farmer", "farmers"},
    {"doctor", "doctors"}, {"sailor", "sailors"}, {"king", "kings"}, {"queen", "queens"}, {"merchant", "merchants"},
    {"student", "students"}, {"painter", "painters"}, {"baker", "bakers"}, {"soldier", "soldiers"},
    {"hunter", "hunters"}, {"singer", "singers"}, {"stranger", "strangers"}, {"neighbor", "neighbors"},
    {"guard", "guards"}, {"thief", "thieves"}, {"river", "rivers"}, {"mountain", "mountains"}, {"city", "cities"},
    {"village", "villages"}, {"garden", "gardens"}, {"house", "houses"}, {"road", "roads"}, {"bridge", "bridges"},
    {"forest", "forests"}, {"lake", "lakes"}, {"island", "islands"}, {"ship", "ships"}, {"train", "trains"},
    {"letter", "letters"}, {"book", "books"}, {"song", "songs"}, {"storm", "storms"}, {"window", "windows"},
    {"door", "doors"}, {"table", "tables"}, {"lamp", "lamps"}, {"key", "keys"}, {"box", "boxes"}, {"coin", "coins"},
    {"map", "maps"}, {"clock", "clocks"}, {"tree", "trees"}, {"flower", "flowers"}, {"stone", "stones"},
    {"cloud", "clouds"}, {"star", "stars"}, {"field", "fields"}, {"hill", "hills"}, {"valley", "valleys"},
    {"tower", "towers"}, {"castle", "castles"}, {"market", "markets"}, {"street", "streets"}, {"school", "schools"},
    {"library", "libraries"}, {"kitchen", "kitchens"}, {"boat", "boats"}, {"wagon", "wagons"}, {"candle", "candles"},
    {"mirror", "mirrors"}, {"basket", "baskets"}, {"bottle", "bottles"}, {"blanket", "blankets"}, {"hat", "hats"},
    {"coat", "coats"}, {"apple", "apples"}, {"loaf", "loaves"}, {"cake", "cakes"}, {"orange", "oranges"},
    {"egg", "eggs"}, {"owl", "owls"}, {"engine", "engines"}, {"umbrella", "umbrellas"}, {"envelope", "envelopes"},
    {"anchor", "anchors"}, {"shadow", "shadows"}, {"wall", "walls"}, {"roof", "roofs"}, {"well", "wells"},
    {"gate", "gates"}, {"path", "paths"}, {"shore", "shores"}, {"harbor", "harbors"}, {"station", "stations"},
    {"museum", "museums"}, {"story", "stories"}, {"picture", "pictures"}, {"question", "questions"},
    {"answer", "answers"}, {"promise", "promises"}, {"secret", "secrets"}, {"journey", "journeys"},
    {"party", "parties"}, {"lesson", "lessons"}, {"dream", "dreams"}, {"knife", "knives"}, {"leaf", "leaves"},
    {"wheel", "wheels"}, {"rope", "ropes"}, {"ladder", "ladders"}, {"bell", "bells"}, {"drum", "drums"},
    {"violin", "violins"}, {"piano", "pianos"}, {"radio", "radios"}, {"meadow", "meadows"}, {"orchard", "orchards"},
};

constexpr Verb kTransitiveVerbs[] = {
    {"see", "sees", "saw"}, {"find", "finds", "found"}, {"carry", "carries", "carried"},
    {"open", "opens", "opened"}, {"close", "closes", "closed"}, {"build", "builds", "built"},
    {"paint", "paints", "painted"}, {"watch", "watches", "watched"}, {"follow", "follows", "followed"},
    {"call", "calls", "called"}, {"help", "helps", "helped"}, {"visit", "visits", "visited"},
    {"clean", "cleans", "cleaned"}, {"sell", "sells", "sold"}, {"buy", "buys", "bought"},
    {"bring", "brings", "brought"}, {"hide", "hides", "hid"}, {"lose", "loses", "lost"},
    {"catch", "catches", "caught"}, {"push", "pushes", "pushed"}, {"pull", "pulls", "pulled"},
    {"draw", "draws", "drew"}, {"read", "reads", "read"}, {"write", "writes", "wrote"}, {"love", "loves", "loved"},
    {"fear", "fears", "feared"}, {"remember", "remembers", "remembered"}, {"forget", "forgets", "forgot"},
    {"choose", "chooses", "chose"}, {"break", "breaks", "broke"}, {"fix", "fixes", "fixed"},
    {"hold", "holds", "held"}, {"throw", "throws", "threw"}, {"wash", "washes", "washed"},
    {"count", "counts", "counted"}, {"cook", "cooks", "cooked"}, {"feed", "feeds", "fed"}, {"meet", "meets", "met"},
    {"teach", "teaches", "taught"}, {"guard", "guards", "guarded"}, {"repair", "repairs", "repaired"},
    {"describe", "describes", "described"}, {"admire", "admires", "admired"}, {"notice", "notices", "noticed"},
    {"leave", "leaves", "left"}, {"keep", "keeps", "kept"}, {"send", "sends", "sent"}, {"chase", "chases", "chased"},
};

constexpr Verb kIntransitiveVerbs[] = {
    {"sleep", "sleeps", "slept"}, {"run", "runs", "ran"}, {"walk", "walks", "walked"}, {"sing", "sings", "sang"},
    {"laugh", "laughs", "laughed"}, {"wait", "waits", "waited"}, {"rest", "rests", "rested"},
    {"dance", "dances", "danced"}, {"swim", "swims", "swam"}, {"fly", "flies", "flew"}, {"cry", "cries", "cried"},
    {"shine", "shines", "shone"}, {"fall", "falls", "fell"}, {"arrive", "arrives", "arrived"},
    {"wander", "wanders", "wandered"}, {"listen", "listens", "listened"}, {"smile", "smiles", "smiled"},
    {"work", "works", "worked"}, {"travel", "travels", "traveled"}, {"hurry", "hurries", "hurried"},
    {"whisper", "whispers", "whispered"}, {"shout", "shouts", "shouted"}, {"sit", "sits", "sat"},
    {"stand", "stands", "stood"}, {"grow", "grows", "grew"}, {"disappear", "disappears", "disappeared"},
    {"return", "returns", "returned"}, {"rise", "rises", "rose"},
};

constexpr std::string_view kAdjectives[] = {
    "old", "young", "small", "large", "tall", "short", "quiet", "loud", "bright", "dark", "warm", "cold",
    "heavy", "light", "green", "red", "blue", "yellow", "white", "black", "brown", "golden", "silver", "wooden",
    "broken", "empty", "full", "happy", "sad", "tired", "hungry", "clever", "brave", "gentle", "proud", "strange",
    "famous", "hidden", "ancient", "modern", "narrow", "wide", "deep", "shallow", "rough", "smooth", "soft", "hard",
    "sweet", "bitter", "rich", "poor", "busy", "lazy", "careful", "curious", "lonely", "friendly", "angry", "calm",
    "wild", "tame", "clean", "dirty", "early", "late", "open", "round", "square", "thin", "thick", "strong", "weak",
    "quick", "slow", "noisy", "silent", "sleepy", "lucky", "honest", "elegant", "humble", "ordinary", "distant",
};

constexpr std::string_view kAdverbs[] = {
    "slowly", "quickly", "quietly", "loudly", "carefully", "happily", "sadly", "suddenly", "gently", "often",
    "rarely", "always", "never", "softly", "bravely", "easily", "eagerly", "calmly", "proudly", "together",
    "alone", "again", "politely", "patiently", "secretly", "badly", "well", "twice",
};

constexpr std::string_view kPrepositions[] = {
    "near", "behind", "across", "under", "beside", "inside", "above", "along", "around", "beyond", "below",
    "toward", "past", "through", "over", "against",
};

constexpr std::string_view kTimePhrases[] = {
    "in the morning", "at night", "every winter", "after the rain", "before dawn", "on Sunday", "in the spring",
    "at noon", "during the storm", "last summer", "one evening", "every day", "in the autumn", "at midnight",
    "after dinner", "on a cold day", "early in the year", "late in the evening", "once upon a time", "that week",
};

constexpr std::string_view kNames[] = {
    "Anna", "Boris", "Clara", "David", "Elena", "Felix", "Grace", "Hugo", "Iris", "Jonas", "Kira", "Leo", "Maya",
    "Nora", "Oscar", "Paula", "Quinn", "Rosa", "Simon", "Tara", "Victor", "Wendy", "Yusuf", "Zoe", "Arthur",
    "Bella", "Caleb", "Daria", "Emil", "Fiona", "Gavin", "Hana", "Ivan", "Julia", "Karl", "Lena", "Marco", "Nina",
    "Otto", "Petra",
};

struct NounPhrase {
  std::string text;
  bool plural = false;
};

bool starts_with_vowel(std::string_view word) { return std::string_view("aeiou").find(word[0]) != std::string_view::npos; }

std::string determiner(Rng& rng, bool plural, std::string_view next_word) {
  static constexpr std::string_view kPossessives[] = {"my", "his", "her", "our", "their"};
  static constexpr std::string_view kCounts[] = {"two", "three", "four", "five", "several"};
  const uint64_t roll = rng.below(10);
  if (roll == 9) return str(pick(rng, kPossessives)) + " ";
  if (!plural) {
    if (roll < 5) return "the ";
    if (roll < 8) return starts_with_vowel(next_word) ? "an " : "a ";
    return chance(rng, 0.5) ? "this " : "that ";
  }
  if (roll < 5) return "the ";
  if (roll == 5) return "some ";
  if (roll == 6) return "many ";
  if (roll == 7) return str(pick(rng, kCounts)) + " ";
  return chance(rng, 0.5) ? "these " : "those ";
}

NounPhrase noun_phrase(Rng& rng, bool allow_name) {
  if (allow_name && chance(rng, 0.2)) return {str(pick(rng, kNames)), false};
  const Noun& noun = pick(rng, kNouns);
  const bool plural = chance(rng, 0.35);
  std::string words = str(plural ? noun.many : noun.one);
  if (chance(rng, 0.4)) words = str(pick(rng, kAdjectives)) + " " + words;
  return {determiner(rng, plural, words) + words, plural};
}

std::string verb_form(const Verb& verb, bool plural_subject, bool past) {
  return str(past ? verb.past : plural_subject ? verb.base : verb.third);
}

std::string be(bool plural, bool past) { return past ? (plural ? "were" : "was") : (plural ? "are" : "is"); }

std::string clause(Rng& rng, bool past) {
  const NounPhrase subject = noun_phrase(rng, true);
  std::string out = subject.text + " ";
  if (chance(rng, 0.6)) {
    out += cat({verb_form(pick(rng, kTransitiveVerbs), subject.plural, past), " ", noun_phrase(rng, true).text});
  } else {
    out += verb_form(pick(rng, kIntransitiveVerbs), subject.plural, past);
    if (chance(rng, 0.4)) out += " " + str(pick(rng, kAdverbs));
  }
  if (chance(rng, 0.35)) out += cat({" ", str(pick(rng, kPrepositions)), " ", noun_phrase(rng, false).text});
  return out;
}

std::string prose_sentence(Rng& rng, bool past) {
  std::string sentence;
  switch (rng.below(9)) {
    case 0:
    case 1: sentence = clause(rng, past) + "."; break;
    case 2: sentence = cat({str(pick(rng, kTimePhrases)), ", ", clause(rng, past), "."}); break;
    case 3: sentence = cat({clause(rng, past), ", and ", clause(rng, past), "."}); break;
    case 4: sentence = cat({clause(rng, past), " because ", clause(rng, past), "."}); break;
    case 5: {
      const NounPhrase subject = noun_phrase(rng, false);
      std::string question;
      if (chance(rng, 0.5)) {
        question = "where " + be(subject.plural, past) + " " + subject.text + "?";
      } else {
        const std::string auxiliary = past ? "did" : subject.plural ? "do" : "does";
        question = cat({"why ", auxiliary, " ", subject.text, " ", str(pick(rng, kTransitiveVerbs).base), " ",
                        noun_phrase(rng, true).text, "?"});
      }
      capitalize(question);
      sentence = "\"" + question + "\" asked " + str(pick(rng, kNames)) + ".";
      break;
    }
    case 6: sentence = cat({str(pick(rng, kNames)), " said that ", clause(rng, past), "."}); break;
    case 7: {
      const NounPhrase first = noun_phrase(rng, false);
      sentence = first.text + " " + be(first.plural, past) + " " + str(pick(rng, kAdjectives));
      if (chance(rng, 0.5)) {
        const NounPhrase second = noun_phrase(rng, false);
        sentence += ", but " + second.text + " " + be(second.plural, past) + " " + str(pick(rng, kAdjectives));
      }
      sentence += ".";
      break;
    }
    default: {
      const NounPhrase thing = noun_phrase(rng, false);
      sentence = cat({"there ", be(thing.plural, past), " ", thing.text, " ", str(pick(rng, kPrepositions)), " ",
                      noun_phrase(rng, false).text, "."});
      break;
    }
  }
  capitalize(sentence);
  return sentence;
}

// ---------------------------------------------------------------------------------------------------
// Arithmetic: every statement is true, so the digits after "=" are predictable from the operands.

int64_t operand(Rng& rng, int max_digits) {
  static constexpr int64_t kPowers[] = {1, 10, 100, 1000, 10000};
  const int digits = static_cast<int>(between(rng, 1, max_digits));
  return between(rng, digits == 1 ? 0 : kPowers[digits - 1], kPowers[digits] - 1);
}

std::string number_list(const std::vector<int64_t>& numbers) {
  std::vector<std::string> parts;
  for (int64_t n : numbers) parts.push_back(std::to_string(n));
  return join(parts, ", ");
}

std::vector<int64_t> random_numbers(Rng& rng, int64_t count, int64_t hi) {
  std::vector<int64_t> numbers(count);
  for (int64_t& n : numbers) n = between(rng, 0, hi);
  return numbers;
}

std::string arithmetic_line(Rng& rng, int kind) {
  using std::to_string;
  switch (kind) {
    case 0: {
      const int64_t a = operand(rng, 3), b = operand(rng, 3);
      return to_string(a) + " + " + to_string(b) + " = " + to_string(a + b);
    }
    case 1: {
      const int64_t a = operand(rng, 3), b = operand(rng, 3);
      return to_string(a) + " - " + to_string(b) + " = " + to_string(a - b);
    }
    case 2: {
      const int64_t a = operand(rng, 2), b = operand(rng, chance(rng, 0.5) ? 1 : 2);
      return to_string(a) + " * " + to_string(b) + " = " + to_string(a * b);
    }
    case 3: {
      const int64_t divisor = between(rng, 2, 12), quotient = between(rng, 0, 99), rest = between(rng, 0, divisor - 1);
      const std::string line = to_string(divisor * quotient + rest) + " / " + to_string(divisor) + " = " + to_string(quotient);
      return rest == 0 ? line : line + " rem " + to_string(rest);
    }
    case 4: {
      int64_t value = between(rng, 0, 50);
      const int64_t magnitude = between(rng, 1, 15);
      const int64_t step = chance(rng, 0.2) ? -magnitude : magnitude;
      std::vector<int64_t> terms(between(rng, 5, 9));
      for (int64_t& term : terms) {
        term = value;
        value += step;
      }
      return number_list(terms);
    }
    case 5: {
      int64_t value = between(rng, 1, 5);
      const int64_t ratio = between(rng, 2, 4);
      std::vector<int64_t> terms(between(rng, 5, 7));
      for (int64_t& term : terms) {
        term = value;
        value *= ratio;
      }
      return number_list(terms);
    }
    case 6: {
      std::vector<int64_t> terms = {between(rng, 0, 9), between(rng, 1, 9)};
      const int64_t length = between(rng, 6, 10);
      while (static_cast<int64_t>(terms.size()) < length) terms.push_back(terms[terms.size() - 1] + terms[terms.size() - 2]);
      return number_list(terms);
    }
    case 7: {
      const std::vector<int64_t> numbers = random_numbers(rng, between(rng, 3, 5), 99);
      const bool maximum = chance(rng, 0.5);
      const int64_t result = maximum ? *std::max_element(numbers.begin(), numbers.end())
                                     : *std::min_element(numbers.begin(), numbers.end());
      return std::string(maximum ? "max(" : "min(") + number_list(numbers) + ") = " + to_string(result);
    }
    case 8: {
      std::vector<int64_t> numbers = random_numbers(rng, between(rng, 4, 7), 99);
      std::string line = "sort(" + number_list(numbers) + ") = ";
      std::sort(numbers.begin(), numbers.end());
      return line + number_list(numbers);
    }
    default: {
      const int64_t a = operand(rng, 2), b = operand(rng, 2);
      return to_string(a) + (a < b ? " < " : a > b ? " > " : " = ") + to_string(b);
    }
  }
}

// ---------------------------------------------------------------------------------------------------
// Code: C-like functions whose identifiers combine verbs and nouns in one naming style per document;
// braces balance and indentation follows nesting.

constexpr std::string_view kCodeVerbs[] = {
    "get", "set", "compute", "update", "find", "count", "load", "store", "parse", "read", "write", "reset",
    "check", "apply", "scale", "merge", "split", "clear", "fill", "copy", "sum", "sort", "push", "pop", "init",
    "build", "draw", "move", "swap", "normalize", "encode", "decode", "insert", "remove", "resize", "print",
    "validate", "hash", "compare", "advance",
};

constexpr std::string_view kCodeNouns[] = {
    "buffer", "index", "value", "node", "list", "table", "count", "size", "item", "entry", "key", "record",
    "frame", "pixel", "token", "line", "word", "score", "weight", "offset", "length", "total", "limit", "state",
    "flag", "cache", "queue", "stack", "tree", "path", "matrix", "vector", "row", "column", "block", "packet",
    "chunk", "sample", "message", "channel",
};

constexpr std::string_view kScalarTypes[] = {"int", "int", "float", "double", "long", "size_t", "unsigned"};
constexpr std::string_view kHeaders[] = {"stdio.h", "stdlib.h", "string.h", "math.h", "stdint.h", "stdbool.h"};

class CodeWriter {
 public:
  explicit CodeWriter(Rng& rng) : rng_(rng), camel_case_(chance(rng, 0.35)) {}

  std::string document() {
    std::string out;
    if (chance(rng_, 0.4)) {
      std::vector<std::string_view> headers(std::begin(kHeaders), std::end(kHeaders));
      const int64_t count = between(rng_, 1, 3);
      for (int64_t i = 0; i < count; ++i) {
        const size_t at = rng_.below(headers.size());
        out += "#include <" + str(headers[at]) + ">\n";
        headers.erase(headers.begin() + at);
      }
      out += "\n";
    }
    if (chance(rng_, 0.25)) out += structure() + "\n";
    const int64_t functions = between(rng_, 1, 2);
    for (int64_t i = 0; i < functions; ++i) {
      if (i) out += "\n";
      out += function();
    }
    return out;
  }

 private:
  std::string identifier(std::string_view first, std::string_view second) {
    if (!camel_case_) return str(first) + "_" + str(second);
    std::string tail = str(second);
    tail[0] = static_cast<char>(tail[0] - 'a' + 'A');
    return str(first) + tail;
  }

  // A verb_noun (or verbNoun) name; the two draws are separate statements to fix their order.
  std::string function_name() {
    const std::string_view verb = pick(rng_, kCodeVerbs);
    return identifier(verb, pick(rng_, kCodeNouns));
  }

  std::string fresh_variable() {
    std::string name = str(pick(rng_, kCodeNouns));
    if (chance(rng_, 0.3)) name = identifier(name, pick(rng_, kCodeNouns));
    while (std::find(scalars_.begin(), scalars_.end(), name) != scalars_.end() ||
           std::find(arrays_.begin(), arrays_.end(), name) != arrays_.end())
      name += "2";
    return name;
  }

  std::string indent() const { return std::string(4 * depth_, ' '); }

  std::string structure() {
    std::string out = "struct " + str(pick(rng_, kCodeNouns)) + " {\n";
    const int64_t fields = between(rng_, 2, 4);
    for (int64_t i = 0; i < fields; ++i)
      out += cat({"    ", str(pick(rng_, kScalarTypes)), " ", str(pick(rng_, kCodeNouns)), ";\n"});
    return out + "};\n";
  }

  std::string literal() {
    static constexpr std::string_view kCommon[] = {"0", "1", "2", "10", "100", "-1"};
    return chance(rng_, 0.6) ? str(pick(rng_, kCommon)) : std::to_string(between(rng_, 3, 255));
  }

  std::string term() {
    const uint64_t roll = rng_.below(10);
    if (roll < 5) return scalars_[rng_.below(scalars_.size())];
    if (roll < 7 && !arrays_.empty())
      return cat({arrays_[rng_.below(arrays_.size())], "[", scalars_[rng_.below(scalars_.size())], "]"});
    if (roll == 7) return cat({function_name(), "(", scalars_[rng_.below(scalars_.size())], ")"});
    return literal();
  }

  std::string expression() {
    static constexpr std::string_view kOperators[] = {" + ", " - ", " * ", " / ", " % ", " + ", " - "};
    return chance(rng_, 0.5) ? term() : cat({term(), str(pick(rng_, kOperators)), term()});
  }

  std::string condition() {
    static constexpr std::string_view kComparisons[] = {" < ", " > ", " <= ", " >= ", " == ", " != "};
    std::string out = cat({term(), str(pick(rng_, kComparisons)), term()});
    if (chance(rng_, 0.2))
      out += cat({chance(rng_, 0.5) ? " && " : " || ", term(), str(pick(rng_, kComparisons)), term()});
    return out;
  }

  std::string block(int64_t statements) {
    ++depth_;
    const size_t scope = scalars_.size();
    std::string out;
    for (int64_t i = 0; i < statements; ++i) out += statement();
    scalars_.resize(scope);
    --depth_;
    return out;
  }

  std::string statement() {
    static constexpr std::string_view kAssignments[] = {" = ", " += ", " -= ", " *= "};
    const bool can_nest = depth_ < 3;
    switch (rng_.below(10)) {
      case 0:
      case 1:
      case 2: {
        const std::string type = str(pick(rng_, kScalarTypes));
        const std::string init = expression();
        const std::string name = fresh_variable();
        scalars_.push_back(name);
        return indent() + type + " " + name + " = " + init + ";\n";
      }
      case 3:
      case 4:
        return cat({indent(), scalars_[rng_.below(scalars_.size())], str(pick(rng_, kAssignments)), expression(), ";\n"});
      case 5:
        if (can_nest) {
          std::string out = cat({indent(), "if (", condition(), ") {\n", block(between(rng_, 1, 3)), indent(), "}"});
          if (chance(rng_, 0.3)) out += cat({" else {\n", block(between(rng_, 1, 2)), indent(), "}"});
          return out + "\n";
        }
        [[fallthrough]];
      case 6:
        if (can_nest && !arrays_.empty()) {
          static constexpr std::string_view kLoopVariables[] = {"i", "j", "k"};
          const std::string loop_variable = str(kLoopVariables[std::min<int>(depth_ - 1, 2)]);
          const std::string bound = scalars_[rng_.below(scalars_.size())];
          const std::string head = indent() + "for (int " + loop_variable + " = 0; " + loop_variable + " < " + bound +
                                   "; " + loop_variable + "++) {\n";
          scalars_.push_back(loop_variable);
          std::string body = block(between(rng_, 1, 3));
          scalars_.pop_back();
          return head + body + indent() + "}\n";
        }
        [[fallthrough]];
      case 7:
        if (can_nest) {
          const std::string counter = scalars_[rng_.below(scalars_.size())];
          return cat({indent(), "while (", counter, " > ", literal(), ") {\n", block(between(rng_, 1, 2)), indent(),
                      "    ", counter, " /= 2;\n", indent(), "}\n"});
        }
        [[fallthrough]];
      case 8: return cat({indent(), function_name(), "(", expression(), ");\n"});
      default:
        return cat({indent(), scalars_[rng_.below(scalars_.size())], chance(rng_, 0.7) ? "++" : "--", ";\n"});
    }
  }

  std::string function() {
    scalars_.clear();
    arrays_.clear();
    const bool returns_void = chance(rng_, 0.2);
    const std::string return_type = returns_void ? "void" : str(pick(rng_, kScalarTypes));
    std::vector<std::string> parameters;
    if (chance(rng_, 0.6)) {
      const std::string array = str(pick(rng_, kCodeNouns)) + "s";
      arrays_.push_back(array);
      parameters.push_back("const " + str(pick(rng_, kScalarTypes)) + "* " + array);
    }
    // At least one scalar parameter, so that a body always has a variable to use (scalars_ is never empty).
    const int64_t scalar_parameters = between(rng_, 1, arrays_.empty() ? 2 : 3);
    for (int64_t i = 0; i < scalar_parameters; ++i) {
      const std::string name = fresh_variable();
      parameters.push_back(str(pick(rng_, kScalarTypes)) + " " + name);
      scalars_.push_back(name);
    }
    std::string out;
    if (chance(rng_, 0.3))
      out += cat({"// ", str(pick(rng_, kCodeVerbs)), " the ", str(pick(rng_, kCodeNouns)), " of each ",
                  str(pick(rng_, kCodeNouns)), "\n"});
    out += cat({chance(rng_, 0.2) ? "static " : "", return_type, " ", function_name(), "(", join(parameters, ", "),
                ") {\n"});
    ++depth_;
    const int64_t statements = between(rng_, 2, 6);
    for (int64_t i = 0; i < statements; ++i) out += statement();
    if (!returns_void) out += indent() + "return " + expression() + ";\n";
    --depth_;
    return out + "}\n";
  }

  Rng& rng_;
  bool camel_case_;
  int depth_ = 0;
  std::vector<std::string> scalars_;
  std::vector<std::string> arrays_;
};

// ---------------------------------------------------------------------------------------------------
// Records: one schema per document, rendered as a JSON array, JSON lines or CSV. Ids and timestamps
// increase within a document, e-mail addresses repeat the name, log levels go with status codes.

constexpr std::string_view kSurnames[] = {
    "Berg", "Costa", "Dahl", "Evans", "Fischer", "Garcia", "Hansen", "Ito", "Jensen", "Kowalski", "Larsen",
    "Moreau", "Nakamura", "Olsen", "Petrov", "Quint", "Rossi", "Schmidt", "Tanaka", "Usman", "Varga", "Weber",
    "Young", "Zhang", "Alvarez", "Brooks", "Chen", "Dubois", "Eriksen", "Fontaine", "Gruber", "Horvat", "Ivanova",
    "Jovanovic", "Keller", "Lindqvist", "Meyer", "Novak", "Okafor", "Park",
};
constexpr std::string_view kCities[] = {
    "Lisbon", "Oslo", "Kyoto", "Lagos", "Lima", "Porto", "Vienna", "Dublin", "Austin", "Quito", "Riga", "Tunis",
    "Perth", "Leeds", "Bergen", "Malmo", "Graz", "Turin", "Krakow", "Seville", "Denver", "Osaka", "Nairobi",
    "Hanoi", "Bogota", "Cairo", "Zagreb", "Tallinn", "Geneva", "Utrecht",
};
constexpr std::string_view kMailDomains[] = {"example.com", "mail.net", "post.org", "inbox.io"};
constexpr std::string_view kMaterials[] = {"ceramic", "steel", "wooden", "glass", "cotton", "leather", "paper", "copper"};
constexpr std::string_view kProducts[] = {
    "lamp", "mug", "chair", "kettle", "notebook", "backpack", "clock", "vase", "bowl", "pen", "scarf", "shelf",
    "basket", "mirror", "jar", "tray",
};
constexpr std::string_view kColors[] = {"blue", "red", "green", "black", "white", "grey", "yellow", "orange"};
constexpr std::string_view kTags[] = {"home", "office", "kitchen", "gift", "sale", "new", "outdoor", "eco", "travel", "kids"};
constexpr std::string_view kServices[] = {"auth", "billing", "search", "storage", "gateway", "mailer", "scheduler"};
constexpr std::string_view kInfoMessages[] = {"request served", "cache hit", "user logged in", "job finished", "file uploaded"};
constexpr std::string_view kWarnMessages[] = {"slow response", "retrying request", "token expired", "queue is long"};
constexpr std::string_view kErrorMessages[] = {"connection refused", "timeout", "disk full", "internal error"};

// A JSON value and how the same value is written in a CSV cell.
struct Field {
  std::string key;
  std::string json;
  std::string csv;
};
using Record = std::vector<Field>;

Field text_field(std::string key, const std::string& value) { return {std::move(key), "\"" + value + "\"", value}; }
Field raw_field(std::string key, const std::string& value) { return {std::move(key), value, value}; }

std::string decimal(double value, int digits) {
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%.*f", digits, value);
  return buffer;
}

std::string lowercase(std::string text) {
  for (char& c : text)
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  return text;
}

// Minutes since 2000-01-01 00:00 on a calendar of 28-day months: timestamps look real and increase,
// without month-length bookkeeping.
std::string timestamp(int64_t minutes, bool iso) {
  const int64_t minute = minutes % 60, hour = minutes / 60 % 24, day = minutes / 1440 % 28 + 1,
                month = minutes / 40320 % 12 + 1, year = 2000 + minutes / 483840;
  char buffer[40];
  if (iso) {
    std::snprintf(buffer, sizeof buffer, "%04lld-%02lld-%02lldT%02lld:%02lld:00Z", static_cast<long long>(year),
                  static_cast<long long>(month), static_cast<long long>(day), static_cast<long long>(hour),
                  static_cast<long long>(minute));
  } else {
    std::snprintf(buffer, sizeof buffer, "%04lld-%02lld-%02lld %02lld:%02lld", static_cast<long long>(year),
                  static_cast<long long>(month), static_cast<long long>(day), static_cast<long long>(hour),
                  static_cast<long long>(minute));
  }
  return buffer;
}

std::vector<Record> people(Rng& rng, int64_t count) {
  std::vector<Record> records;
  int64_t id = between(rng, 1000, 9000);
  for (int64_t i = 0; i < count; ++i) {
    const std::string first = str(pick(rng, kNames)), last = str(pick(rng, kSurnames));
    id += between(rng, 1, 5);
    records.push_back({raw_field("id", std::to_string(id)), text_field("name", first + " " + last),
                       raw_field("age", std::to_string(between(rng, 18, 90))), text_field("city", str(pick(rng, kCities))),
                       text_field("email", lowercase(first) + "." + lowercase(last) + "@" + str(pick(rng, kMailDomains))),
                       raw_field("active", chance(rng, 0.7) ? "true" : "false")});
  }
  return records;
}

std::vector<Record> products(Rng& rng, int64_t count) {
  std::vector<Record> records;
  for (int64_t i = 0; i < count; ++i) {
    const std::string sku = cat({std::string(1, static_cast<char>('A' + rng.below(26))),
                                 std::string(1, static_cast<char>('A' + rng.below(26))), "-",
                                 std::to_string(between(rng, 1000, 9999))});
    const int64_t dollars = between(rng, 1, 499);
    const int64_t cents = dollars * 100 + (chance(rng, 0.5) ? 99 : between(rng, 0, 99));
    std::vector<std::string> tags;
    const int64_t tag_count = between(rng, 1, 3);
    while (static_cast<int64_t>(tags.size()) < tag_count) {
      const std::string tag = str(pick(rng, kTags));
      if (std::find(tags.begin(), tags.end(), tag) == tags.end()) tags.push_back(tag);
    }
    std::vector<std::string> quoted_tags;
    for (const std::string& tag : tags) quoted_tags.push_back("\"" + tag + "\"");
    records.push_back({text_field("sku", sku),
                       text_field("title", cat({str(pick(rng, kColors)), " ", str(pick(rng, kMaterials)), " ",
                                                str(pick(rng, kProducts))})),
                       raw_field("price", decimal(static_cast<double>(cents) / 100.0, 2)),
                       raw_field("stock", std::to_string(between(rng, 0, 500))),
                       {"tags", cat({"[", join(quoted_tags, ", "), "]"}), join(tags, ";")}});
  }
  return records;
}

std::vector<Record> events(Rng& rng, int64_t count) {
  static constexpr std::string_view kOkStatus[] = {"200", "200", "201", "204", "301"};
  static constexpr std::string_view kWarnStatus[] = {"400", "401", "403", "404", "429"};
  static constexpr std::string_view kErrorStatus[] = {"500", "502", "503", "504"};
  std::vector<Record> records;
  int64_t minutes = between(rng, 0, 12 * 483840);
  const std::string service = str(pick(rng, kServices));
  for (int64_t i = 0; i < count; ++i) {
    minutes += between(rng, 0, 30);
    const uint64_t roll = rng.below(10);
    const std::string level = roll < 6 ? "info" : roll < 8 ? "warn" : roll < 9 ? "error" : "debug";
    const std::string status = level == "error" ? str(pick(rng, kErrorStatus))
                               : level == "warn" ? str(pick(rng, kWarnStatus))
                                                 : str(pick(rng, kOkStatus));
    const std::string message = level == "error" ? str(pick(rng, kErrorMessages))
                                : level == "warn" ? str(pick(rng, kWarnMessages))
                                                  : str(pick(rng, kInfoMessages));
    records.push_back({text_field("ts", timestamp(minutes, true)), text_field("level", level),
                       text_field("service", service), raw_field("status", status),
                       raw_field("latency_ms", std::to_string(between(rng, 1, level == "error" ? 5000 : 800))),
                       text_field("msg", message)});
  }
  return records;
}

std::vector<Record> sensor_readings(Rng& rng, int64_t count) {
  std::vector<Record> records;
  const std::string sensor =
      cat({std::string(1, "thp"[rng.below(3)]), "-", rng.below(2) ? "" : "0", std::to_string(between(rng, 1, 40))});
  int64_t minutes = between(rng, 0, 12 * 483840);
  const int64_t interval = 5 * between(rng, 1, 3);
  double temperature = static_cast<double>(between(rng, 50, 300)) / 10.0;
  double humidity = static_cast<double>(between(rng, 20, 80)) / 100.0;
  for (int64_t i = 0; i < count; ++i) {
    minutes += interval;
    temperature += static_cast<double>(between(rng, -5, 5)) / 10.0;
    humidity = std::clamp(humidity + static_cast<double>(between(rng, -3, 3)) / 100.0, 0.05, 0.99);
    records.push_back({text_field("sensor", sensor), text_field("time", timestamp(minutes, false)),
                       raw_field("temp_c", decimal(temperature, 1)), raw_field("humidity", decimal(humidity, 2)),
                       raw_field("ok", temperature < 35.0 ? "true" : "false")});
  }
  return records;
}

std::string render_json_object(const Record& record) {
  std::vector<std::string> members;
  for (const Field& field : record) members.push_back("\"" + field.key + "\": " + field.json);
  return cat({"{", join(members, ", "), "}"});
}

std::string render_records(Rng& rng, const std::vector<Record>& records) {
  std::vector<std::string> lines;
  switch (rng.below(3)) {
    case 0:
      for (const Record& record : records) lines.push_back("  " + render_json_object(record));
      return "[\n" + join(lines, ",\n") + "\n]";
    case 1:
      for (const Record& record : records) lines.push_back(render_json_object(record));
      return join(lines, "\n");
    default: {
      std::vector<std::string> header;
      for (const Field& field : records.front()) header.push_back(field.key);
      lines.push_back(join(header, ","));
      for (const Record& record : records) {
        std::vector<std::string> cells;
        for (const Field& field : record) cells.push_back(field.csv);
        lines.push_back(join(cells, ","));
      }
      return join(lines, "\n");
    }
  }
}

// ---------------------------------------------------------------------------------------------------
// Conlang: an agglutinative language (in the manner of Finnish) whose suffixes follow vowel harmony:
// a root with back vowels (a o u) takes -ssa, one with front vowels (ä ö y) takes -ssä. The lexicon is
// drawn once from a fixed seed, so the language is the same in every corpus.

constexpr uint64_t kConlangLexiconSeed = 0x4C696E674C616E67ull;

struct ConlangWord {
  std::string root;
  std::string last_vowel;
  bool front = false;  // takes front-vowel suffixes
};

struct ConlangLexicon {
  std::vector<ConlangWord> nouns, verbs, adjectives;
};

ConlangLexicon build_conlang_lexicon() {
  static constexpr std::string_view kOnsets[] = {"k", "t", "p", "v", "l", "m", "n", "s", "r", "h", "j", ""};
  static constexpr std::string_view kBackVowels[] = {"a", "o", "u", "a"};
  static constexpr std::string_view kFrontVowels[] = {"ä", "ö", "y", "ä"};
  static constexpr std::string_view kNeutralVowels[] = {"e", "i"};
  static constexpr std::string_view kCodas[] = {"n", "s", "l", "t", "r"};
  Rng rng(kConlangLexiconSeed);
  std::set<std::string> used;
  auto make_words = [&](size_t count, int64_t min_syllables, int64_t max_syllables) {
    std::vector<ConlangWord> words;
    while (words.size() < count) {
      ConlangWord word;
      word.front = chance(rng, 0.45);
      const int64_t syllables = between(rng, min_syllables, max_syllables);
      for (int64_t s = 0; s < syllables; ++s) {
        const std::string vowel = str(chance(rng, 0.25) ? pick(rng, kNeutralVowels)
                                      : word.front      ? pick(rng, kFrontVowels)
                                                        : pick(rng, kBackVowels));
        word.root += str(pick(rng, kOnsets)) + vowel;
        word.last_vowel = vowel;
        if (s + 1 < syllables && chance(rng, 0.25)) word.root += str(pick(rng, kCodas));
      }
      if (used.insert(word.root).second) words.push_back(std::move(word));
    }
    return words;
  };
  ConlangLexicon lexicon;
  lexicon.nouns = make_words(160, 2, 3);
  lexicon.verbs = make_words(100, 2, 2);
  lexicon.adjectives = make_words(60, 2, 3);
  return lexicon;
}

const ConlangLexicon& conlang_lexicon() {
  static const ConlangLexicon lexicon = build_conlang_lexicon();
  return lexicon;
}

enum class Case { Nominative, Genitive, Inessive, Adessive, Elative, Allative, Plural };

std::string inflect(const ConlangWord& word, Case grammatical_case) {
  const auto harmonic = [&](std::string_view back, std::string_view front) { return str(word.front ? front : back); };
  switch (grammatical_case) {
    case Case::Nominative: return word.root;
    case Case::Genitive: return word.root + "n";
    case Case::Inessive: return word.root + harmonic("ssa", "ssä");
    case Case::Adessive: return word.root + harmonic("lla", "llä");
    case Case::Elative: return word.root + harmonic("sta", "stä");
    case Case::Allative: return word.root + "lle";
    case Case::Plural: return word.root + "t";
  }
  return word.root;
}

// person 0..5: I, you, he/she, we, you (plural), they. The third person singular lengthens the final
// vowel; the past inserts -i- before the ending.
std::string conjugate(const ConlangWord& verb, int person, bool past) {
  const std::string stem = verb.root + (past ? "i" : "");
  switch (person) {
    case 0: return stem + "n";
    case 1: return stem + "t";
    case 2: return past ? stem : stem + verb.last_vowel;
    case 3: return stem + "mme";
    case 4: return stem + "tte";
    default: return stem + (verb.front ? "vät" : "vat");
  }
}

std::string noun_group(Rng& rng, Case grammatical_case) {
  const ConlangLexicon& lexicon = conlang_lexicon();
  std::string group;
  if (chance(rng, 0.35)) group = inflect(pick_from(rng, lexicon.adjectives), grammatical_case) + " ";
  return group + inflect(pick_from(rng, lexicon.nouns), grammatical_case);
}

std::string conlang_clause(Rng& rng, bool past) {
  static constexpr std::string_view kPronouns[] = {"minä", "sinä", "hän", "me", "te", "he"};
  static constexpr std::string_view kTimes[] = {"nyt", "sitten", "eilen", "huomenna", "aina", "usein"};
  static constexpr Case kPlaces[] = {Case::Inessive, Case::Adessive, Case::Elative, Case::Allative};
  std::vector<std::string> words;
  if (chance(rng, 0.2)) words.push_back(str(pick(rng, kTimes)));
  int person;
  if (chance(rng, 0.4)) {
    person = static_cast<int>(rng.below(6));
    words.push_back(str(kPronouns[person]));
  } else {
    const bool plural = chance(rng, 0.25);
    person = plural ? 5 : 2;
    words.push_back(noun_group(rng, plural ? Case::Plural : Case::Nominative));
  }
  if (chance(rng, 0.35)) words.push_back(noun_group(rng, pick(rng, kPlaces)));
  if (chance(rng, 0.6)) words.push_back(noun_group(rng, Case::Genitive));
  words.push_back(conjugate(pick_from(rng, conlang_lexicon().verbs), person, past));
  return join(words, " ");
}

std::string conlang_sentence(Rng& rng, bool past) {
  static constexpr std::string_view kConjunctions[] = {", ja ", ", mutta ", ", kun "};
  std::string sentence = conlang_clause(rng, past);
  if (chance(rng, 0.25)) sentence += cat({str(pick(rng, kConjunctions)), conlang_clause(rng, past)});
  const bool question = chance(rng, 0.1);
  sentence += question ? "?" : ".";
  capitalize(sentence);
  return sentence;
}

template <class Sentence>
std::string paragraphs(Rng& rng, int64_t min_sentences, int64_t max_sentences, Sentence sentence) {
  std::vector<std::string> paragraph_texts;
  const int64_t paragraph_count = between(rng, 1, 3);
  for (int64_t p = 0; p < paragraph_count; ++p) {
    std::vector<std::string> sentences;
    const int64_t sentence_count = between(rng, min_sentences, max_sentences);
    for (int64_t s = 0; s < sentence_count; ++s) sentences.push_back(sentence());
    paragraph_texts.push_back(join(sentences, " "));
  }
  return join(paragraph_texts, "\n\n");
}

}  // namespace

std::string prose_document(Rng& rng) {
  const bool past = chance(rng, 0.6);
  return paragraphs(rng, 3, 7, [&] { return prose_sentence(rng, past); });
}

std::string arithmetic_document(Rng& rng) {
  std::vector<std::string> lines;
  if (chance(rng, 0.5)) lines.push_back("exercise set " + std::to_string(between(rng, 1, 999)) + ":");
  std::vector<int> kinds(between(rng, 1, 3));
  for (int& kind : kinds) kind = static_cast<int>(rng.below(10));
  const int64_t line_count = between(rng, 12, 40);
  for (int64_t i = 0; i < line_count; ++i) lines.push_back(arithmetic_line(rng, pick_from(rng, kinds)));
  return join(lines, "\n");
}

std::string code_document(Rng& rng) { return CodeWriter(rng).document(); }

std::string records_document(Rng& rng) {
  const int64_t count = between(rng, 3, 10);
  switch (rng.below(4)) {
    case 0: return render_records(rng, people(rng, count));
    case 1: return render_records(rng, products(rng, count));
    case 2: return render_records(rng, events(rng, count));
    default: return render_records(rng, sensor_readings(rng, count));
  }
}

std::string conlang_document(Rng& rng) {
  const bool past = chance(rng, 0.5);
  // Conlang sentences are shorter than prose ones; more of them keep the domains' byte shares similar.
  return paragraphs(rng, 4, 10, [&] { return conlang_sentence(rng, past); });
}

}  // namespace lt::corpus_domains
