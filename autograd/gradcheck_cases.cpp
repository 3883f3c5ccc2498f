// The gradient-check table: one entry per op and variant. Adding an op's check is adding a line here.
// Shapes include 1, 3, 17 and 129 so that SIMD tails (and single-lane vectors) are exercised.
#include "autograd/gradcheck.h"
#include "autograd/ops.h"

namespace lt {
namespace {

using Inputs = std::vector<Variable>;

}  // namespace

std::vector<GradCase> core_gradcheck_cases() {
  std::vector<GradCase> cases;
  auto add_case = [&](GradCase c) { cases.push_back(std::move(c)); };

  // ---- elementwise
  add_case(simple("add", "same shape [17, 3]", {{17, 3}, {17, 3}}, [](const Inputs& x) { return add(x[0], x[1]); }));
  add_case(simple("add", "broadcast [3, 17, 129] + [129]", {{3, 17, 129}, {129}},
                  [](const Inputs& x) { return add(x[0], x[1]); }));
  add_case(simple("sub", "broadcast [17, 129] - [17, 129]", {{17, 129}, {17, 129}},
                  [](const Inputs& x) { return sub(x[0], x[1]); }));
  add_case(simple("sub", "broadcast [3, 17] - [17]", {{3, 17}, {17}}, [](const Inputs& x) { return sub(x[0], x[1]); }));
  add_case(simple("mul", "same shape [129]", {{129}, {129}}, [](const Inputs& x) { return mul(x[0], x[1]); }));
  add_case(simple("mul", "broadcast [3, 1, 17] * [1, 17]", {{3, 1, 17}, {1, 17}},
                  [](const Inputs& x) { return mul(x[0], x[1]); }));
  add_case(simple("scale", "[17, 3] * -0.7", {{17, 3}}, [](const Inputs& x) { return scale(x[0], -0.7); }));

  // ---- shape and reductions
  add_case(simple("reshape", "[3, 17] -> [17, 3]", {{3, 17}}, [](const Inputs& x) { return reshape(x[0], {17, 3}); }));
  // The identity with a hook on its backward, inside a product so that its incoming gradient is not all ones.
  add_case(simple("call_before_backward", "[3, 17] times itself", {{3, 17}},
                  [](const Inputs& x) { return mul(call_before_backward(x[0], [] {}), x[0]); }));
  add_case(simple("slice_cols", "[3, 17, 129] cols 5..22", {{3, 17, 129}},
                  [](const Inputs& x) { return slice_cols(x[0], 5, 17); }));
  add_case(simple("slice_cols", "[17, 3] col 2", {{17, 3}}, [](const Inputs& x) { return slice_cols(x[0], 2, 1); }));
  add_case(simple("sum", "[3, 129]", {{3, 129}}, [](const Inputs& x) { return sum(x[0]); }));
  add_case(simple("mean", "[17, 3]", {{17, 3}}, [](const Inputs& x) { return mean(x[0]); }));

  // ---- matmul
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      const std::string flags = std::string(ta ? "T" : "N") + (tb ? "T" : "N");
      const int64_t M = 17, K = 3, N = 129;
      add_case(simple("matmul", flags + " [17x3]@[3x129]", {ta ? Shape{K, M} : Shape{M, K}, tb ? Shape{N, K} : Shape{K, N}},
                      [ta, tb](const Inputs& x) { return matmul(x[0], x[1], ta, tb); }));
      add_case(simple("matmul", flags + " batched 3x[1x17]@[17x3]", {ta ? Shape{3, 17, 1} : Shape{3, 1, 17},
                                                                      tb ? Shape{3, 3, 17} : Shape{3, 17, 3}},
                      [ta, tb](const Inputs& x) { return matmul(x[0], x[1], ta, tb); }));
    }
  add_case(simple("matmul", "shared b [3,17,3]@[3,129]", {{3, 17, 3}, {3, 129}},
                  [](const Inputs& x) { return matmul(x[0], x[1]); }));
  add_case(simple("matmul", "shared b^T [3,17,3]@[129,3]^T", {{3, 17, 3}, {129, 3}},
                  [](const Inputs& x) { return matmul(x[0], x[1], false, true); }));
  add_case(simple("matmul_add", "[17,129] + [17x3]@[129x3]^T", {{17, 129}, {17, 3}, {129, 3}},
                  [](const Inputs& x) { return matmul_add(x[1], x[2], x[0], false, true); }));
  add_case(simple("matmul_add", "[3,17,129] + shared b [3,17,3]@[3,129]", {{3, 17, 129}, {3, 17, 3}, {3, 129}},
                  [](const Inputs& x) { return matmul_add(x[1], x[2], x[0]); }));
  add_case(simple("matmul_add", "TN [3,129] + [17x3]^T@[17x129]", {{3, 129}, {17, 3}, {17, 129}},
                  [](const Inputs& x) { return matmul_add(x[1], x[2], x[0], true, false); }));

