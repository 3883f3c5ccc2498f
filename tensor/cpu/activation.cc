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
#include "tensor/cpu/bf16-inl.h"
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

// Runs `body` (kIn input vectors -> kOut output vectors) over elements [begin, end) of the arrays.
template <size_t kIn, size_t kOut, class T, class Body>
void MapRange(const std::array<const T*, kIn>& in, const std::array<T*, kOut>& out, int64_t begin, int64_t end,
              const Body& body) {
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
}

// Runs `body` over n elements, split across threads.
template <size_t kIn, size_t kOut, class T, class Body>
void MapVectors(const std::array<const T*, kIn>& in, const std::array<T*, kOut>& out, int64_t n, const Body& body) {
  parallel_for(n, 1 << 14, [&](int64_t begin, int64_t end) { MapRange(in, out, begin, end, body); });
}

// An array of rows: row r of C elements starts at base + r * stride (a half of a fused gate_up row has
// stride 2C, a plain row C).
template <class P>
struct Rows {
  P base;
  int64_t stride;
};

// Runs `body` over C elements of each of R rows, rows split across threads, then `row_done(r)` while the
// row is in cache.
template <size_t kIn, size_t kOut, class T, class Body, class RowDone = void (*)(int64_t)>
void MapRowVectors(const std::array<Rows<const T*>, kIn>& in, const std::array<Rows<T*>, kOut>& out, int64_t R,
                   int64_t C, const Body& body, const RowDone& row_done = [](int64_t) {}) {
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 14) / std::max<int64_t>(C, 1));
  parallel_for(R, grain, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      std::array<const T*, kIn> in_row;
      std::array<T*, kOut> out_row;
      for (size_t k = 0; k < kIn; ++k) in_row[k] = in[k].base + r * in[k].stride;
      for (size_t k = 0; k < kOut; ++k) out_row[k] = out[k].base + r * out[k].stride;
      MapRange(in_row, out_row, 0, C, body);
      row_done(r);
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

// gate_up: R rows of [gate (C) | up (C)], y: R rows of C. Under mixed precision (f32) the bf16 copies of
// gate_up and y that autograd keeps (gate_up_bf16, y_bf16; nullptr: none), rounded row by row in cache.
template <class T>
void SwigluT(const T* gate_up, T* y, int64_t R, int64_t C, uint16_t* gate_up_bf16, uint16_t* y_bf16) {
  MapRowVectors<2, 1, T>(
      {Rows<const T*>{gate_up, 2 * C}, Rows<const T*>{gate_up + C, 2 * C}}, {Rows<T*>{y, C}}, R, C,
      [](auto d, const auto& v) { return std::array{hn::Mul(hn::Mul(v[0], Sigmoid(d, v[0])), v[1])}; },
      [&](int64_t r) {
        if constexpr (std::is_same_v<T, float>) {
          if (gate_up_bf16) RoundRowToBf16(gate_up + r * 2 * C, 2 * C, gate_up_bf16 + r * 2 * C);
          if (y_bf16) RoundRowToBf16(y + r * C, C, y_bf16 + r * C);
        }
      });
}

// y = silu(g) u: dgate = dy u silu'(g), dup = dy silu(g), into dgate_up's halves.
struct SwigluBackwardBody {
  template <class D, class Args>
  auto operator()(D d, const Args& v) const {  // v: gate, up, dy
    const auto s = Sigmoid(d, v[0]);
    return std::array{hn::Mul(hn::Mul(v[2], v[1]), SiluDerivative(d, v[0], s)), hn::Mul(v[2], hn::Mul(v[0], s))};
  }
};

template <class T>
void SwigluBackwardT(const T* gate_up, const T* dy, T* dgate_up, int64_t R, int64_t C) {
  MapRowVectors<3, 2, T>({Rows<const T*>{gate_up, 2 * C}, Rows<const T*>{gate_up + C, 2 * C}, Rows<const T*>{dy, C}},
                         {Rows<T*>{dgate_up, 2 * C}, Rows<T*>{dgate_up + C, 2 * C}}, R, C, SwigluBackwardBody());
}

// The same from gate_up's kept bf16 copy (mixed precision, f32): each row's gate and up widened piece by
// piece into buffers in cache as they are read. Widening is exact, so these are the bits of the f32 kernel
// on the widened copy, with no widened copy in memory.
void SwigluBackwardFromBf16(const uint16_t* gate_up, const float* dy, float* dgate_up, int64_t R, int64_t C) {
  constexpr int64_t kPiece = 512;
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 14) / std::max<int64_t>(C, 1));
  parallel_for(R, grain, [&](int64_t begin, int64_t end) {
    alignas(64) float gate[kPiece], up[kPiece];
    for (int64_t r = begin; r < end; ++r)
      for (int64_t c = 0; c < C; c += kPiece) {
        const int64_t n = std::min(kPiece, C - c);
        const uint16_t* gate_bf16 = gate_up + r * 2 * C + c;
        WidenRowFromBf16(gate_bf16, n, gate);
        WidenRowFromBf16(gate_bf16 + C, n, up);
        float* dgate = dgate_up + r * 2 * C + c;
        MapRange<3, 2, float>({gate, up, dy + r * C + c}, {dgate, dgate + C}, 0, n, SwigluBackwardBody());
      }
  });
}

