#include "dist/data_parallel.h"

#include <algorithm>

namespace lt {

void DataParallel::average(FlatParameters& params, Module& module) {
  if (comm_.size() == 1) return;
  const std::vector<FlatParameters::Run> runs = params.runs_with_grad(/*split_by_decay=*/false);
  // Every rank must reduce the same stretches, or the collectives below would pair different data.
  int64_t elements = 0;
  for (const FlatParameters::Run& run : runs) elements += run.end - run.begin;
  Tensor check = Tensor::full({1}, static_cast<double>(elements), DType::F64);
  comm_.all_reduce(check, ReduceOp::Mean);
  LT_CHECK(check.item() == static_cast<double>(elements), "data parallel: rank ", comm_.rank(), " has gradients for ",
           elements, " elements, the ranks' mean is ", check.item(), ": the ranks' models or batches differ");
  Tensor& grads = params.grads();
  for (const FlatParameters::Run& run : runs)
    for (int64_t begin = run.begin; begin < run.end; begin += kBucketElements) {
      Tensor bucket = grads.narrow(begin, std::min(kBucketElements, run.end - begin));
      comm_.all_reduce(bucket, ReduceOp::Mean);
    }
  for (const Buffer& buffer : module.buffers()) comm_.all_reduce(*buffer.value, ReduceOp::Mean);
}

void DataParallel::sum(std::vector<double>& values) {
  if (comm_.size() == 1 || values.empty()) return;
  Tensor t = Tensor::from_vector<double>({static_cast<int64_t>(values.size())}, values);
  comm_.all_reduce(t, ReduceOp::Sum);
  values = t.to_vector<double>();
}

}  // namespace lt