  // ---- activations
  for (const Shape& shape : std::vector<Shape>{{1}, {3, 17}, {129}, {2, 3, 129}}) {
    add_case(simple("silu", "x " + shape_str(shape), {shape}, [](const Inputs& x) { return silu(x[0]); }));
    Shape gate_up = shape;
    gate_up.back() *= 2;
    add_case(simple("swiglu", "gate_up " + shape_str(gate_up), {gate_up},
                    [](const Inputs& x) { return swiglu(x[0]); }));
  }

  // ---- normalisation
  for (const Shape& shape : std::vector<Shape>{{129}, {1, 129}, {3, 17}, {17, 3}, {2, 3, 129}}) {
    add_case(simple("rmsnorm", "x " + shape_str(shape) + ", weight and eps 1e-6", {shape, {shape.back()}},
                    [](const Inputs& x) { return rmsnorm(x[0], x[1], 1e-6); }));
  }
  // The residual stream's sum used again beside its norm (the next attention's residual), and not (the final
  // norm).
  for (const Shape& shape : std::vector<Shape>{{1, 129}, {3, 17}, {2, 3, 129}}) {
    add_case(simple("add_rmsnorm", "a + b " + shape_str(shape) + " and its norm, both used", {shape, shape, {shape.back()}},
                    [](const Inputs& x) {
                      const AddRmsNorm r = add_rmsnorm(x[0], x[1], x[2], 1e-6);
                      return add(r.normed, scale(r.sum, 0.5));
                    }));
    add_case(simple("add_rmsnorm", "a + b " + shape_str(shape) + ", the norm alone", {shape, shape, {shape.back()}},
                    [](const Inputs& x) { return add_rmsnorm(x[0], x[1], x[2], 1e-6).normed; }));
  }

  // ---- softmax and losses
  for (const Shape& shape : std::vector<Shape>{{1, 3}, {3, 17}, {17, 129}, {2, 3, 129}}) {
    add_case(simple("softmax", "x " + shape_str(shape), {shape}, [](const Inputs& x) { return softmax(x[0]); }));
    add_case(
        simple("log_softmax", "x " + shape_str(shape), {shape}, [](const Inputs& x) { return log_softmax(x[0]); }));
  }
  // Targets in [0, V) from a fixed seed, every `ignore_every`-th one (if > 0) set to the ignore index -100.
  auto make_targets = [](const Shape& shape, int64_t V, DType dtype, int64_t ignore_every, uint64_t seed) {
    Rng rng(seed);
    std::vector<int64_t> ids(static_cast<size_t>(shape_numel(shape)));
    for (size_t n = 0; n < ids.size(); ++n)
      ids[n] = ignore_every > 0 && n % ignore_every == 0 ? -100 : static_cast<int64_t>(rng.below(V));
    if (dtype == DType::I64) return Tensor::from_vector(shape, ids);
    return Tensor::from_vector(shape, std::vector<int32_t>(ids.begin(), ids.end()));
  };
  struct CrossEntropyVariant {
    Shape logits_shape;
    DType target_dtype;
    int64_t ignore_every;
    std::string what;
  };
  for (const CrossEntropyVariant& v : std::vector<CrossEntropyVariant>{
           {{1, 3}, DType::I32, 0, "logits [1, 3], i32 targets"},
           {{3, 17}, DType::I64, 0, "logits [3, 17], i64 targets"},
           {{17, 129}, DType::I32, 4, "logits [17, 129], i32 targets, every 4th ignored"},
           {{129, 17}, DType::I64, 3, "logits [129, 17], i64 targets, every 3rd ignored"},
           {{2, 3, 129}, DType::I64, 5, "logits [2, 3, 129], i64 targets, every 5th ignored"},
           {{3, 17}, DType::I32, 1, "logits [3, 17], i32 targets, all ignored"}}) {
    const Tensor targets = make_targets(Shape(v.logits_shape.begin(), v.logits_shape.end() - 1),
                                        v.logits_shape.back(), v.target_dtype, v.ignore_every, 7);
    add_case(simple("cross_entropy", v.what, {v.logits_shape},
                    [targets](const Inputs& x) { return cross_entropy(x[0], targets, -100); }));
  }

