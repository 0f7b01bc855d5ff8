// safetensors encoding and strict decoding of the flat F32 parameter buffer.
// Format: https://github.com/huggingface/safetensors (8-byte LE header length,
// JSON header padded with spaces to 8-byte alignment, raw tensor data).
#include "common/safetensors.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/file_util.h"
#include "common/status_macros.h"

// Tensor data is copied byte for byte between the file and float buffers.
static_assert(sizeof(float) == 4 && std::numeric_limits<float>::is_iec559,
              "safetensors F32 needs IEEE-754 binary32 floats");
#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors.cc assumes a little-endian host"
#endif

namespace dp {
namespace {

// Same cap as the reference implementation, against hostile length fields.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
constexpr int kMaxJsonDepth = 32;

// Length of the valid UTF-8 sequence starting at s[i], or 0 if invalid
// (overlong forms, surrogates and code points above U+10FFFF included).
size_t Utf8SeqLen(absl::string_view s, size_t i) {
  const unsigned char c = static_cast<unsigned char>(s[i]);
  if (c < 0x80) return 1;
  size_t n;
  uint32_t cp;
  if ((c & 0xE0) == 0xC0) {
    n = 2, cp = c & 0x1F;
  } else if ((c & 0xF0) == 0xE0) {
    n = 3, cp = c & 0x0F;
  } else if ((c & 0xF8) == 0xF0) {
    n = 4, cp = c & 0x07;
  } else {
    return 0;
  }
  if (i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k) {
    const unsigned char cc = static_cast<unsigned char>(s[i + k]);
    if ((cc & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (cc & 0x3F);
  }
  static constexpr uint32_t kMinCodePoint[] = {0, 0, 0x80, 0x800, 0x10000};
  if (cp < kMinCodePoint[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
    return 0;
  return n;
}

void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

// Appends `s` as a JSON string literal. Invalid UTF-8 bytes become U+FFFD so
// that the output always parses.
void AppendJsonString(absl::string_view s, std::string* out) {
  out->push_back('"');
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    const size_t n = Utf8SeqLen(s, i);
    if (n == 0) {
      AppendUtf8(0xFFFD, out);
      ++i;
    } else if (c == '"' || c == '\\') {
      out->push_back('\\');
      out->push_back(static_cast<char>(c));
      ++i;
    } else if (c < 0x20) {
      static constexpr char kHex[] = "0123456789abcdef";
      out->append("\\u00");
      out->push_back(kHex[c >> 4]);
      out->push_back(kHex[c & 0xF]);
      ++i;
    } else {
      out->append(s.data() + i, n);
      i += n;
    }
  }
  out->push_back('"');
}

// The subset of JSON a safetensors header uses. Objects keep member order.
struct Json {
  enum Kind { kObject, kArray, kString, kInt };
  Kind kind = kObject;
  uint64_t num = 0;               // kInt
  std::string str;                // kString
  std::vector<std::string> keys;  // kObject, parallel to `values`
  std::vector<Json> values;       // kObject members or kArray items
};

// Strict recursive-descent parser: objects (no duplicate keys), arrays,
// strings (escapes, valid UTF-8) and non-negative integers that fit in u64.
// true/false/null, negative and fractional numbers are rejected.
class JsonParser {
 public:
  explicit JsonParser(absl::string_view text) : s_(text) {}

  absl::StatusOr<Json> ParseDocument() {
    Json root;
    SkipSpace();
    RETURN_IF_ERROR(ParseValue(&root, 0));
    SkipSpace();
    if (pos_ != s_.size()) return Error("trailing characters after the value");
    return root;
  }

 private:
  absl::Status Error(absl::string_view what) const {
    return absl::DataLossError(
        absl::StrCat("malformed JSON header at byte ", pos_, ": ", what));
  }
  bool AtEnd() const { return pos_ >= s_.size(); }
  char Peek() const { return AtEnd() ? '\0' : s_[pos_]; }
  bool Consume(char c) {
    if (AtEnd() || s_[pos_] != c) return false;
    ++pos_;
    return true;
  }
  void SkipSpace() {
    while (!AtEnd() && (s_[pos_] == ' ' || s_[pos_] == '\t' ||
                        s_[pos_] == '\n' || s_[pos_] == '\r')) {
      ++pos_;
    }
  }

  absl::Status ParseValue(Json* out, int depth) {
    if (depth > kMaxJsonDepth) return Error("nested too deeply");
    const char c = Peek();
    if (c == '{') return ParseObject(out, depth);
    if (c == '[') return ParseArray(out, depth);
    if (c == '"') {
      out->kind = Json::kString;
      return ParseString(&out->str);
    }
    if (c >= '0' && c <= '9') {
      out->kind = Json::kInt;
      return ParseInt(&out->num);
    }
    if (AtEnd()) return Error("unexpected end of header");
    if (c == '-') return Error("negative numbers are not allowed");
    return Error(
        absl::StrCat("unexpected character '", absl::string_view(&c, 1), "'"));
  }

  absl::Status ParseObject(Json* out, int depth) {
    out->kind = Json::kObject;
    ++pos_;  // '{'
    SkipSpace();
    if (Consume('}')) return absl::OkStatus();
    std::set<std::string> seen;
    for (;;) {
      SkipSpace();
      if (Peek() != '"') return Error("expected a string key");
      std::string key;
      RETURN_IF_ERROR(ParseString(&key));
      if (!seen.insert(key).second) {
        return Error(absl::StrCat("duplicate key \"", key, "\""));
      }
      SkipSpace();
      if (!Consume(':')) return Error("expected ':'");
      SkipSpace();
      Json value;
      RETURN_IF_ERROR(ParseValue(&value, depth + 1));
      out->keys.push_back(std::move(key));
      out->values.push_back(std::move(value));
      SkipSpace();
      if (Consume('}')) return absl::OkStatus();
      if (!Consume(',')) return Error("expected ',' or '}'");
    }
  }

  absl::Status ParseArray(Json* out, int depth) {
    out->kind = Json::kArray;
    ++pos_;  // '['
    SkipSpace();
    if (Consume(']')) return absl::OkStatus();
    for (;;) {
      SkipSpace();
      Json value;
      RETURN_IF_ERROR(ParseValue(&value, depth + 1));
      out->values.push_back(std::move(value));
      SkipSpace();
      if (Consume(']')) return absl::OkStatus();
      if (!Consume(',')) return Error("expected ',' or ']'");
    }
  }

  absl::Status ParseInt(uint64_t* out) {
    const size_t start = pos_;
    uint64_t v = 0;
    while (!AtEnd() && s_[pos_] >= '0' && s_[pos_] <= '9') {
      const uint64_t d = static_cast<uint64_t>(s_[pos_] - '0');
      if (v > (std::numeric_limits<uint64_t>::max() - d) / 10) {
        return Error("integer too large");
      }
      v = v * 10 + d;
      ++pos_;
    }
    if (s_[start] == '0' && pos_ - start > 1) {
      return Error("leading zeros are not allowed");
    }
    const char c = Peek();
    if (c == '.' || c == 'e' || c == 'E') {
      return Error("only non-negative integers are allowed");
    }
    *out = v;
    return absl::OkStatus();
  }

  absl::Status ParseHex4(uint32_t* out) {
    if (s_.size() - pos_ < 4) return Error("truncated \\u escape");
    uint32_t v = 0;
    for (int k = 0; k < 4; ++k) {
      const char c = s_[pos_++];
      v <<= 4;
      if (c >= '0' && c <= '9') {
        v |= static_cast<uint32_t>(c - '0');
      } else if (c >= 'a' && c <= 'f') {
        v |= static_cast<uint32_t>(c - 'a' + 10);
      } else if (c >= 'A' && c <= 'F') {
        v |= static_cast<uint32_t>(c - 'A' + 10);
      } else {
        return Error("bad hex digit in \\u escape");
      }
    }
    *out = v;
    return absl::OkStatus();
  }

  absl::Status ParseString(std::string* out) {
    ++pos_;  // '"'
    for (;;) {
      if (AtEnd()) return Error("unterminated string");
      const unsigned char c = static_cast<unsigned char>(s_[pos_]);
      if (c == '"') {
        ++pos_;
        return absl::OkStatus();
      }
      if (c < 0x20) return Error("control character in string");
      if (c != '\\') {
        const size_t n = Utf8SeqLen(s_, pos_);
        if (n == 0) return Error("invalid UTF-8");
        out->append(s_.data() + pos_, n);
        pos_ += n;
        continue;
      }
      ++pos_;
      if (AtEnd()) return Error("unterminated escape");
      const char e = s_[pos_++];
      // The one-character escapes, and what each stands for.
      constexpr absl::string_view kEscapes = "\"\\/bfnrt";
      constexpr absl::string_view kMeanings = "\"\\/\b\f\n\r\t";
      if (const size_t i = kEscapes.find(e); i != absl::string_view::npos) {
        out->push_back(kMeanings[i]);
        continue;
      }
      if (e != 'u') return Error("unknown escape");
      uint32_t cp;
      RETURN_IF_ERROR(ParseHex4(&cp));
      if (cp >= 0xDC00 && cp <= 0xDFFF) return Error("lone low surrogate");
      if (cp >= 0xD800 && cp <= 0xDBFF) {
        uint32_t lo;
        if (!Consume('\\') || !Consume('u')) {
          return Error("high surrogate without a low surrogate");
        }
        RETURN_IF_ERROR(ParseHex4(&lo));
        if (lo < 0xDC00 || lo > 0xDFFF) {
          return Error("high surrogate without a low surrogate");
        }
        cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
      }
      AppendUtf8(cp, out);
    }
  }

  absl::string_view s_;
  size_t pos_ = 0;
};

std::string ShapeString(const std::vector<uint64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ","), "]");
}

// One header entry, checked against the layout tensor it names.
struct Range {
  uint64_t begin, end;
  const std::string* name;
};

// What one header entry says of its tensor.
struct Entry {
  std::string dtype;
  std::vector<uint64_t> shape;
  uint64_t begin = 0, end = 0;
};

absl::StatusOr<Entry> ParseEntry(const std::string& name, const Json& entry) {
  const auto malformed = [&name](absl::string_view what) {
    return absl::DataLossError(absl::StrCat("tensor \"", name, "\": ", what));
  };
  if (entry.kind != Json::kObject) return malformed("entry is not an object");
  const Json* dtype = nullptr;
  const Json* shape = nullptr;
  const Json* offsets = nullptr;
  for (size_t i = 0; i < entry.keys.size(); ++i) {
    const std::string& k = entry.keys[i];
    const Json* v = &entry.values[i];
    if (k == "dtype") {
      dtype = v;
    } else if (k == "shape") {
      shape = v;
    } else if (k == "data_offsets") {
      offsets = v;
    } else {
      return malformed(absl::StrCat("unknown field \"", k, "\""));
    }
  }
  if (dtype == nullptr || dtype->kind != Json::kString) {
    return malformed("missing or non-string \"dtype\"");
  }
  if (shape == nullptr || shape->kind != Json::kArray) {
    return malformed("missing or non-array \"shape\"");
  }
  if (offsets == nullptr || offsets->kind != Json::kArray ||
      offsets->values.size() != 2 || offsets->values[0].kind != Json::kInt ||
      offsets->values[1].kind != Json::kInt) {
    return malformed("\"data_offsets\" is not [begin,end]");
  }
  Entry e{dtype->str, {}, offsets->values[0].num, offsets->values[1].num};
  for (const Json& d : shape->values) {
    if (d.kind != Json::kInt) return malformed("\"shape\" holds a non-integer");
    e.shape.push_back(d.num);
  }
  return e;
}

absl::StatusOr<Range> CheckTensorEntry(const TensorInfo& t, const Json& json,
                                       uint64_t data_size) {
  const auto malformed = [&t](absl::string_view what) {
    return absl::DataLossError(absl::StrCat("tensor \"", t.name, "\": ", what));
  };
  ASSIGN_OR_RETURN(const Entry entry, ParseEntry(t.name, json));
  const std::vector<uint64_t>& dims = entry.shape;
  if (entry.dtype != "F32") {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor \"", t.name, "\" has dtype ", entry.dtype, ", expected F32"));
  }
  const std::vector<uint64_t> want(t.shape.begin(), t.shape.end());
  if (dims != want) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor \"", t.name, "\" has shape ", ShapeString(dims),
                     ", expected ", ShapeString(want)));
  }
  const uint64_t begin = entry.begin;
  const uint64_t end = entry.end;
  const uint64_t want_bytes = static_cast<uint64_t>(t.size) * sizeof(float);
  if (end < begin || end - begin != want_bytes) {
    return malformed(absl::StrCat("data_offsets [", begin, ",", end,
                                  "] do not span ", want_bytes, " bytes"));
  }
  if (end > data_size) {
    return malformed(absl::StrCat("data_offsets [", begin, ",", end,
                                  "] extend past the ", data_size,
                                  "-byte data buffer"));
  }
  return Range{begin, end, &t.name};
}

}  // namespace

