// Activations: SiLU and SwiGLU (silu(gate) * up), forward and backward, each one pass over memory; and
// the MoE combine's backward with the routed experts' SwiGLU backward folded in (swiglu_combine_backward).
//
// sigmoid(x) is computed from e = exp(-|x|), which lies in (0, 1] for every x: sigmoid = 1 / (1 + e)
// for x >= 0 and e / (1 + e) otherwise. exp never overflows, so large |x| saturates cleanly to 0 or 1
// instead of producing inf / inf; being <= 0, its argument suits ExpNonPositive (tensor/cpu/exp-inl.h).
//
// The last partial vector of a range is copied into a zero-padded buffer and run through the same
// vector code as the rest, so every element gets bit-identical arithmetic wherever the chunk bounds
// of parallel_for fall.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "tensor/cpu/activation.cc"
#include <algorithm>
#include <array>

#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "tensor/cpu/exp-inl.h"
#include "tensor/cpu/kernels.h"
#include "tensor/dtype_switch.h"
#include "tensor/threadpool.h"

HWY_BEFORE_NAMESPACE();
namespace lt::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

template <class D, class V = hn::Vec<D>>
HWY_INLINE V Sigmoid(D d, V x) {
  const V one = hn::Set(d, hn::TFromD<D>(1));
  const V e = ExpNonPositive(d, hn::Neg(hn::Abs(x)));
  return hn::Div(hn::IfThenElse(hn::Ge(x, hn::Zero(d)), one, e), hn::Add(one, e));
}

// Runs `body` (kIn input vectors -> kOut output vectors) over n elements, split across threads.
template <size_t kIn, size_t kOut, class T, class Body>
void MapVectors(const std::array<const T*, kIn>& in, const std::array<T*, kOut>& out, int64_t n, const Body& body) {
  parallel_for(n, 1 << 14, [&](int64_t begin, int64_t end) {
    const hn::ScalableTag<T> d;
    using V = hn::Vec<decltype(d)>;
    const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
    std::array<V, kIn> args;
    int64_t i = begin;
    for (; i + lanes <= end; i += lanes) {
      for (size_t k = 0; k < kIn; ++k) args[k] = hn::LoadU(d, in[k] + i);
      const std::array<V, kOut> results = body(d, args);
      for (size_t k = 0; k < kOut; ++k) hn::StoreU(results[k], d, out[k] + i);
    }
    if (i == end) return;
    const int64_t count = end - i;
    T padded[HWY_LANES(T)];
    for (size_t k = 0; k < kIn; ++k) {
      std::fill(padded, padded + lanes, T(0));
      std::copy(in[k] + i, in[k] + end, padded);
      args[k] = hn::LoadU(d, padded);
    }
    const std::array<V, kOut> results = body(d, args);
    for (size_t k = 0; k < kOut; ++k) {
      hn::StoreU(results[k], d, padded);
      std::copy(padded, padded + count, out[k] + i);
    }
  });
}

template <class T>
void SiluT(const T* x, T* y, int64_t n) {
  MapVectors<1, 1, T>({x}, {y}, n, [](auto d, const auto& v) {
    return std::array{hn::Mul(v[0], Sigmoid(d, v[0]))};
  });
}

// d silu(x) / dx = s + x s (1 - s) = s (1 + x (1 - s)), s = sigmoid(x).
template <class D, class V = hn::Vec<D>>
HWY_INLINE V SiluDerivative(D d, V x, V s) {
  const V one = hn::Set(d, hn::TFromD<D>(1));
  return hn::Mul(s, hn::MulAdd(x, hn::Sub(one, s), one));
}

template <class T>
void SiluBackwardT(const T* x, const T* dy, T* dx, int64_t n) {
  MapVectors<2, 1, T>({x, dy}, {dx}, n, [](auto d, const auto& v) {
    return std::array{hn::Mul(v[1], SiluDerivative(d, v[0], Sigmoid(d, v[0])))};
  });
}