  // ---- rope
  // theta 10000 and Ling's 600000; D = 2 (one pair), 6, and 130 (a vector tail in each half); pos_offset
  // up to 16000, where the angles are large.
  struct RopeCase {
    Shape shape;
    double theta;
    int64_t pos_offset;
  };
  for (const RopeCase& rc : std::vector<RopeCase>{{{2, 3, 1, 2}, 10000.0, 0},
                                                  {{1, 17, 2, 6}, 10000.0, 5},
                                                  {{1, 1, 3, 6}, 600000.0, 7},
                                                  {{1, 3, 1, 130}, 10000.0, 0},
                                                  {{1, 3, 2, 6}, 600000.0, 16000}}) {
    const double theta = rc.theta;
    const int64_t pos_offset = rc.pos_offset;
    add_case(simple("rope",
                    "x " + shape_str(rc.shape) + " theta " + std::to_string(static_cast<int64_t>(theta)) + " pos " +
                        std::to_string(pos_offset),
                    {rc.shape}, [theta, pos_offset](const Inputs& x) { return rope(x[0], theta, pos_offset); }));
  }

  // ---- attention
  // q [B, T, Hq, D], k and v [B, T, Hkv, D]. The kernel works in blocks of 64 rows: T = 129 spans three
  // query and key blocks (64, 64, 1), so the online-softmax rescaling and the diagonal tiles are checked.
  struct AttentionCase {
    int64_t B, T, Hq, Hkv, D;
  };
  for (const AttentionCase& ac : std::vector<AttentionCase>{
           {1, 1, 1, 1, 3},     // one position: a softmax over one score
           {2, 3, 4, 2, 3},     // GQA, two query heads per kv head
           {1, 17, 3, 1, 17},   // GQA, three query heads share one kv head; D with a vector tail
           {1, 17, 2, 2, 3},    // Hq == Hkv
           {1, 129, 1, 1, 3},   // several blocks
           {1, 129, 2, 1, 2}})  // several blocks with GQA
    add_case(simple("attention",
                    "B=" + std::to_string(ac.B) + " T=" + std::to_string(ac.T) + " Hq=" + std::to_string(ac.Hq) +
                        " Hkv=" + std::to_string(ac.Hkv) + " D=" + std::to_string(ac.D),
                    {{ac.B, ac.T, ac.Hq, ac.D}, {ac.B, ac.T, ac.Hkv, ac.D}, {ac.B, ac.T, ac.Hkv, ac.D}},
                    [](const Inputs& x) { return attention(x[0], x[1], x[2]); }));

  // Packed documents (doc_start): a one-token document, a boundary inside a block and one on the block
  // boundary at 64, two rows packed differently.
  {
    const int64_t T = 129;
    std::vector<int32_t> starts(2 * T);
    for (int64_t t = 0; t < T; ++t) {
      starts[t] = t < 1 ? 0 : t < 10 ? 1 : t < 64 ? 10 : 64;
      starts[T + t] = t < 100 ? 0 : 100;
    }
    const Tensor doc_start = Tensor::from_vector<int32_t>({2, T}, starts);
    add_case(simple("attention", "packed documents B=2 T=129 Hq=2 Hkv=1 D=3",
                    {{2, T, 2, 3}, {2, T, 1, 3}, {2, T, 1, 3}},
                    [doc_start](const Inputs& x) { return attention(x[0], x[1], x[2], doc_start); }));
    add_case(simple("qkv_attention", "packed documents B=2 T=129 Hq=2 Hkv=1 D=2",
                    {{2, T, 4 * 2}},
                    [doc_start](const Inputs& x) { return qkv_attention(x[0], 2, 1, 10000.0, 0, doc_start); }));
  }