std::string EncodeSafetensors(
    const ModelLayout& layout, absl::Span<const float> params,
    const std::map<std::string, std::string>& metadata) {
  DP_CHECK(static_cast<int64_t>(params.size()) == layout.num_params());
  // Key order as the reference writer: "__metadata__" first, then tensors.
  std::string header = "{";
  if (!metadata.empty()) {
    header += "\"__metadata__\":{";
    bool first = true;
    for (const auto& [key, value] : metadata) {
      if (!first) header += ',';
      first = false;
      AppendJsonString(key, &header);
      header += ':';
      AppendJsonString(value, &header);
    }
    header += '}';
  }
  uint64_t offset = 0;
  for (const TensorInfo& t : layout.tensors()) {
    if (header.size() > 1) header += ',';
    AppendJsonString(t.name, &header);
    const uint64_t bytes = static_cast<uint64_t>(t.size) * sizeof(float);
    absl::StrAppend(&header, ":{\"dtype\":\"F32\",\"shape\":[",
                    absl::StrJoin(t.shape, ","), "],\"data_offsets\":[", offset,
                    ",", offset + bytes, "]}");
    offset += bytes;
  }
  header += '}';
  // 8 + header.size() is then a multiple of 8, so the data is aligned.
  header.append((8 - header.size() % 8) % 8, ' ');

  std::string out;
  out.reserve(8 + header.size() + offset);
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>(n >> (8 * i)));
  out += header;
  for (const TensorInfo& t : layout.tensors()) {
    out.append(reinterpret_cast<const char*>(params.data() + t.offset),
               static_cast<size_t>(t.size) * sizeof(float));
  }
  return out;
}

