// fail_cuda and fail_cublas (tensor/cuda/cuda_runtime.h), apart from the runtime's other functions: code
// that only checks CUDA calls (the NCCL communicator) links them without the device runtime, so the
// emulated GPU (tests/cuda/emulated_gpu.cpp) can stand in for that runtime under the whole command line.
// CMake globs every .cpp under tensor/ into the library, CUDA or not, hence the guard.
#ifdef LINGTRAIN_CUDA
#include "tensor/cuda/cuda_runtime.h"

#include "tensor/error.h"

namespace lt::cuda {

void fail_cuda(cudaError_t status, const char* call, const char* file, int line) {
  // A failed call is also recorded as the thread's last error; clear it so that a later, unrelated
  // cudaGetLastError() check does not report this failure a second time.
  cudaGetLastError();
  fail("CUDA error at ", file, ":", line, ": ", call, " failed: ", cudaGetErrorString(status), " (",
       cudaGetErrorName(status), ")");
}

void fail_cublas(cublasStatus_t status, const char* call, const char* file, int line) {
  fail("cuBLAS error at ", file, ":", line, ": ", call, " failed: ", cublasGetStatusString(status), " (",
       cublasGetStatusName(status), ")");
}

}  // namespace lt::cuda
#endif  // LINGTRAIN_CUDA
