#include "moe/ops.h"

#include "autograd/ops.h"
#include "tensor/kernels.h"

namespace lt {
namespace {

Shape leading(const Shape& s) { return Shape(s.begin(), s.end() - 1); }

struct NormalizeRowsNode : Node {
  Tensor w, sums;
  const char* name() const override { return "normalize_rows"; }
  std::vector<Tensor> backward(const Tensor& g) override {
    Tensor dv = Tensor::empty_like(g);
    kernels::normalize_rows_backward(w, sums, g, dv);
    return {dv};
  }
};

// d/dx_j of mean_n lse_n^2 = 2 lse_n softmax(x_n)_j / N.
struct ZLossNode : Node {
  Tensor logits, lse;
  const char* name() const override { return "router_z_loss"; }
  std::vector<Tensor> backward(const Tensor& g) override {
    Tensor probs = Tensor::empty_like(logits);
    kernels::softmax(logits, probs);
    Tensor row_factor = Tensor::empty_like(lse);
    kernels::scale(lse, 2.0 * g.item() / static_cast<double>(lse.numel()), row_factor);
    Tensor d = Tensor::empty_like(logits);
    kernels::scale_rows(probs, row_factor, d);
    return {d};
  }
};

struct ScaleRowsNode : Node {
  Tensor x, w;
  const char* name() const override { return "scale_rows"; }
  std::vector<Tensor> backward(const Tensor& g) override {
    Tensor dx = needs_grad(0) ? Tensor::empty_like(x) : Tensor();
    Tensor dw = needs_grad(1) ? Tensor::empty_like(w) : Tensor();
    kernels::scale_rows_backward(x, w, g, dx, dw);
    return {dx, dw};
  }
};

// Per expert e with rows R_e = [offsets[e], offsets[e+1]):
//   y[R_e] = x[R_e] w[e]^T,  dx[R_e] = dy[R_e] w[e],  dw[e] = dy[R_e]^T x[R_e].
// Each is one dense GEMM on contiguous views, so the experts' work is as efficient as their segment
// sizes allow; an expert that received no tokens gets a zero gradient.
struct GroupedMatmulNode : Node {
  Tensor x, w;
  std::vector<int64_t> offsets;
  const char* name() const override { return "grouped_matmul"; }
  std::vector<Tensor> backward(const Tensor& g) override {
    const int64_t E = w.dim(0), N = w.dim(1), K = w.dim(2);
    Tensor dx = needs_grad(0) ? Tensor::empty_like(x) : Tensor();
    Tensor dw = needs_grad(1) ? Tensor::empty_like(w) : Tensor();
    for (int64_t e = 0; e < E; ++e) {
      const int64_t begin = offsets[e], rows = offsets[e + 1] - offsets[e];
      const Tensor w_e = w.narrow(e, 1).reshape({N, K});
      const Tensor g_e = g.narrow(begin, rows);
      if (dx.defined() && rows > 0) {
        Tensor dx_e = dx.narrow(begin, rows);
        kernels::matmul(g_e, false, w_e, false, dx_e);
      }
      if (dw.defined()) {
        Tensor dw_e = dw.narrow(e, 1).reshape({N, K});
        if (rows == 0) dw_e.zero_();
        else kernels::matmul(g_e, true, x.narrow(begin, rows), false, dw_e);
      }
    }
    return {dx, dw};
  }
};

}  // namespace

Variable normalize_rows(const Variable& v_NK) {
  Tensor w = Tensor::empty_like(v_NK.value());
  Tensor sums = Tensor::empty(leading(v_NK.shape()), v_NK.value().dtype(), v_NK.value().device());
  kernels::normalize_rows(v_NK.value(), w, sums);
  auto node = std::make_shared<NormalizeRowsNode>();
  node->w = w;
  node->sums = sums;
  return make_result(w, node, {v_NK});
}

Variable router_z_loss(const Variable& logits_NE) {
  const Tensor& logits = logits_NE.value();
  LT_CHECK(logits.ndim() == 2, "router_z_loss: logits must be [N, E], got ", logits.str());
  Tensor lse = Tensor::empty({logits.dim(0)}, logits.dtype(), logits.device());
  kernels::row_logsumexp(logits, lse);
  Tensor squares = Tensor::empty_like(lse);
  kernels::mul(lse, lse, squares);
  Tensor loss = Tensor::empty({1}, logits.dtype(), logits.device());
  kernels::sum(squares, loss);
  kernels::scale(loss, 1.0 / static_cast<double>(std::max<int64_t>(logits.dim(0), 1)), loss);
  auto node = std::make_shared<ZLossNode>();
  node->logits = logits;
  node->lse = lse;
  return make_result(loss, node, {logits_NE});
}

Variable load_balance_loss(const Variable& probs_NE, const std::vector<int64_t>& expert_counts, int64_t k) {
  const Tensor& probs = probs_NE.value();
  const int64_t N = probs.dim(0), E = probs.dim(1);
  LT_CHECK(static_cast<int64_t>(expert_counts.size()) == E, "load_balance_loss: ", expert_counts.size(),
           " counts for ", E, " experts");
  // E * sum_e f_e * (1/N) sum_n p[n, e] = (E / (N^2 k)) * sum_{n,e} p[n, e] count_e.
  std::vector<double> counts(expert_counts.begin(), expert_counts.end());
  const Variable counts_E(Tensor::from_vector<double>({E}, counts).to(probs.dtype()).to(probs.device()));
  const double factor = static_cast<double>(E) / (static_cast<double>(N) * static_cast<double>(N) * k);
  return scale(sum(mul(probs_NE, counts_E)), factor);
}

Variable scale_rows(const Variable& x_MC, const Variable& w_M) {
  Tensor out = Tensor::empty_like(x_MC.value());
  kernels::scale_rows(x_MC.value(), w_M.value(), out);
  auto node = std::make_shared<ScaleRowsNode>();
  if (grad_enabled()) {
    node->x = x_MC.value();
    node->w = w_M.value();
  }
  return make_result(out, node, {x_MC, w_M});
}

Variable grouped_matmul(const Variable& x_MK, const Variable& w_ENK, const std::vector<int64_t>& offsets) {
  const Tensor& x = x_MK.value();
  const Tensor& w = w_ENK.value();
  LT_CHECK(x.ndim() == 2 && w.ndim() == 3 && x.dim(1) == w.dim(2), "grouped_matmul: x ", x.str(),
           " and expert weights ", w.str(), " do not fit ([M, K] and [E, N, K])");
  const int64_t E = w.dim(0), N = w.dim(1), K = w.dim(2);
  LT_CHECK(static_cast<int64_t>(offsets.size()) == E + 1 && offsets.front() == 0 && offsets.back() == x.dim(0),
           "grouped_matmul: offsets must run from 0 to ", x.dim(0), " over ", E, " experts");
  Tensor y = Tensor::empty({x.dim(0), N}, x.dtype(), x.device());
  for (int64_t e = 0; e < E; ++e) {
    const int64_t rows = offsets[e + 1] - offsets[e];
    LT_CHECK(rows >= 0, "grouped_matmul: offsets must not decrease");
    if (rows == 0) continue;
    Tensor y_e = y.narrow(offsets[e], rows);
    kernels::matmul(x.narrow(offsets[e], rows), false, w.narrow(e, 1).reshape({N, K}), true, y_e);
  }
  auto node = std::make_shared<GroupedMatmulNode>();
  node->offsets = offsets;
  if (grad_enabled()) {
    node->x = x;
    node->w = w;
  }
  return make_result(y, node, {x_MK, w_ENK});
}

}  // namespace lt
