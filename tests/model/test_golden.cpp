// The whole model against the PyTorch reference (tests/reference/ling_reference.py, written from
// docs/architecture.md): a tiny MoE model (one dense and one MoE layer, awkward sizes) with its
// config.json and f32 weights, and the reference's float64 logits, losses, gradients of the total
// loss, and parameters after three clipped AdamW steps, all under tests/golden/ling_small.
// Regenerate with
//   /usr/bin/python3 tests/reference/ling_reference.py golden --out tests/golden/ling_small
// In f64 everything must agree to ~1e-9 (only the order of summation differs); in f32 the logits,
// losses and gradients to ~1e-4.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iomanip>
#include <memory>
#include <sstream>
#include <string>

#include "model/config.h"
#include "model/hf_names.h"
#include "model/ling.h"
#include "trainer/trainer.h"

namespace lt {
namespace {

constexpr double kLr = 1e-2, kClip = 1.0;  // as the reference's golden run
constexpr int kSteps = 3;

struct Golden {
  LingConfig config;
  SafetensorsFile weights;  // model.safetensors, f32, Hugging Face names
  SafetensorsFile tensors;  // golden.safetensors
};

const Golden& golden() {
  static const Golden g = [] {
    const std::string dir = std::string(LINGTRAIN_SOURCE_DIR) + "/tests/golden/ling_small/";
    return Golden{load_config(dir + "config.json"), load_safetensors(dir + "model.safetensors"),
                  load_safetensors(dir + "golden.safetensors")};
  }();
  return g;
}

std::unique_ptr<LingForCausalLM> golden_model(DType dtype) {
  auto model = std::make_unique<LingForCausalLM>(golden().config, 0);
  for (const Parameter& p : model->parameters()) p.value->value() = p.value->value().to(dtype);
  load_hf_state_dict(*model, golden().weights);  // converts the f32 file to the parameters' dtype
  return model;
}

// The parameters' values or gradients (`of` picks which) under their Hugging Face names (model/hf_names.h).
template <class Of>
NamedTensors by_hf_name(LingForCausalLM& model, Of of) {
  NamedTensors by_parameter;
  for (const Parameter& p : model.parameters()) by_parameter.emplace_back(p.name, of(*p.value));
  return hf_named(by_parameter);
}

// The largest error of a group of tensors, relative to each tensor's largest expected magnitude:
// gradients hold entries that cancel to near zero, where an element-wise relative error means nothing.
struct MaxError {
  double value = 0, abs_value = 0;
  std::string where;
  void add(const std::string& what, const Tensor& actual, const Tensor& expected) {
    ASSERT_EQ(actual.shape(), expected.shape()) << what;
    const std::vector<double> a = actual.to(DType::F64).to_vector<double>();
    const std::vector<double> e = expected.to(DType::F64).to_vector<double>();
    double scale = 0;
    for (double v : e) scale = std::max(scale, std::fabs(v));
    for (size_t i = 0; i < a.size(); ++i) {
      abs_value = std::max(abs_value, std::fabs(a[i] - e[i]));
      const double err = std::fabs(a[i] - e[i]) / std::max(scale, 1e-300);
      if (!(err <= value)) {  // also catches NaN
        value = std::isnan(err) ? INFINITY : err;
        std::ostringstream text;
        text << what << "[" << i << "]: got " << std::setprecision(17) << a[i] << ", expected " << e[i];
        where = text.str();
      }
    }
  }
  void check(const char* group, double tolerance) const {
    std::printf("[golden] %-34s max relative error %.3e (absolute %.3e)\n", group, value, abs_value);
    EXPECT_LE(value, tolerance) << group << ": worst at " << where;
  }
};

Tensor scalar(double v) { return Tensor::from_vector<double>({1}, {v}); }

LossBreakdown forward(LingForCausalLM& model, Tensor* logits_out = nullptr) {
  MoEContext context;  // training = false: no routing warmup, so the routing is deterministic
  LossBreakdown loss = model.loss(golden().tensors.get("ids"), golden().tensors.get("targets"), context);
  if (logits_out) {
    MoEContext again;
    *logits_out = model.logits(golden().tensors.get("ids"), again).value();
  }
  return loss;
}

void check_forward(DType dtype, double tolerance) {
  auto model = golden_model(dtype);
  Tensor logits;
  const LossBreakdown loss = forward(*model, &logits);
  const SafetensorsFile& g = golden().tensors;
  MaxError logits_error, loss_error;
  logits_error.add("logits", logits, g.get("logits"));
  loss_error.add("lm_loss", loss.lm.value(), g.get("lm_loss"));
  loss_error.add("aux", loss.aux, g.get("aux"));
  loss_error.add("total_loss", loss.total.value(), g.get("total_loss"));
  loss_error.add("balance", loss.balance, g.get("balance"));
  loss_error.add("z", loss.z, g.get("z"));
  const std::string tag = dtype == DType::F64 ? "f64 " : "f32 ";
  logits_error.check((tag + "logits").c_str(), tolerance);
  loss_error.check((tag + "losses (lm, aux, total, bal, z)").c_str(), tolerance);
}

TEST(Golden, ForwardF64) { check_forward(DType::F64, 1e-9); }

TEST(Golden, ForwardF32) { check_forward(DType::F32, 1e-4); }

void check_gradients(DType dtype, double tolerance) {
  auto model = golden_model(dtype);
  forward(*model).total.backward();
  MaxError error;
  for (const auto& [name, grad] : by_hf_name(*model, [](const Variable& v) { return v.grad(); })) {
    ASSERT_TRUE(grad.defined()) << name << " has no gradient";
    error.add("grad." + name, grad, golden().tensors.get("grad." + name));
  }
  error.check(dtype == DType::F64 ? "f64 gradients (all params)" : "f32 gradients (all params)", tolerance);
}

TEST(Golden, GradientsF64) { check_gradients(DType::F64, 1e-9); }

TEST(Golden, GradientsF32) { check_gradients(DType::F32, 1e-4); }

TEST(Golden, AdamWStepsF64) {
  auto model = golden_model(DType::F64);
  TrainerSettings settings;  // Ling's AdamW: betas 0.9/0.95, eps 1e-8, decay 0.1; no routing warmup
  settings.clip = kClip;
  settings.schedule.kind = "constant";
  settings.schedule.peak = kLr;
  Trainer trainer(*model, settings);
  const std::vector<TokenBatch> batch = {{golden().tensors.get("ids"), golden().tensors.get("targets")}};
  const std::vector<double> expected_norms = golden().tensors.get("grad_norms").to_vector<double>();
  MaxError norm_error, param_error;
  for (int step = 0; step < kSteps; ++step)
    norm_error.add("grad_norm step " + std::to_string(step), scalar(trainer.step(batch).grad_norm),
                   scalar(expected_norms[step]));
  for (const auto& [name, value] : by_hf_name(*model, [](const Variable& v) { return v.value(); }))
    param_error.add("step3." + name, value, golden().tensors.get("step3." + name));
  norm_error.check("f64 pre-clip grad norms", 1e-9);
  param_error.check("f64 params after 3 steps", 1e-9);
}

}  // namespace
}  // namespace lt