template <class T>
void SwigluT(const T* gate, const T* up, T* y, int64_t n) {
  MapVectors<2, 1, T>({gate, up}, {y}, n, [](auto d, const auto& v) {
    return std::array{hn::Mul(hn::Mul(v[0], Sigmoid(d, v[0])), v[1])};
  });
}

// y = silu(g) u: dgate = dy u silu'(g), dup = dy silu(g).
template <class T>
void SwigluBackwardT(const T* gate, const T* up, const T* dy, T* dgate, T* dup, int64_t n) {
  MapVectors<3, 2, T>({gate, up, dy}, {dgate, dup}, n, [](auto d, const auto& v) {
    const auto s = Sigmoid(d, v[0]);
    return std::array{hn::Mul(hn::Mul(v[2], v[1]), SiluDerivative(d, v[0], s)),
                      hn::Mul(v[2], hn::Mul(v[0], s))};
  });
}

// swiglu_combine_backward (tensor/kernels.h): per assignment, its row of C values in vectors, the last
// partial one through zero-padded copies (zeros add nothing to the dot). Each element gets SwigluT's and
// SwigluBackwardT's arithmetic, the weight applied as the combine's backward applies it (h w, t w); dw
// sums its products in Lanes partial sums. Assignment a owns row pos[a] and dw[a], so the assignments
// split across threads with no two sharing a byte.
template <class T>
void SwigluCombineBackwardT(const T* w, const int32_t* pos, int64_t assignments, int64_t C, const T* gate, const T* up,
                            T* t, T* h, T* dup, T* dw) {
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 12) / std::max<int64_t>(C, 1));
  parallel_for(assignments, grain, [&](int64_t begin, int64_t end) {
    const hn::ScalableTag<T> d;
    using V = hn::Vec<decltype(d)>;
    const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
    for (int64_t a = begin; a < end; ++a) {
      const int64_t row = static_cast<int64_t>(pos[a]) * C;
      const V weight = hn::Set(d, w[a]);
      V dot = hn::Zero(d);
      // h_m, dgate and dup of one vector: into h, t and dup at `out` (the row's, or the padded copies').
      auto step = [&](V g, V u, V dh_unweighted, T* h_out, T* t_out, T* dup_out) {
        const V s = Sigmoid(d, g);
        const V silu = hn::Mul(g, s);
        const V h_m = hn::Mul(silu, u);
        dot = hn::MulAdd(dh_unweighted, h_m, dot);
        const V dy = hn::Mul(dh_unweighted, weight);
        hn::StoreU(hn::Mul(h_m, weight), d, h_out);
        hn::StoreU(hn::Mul(hn::Mul(dy, u), SiluDerivative(d, g, s)), d, t_out);
        hn::StoreU(hn::Mul(dy, silu), d, dup_out);
      };
      int64_t c = 0;
      for (; c + lanes <= C; c += lanes) {
        const int64_t i = row + c;
        step(hn::LoadU(d, gate + i), hn::LoadU(d, up + i), hn::LoadU(d, t + i), h + i, t + i, dup + i);
      }
      if (c < C) {
        const int64_t count = C - c, i = row + c;
        T g[HWY_LANES(T)] = {}, u[HWY_LANES(T)] = {}, dh[HWY_LANES(T)] = {};
        T h_part[HWY_LANES(T)], t_part[HWY_LANES(T)], dup_part[HWY_LANES(T)];
        std::copy(gate + i, gate + i + count, g);
        std::copy(up + i, up + i + count, u);
        std::copy(t + i, t + i + count, dh);
        step(hn::LoadU(d, g), hn::LoadU(d, u), hn::LoadU(d, dh), h_part, t_part, dup_part);
        std::copy(h_part, h_part + count, h + i);
        std::copy(t_part, t_part + count, t + i);
        std::copy(dup_part, dup_part + count, dup + i);
      }
      if (dw != nullptr) dw[a] = hn::GetLane(hn::SumOfLanes(d, dot));
    }
  });
}

void SiluKernel(DType dtype, const void* x, void* y, int64_t n) {
  LT_FLOAT_SWITCH(dtype, T, SiluT<T>(static_cast<const T*>(x), static_cast<T*>(y), n));
}

