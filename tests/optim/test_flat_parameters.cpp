// The flat parameter buffer: module order is kept (weight decay no longer reorders parameters), every
// parameter and every layer is one named contiguous range, the ranges tile the buffer, and the
// parameters and their gradients are views of the two buffers.
#include <gtest/gtest.h>

#include "autograd/ops.h"
#include "model/ling.h"
#include "optim/flat_parameters.h"

namespace lt {
namespace {

TEST(FlatParameters, LayerOfNames) {
  EXPECT_EQ(FlatParameters::layer_of("model.layers.3.attention.dense.weight"), "model.layers.3");
  EXPECT_EQ(FlatParameters::layer_of("model.layers.12.mlp.experts.gate_up_proj.weight"), "model.layers.12");
  EXPECT_EQ(FlatParameters::layer_of("model.word_embeddings.weight"), "model.word_embeddings");
  EXPECT_EQ(FlatParameters::layer_of("model.norm.weight"), "model.norm");
  EXPECT_EQ(FlatParameters::layer_of("lm_head.weight"), "lm_head");
  EXPECT_EQ(FlatParameters::layer_of("bias"), "bias");
}

TEST(FlatParameters, ModuleOrderWithOneRangePerLayer) {
  LingConfig config = preset_config("tiny");
  LingForCausalLM model(config, 1);
  const std::vector<Parameter> listed = model.parameters();
  FlatParameters flat(model.parameters());
  ASSERT_EQ(flat.parameters().size(), listed.size());
  for (size_t i = 0; i < listed.size(); ++i) {
    EXPECT_EQ(flat.parameters()[i].parameter.name, listed[i].name) << "the layout must keep module order";
    const Tensor& value = listed[i].value->value();
    EXPECT_EQ(flat.parameters()[i].range.size(), value.numel());
    EXPECT_EQ(value.data<float>(), flat.values().data<float>() + flat.parameters()[i].range.begin) << listed[i].name;
  }
  // Embedding, one range per decoder layer, final norm, head; the ranges tile the buffer in order.
  const std::vector<FlatParameters::Range>& layers = flat.layers();
  ASSERT_EQ(layers.size(), static_cast<size_t>(config.num_hidden_layers + 3));
  EXPECT_EQ(layers.front().name, "model.word_embeddings");
  EXPECT_EQ(layers[1].name, "model.layers.0");
  EXPECT_EQ(layers[config.num_hidden_layers].name, "model.layers." + std::to_string(config.num_hidden_layers - 1));
  EXPECT_EQ(layers.back().name, "lm_head");
  int64_t expected_begin = 0;
  for (const FlatParameters::Range& r : layers) {
    EXPECT_EQ(r.begin, expected_begin) << r.name;
    EXPECT_GT(r.size(), 0) << r.name;
    expected_begin = r.end;
  }
  EXPECT_EQ(expected_begin, flat.numel());
  // Every parameter lies inside its layer's range.
  for (const FlatParameters::ParameterRange& p : flat.parameters()) {
    const std::string layer = FlatParameters::layer_of(p.parameter.name);
    bool inside = false;
    for (const FlatParameters::Range& r : layers)
      inside = inside || (r.name == layer && p.range.begin >= r.begin && p.range.end <= r.end);
    EXPECT_TRUE(inside) << p.parameter.name;
  }
}

TEST(FlatParameters, GradientsLandInTheFlatBufferAndRunsSplitByDecay) {
  LingConfig config = preset_config("tiny");
  LingForCausalLM model(config, 1);
  FlatParameters flat(model.parameters());
  MoEContext context;
  const Tensor ids = Tensor::from_vector<int32_t>({1, 4}, {1, 2, 3, 4});
  model.loss(ids, ids, context).total.backward();
  for (const FlatParameters::ParameterRange& p : flat.parameters()) {
    ASSERT_TRUE(p.parameter.value->grad().defined()) << p.parameter.name;
    EXPECT_EQ(p.parameter.value->grad().data<float>(), flat.grads().data<float>() + p.range.begin);
  }
  // Everything holds a gradient: one run over the whole buffer, or alternating decay runs in module order.
  const auto whole = flat.runs_with_grad(false);
  ASSERT_EQ(whole.size(), 1u);
  EXPECT_EQ(whole[0].end, flat.parameters().back().range.end);
  const auto by_decay = flat.runs_with_grad(true);
  ASSERT_GT(by_decay.size(), 2u);
  for (size_t i = 1; i < by_decay.size(); ++i) {
    EXPECT_NE(by_decay[i].weight_decay, by_decay[i - 1].weight_decay);
    EXPECT_GE(by_decay[i].begin, by_decay[i - 1].end);
  }
  flat.zero_grad();
  EXPECT_TRUE(flat.runs_with_grad(false).empty());
}

}  // namespace
}  // namespace lt
