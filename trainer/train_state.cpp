#include "trainer/train_state.h"

#include <map>
#include <type_traits>

namespace lt {

namespace {

// nlohmann's get<integer>() casts a floating-point value without a range check (undefined behaviour for
// 1e300, or for a uint64 literal one past the maximum, which it stores as a double), so integers are
// checked to be stored as integers first. Found by tests/fuzz/fuzz_trainer_json.
template <class Integer>
Integer exact_integer(const Json& value, const std::string& source, const std::string& what) {
  const bool fits = std::is_unsigned_v<Integer> ? value.is_number_unsigned() : value.is_number_integer();
  LT_CHECK(fits, source, ": ", what, " must be ", std::is_unsigned_v<Integer> ? "a non-negative " : "an ",
           "integer, got ", value.dump());
  return value.get<Integer>();
}

SamplerCursor sampler_cursor_from_json(const JsonObject& o) {
  const int64_t epoch = o.get<int64_t>("epoch"), position = o.get<int64_t>("position");
  const int64_t given = o.get<int64_t>("given", 0);  // absent from checkpoints of one-source data before mixtures
  LT_CHECK(epoch >= 0 && position >= 0 && given >= 0, o.source(),
           ": data_cursor epoch, position and given must be >= 0, got ", epoch, ", ", position, " and ", given);
  return {static_cast<uint64_t>(epoch), static_cast<uint64_t>(position), static_cast<uint64_t>(given)};
}

Json sampler_cursor_to_json(const SamplerCursor& c) {
  return {{"epoch", c.epoch}, {"position", c.position}, {"given", c.given}};
}

// One source's cursor as it always was ({"epoch", "position", "given"}); a mixture's as {"sources": [...]}.
Json data_cursor_to_json(const DataCursor& cursor) {
  if (cursor.size() <= 1) return sampler_cursor_to_json(cursor.empty() ? SamplerCursor{} : cursor[0]);
  Json sources = Json::array();
  for (const SamplerCursor& c : cursor) sources.push_back(sampler_cursor_to_json(c));
  return {{"sources", sources}};
}

DataCursor data_cursor_from_json(const JsonObject& o) {
  if (!o.has("sources")) return {sampler_cursor_from_json(o)};
  const Json& sources = o.json().at("sources");
  LT_CHECK(sources.is_array() && !sources.empty(), o.source(), ": data_cursor sources must be a non-empty list");
  DataCursor cursor;
  for (const Json& source : sources) cursor.push_back(sampler_cursor_from_json(JsonObject(source, o.source())));
  return cursor;
}

}  // namespace

Json train_state_to_json(const TrainState& state, Module& model) {
  Json buffers = Json::object();
  for (const Buffer& b : model.buffers()) {
    // Every buffer goes through f64, which holds f32 and bf16 values exactly.
    const Tensor& value = *b.value;
    buffers[b.name] = {{"shape", value.shape()}, {"values", value.to(Device::cpu()).to(DType::F64).to_vector<double>()}};
  }
  return Json{{"step", state.step},
              {"tokens_seen", state.tokens_seen},
              {"stage", state.stage},
              {"stage_step", state.stage_step},
              {"stage_tokens", state.stage_tokens},
              {"data_cursor", data_cursor_to_json(state.data_cursor)},
              {"module_buffers", buffers}};
}

void train_state_from_json(const Json& json, const std::string& source, TrainState& state, Module& model) {
  const JsonObject o(json, source);
  state.step = o.get<int64_t>("step");
  state.tokens_seen = o.get<int64_t>("tokens_seen");
  state.stage = o.get<int64_t>("stage");
  state.stage_step = o.get<int64_t>("stage_step");
  state.stage_tokens = o.get<int64_t>("stage_tokens");
  LT_CHECK(state.step >= 0 && state.tokens_seen >= 0 && state.stage >= 0 && state.stage_step >= 0 &&
               state.stage_tokens >= 0,
           source, ": step, tokens and stage counters must be >= 0");
  // Checkpoints written before the warmup noise became a function of each token's place kept the state of
  // its generator under "rng"; nothing needs it now.
  state.data_cursor = data_cursor_from_json(o.object("data_cursor"));

  const JsonObject saved = o.object("module_buffers");
  std::map<std::string, bool> restored;
  for (const Buffer& b : model.buffers()) {
    LT_CHECK(saved.has(b.name), source, ": no state for the model's buffer '", b.name, "'");
    const Json& entry = saved.json().at(b.name);
    Tensor& destination = *b.value;
    try {
      const Json& dims = entry.at("shape");
      LT_CHECK(dims.is_array(), source, ": buffer '", b.name, "' shape must be a list, got ", dims.dump());
      Shape shape;
      for (const Json& dim : dims) shape.push_back(exact_integer<int64_t>(dim, source, "buffer '" + b.name + "' shape"));
      LT_CHECK(shape == destination.shape(), source, ": buffer '", b.name, "' has shape ", shape_str(shape),
               ", the model needs ", shape_str(destination.shape()));
      const std::vector<double> values = entry.at("values").get<std::vector<double>>();
      LT_CHECK(static_cast<int64_t>(values.size()) == destination.numel(), source, ": buffer '", b.name, "' holds ",
               values.size(), " values for shape ", shape_str(shape));
      destination.copy_from(Tensor::from_vector<double>(shape, values).to(destination.dtype()).to(destination.device()));
    } catch (const nlohmann::json::exception& e) {
      fail(source, ": malformed buffer '", b.name, "' (", e.what(), ")");
    }
    restored[b.name] = true;
  }
  for (const auto& [name, value] : saved.json().items())
    LT_CHECK(restored.count(name), source, ": buffer '", name, "' does not belong to this model");
}

}  // namespace lt
