#include "io/safetensors.h"

#include <algorithm>
#include <bit>
#include <set>
#include <sstream>

#include "io/atomic_file.h"
#include "io/input_file.h"
#include "io/json.h"
#include "tensor/error.h"

namespace lt {

static_assert(std::endian::native == std::endian::little,
              "safetensors data and header length are little-endian; this reader copies bytes as they are");

namespace {

// The safetensors library refuses headers above 100 MB; so do we, which also keeps a corrupt length
// from asking for an absurd allocation.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

const char* safetensors_dtype_name(DType dtype) {
  switch (dtype) {
    case DType::F32: return "F32";
    case DType::F64: return "F64";
    case DType::BF16: return "BF16";
    case DType::I32: return "I32";
    case DType::I64: return "I64";
  }
  fail("unknown dtype");
}

bool dtype_from_safetensors_name(const std::string& name, DType& dtype) {
  for (DType candidate : {DType::F32, DType::F64, DType::BF16, DType::I32, DType::I64}) {
    if (name == safetensors_dtype_name(candidate)) {
      dtype = candidate;
      return true;
    }
  }
  return false;
}

// Position in the safetensors library's Dtype enum, which is ordered by alignment; the writer sorts
// tensors by this rank, largest first, then by name.
int safetensors_dtype_rank(DType dtype) {
  switch (dtype) {
    case DType::BF16: return 0;
    case DType::I32: return 1;
    case DType::F32: return 2;
    case DType::F64: return 3;
    case DType::I64: return 4;
  }
  fail("unknown dtype");
}

// A JSON string literal, as serde_json writes it.
std::string quoted(const std::string& text, const std::string& path) {
  try {
    return Json(text).dump();
  } catch (const Json::type_error&) {
    fail(path, ": name or metadata '", text, "' is not valid UTF-8");
  }
}

std::string offsets_str(uint64_t begin, uint64_t end) {
  std::ostringstream out;
  out << '[' << begin << ", " << end << ')';
  return out.str();
}

// A JSON array of non-negative integers that fit in int64 (shapes and offsets), or false.
bool read_unsigned_list(const Json& value, std::vector<uint64_t>& out) {
  if (!value.is_array()) return false;
  out.clear();
  for (const Json& item : value) {
    if (!item.is_number_unsigned()) return false;  // nlohmann stores every non-negative integer as unsigned
    const uint64_t number = item.get<uint64_t>();
    if (number > static_cast<uint64_t>(INT64_MAX)) return false;
    out.push_back(number);
  }
  return true;
}

SafetensorsEntry parse_entry(const std::string& path, const std::string& name, const Json& info) {
  const std::string what = path + ": tensor '" + name + "'";
  if (!info.is_object()) fail(what, " must be described by an object, got ", info.type_name());
  for (const char* key : {"dtype", "shape", "data_offsets"})
    if (!info.contains(key)) fail(what, " has no '", key, "'");
  if (!info["dtype"].is_string()) fail(what, ": 'dtype' must be a string, got ", info["dtype"].type_name());

  SafetensorsEntry entry;
  entry.name = name;
  const std::string dtype_name_in_file = info["dtype"].get<std::string>();
  if (!dtype_from_safetensors_name(dtype_name_in_file, entry.dtype))
    fail(what, " has dtype ", dtype_name_in_file, ", which lingtrain does not read (it reads F32, F64, BF16, I32, I64)");

  std::vector<uint64_t> dims, offsets;
  if (!read_unsigned_list(info["shape"], dims))
    fail(what, ": 'shape' must be a list of non-negative integers, got ", info["shape"].dump());
  if (!read_unsigned_list(info["data_offsets"], offsets) || offsets.size() != 2)
    fail(what, ": 'data_offsets' must be two non-negative integers [begin, end], got ", info["data_offsets"].dump());
  entry.begin = offsets[0];
  entry.end = offsets[1];
  if (entry.end < entry.begin) fail(what, " has data_offsets ", info["data_offsets"].dump(), " with end before begin");

  uint64_t bytes = dtype_size(entry.dtype);
  for (uint64_t dim : dims) {
    if (dim != 0 && bytes > UINT64_MAX / dim) fail(what, " has a shape too large to address: ", info["shape"].dump());
    bytes *= dim;
    entry.shape.push_back(static_cast<int64_t>(dim));
  }
  if (entry.end - entry.begin != bytes)
    fail(what, " has data_offsets ", info["data_offsets"].dump(), " (", entry.end - entry.begin, " bytes) but ",
         dtype_name_in_file, ' ', shape_str(entry.shape), " needs ", bytes, " bytes");
  return entry;
}

SafetensorsHeader parse_header(const InputFile& file) {
  const std::string& path = file.path();
  if (file.size() < 8)
    fail(path, ": not a safetensors file: ", file.size(), " bytes, shorter than the 8-byte header length");
  uint64_t header_bytes = 0;
  file.read_at(0, &header_bytes, 8, "the header length");
  if (header_bytes > kMaxHeaderBytes)
    fail(path, ": header length ", header_bytes, " exceeds the ", kMaxHeaderBytes,
         "-byte limit of the format (not a safetensors file?)");
  if (header_bytes > file.size() - 8)
    fail(path, ": header length ", header_bytes, " runs past the end of the file (", file.size(), " bytes)");

  std::string text(header_bytes, '\0');
  file.read_at(8, text.data(), text.size(), "the header");
  const Json header = parse_json(text, path + " header");  // "<path> header: invalid JSON at line 1, column 9 ..."
  if (!header.is_object()) fail(path, ": the safetensors header must be a JSON object, got ", header.type_name());

  SafetensorsHeader result;
  result.data_start = 8 + header_bytes;
  for (const auto& [name, info] : header.items()) {
    if (name != "__metadata__") {
      result.entries.push_back(parse_entry(path, name, info));
      continue;
    }
    if (!info.is_object()) fail(path, ": __metadata__ must be an object of strings, got ", info.type_name());
    for (const auto& [key, value] : info.items()) {
      if (!value.is_string()) fail(path, ": __metadata__ key '", key, "' must be a string, got ", value.type_name());
      result.metadata[key] = value.get<std::string>();
    }
  }

  // The data section must be tiled exactly: tensors back to back from offset 0 to its end (the
  // safetensors library refuses gaps, overlaps and trailing bytes alike; each means a corrupt file).
  std::stable_sort(result.entries.begin(), result.entries.end(), [](const auto& a, const auto& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  const uint64_t data_bytes = file.size() - result.data_start;
  uint64_t covered = 0;
  const SafetensorsEntry* previous = nullptr;
  for (const SafetensorsEntry& entry : result.entries) {
    if (entry.begin < covered)
      fail(path, ": tensor '", entry.name, "' data ", offsets_str(entry.begin, entry.end), " overlaps tensor '",
           previous->name, "' data ", offsets_str(previous->begin, previous->end));
    if (entry.begin > covered)
      fail(path, ": bytes ", offsets_str(covered, entry.begin), " of the data section belong to no tensor (before '",
           entry.name, "')");
    if (entry.end > data_bytes)
      fail(path, ": file is truncated: tensor '", entry.name, "' needs data bytes ", offsets_str(entry.begin, entry.end),
           " but the data section has ", data_bytes, " bytes");
    covered = entry.end;
    previous = &entry;
  }
  if (covered != data_bytes)
    fail(path, ": ", data_bytes - covered, " trailing bytes after the last tensor's data (data section ", data_bytes,
         " bytes, tensors cover ", covered, ")");
  return result;
}

Tensor read_entry(const InputFile& file, const SafetensorsHeader& header, const SafetensorsEntry& entry) {
  Tensor tensor = Tensor::empty(entry.shape, entry.dtype);
  const std::string what = "tensor '" + entry.name + "'";
  file.read_at(header.data_start + entry.begin, tensor.raw_data(), entry.end - entry.begin, what.c_str());
  return tensor;
}

void check_expected(const std::string& path, const std::string& name, const Shape& shape, DType dtype,
                    const Shape& expected_shape, DType expected_dtype) {
  if (shape != expected_shape)
    fail(path, ": tensor '", name, "' has shape ", shape_str(shape), ", expected ", shape_str(expected_shape));
  if (dtype != expected_dtype)
    fail(path, ": tensor '", name, "' has dtype ", dtype_name(dtype), ", expected ", dtype_name(expected_dtype));
}

}  // namespace

const SafetensorsEntry* SafetensorsHeader::find(const std::string& name) const {
  for (const SafetensorsEntry& entry : entries)
    if (entry.name == name) return &entry;
  return nullptr;
}

const Tensor& SafetensorsFile::get(const std::string& name) const {
  const auto it = tensors.find(name);
  if (it == tensors.end()) fail(path, ": no tensor named '", name, "' (the file holds ", tensors.size(), " tensors)");
  return it->second;
}

const Tensor& SafetensorsFile::get(const std::string& name, const Shape& expected_shape, DType expected_dtype) const {
  const Tensor& tensor = get(name);
  check_expected(path, name, tensor.shape(), tensor.dtype(), expected_shape, expected_dtype);
  return tensor;
}

void save_safetensors(const std::string& path, const NamedTensors& tensors, const SafetensorsMetadata& metadata) {
  std::set<std::string> seen;
  for (const auto& [name, tensor] : tensors) {
    if (name == "__metadata__") fail(path, ": '__metadata__' is reserved by the format and cannot name a tensor");
    if (!seen.insert(name).second) fail(path, ": tensor name '", name, "' appears twice");
    if (!tensor.defined()) fail(path, ": tensor '", name, "' is undefined");
  }

  std::vector<const std::pair<std::string, Tensor>*> order;
  for (const auto& named : tensors) order.push_back(&named);
  std::sort(order.begin(), order.end(), [](const auto* a, const auto* b) {
    const int rank_a = safetensors_dtype_rank(a->second.dtype()), rank_b = safetensors_dtype_rank(b->second.dtype());
    return rank_a != rank_b ? rank_a > rank_b : a->first < b->first;
  });

  // Compact JSON in serde_json's layout: no spaces, fields in the order dtype, shape, data_offsets.
  std::string header = "{";
  if (!metadata.empty()) {
    SafetensorsMetadata with_format = metadata;
    with_format.emplace("format", "pt");
    header += "\"__metadata__\":{";
    bool first = true;
    for (const auto& [key, value] : with_format) {
      if (!first) header += ",";
      header += quoted(key, path);
      header += ":";
      header += quoted(value, path);
      first = false;
    }
    header += "}";
  }
  uint64_t offset = 0;
  for (const auto* named : order) {
    const Tensor& tensor = named->second;
    if (header.size() > 1) header += ",";
    header += quoted(named->first, path) + ":{\"dtype\":\"" + safetensors_dtype_name(tensor.dtype()) + "\",\"shape\":[";
    for (int axis = 0; axis < tensor.ndim(); ++axis) {
      if (axis) header += ",";
      header += std::to_string(tensor.dim(axis));
    }
    header += "],\"data_offsets\":[" + std::to_string(offset) + "," + std::to_string(offset + tensor.nbytes()) + "]}";
    offset += tensor.nbytes();
  }
  header += "}";
  header.append((8 - header.size() % 8) % 8, ' ');

  write_file_atomic(path, [&](FileSink& sink) {
    const uint64_t header_bytes = header.size();
    sink.write(&header_bytes, sizeof header_bytes);
    sink.write(header);
    for (const auto* named : order) {
      const Tensor host = named->second.to(Device::cpu());
      sink.write(host.raw_data(), host.nbytes());
    }
  });
}

SafetensorsHeader read_safetensors_header(const std::string& path) { return parse_header(InputFile(path)); }

SafetensorsFile load_safetensors(const std::string& path) {
  const InputFile file(path);
  const SafetensorsHeader header = parse_header(file);
  SafetensorsFile result;
  result.path = path;
  result.metadata = header.metadata;
  for (const SafetensorsEntry& entry : header.entries) result.tensors.emplace(entry.name, read_entry(file, header, entry));
  return result;
}

Tensor load_safetensors_tensor(const std::string& path, const std::string& name, const Shape& expected_shape,
                               DType expected_dtype) {
  const InputFile file(path);
  const SafetensorsHeader header = parse_header(file);
  const SafetensorsEntry* entry = header.find(name);
  if (!entry) fail(path, ": no tensor named '", name, "' (the file holds ", header.entries.size(), " tensors)");
  check_expected(path, name, entry->shape, entry->dtype, expected_shape, expected_dtype);
  return read_entry(file, header, *entry);
}

}  // namespace lt
