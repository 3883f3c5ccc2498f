#include "trainer/stage_settings.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <type_traits>

#include "tensor/error.h"

namespace lt {

const char* stage_kind_name(StageKind kind) {
  switch (kind) {
    case StageKind::Pretrain: return "pretrain";
    case StageKind::Sft: return "sft";
    case StageKind::Dpo: return "dpo";
  }
  fail("unknown stage kind ", static_cast<int>(kind));
}

StageKind parse_stage_kind(const std::string& name, const std::string& where) {
  for (StageKind kind : {StageKind::Pretrain, StageKind::Sft, StageKind::Dpo})
    if (name == stage_kind_name(kind)) return kind;
  fail(where, ": kind must be pretrain, sft or dpo, got '", name, "'");
}

namespace {

template <class T>
constexpr StageKey::Type key_type() {
  if constexpr (std::is_same_v<T, int64_t>) return StageKey::Type::Integer;
  else if constexpr (std::is_same_v<T, double>) return StageKey::Type::Number;
  else if constexpr (std::is_same_v<T, std::string> || std::is_same_v<T, DataSpec>) return StageKey::Type::Text;
  else return StageKey::Type::Kind;
}

template <class T>
void read_key(const JsonObject& o, const char* key, T& value, const std::string&) {
  value = o.get<T>(key, value);
}
void read_key(const JsonObject& o, const char* key, StageKind& value, const std::string& where) {
  if (o.has(key)) value = parse_stage_kind(o.get<std::string>(key), where);
}
void read_key(const JsonObject& o, const char* key, DataSpec& value, const std::string& where) {
  if (o.has(key)) value = DataSpec::from_json(o.json().at(key), where + ": " + key);
}

template <class T>
Json json_of(const T& value) {
  return Json(value);
}
Json json_of(StageKind kind) { return stage_kind_name(kind); }
Json json_of(const DataSpec& data) { return data.to_json(); }

bool is_source_name(const std::string& name) {
  return !name.empty() && std::all_of(name.begin(), name.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.';
  });
}

// One entry of the command line's form: "NAME@WEIGHT=PATHS", or PATHS alone.
DataSource parse_source(const std::string& entry, const std::string& where) {
  const size_t at = entry.find('@'), equals = entry.find('=');
  if (at == std::string::npos || equals == std::string::npos || at > equals || !is_source_name(entry.substr(0, at)))
    return {"", entry, 1};
  const std::string weight_text = entry.substr(at + 1, equals - at - 1);
  char* end = nullptr;
  const double weight = std::strtod(weight_text.c_str(), &end);
  LT_CHECK(!weight_text.empty() && *end == '\0', where, ": source '", entry.substr(0, at), "': weight '", weight_text,
           "' is not a number (NAME@WEIGHT=PATHS)");
  return {entry.substr(0, at), entry.substr(equals + 1), weight};
}

// Every key, whatever the kind.
Json all_keys_json(const StageSettings& s) {
  Json out = Json::object();
#define LT_WRITE_KEY(type, key, default_value, sft_default, dpo_default, kinds, traits, help) out[#key] = json_of(s.key);
  LT_STAGE_SETTINGS(LT_WRITE_KEY)
#undef LT_WRITE_KEY
  return out;
}

// The checks that span several keys (one key's type is checked as it is read).
void validate(const StageSettings& s, const std::string& where) {
  LT_CHECK(s.beta > 0 && s.rpo_alpha >= 0 && s.epochs >= 0, where, ": beta must be > 0, rpo_alpha and epochs >= 0");
  LT_CHECK(s.kind != StageKind::Dpo || !s.reference.empty(), where, ": a dpo stage needs 'reference' (a checkpoint)");
  LT_CHECK(s.kind == StageKind::Pretrain || !s.data.empty(), where, ": a", s.kind == StageKind::Sft ? "n " : " ",
           stage_kind_name(s.kind), " stage needs 'data' (a JSONL file)");
  LT_CHECK(s.kind == StageKind::Pretrain || !s.data.is_mixture(), where, ": a mixture of sources is for pre-training; ",
           stage_kind_name(s.kind), " reads one JSONL file");
  LT_CHECK(s.on_exhausted == "repeat" || s.on_exhausted == "end", where, ": on_exhausted must be repeat or end, got '",
           s.on_exhausted, "'");
  // A post-training stage may leave its steps to its epochs (0: sized when the run packs its data).
  LT_CHECK((s.steps > 0 || (s.steps == 0 && s.kind != StageKind::Pretrain && s.epochs > 0)) && s.batch > 0 &&
               s.seq > 0 && s.accum > 0,
           where, ": steps, batch, seq and accum must be > 0");
  LT_CHECK(s.rope_theta >= 0, where, ": rope_theta must be >= 0 (0 keeps the model's)");
  LT_CHECK(s.clip >= 0 && s.weight_decay >= 0, where, ": clip and weight_decay must be >= 0");
  LT_CHECK(s.batch_warmup_start >= 0 && s.batch_warmup_steps >= 0, where,
           ": batch_warmup_start and batch_warmup_steps must be >= 0");
  LT_CHECK(stage_token_bound(s), where, ": steps x batch x accum x seq exceed a 64-bit token count");
  try {
    s.schedule().validate();
  } catch (const Error& e) {
    fail(where, ": ", e.what());
  }
}

}  // namespace

