#include "tensor/device.h"

#ifdef LINGTRAIN_CUDA
#include "tensor/cuda/cuda_runtime.h"
#endif

namespace lt {

#ifdef LINGTRAIN_CUDA
bool cuda_compiled() { return true; }
int cuda_device_count() { return cuda::device_count(); }
#else
bool cuda_compiled() { return false; }
int cuda_device_count() { return 0; }
#endif

}  // namespace lt
