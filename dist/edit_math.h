// The arithmetic of an EDiT synchronisation (docs/architecture.md §11), one piece per concept, each
// checked against hand computations; the synchronisation itself (layer by layer over the sync group)
// builds on these.
//
// For one layer on worker m: the pseudo-gradient Delta_m = anchor - current and its norm G_m; an
// anomaly detector per layer (optim/anomaly_detector.h) drops outlying norms (Delta_m := 0); the workers' pseudo-gradients are
// averaged with weights softmax(-G / T) (smaller steps count more); the average is clipped to a norm
// phi; the outer optimizer (SGD with Nesterov momentum, or plain averaging) moves the anchor by it.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "optim/anomaly_detector.h"
#include "tensor/tensor.h"

namespace lt {

// Weights of the workers' pseudo-gradients: softmax over workers of -norm / temperature, computed
// from the smallest norm so no exponential overflows. A worker whose pseudo-gradient was dropped as
// an anomaly passes dropped = true and gets weight 0 (the reference adds 1e6 to its norm for this).
// All dropped: all weights 0.
std::vector<double> pseudo_gradient_weights(const std::vector<double>& norms, const std::vector<bool>& dropped,
                                            double temperature);

// The factor that clips a vector of norm `norm` to at most `max_norm` (1 when max_norm <= 0: no clip),
// with the 1e-6 of gradient clipping.
double clip_factor(double norm, double max_norm);

// The outer optimizer on the anchor: SGD with (Nesterov) momentum as PyTorch's torch.optim.SGD, the
// pseudo-gradient as the gradient: buf = momentum buf + g (buf = g on the first step);
// step = g + momentum buf (Nesterov) or buf; anchor -= lr step. momentum 0 and lr 1 is plain averaging.
struct OuterSgd {
  double lr = 0.7, momentum = 0.8;
  bool nesterov = true;
  // anchor, grad and momentum_buffer: one shape and float dtype; first: the buffer holds nothing yet.
  void step(Tensor& anchor, const Tensor& grad, Tensor& momentum_buffer, bool first) const;
};

}  // namespace lt