  // qkv_attention: the fused projection [B, T, (Hq + 2 Hkv) D] split with RoPE; D = 2 (one pair) and
  // D = 18 (a vector tail in each half), GQA, and a position offset.
  struct QkvCase {
    int64_t B, T, Hq, Hkv, D, pos_offset;
  };
  for (const QkvCase& qc : std::vector<QkvCase>{{1, 1, 1, 1, 2, 0}, {2, 3, 4, 2, 2, 5}, {1, 17, 2, 1, 18, 0},
                                               {1, 129, 1, 1, 2, 3}})
    add_case(simple("qkv_attention",
                    "B=" + std::to_string(qc.B) + " T=" + std::to_string(qc.T) + " Hq=" + std::to_string(qc.Hq) +
                        " Hkv=" + std::to_string(qc.Hkv) + " D=" + std::to_string(qc.D) + " pos " +
                        std::to_string(qc.pos_offset),
                    {{qc.B, qc.T, (qc.Hq + 2 * qc.Hkv) * qc.D}}, [qc](const Inputs& x) {
                      return qkv_attention(x[0], qc.Hq, qc.Hkv, 10000.0, qc.pos_offset);
                    }));

  // ---- indexing
  // Index lists repeat entries and skip some rows/columns: repeated uses must sum their gradients and
  // unused ones must get exactly zero.
  for (int64_t C : {1, 3, 17, 129}) {
    const std::string cols = std::to_string(C);
    const Tensor ids = Tensor::from_vector<int64_t>({2, 4}, {3, 0, 3, 4, 1, 3, 0, 2});
    add_case(simple("embedding", "[6, " + cols + "] ids i64 [2, 4] repeated", {{6, C}},
                    [ids](const Inputs& x) { return embedding(x[0], ids); }));
    const Tensor rows_i32 = Tensor::from_vector<int32_t>({9}, {6, 0, 2, 2, 5, 0, 1, 6, 2});
    add_case(simple("gather_rows", "[7, " + cols + "] idx i32 [9] repeated", {{7, C}},
                    [rows_i32](const Inputs& x) { return gather_rows(x[0], rows_i32); }));
    const Tensor rows_i64 = Tensor::from_vector<int64_t>({9}, {4, 0, 2, 2, 6, 0, 1, 4, 2});
    add_case(simple("scatter_add_rows", "[9, " + cols + "] -> [7, " + cols + "] idx i64 repeated", {{9, C}},
                    [rows_i64](const Inputs& x) { return scatter_add_rows(x[0], rows_i64, 7); }));
    // Columns j and j + 2 of each row pick the same entry.
    std::vector<int32_t> picks;
    for (int64_t n = 0; n < 4; ++n)
      for (int64_t j = 0; j < 3; ++j) picks.push_back(static_cast<int32_t>((n * 5 + (j % 2) * 7) % C));
    const Tensor cols_idx = Tensor::from_vector<int32_t>({4, 3}, picks);
    add_case(simple("gather_cols", "[4, " + cols + "] idx [4, 3] repeated", {{4, C}},
                    [cols_idx](const Inputs& x) { return gather_cols(x[0], cols_idx); }));
    // topk needs a strict order that a finite-difference step cannot change: each row is a shuffled
    // ramp with steps of 0.5 plus jitter below 0.25, so no two values are within 0.25 of each other.
    const int64_t k = std::min<int64_t>(C, C == 129 ? 8 : 2);
    add_case({"topk", "[3, " + cols + "] k=" + std::to_string(k),
              [C](Rng& rng) {
                const int64_t rows = 3;
                std::vector<double> values(static_cast<size_t>(rows * C));
                for (int64_t r = 0; r < rows; ++r) {
                  std::vector<int64_t> rank(static_cast<size_t>(C));
                  for (int64_t c = 0; c < C; ++c) rank[c] = c;
                  for (int64_t c = C - 1; c > 0; --c) std::swap(rank[c], rank[rng.below(static_cast<uint64_t>(c + 1))]);
                  for (int64_t c = 0; c < C; ++c)
                    values[r * C + c] = 0.5 * static_cast<double>(rank[c] - C / 2) + 0.25 * rng.uniform();
                }
                return Inputs{Variable(Tensor::from_vector<double>({rows, C}, values), true)};
              },
              [k](const Inputs& x) { return topk(x[0], k).values; }});
  }
  add_case(simple("embedding", "[6, 17] ids i32 [8] repeated", {{6, 17}}, [](const Inputs& x) {
    return embedding(x[0], Tensor::from_vector<int32_t>({8}, {5, 5, 0, 2, 5, 1, 0, 3}));
  }));

  return cases;
}

}  // namespace lt