namespace {

// The header of a file image as JSON (an object), and the data after it.
absl::StatusOr<Json> ParseHeader(absl::string_view bytes,
                                 absl::string_view* data) {
  if (bytes.size() < 8) {
    return absl::DataLossError(
        absl::StrCat("truncated: ", bytes.size(),
                     " bytes, less than the 8-byte header length"));
  }
  uint64_t n = 0;
  for (size_t i = 0; i < 8; ++i) {
    n |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[i])) << (8 * i);
  }
  if (n > kMaxHeaderBytes) {
    return absl::DataLossError(absl::StrCat(
        "header length ", n, " exceeds the limit of ", kMaxHeaderBytes));
  }
  if (n > bytes.size() - 8) {
    return absl::DataLossError(absl::StrCat("truncated: header length ", n,
                                            " but only ", bytes.size() - 8,
                                            " bytes follow the length field"));
  }
  *data = bytes.substr(8 + n);
  ASSIGN_OR_RETURN(Json root, JsonParser(bytes.substr(8, n)).ParseDocument());
  if (root.kind != Json::kObject) {
    return absl::DataLossError("header is not a JSON object");
  }
  return root;
}

}  // namespace

absl::StatusOr<ModelLayout> SafetensorsModel(absl::string_view bytes) {
  absl::string_view data;
  ASSIGN_OR_RETURN(const Json root, ParseHeader(bytes, &data));
  std::vector<std::pair<uint64_t, TensorInfo>> by_offset;
  for (size_t i = 0; i < root.keys.size(); ++i) {
    const std::string& name = root.keys[i];
    if (name == "__metadata__") continue;  // DecodeSafetensors checks it
    ASSIGN_OR_RETURN(const Entry e, ParseEntry(name, root.values[i]));
    if (e.dtype != "F32") {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor \"", name, "\" has dtype ", e.dtype,
                       ": dp-ps trains float32 (F32) tensors only"));
    }
    TensorInfo t{name, {}};
    for (uint64_t d : e.shape) {
      if (d > static_cast<uint64_t>(kMaxModelParams)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "tensor \"", name, "\" has a dimension of ", d, ", too large"));
      }
      t.shape.push_back(static_cast<int64_t>(d));
    }
    by_offset.push_back({e.begin, std::move(t)});
  }
  // The data's order is the file's own (dp-ps writes a model in its order;
  // safetensors.torch.save_file sorts by dtype, then name), unlike the
  // header's, which JSON writers are free to reorder.
  std::stable_sort(by_offset.begin(), by_offset.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<TensorInfo> tensors;
  for (auto& [offset, t] : by_offset) tensors.push_back(std::move(t));
  if (std::optional<std::vector<int>> dims = MlpDimsOfTensors(tensors)) {
    return ModelLayout::Mlp(*std::move(dims));
  }
  return ModelLayout::FromTensors(std::move(tensors));
}