DataSpec DataSpec::from_json(const Json& json, const std::string& where) {
  DataSpec spec;
  if (json.is_string()) {
    const std::string text = json.get<std::string>();
    if (text.empty()) return spec;
    size_t begin = 0;
    for (;;) {
      const size_t end = text.find(';', begin);
      spec.sources.push_back(parse_source(text.substr(begin, end == std::string::npos ? end : end - begin), where));
      if (end == std::string::npos) break;
      begin = end + 1;
    }
  } else {
    LT_CHECK(json.is_array() && !json.empty(), where, ": must be a string (files) or a list of sources, got ",
             json.dump());
    for (size_t i = 0; i < json.size(); ++i) {
      const JsonObject o(json[i], where + "[" + std::to_string(i) + "]");
      for (const auto& [key, value] : o.json().items())
        LT_CHECK(key == "name" || key == "path" || key == "weight", o.source(), ": unknown key '", key,
                 "' (name, path, weight)");
      spec.sources.push_back({o.get<std::string>("name"), o.get<std::string>("path"), o.get<double>("weight", 1.0)});
    }
  }
  if (!spec.is_mixture()) return spec;
  for (size_t i = 0; i < spec.sources.size(); ++i) {
    const DataSource& source = spec.sources[i];
    LT_CHECK(is_source_name(source.name), where, ": source ", i, " needs a name of letters, digits, '_', '-' or '.' (",
             "NAME@WEIGHT=PATHS), got '", source.name, "'");
    LT_CHECK(!source.path.empty(), where, ": source '", source.name, "' names no files");
    LT_CHECK(std::isfinite(source.weight) && source.weight > 0, where, ": source '", source.name, "' has weight ",
             source.weight, ", it must be > 0");
    for (size_t j = 0; j < i; ++j)
      LT_CHECK(spec.sources[j].name != source.name, where, ": source name '", source.name, "' appears twice");
  }
  return spec;
}

Json DataSpec::to_json() const {
  if (!is_mixture()) return path();
  Json sources = Json::array();
  for (const DataSource& s : this->sources)
    sources.push_back({{"name", s.name}, {"path", s.path}, {"weight", s.weight}});
  return sources;
}

