#include "piper/runtime/checkpoint/safetensors.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>

#include "piper/base/json.h"

namespace piper {
namespace {

constexpr uint64_t kMaxHeaderBytes = 100ull << 20;  // the format's own limit is 100 MB

Status corrupt(const std::string& path, const std::string& what) {
  return data_loss("safetensors file '" + path + "' is corrupt: " + what);
}

}  // namespace

uint64_t safetensors_entry_checksum(const std::string& name, const std::string& dtype, const Shape& shape,
                                    uint64_t begin, uint64_t end, const void* data) {
  // Fields separated by NUL, so that moving a character from one field to the next changes the sum.
  std::string entry = name + '\0' + dtype + '\0' + shape_to_string(shape) + '\0';
  for (uint64_t v : {begin, end}) {
    for (int i = 0; i < 8; ++i) entry.push_back(static_cast<char>(v >> (8 * i)));
  }
  return fnv1a64(data, static_cast<size_t>(end - begin), fnv1a64(entry.data(), entry.size()));
}

Result<SafetensorsWritten> write_safetensors(const std::string& path,
                                             const std::vector<std::pair<std::string, const Tensor*>>& tensors,
                                             const std::map<std::string, std::string>& metadata) {
  OrderedJson header = OrderedJson::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::set<std::string> seen;
  SafetensorsWritten written;
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    if (name.empty() || name == "__metadata__" || !seen.insert(name).second) {
      return invalid_argument("safetensors: tensor name '" + name + "' is empty, reserved or repeated");
    }
    const uint64_t bytes = static_cast<uint64_t>(t->nbytes());
    header[name] = {{"dtype", "F32"}, {"shape", t->shape()}, {"data_offsets", {offset, offset + bytes}}};
    written.entries.push_back({name, "F32", t->shape(), offset, offset + bytes,
                               safetensors_entry_checksum(name, "F32", t->shape(), offset, offset + bytes, t->data())});
    offset += bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  const std::string tmp = path + ".tmp";
  std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
  if (!out) return not_found("cannot write '" + tmp + "': " + std::strerror(errno));
  unsigned char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(static_cast<uint64_t>(text.size()) >> (8 * i));
  out.write(reinterpret_cast<const char*>(len), 8);
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  uint64_t hash = fnv1a64(text.data(), text.size(), fnv1a64(len, 8));
  for (const auto& entry : tensors) {
    const Tensor* t = entry.second;
    if (t->numel() == 0) continue;
    out.write(reinterpret_cast<const char*>(t->data()), t->nbytes());  // x86-64 is little-endian
    hash = fnv1a64(t->data(), static_cast<size_t>(t->nbytes()), hash);
  }
  out.close();
  if (!out) return internal_error("writing '" + tmp + "' failed (disk full?)");
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) return internal_error("cannot rename '" + tmp + "' to '" + path + "': " + ec.message());
  written.bytes = 8 + text.size() + offset;
  written.file_hash = hash;
  return written;
}

Result<SafetensorsFile> read_safetensors(const std::string& path, MemCategory category) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return not_found("safetensors file '" + path + "' cannot be opened: " + std::strerror(errno));
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) return data_loss("safetensors file '" + path + "': read error");
  return parse_safetensors(bytes, path, category);
}

