// The state of a training run that is not the parameters or the optimiser moments: how far it got,
// where the data stream stands, the random generators, and the modules' buffers (non-trained state
// such as the routing-warmup statistics). With the weights and the optimiser it is everything a run
// needs to continue bit for bit; it is written as trainer_state.json in every checkpoint.
#pragma once
#include <cstdint>
#include <string>

#include "data/batch_sampler.h"
#include "io/json.h"
#include "nn/module.h"
#include "tensor/random.h"

namespace lt {

struct TrainState {
  int64_t step = 0;          // optimiser steps taken over the whole run
  int64_t tokens_seen = 0;   // training tokens consumed over the whole run
  int64_t stage = 0;         // the recipe stage being run (trainer/recipe.h)
  int64_t stage_step = 0;    // steps taken in that stage: the schedule's position
  int64_t stage_tokens = 0;  // tokens consumed in that stage: the wsd halving point's position
  DataCursor data_cursor;    // of the current stage's data (empty at its start)
};

// The state plus the buffers of `model` (by name; f64 values written exactly, with 17 digits).
Json train_state_to_json(const TrainState& state, Module& model);
// Restores both; errors name `source` (a trainer_state.json) and the key or buffer at fault.
void train_state_from_json(const Json& json, const std::string& source, TrainState& state, Module& model);

}  // namespace lt