void SiluBackwardKernel(DType dtype, const void* x, const void* dy, void* dx, int64_t n) {
  LT_FLOAT_SWITCH(dtype, T,
                  SiluBackwardT<T>(static_cast<const T*>(x), static_cast<const T*>(dy), static_cast<T*>(dx), n));
}

void SwigluKernel(DType dtype, const void* gate, const void* up, void* y, int64_t n) {
  LT_FLOAT_SWITCH(dtype, T,
                  SwigluT<T>(static_cast<const T*>(gate), static_cast<const T*>(up), static_cast<T*>(y), n));
}

void SwigluBackwardKernel(DType dtype, const void* gate, const void* up, const void* dy, void* dgate, void* dup,
                          int64_t n) {
  LT_FLOAT_SWITCH(dtype, T,
                  SwigluBackwardT<T>(static_cast<const T*>(gate), static_cast<const T*>(up),
                                     static_cast<const T*>(dy), static_cast<T*>(dgate), static_cast<T*>(dup), n));
}

void SwigluCombineBackwardKernel(DType dtype, const void* w, const int32_t* pos, int64_t assignments, int64_t C,
                                 const void* gate, const void* up, void* t, void* h, void* dup, void* dw) {
  LT_FLOAT_SWITCH(dtype, T,
                  SwigluCombineBackwardT<T>(static_cast<const T*>(w), pos, assignments, C, static_cast<const T*>(gate),
                                            static_cast<const T*>(up), static_cast<T*>(t), static_cast<T*>(h),
                                            static_cast<T*>(dup), static_cast<T*>(dw)));
}

}  // namespace lt::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace lt::cpu {
HWY_EXPORT(SiluKernel);
HWY_EXPORT(SiluBackwardKernel);
HWY_EXPORT(SwigluKernel);
HWY_EXPORT(SwigluBackwardKernel);
HWY_EXPORT(SwigluCombineBackwardKernel);

void silu(const Tensor& x, Tensor& y) {
  HWY_DYNAMIC_DISPATCH(SiluKernel)(x.dtype(), x.raw_data(), y.raw_data(), x.numel());
}

void silu_backward(const Tensor& x, const Tensor& dy, Tensor& dx) {
  HWY_DYNAMIC_DISPATCH(SiluBackwardKernel)(x.dtype(), x.raw_data(), dy.raw_data(), dx.raw_data(), x.numel());
}

// Never asked for bf16 copies: autograd keeps them on a GPU only.
// The bf16 copies and bf16 GEMM operands are a GPU's (the front door's check_kept refuses them here).
void swiglu(const Tensor& gate, const Tensor& up, Tensor& y, const Tensor&, const Tensor&, const Tensor&) {
  HWY_DYNAMIC_DISPATCH(SwigluKernel)(gate.dtype(), gate.raw_data(), up.raw_data(), y.raw_data(), gate.numel());
}

void swiglu_backward(const Tensor& gate, const Tensor& up, const Tensor& dy, Tensor& dgate, Tensor& dup) {
  HWY_DYNAMIC_DISPATCH(SwigluBackwardKernel)(gate.dtype(), gate.raw_data(), up.raw_data(), dy.raw_data(),
                                             dgate.raw_data(), dup.raw_data(), gate.numel());
}

void swiglu_combine_backward(const Tensor& w, const Tensor& pos, const Tensor& gate, const Tensor& up, Tensor& t,
                             Tensor& h, Tensor& dup, Tensor& dw, const Tensor& /*dgate_bf16*/) {
  HWY_DYNAMIC_DISPATCH(SwigluCombineBackwardKernel)
  (t.dtype(), w.raw_data(), pos.data<int32_t>(), w.numel(), t.dim(1), gate.raw_data(), up.raw_data(), t.raw_data(),
   h.raw_data(), dup.raw_data(), dw.defined() ? dw.raw_data() : nullptr);
}

}  // namespace lt::cpu
#endif  // HWY_ONCE
