// Where a tensor's bytes live. Kernels are chosen by the device of their operands.
#pragma once
#include <string>

namespace lt {

enum class DeviceType { CPU, CUDA };

struct Device {
  DeviceType type = DeviceType::CPU;
  int index = 0;

  static Device cpu() { return {DeviceType::CPU, 0}; }
  static Device cuda(int index = 0) { return {DeviceType::CUDA, index}; }
  bool is_cpu() const { return type == DeviceType::CPU; }
  bool is_cuda() const { return type == DeviceType::CUDA; }
  bool operator==(const Device&) const = default;
  std::string str() const { return is_cpu() ? "cpu" : "cuda:" + std::to_string(index); }
};

// The device a flag names: "cpu", "cuda" (device 0) or "cuda:N". A CUDA device must exist: a binary
// built without CUDA, a machine without a GPU or an index past the last GPU is one error line.
Device parse_device(const std::string& text);

// "NVIDIA H100 80GB HBM3, 79.1 GiB, compute capability 9.0" for a usable GPU index.
std::string cuda_device_description(int index);

// One line per usable GPU ("cuda:0: NVIDIA H100 ..., 79.1 GiB, compute capability 9.0"); empty without.
std::string cuda_device_list();

// True when the CUDA backend was compiled in (nvcc was found at build time).
bool cuda_compiled();
// Number of usable GPUs: 0 when not compiled, when no driver is installed, or when none is present.
int cuda_device_count();

}  // namespace lt