Result<SafetensorsFile> parse_safetensors(const std::string& bytes, const std::string& path, MemCategory category) {
  if (bytes.size() < 8) {
    return corrupt(path, "it has " + std::to_string(bytes.size()) + " bytes, fewer than the 8-byte header length");
  }
  uint64_t header_len = 0;
  for (int i = 0; i < 8; ++i) header_len |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[i])) << (8 * i);
  if (header_len > kMaxHeaderBytes || header_len > bytes.size() - 8) {
    return corrupt(path, "the header claims " + std::to_string(header_len) + " bytes but the file has " +
                             std::to_string(bytes.size() - 8) + " after the length (truncated?)");
  }
  Result<Json> parsed = parse_json(bytes.substr(8, header_len), path + " header");
  if (!parsed.ok()) return corrupt(path, "the header is not valid JSON: " + parsed.status().message());
  const Json& header = *parsed;
  if (!header.is_object()) return corrupt(path, "the header is not a JSON object");
  const uint64_t data_size = bytes.size() - 8 - header_len;
  const char* data = bytes.data() + 8 + header_len;

  SafetensorsFile file;
  struct Entry {
    uint64_t begin, end;
    std::string name;
    Shape shape;
  };
  std::vector<Entry> entries;
  for (const auto& [name, info] : header.items()) {
    if (name == "__metadata__") {
      if (!info.is_object()) return corrupt(path, "__metadata__ is not an object");
      for (const auto& [k, v] : info.items()) {
        if (!v.is_string()) return corrupt(path, "__metadata__." + k + " is not a string");
        file.metadata[k] = v.get<std::string>();
      }
      continue;
    }
    const std::string where = "tensor '" + name + "'";
    if (!info.is_object() || !info.contains("dtype") || !info.contains("shape") || !info.contains("data_offsets")) {
      return corrupt(path, where + " lacks dtype, shape or data_offsets");
    }
    if (!info["dtype"].is_string()) return corrupt(path, where + ": dtype is not a string");
    if (info["dtype"] != "F32") {
      return unimplemented("safetensors file '" + path + "': " + where + " has dtype " +
                           info["dtype"].get<std::string>() + "; only F32 is supported");
    }
    Entry e;
    e.name = name;
    if (!info["shape"].is_array()) return corrupt(path, where + ": shape is not an array");
    for (const Json& s : info["shape"]) {
      if (!s.is_number_unsigned()) return corrupt(path, where + ": shape has a non-integer or negative size");
      e.shape.push_back(s.get<int64_t>());
    }
    const Json& off = info["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned()) {
      return corrupt(path, where + ": data_offsets is not [begin, end]");
    }
    e.begin = off[0].get<uint64_t>();
    e.end = off[1].get<uint64_t>();
    Result<int64_t> numel = shape_numel(e.shape);
    if (!numel.ok()) return corrupt(path, where + ": " + numel.status().message());
    if (e.end < e.begin || e.end - e.begin != static_cast<uint64_t>(*numel) * 4) {
      return corrupt(path, where + ": data_offsets [" + std::to_string(e.begin) + ", " + std::to_string(e.end) +
                               "] do not hold the " + std::to_string(*numel) + " floats of shape " +
                               shape_to_string(e.shape));
    }
    if (e.end > data_size) {
      return corrupt(path, where + " ends at data byte " + std::to_string(e.end) + " but the file has only " +
                               std::to_string(data_size) + " data bytes (truncated)");
    }
    entries.push_back(std::move(e));
  }
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) { return a.begin < b.begin; });
  uint64_t expect = 0;
  for (const Entry& e : entries) {
    if (e.begin != expect) {
      return corrupt(path, "tensor '" + e.name + "' starts at data byte " + std::to_string(e.begin) + ", expected " +
                               std::to_string(expect) + " (overlapping or a hole)");
    }
    expect = e.end;
  }
  if (expect != data_size) {
    return corrupt(path, "the tensors cover " + std::to_string(expect) + " data bytes but the file has " +
                             std::to_string(data_size) + " (trailing bytes)");
  }
  file.file_hash = fnv1a64(bytes.data(), bytes.size());
  for (const Entry& e : entries) {
    PIPER_ASSIGN_OR_RETURN(Tensor t, Tensor::zeros(e.shape, category));
    if (t.numel() > 0) std::memcpy(t.data(), data + e.begin, e.end - e.begin);
    file.tensors.emplace_back(e.name, std::move(t));
    file.entries.push_back({e.name, "F32", e.shape, e.begin, e.end,
                            safetensors_entry_checksum(e.name, "F32", e.shape, e.begin, e.end, data + e.begin)});
  }
  return file;
}

}  // namespace piper