absl::StatusOr<ModelLayout> LoadSafetensorsModel(const std::string& path) {
  ASSIGN_OR_RETURN(const std::string bytes, ReadFile(path));
  absl::StatusOr<ModelLayout> layout = SafetensorsModel(bytes);
  if (!layout.ok()) {
    return absl::Status(layout.status().code(),
                        absl::StrCat(path, ": ", layout.status().message()));
  }
  return layout;
}

absl::StatusOr<std::vector<float>> DecodeSafetensors(const ModelLayout& layout,
                                                     absl::string_view bytes) {
  absl::string_view data;
  ASSIGN_OR_RETURN(const Json root, ParseHeader(bytes, &data));

  const std::vector<TensorInfo>& tensors = layout.tensors();
  std::vector<bool> present(tensors.size(), false);
  std::vector<Range> ranges;
  std::vector<float> params(static_cast<size_t>(layout.num_params()));
  for (size_t i = 0; i < root.keys.size(); ++i) {
    const std::string& name = root.keys[i];
    const Json& entry = root.values[i];
    if (name == "__metadata__") {
      bool ok = entry.kind == Json::kObject;
      for (const Json& v : entry.values) ok = ok && v.kind == Json::kString;
      if (!ok) {
        return absl::DataLossError(
            "\"__metadata__\" is not an object of strings");
      }
      continue;
    }
    const auto it =
        std::find_if(tensors.begin(), tensors.end(),
                     [&name](const TensorInfo& t) { return t.name == name; });
    if (it == tensors.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("unexpected tensor \"", name, "\" not in the model"));
    }
    // The parser rejects duplicate keys, so each tensor is seen at most once.
    present[static_cast<size_t>(it - tensors.begin())] = true;
    ASSIGN_OR_RETURN(const Range r, CheckTensorEntry(*it, entry, data.size()));
    std::memcpy(params.data() + it->offset, data.data() + r.begin,
                r.end - r.begin);
    ranges.push_back(r);
  }
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (!present[i]) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor \"", tensors[i].name, "\" is missing"));
    }
  }
  std::sort(ranges.begin(), ranges.end(),
            [](const Range& a, const Range& b) { return a.begin < b.begin; });
  for (size_t i = 1; i < ranges.size(); ++i) {
    if (ranges[i].begin < ranges[i - 1].end) {
      return absl::DataLossError(
          absl::StrCat("tensors \"", *ranges[i - 1].name, "\" and \"",
                       *ranges[i].name, "\" have overlapping data_offsets"));
    }
  }
  return params;
}

absl::Status SaveSafetensors(const std::string& path, const ModelLayout& layout,
                             absl::Span<const float> params) {
  // WriteFileAtomic's errors already name the path.
  return WriteFileAtomic(path, EncodeSafetensors(layout, params));
}

absl::StatusOr<std::vector<float>> LoadSafetensors(const std::string& path,
                                                   const ModelLayout& layout) {
  ASSIGN_OR_RETURN(const std::string bytes, ReadFile(path));
  absl::StatusOr<std::vector<float>> params = DecodeSafetensors(layout, bytes);
  if (!params.ok()) {
    return absl::Status(params.status().code(),
                        absl::StrCat(path, ": ", params.status().message()));
  }
  return params;
}

}  // namespace dp