// swiglu_combine_backward (tensor/kernels.h): per assignment, its row of C values in vectors, the last
// partial one through zero-padded copies (zeros add nothing to the dot). Each element gets SwigluT's and
// SwigluBackwardT's arithmetic, the weight applied as the combine's backward applies it (h w, t w); dw
// sums its products in Lanes partial sums. Assignment a owns row pos[a] and dw[a], so the assignments
// split across threads with no two sharing a byte. G: gate_up's element type, T's or bf16 (uint16_t: the
// kept copy under mixed precision, widened as it is read).
template <class T, class G>
void SwigluCombineBackwardT(const T* w, const int32_t* pos, int64_t assignments, int64_t C, const G* gate_up,
                            const T* t, T* h, T* dgate_up, T* dw) {
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 12) / std::max<int64_t>(C, 1));
  parallel_for(assignments, grain, [&](int64_t begin, int64_t end) {
    const hn::ScalableTag<T> d;
    using V = hn::Vec<decltype(d)>;
    const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
    for (int64_t a = begin; a < end; ++a) {
      const int64_t m = pos[a];
      const G* gate = gate_up + m * 2 * C;
      const G* up = gate + C;
      const T* t_m = t + m * C;
      T* h_m_out = h + m * C;
      T* dgate = dgate_up + m * 2 * C;
      T* dup = dgate + C;
      const V weight = hn::Set(d, w[a]);
      V dot = hn::Zero(d);
      // h_m, dgate and dup of one vector: into h, dgate and dup at `out` (the row's, or the padded copies').
      auto step = [&](V g, V u, V dh_unweighted, T* h_out, T* dgate_out, T* dup_out) {
        const V s = Sigmoid(d, g);
        const V silu = hn::Mul(g, s);
        const V h_m = hn::Mul(silu, u);
        dot = hn::MulAdd(dh_unweighted, h_m, dot);
        const V dy = hn::Mul(dh_unweighted, weight);
        hn::StoreU(hn::Mul(h_m, weight), d, h_out);
        hn::StoreU(hn::Mul(hn::Mul(dy, u), SiluDerivative(d, g, s)), d, dgate_out);
        hn::StoreU(hn::Mul(dy, silu), d, dup_out);
      };
      int64_t c = 0;
      for (; c + lanes <= C; c += lanes)
        step(LoadWidened(d, gate + c), LoadWidened(d, up + c), hn::LoadU(d, t_m + c), h_m_out + c, dgate + c, dup + c);
      if (c < C) {
        const int64_t count = C - c;
        T g[HWY_LANES(T)] = {}, u[HWY_LANES(T)] = {}, dh[HWY_LANES(T)] = {};
        T h_part[HWY_LANES(T)], dgate_part[HWY_LANES(T)], dup_part[HWY_LANES(T)];
        std::transform(gate + c, gate + C, g, Widened<T, G>);
        std::transform(up + c, up + C, u, Widened<T, G>);
        std::copy(t_m + c, t_m + C, dh);
        step(hn::LoadU(d, g), hn::LoadU(d, u), hn::LoadU(d, dh), h_part, dgate_part, dup_part);
        std::copy(h_part, h_part + count, h_m_out + c);
        std::copy(dgate_part, dgate_part + count, dgate + c);
        std::copy(dup_part, dup_part + count, dup + c);
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

void SwigluKernel(DType dtype, const void* gate_up, void* y, int64_t R, int64_t C, uint16_t* gate_up_bf16,
                  uint16_t* y_bf16) {
  LT_FLOAT_SWITCH(dtype, T,
                  SwigluT<T>(static_cast<const T*>(gate_up), static_cast<T*>(y), R, C, gate_up_bf16, y_bf16));
}

void SwigluBackwardKernel(DType dtype, const void* gate_up, bool gate_up_bf16, const void* dy, void* dgate_up, int64_t R,
                          int64_t C) {
  if (gate_up_bf16)
    return SwigluBackwardFromBf16(static_cast<const uint16_t*>(gate_up), static_cast<const float*>(dy),
                                  static_cast<float*>(dgate_up), R, C);
  LT_FLOAT_SWITCH(dtype, T,
                  SwigluBackwardT<T>(static_cast<const T*>(gate_up), static_cast<const T*>(dy),
                                     static_cast<T*>(dgate_up), R, C));
}

void SwigluCombineBackwardKernel(DType dtype, const void* w, const int32_t* pos, int64_t assignments, int64_t C,
                                 const void* gate_up, bool gate_up_bf16, const void* t, void* h, void* dgate_up,
                                 void* dw) {
  if (gate_up_bf16)
    return SwigluCombineBackwardT<float>(static_cast<const float*>(w), pos, assignments, C,
                                         static_cast<const uint16_t*>(gate_up), static_cast<const float*>(t),
                                         static_cast<float*>(h), static_cast<float*>(dgate_up),
                                         static_cast<float*>(dw));
  LT_FLOAT_SWITCH(dtype, T,
                  SwigluCombineBackwardT<T>(static_cast<const T*>(w), pos, assignments, C,
                                            static_cast<const T*>(gate_up), static_cast<const T*>(t),
                                            static_cast<T*>(h), static_cast<T*>(dgate_up), static_cast<T*>(dw)));
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

// y in bf16 (a GEMM operand written rounded) is a GPU's (the front door refuses it here); the kept copies
// are written on both.
void swiglu(const Tensor& gate_up, Tensor& y, const Tensor& gate_up_bf16, const Tensor& y_bf16) {
  const int64_t C = y.dim(-1);
  const auto bf16_or_null = [](const Tensor& t) { return t.defined() ? t.bf16_data() : nullptr; };
  HWY_DYNAMIC_DISPATCH(SwigluKernel)(gate_up.dtype(), gate_up.raw_data(), y.raw_data(), C == 0 ? 0 : y.numel() / C, C,
                                     bf16_or_null(gate_up_bf16), bf16_or_null(y_bf16));
}

void swiglu_backward(const Tensor& gate_up, const Tensor& dy, Tensor& dgate_up) {
  const int64_t C = dy.dim(-1);
  HWY_DYNAMIC_DISPATCH(SwigluBackwardKernel)(dy.dtype(), gate_up.raw_data(), gate_up.dtype() == DType::BF16,
                                             dy.raw_data(), dgate_up.raw_data(), C == 0 ? 0 : dy.numel() / C, C);
}

void swiglu_combine_backward(const Tensor& w, const Tensor& pos, const Tensor& gate_up, const Tensor& t, Tensor& h,
                             Tensor& dgate_up, Tensor& dw) {
  HWY_DYNAMIC_DISPATCH(SwigluCombineBackwardKernel)
  (t.dtype(), w.raw_data(), pos.data<int32_t>(), w.numel(), t.dim(1), gate_up.raw_data(),
   gate_up.dtype() == DType::BF16, t.raw_data(), h.raw_data(), dgate_up.raw_data(),
   dw.defined() ? dw.raw_data() : nullptr);
}

}  // namespace lt::cpu
#endif  // HWY_ONCE
