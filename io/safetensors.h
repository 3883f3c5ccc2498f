// The safetensors format (Hugging Face), so that a lingtrain checkpoint opens in transformers, vLLM,
// SGLang and the safetensors library itself, and a Hugging Face checkpoint opens here:
//
//   [8 bytes]  N, the header length, unsigned little-endian
//   [N bytes]  a JSON object: for each tensor  "name": {"dtype": "F32", "shape": [2, 3],
//              "data_offsets": [begin, end]}  (byte offsets into the data section), plus an optional
//              "__metadata__": {string: string}; padded with spaces so that N is a multiple of 8
//   [rest]     the data section: each tensor's raw little-endian, row-major bytes
//
// We write exactly what the Rust/Python library writes: "__metadata__" first, then the tensors sorted by
// dtype alignment (largest first) and then by name, their data packed contiguously from offset 0 in
// that same order; so every tensor's data starts aligned to its element size, which lets readers mmap
// the file and use the bytes in place.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "tensor/tensor.h"

namespace lt {

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;
using SafetensorsMetadata = std::map<std::string, std::string>;

// One tensor as the header describes it. Offsets are relative to the start of the data section.
struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::F32;
  Shape shape;
  uint64_t begin = 0;
  uint64_t end = 0;
};

struct SafetensorsHeader {
  std::vector<SafetensorsEntry> entries;  // in file order (by offset)
  SafetensorsMetadata metadata;
  uint64_t data_start = 0;  // file offset of the data section: 8 + header length
  const SafetensorsEntry* find(const std::string& name) const;  // nullptr when absent
};

// A loaded file: every tensor on the CPU, by name.
struct SafetensorsFile {
  std::string path;
  std::map<std::string, Tensor> tensors;
  SafetensorsMetadata metadata;

  const Tensor& get(const std::string& name) const;  // fails naming the file when absent
  // Also fails unless the tensor has exactly this shape and dtype:
  // "model.safetensors: tensor 'lm_head.weight' has shape [8, 4], expected [16, 4]".
  const Tensor& get(const std::string& name, const Shape& expected_shape, DType expected_dtype) const;
};

// Writes the file atomically (io/atomic_file.h). Tensors may live on any device; each is copied to the
// CPU in turn, so the host never holds more than one extra tensor. Names must be unique and not
// "__metadata__". When metadata is given without a "format" key, "format": "pt" is added: transformers
// refuses a file whose metadata lacks it. Empty metadata writes no "__metadata__" at all.
void save_safetensors(const std::string& path, const NamedTensors& tensors, const SafetensorsMetadata& metadata = {});

// Reads and validates the header only (lengths, JSON, dtypes, shapes, offsets against the file size).
SafetensorsHeader read_safetensors_header(const std::string& path);
SafetensorsFile load_safetensors(const std::string& path);
// Reads one tensor, checking its shape and dtype as SafetensorsFile::get does; the others stay on disk.
Tensor load_safetensors_tensor(const std::string& path, const std::string& name, const Shape& expected_shape,
                               DType expected_dtype);

}  // namespace lt
