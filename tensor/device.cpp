#include "tensor/device.h"

#include <cstdlib>

#include "tensor/device_runtime.h"
#include "tensor/error.h"

namespace lt {

bool cuda_compiled() { return kCudaBackend; }

int cuda_device_count() {
  if constexpr (kCudaBackend) return cuda::device_count();
  return 0;
}

Device parse_device(const std::string& text) {
  if (text == "cpu") return Device::cpu();
  int index = 0;
  if (text != "cuda") {
    const std::string prefix = "cuda:";
    char* end = nullptr;
    const long parsed = text.rfind(prefix, 0) == 0 ? std::strtol(text.c_str() + prefix.size(), &end, 10) : -1;
    LT_CHECK(end != nullptr && *end == '\0' && end != text.c_str() + prefix.size() && parsed >= 0,
             "device '", text, "' is not cpu, cuda or cuda:N");
    index = static_cast<int>(parsed);
  }
  LT_CHECK(cuda_compiled(), "device ", text, ": this lingtrain was built without CUDA (nvcc was not found when it was "
           "configured; install the CUDA toolkit and rebuild)");
  const int count = cuda_device_count();
  LT_CHECK(count > 0, "device ", text, ": no CUDA device is usable on this machine (no GPU, or no driver)");
  LT_CHECK(index < count, "device ", text, ": this machine has ", count, " CUDA device(s), cuda:0 to cuda:", count - 1);
  return Device::cuda(index);
}

std::string cuda_device_description(int index) {
  LT_CHECK(index >= 0 && index < cuda_device_count(), "cuda:", index, " is not a usable CUDA device");
  if constexpr (kCudaBackend) return cuda::device_description(index);
  return {};
}

std::string cuda_device_list() {
  std::string list;
  for (int i = 0; i < cuda_device_count(); ++i) list += "cuda:" + std::to_string(i) + ": " + cuda_device_description(i) + "\n";
  return list;
}

}  // namespace lt