const std::vector<StageKey>& stage_keys() {
  static const std::vector<StageKey> keys = {
#define LT_KEY_ROW(type, key, default_value, sft_default, dpo_default, kinds, traits, help) \
  {#key, key_type<type>(), kinds, traits, help},
      LT_STAGE_SETTINGS(LT_KEY_ROW)
#undef LT_KEY_ROW
  };
  return keys;
}

StageSettings stage_defaults(StageKind kind) {
  StageSettings s;
#define LT_KIND_DEFAULT(type, key, default_value, sft_default, dpo_default, kinds, traits, help) \
  if (kind == StageKind::Sft) s.key = sft_default;                                             \
  if (kind == StageKind::Dpo) s.key = dpo_default;
  LT_STAGE_SETTINGS(LT_KIND_DEFAULT)
#undef LT_KIND_DEFAULT
  return s;
}

std::string stage_value_text(const StageSettings& stage, const std::string& key) {
  const Json value = all_keys_json(stage).at(key);
  if (value.is_string()) return value.get<std::string>();
  if (value.is_number_float() && value.get<double>() < 0) return "";  // kUnsetBelowZero
  // A whole number as one ("2", not JSON's "2.0"); others in JSON's shortest form ("0.001").
  if (value.is_number_float() && value.get<double>() == std::floor(value.get<double>()) && value.get<double>() < 1e15)
    return std::to_string(static_cast<long long>(value.get<double>()));
  return value.dump();
}

std::optional<int64_t> stage_token_bound(const StageSettings& s) {
  int64_t sequences = 0, tokens = 0, total = 0;
  if (__builtin_mul_overflow(s.batch, s.accum, &sequences) ||
      __builtin_add_overflow(std::max(sequences, s.batch_warmup_start), s.batch, &sequences) ||
      __builtin_mul_overflow(sequences, s.seq, &tokens) || __builtin_mul_overflow(tokens, s.steps, &total))
    return std::nullopt;
  return total;
}

LRSchedule StageSettings::schedule() const {
  LRSchedule s;
  s.kind = lr_schedule;
  s.peak = lr;
  s.min_lr = min_lr;
  s.warmup_steps = warmup_steps;
  s.halve_at_fraction = halve_at;
  s.total_steps = std::max<int64_t>(steps, 1);
  return s;
}

int64_t StageSettings::micro_batches_at(int64_t step) const {
  return std::max<int64_t>(1, (ramp().at(step) + batch - 1) / batch);
}

double StageSettings::total_tokens() const {
  // Past the batch ramp every step takes `accum` micro-batches, so only the ramp's steps are walked: a
  // walk over all of a recipe's steps hung on a large step count (tests/fuzz/fuzz_trainer_json).
  const BatchRamp r = ramp();
  const int64_t ramp_end = r.ramp_steps > 0 && r.start > 0 ? std::min(steps, r.ramp_steps) : 0;
  double total = 0;
  for (int64_t s = 0; s < ramp_end; ++s) total += static_cast<double>(micro_batches_at(s) * batch * seq);
  return total + static_cast<double>(steps - ramp_end) * static_cast<double>(accum * batch * seq);
}

StageSettings stage_from_json(const JsonObject& o, const std::string& where) {
  for (const auto& [key, value] : o.json().items()) {
    const bool known = std::any_of(stage_keys().begin(), stage_keys().end(),
                                   [&key = key](const StageKey& k) { return key == k.key; });
    LT_CHECK(known, where, ": unknown key '", key, "'");
  }
  StageSettings s;
#define LT_READ_KEY(type, key, default_value, sft_default, dpo_default, kinds, traits, help) \
  read_key(o, #key, s.key, where);
  LT_STAGE_SETTINGS(LT_READ_KEY)
#undef LT_READ_KEY
  validate(s, where);
  return s;
}

Json stage_to_json(const StageSettings& s) {
  Json all = all_keys_json(s), out = Json::object();
  for (const StageKey& k : stage_keys()) {
    if (!k.applies_to(s.kind)) continue;
    if (k.has(kUnsetBelowZero) && all.at(k.key).get<double>() < 0) continue;
    out[k.key] = all.at(k.key);
  }
  return out;
}

}  // namespace lt
