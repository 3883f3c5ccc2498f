// Module buffers: listed and named as parameters are (dotted paths, depth first: a module's own
// buffers, then its children's in registration order), owned by their module at stable addresses, and
// not parameters.
#include <gtest/gtest.h>

#include "nn/module.h"

namespace lt {
namespace {

class Leaf : public Module {
 public:
  Leaf() {
    add_parameter("weight", Tensor::zeros({2}), true);
    stats = &add_buffer("stats", Tensor::full({3}, 1.5, DType::F64));
  }
  Tensor* stats;
};

class Tree : public Module {
 public:
  Tree() {
    first = &add_module("first", std::make_unique<Leaf>());
    add_buffer("count", Tensor::zeros({1}, DType::I64));
    second = &add_module("block.second", std::make_unique<Leaf>());
  }
  Leaf* first;
  Leaf* second;
};

TEST(Module, BuffersAreNamedLikeParametersAndNotTrained) {
  Tree tree;
  const std::vector<Buffer> buffers = tree.buffers("model");
  ASSERT_EQ(buffers.size(), 3u);
  EXPECT_EQ(buffers[0].name, "model.count");
  EXPECT_EQ(buffers[1].name, "model.first.stats");
  EXPECT_EQ(buffers[2].name, "model.block.second.stats");
  EXPECT_EQ(buffers[1].value, tree.first->stats);
  EXPECT_EQ(buffers[2].value, tree.second->stats);
  EXPECT_EQ(buffers[1].value->to_vector<double>(), std::vector<double>({1.5, 1.5, 1.5}));
  EXPECT_EQ(tree.buffers().front().name, "count");
  EXPECT_EQ(tree.parameters().size(), 2u);
  EXPECT_EQ(tree.parameter_count(), 4);
}

}  // namespace
}  // namespace lt
