// The DPO loss on the GPU, with the CPU kernel's arithmetic (tensor/cpu/dpo.cc): the responses' log-
// probabilities are summed in token order (one thread per response, and one more thread for the NLL
// term), the pairs run the shared code of tensor/dpo_math.h on one thread, and the token gradients get a
// thread each. The work is O(N P) scalar steps, small next to the head's GEMMs; every sum has the CPU's
// order, so the results agree with it to the last bit of the math library.
#include <cstdint>

#ifndef LINGTRAIN_CUDA_EMULATION  // the emulation (tensor/cuda/emulation.h) stands in for the runtime
#include "tensor/cuda/cuda_runtime.h"
#endif
#include "tensor/cuda/grid.h"
#include "tensor/cuda/kernels.h"
#include "tensor/dpo_math.h"
#include "tensor/dtype_switch.h"

namespace lt::LT_CUDA_NAMESPACE {
namespace {

// Threads j < 2P: logp[j], the counted tokens of response j in token order. Thread 2P: the NLL over the
// chosen responses' tokens, into nll [2] = {sum, tokens}.
template <class T>
__global__ void dpo_sums_kernel(const T* x, const int32_t* ids, const int32_t* counted, int64_t N, int64_t P,
                                double* logp, double* nll) {
  for (int64_t j = first_index(); j <= 2 * P; j += grid_stride()) {
    double sum = 0;
    int64_t tokens = 0;
    for (int64_t n = 0; n < N; ++n) {
      if (j < 2 * P && ids[n] == j && counted[n]) sum += static_cast<double>(x[n]);
      if (j == 2 * P && ids[n] >= 0 && ids[n] % 2 == 0) {
        sum -= static_cast<double>(x[n]);
        ++tokens;
      }
    }
    if (j < 2 * P) {
      logp[j] = sum;
    } else {
      nll[0] = sum;
      nll[1] = static_cast<double>(tokens);
    }
  }
}

// dlogp [2P + 1]: the pairs' gradients, then d loss / d (a chosen token) via the NLL.
template <class T>
__global__ void dpo_pairs_kernel(const double* logp, const double* ref, int64_t P, double beta, double rpo_alpha,
                                 const double* nll, double* stats, double* dlogp, T* loss) {
  double total = 0;
  DpoPairs(logp, ref, P, beta, rpo_alpha, nll[0], static_cast<int64_t>(nll[1]), stats, dlogp, &total, dlogp + 2 * P);
  loss[0] = static_cast<T>(total);
}

template <class T>
__global__ void dpo_token_gradient_kernel(const int32_t* ids, const int32_t* counted, int64_t N, int64_t P,
                                          const double* dlogp, T* dx) {
  for (int64_t n = first_index(); n < N; n += grid_stride())
    dx[n] = static_cast<T>(DpoTokenGradient(ids[n], counted[n] != 0, dlogp, dlogp[2 * P]));
}

}  // namespace

void dpo_loss(const Tensor& token_logp, const Tensor& response, const Tensor& counted, const Tensor& reference_logp,
              double beta, double rpo_alpha, Tensor& loss, Tensor& stats, Tensor& dtoken_logp) {
  const int64_t N = token_logp.numel(), P = reference_logp.numel() / 2;
  const DeviceGuard guard(token_logp.device().index);
  Tensor logp = Tensor::empty({2 * P}, DType::F64, token_logp.device());
  Tensor nll = Tensor::empty({2}, DType::F64, token_logp.device());
  Tensor dlogp = Tensor::empty({2 * P + 1}, DType::F64, token_logp.device());
  LT_FLOAT_SWITCH(token_logp.dtype(), T, {
    LT_CUDA_LAUNCH(blocks_for(2 * P + 1), kThreadsPerBlock, dpo_sums_kernel<T>)(
        token_logp.data<T>(), response.data<int32_t>(), counted.data<int32_t>(), N, P, logp.data<double>(),
        nll.data<double>());
    LT_CUDA_LAUNCH(1, 1, dpo_pairs_kernel<T>)(logp.data<double>(), reference_logp.data<double>(), P, beta, rpo_alpha,
                                              nll.data<double>(), stats.data<double>(), dlogp.data<double>(),
                                              loss.data<T>());
    if (dtoken_logp.defined() && N > 0)
      LT_CUDA_LAUNCH(blocks_for(N), kThreadsPerBlock, dpo_token_gradient_kernel<T>)(
          response.data<int32_t>(), counted.data<int32_t>(), N, P, dlogp.data<double>(), dtoken_logp.data<T>());
  });
  LT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace lt::LT_CUDA_NAMESPACE
