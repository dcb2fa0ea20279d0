// .npy reading and writing. Layout: "\x93NUMPY", major and minor version bytes, the header
// length (uint16 in version 1, uint32 in 2 and 3), an ASCII Python dict literal
// {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), } padded with spaces and a newline
// so that the data starts on a 64-byte boundary, then the raw array in C order.
#include "core/npy.h"

#include "core/atomic_file.h"

#include <cctype>
#include <charconv>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <vector>

namespace ft::npy {
namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicSize = 6;

struct Header {
  std::string descr;
  bool fortran_order = false;
  Shape shape;
};

DType dtype_from_descr(const std::string& descr, const std::string& path) {
  if (descr == "<f4") return DType::f32;
  if (descr == "<u2") return DType::bf16;
  if (descr == "<i4") return DType::i32;
  if (descr == "<f8") return DType::f64;
  throw Error(str(path, ": unsupported .npy dtype '", descr,
                  "' (supported: '<f4' float32, '<u2' uint16 holding bf16, '<i4' int32, "
                  "'<f8' float64)"));
}

const char* descr_from_dtype(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return "<f4";
    case DType::bf16:
      return "<u2";
    case DType::i32:
      return "<i4";
    case DType::i16:
      return "<i2";
    case DType::f64:
      return "<f8";
  }
  return "?";
}

// The text after "'key':" in the header dict, with leading spaces skipped.
std::string value_after(const std::string& dict, const std::string& key, const std::string& path) {
  const size_t at = dict.find("'" + key + "'");
  FT_CHECK(at != std::string::npos, path, ": .npy header has no '", key, "' entry: ", dict);
  size_t pos = dict.find(':', at);
  FT_CHECK(pos != std::string::npos, path, ": malformed .npy header: ", dict);
  ++pos;
  while (pos < dict.size() && dict[pos] == ' ') ++pos;
  return dict.substr(pos);
}

Shape parse_shape(const std::string& text, const std::string& path) {
  FT_CHECK(!text.empty() && text[0] == '(', path, ": malformed .npy shape: ", text);
  const size_t close = text.find(')');
  FT_CHECK(close != std::string::npos, path, ": malformed .npy shape: ", text);
  Shape shape;
  size_t pos = 1;
  while (pos < close) {
    while (pos < close && (text[pos] == ' ' || text[pos] == ',')) ++pos;
    if (pos >= close) break;
    FT_CHECK(std::isdigit(static_cast<unsigned char>(text[pos])), path,
             ": malformed .npy shape: ", text.substr(0, close + 1));
    int64_t dim = 0;
    const char* begin = text.data() + pos;
    const auto [end, ec] = std::from_chars(begin, text.data() + close, dim);
    FT_CHECK(ec == std::errc(), path, ": .npy shape ", text.substr(0, close + 1),
             " has a dimension out of range (at most ", std::numeric_limits<int64_t>::max(), ")");
    shape.push_back(dim);
    pos += static_cast<size_t>(end - begin);
  }
  return shape;
}

Header parse_header(const std::string& dict, const std::string& path) {
  Header h;
  const std::string descr = value_after(dict, "descr", path);
  FT_CHECK(descr.size() >= 2 && descr[0] == '\'', path, ": malformed .npy descr: ", dict);
  h.descr = descr.substr(1, descr.find('\'', 1) - 1);
  const std::string fortran = value_after(dict, "fortran_order", path);
  FT_CHECK(fortran.rfind("False", 0) == 0 || fortran.rfind("True", 0) == 0, path,
           ": malformed .npy fortran_order: ", dict);
  h.fortran_order = fortran.rfind("True", 0) == 0;
  h.shape = parse_shape(value_after(dict, "shape", path), path);
  return h;
}

uint32_t read_header_length(std::ifstream& in, int major, const std::string& path) {
  unsigned char bytes[4] = {0, 0, 0, 0};
  const int width = major == 1 ? 2 : 4;
  in.read(reinterpret_cast<char*>(bytes), width);
  FT_CHECK(in.gcount() == width, path, ": truncated .npy file (no header length)");
  uint32_t length = 0;
  for (int i = width - 1; i >= 0; --i) length = (length << 8) | bytes[i];
  return length;
}

}  // namespace

namespace {

// A .npy file opened and its header read: the stream is left at the first data byte, and
// `held` is what the file holds after the header (checked sizes are compared with it before
// anything of that size is allocated).
struct OpenArray {
  std::ifstream in;
  Header header;
  int64_t held = 0;
};

OpenArray open_array(const std::string& path) {
  OpenArray a;
  std::error_code ec;
  const auto file_bytes = static_cast<int64_t>(std::filesystem::file_size(path, ec));
  a.in.open(path, std::ios::binary);
  std::ifstream& in = a.in;
  FT_CHECK(!ec && in.good(), path, ": cannot open .npy file");
  char magic[kMagicSize + 2] = {};
  in.read(magic, kMagicSize + 2);
  FT_CHECK(in.gcount() == static_cast<std::streamsize>(kMagicSize + 2) &&
               std::memcmp(magic, kMagic, kMagicSize) == 0,
           path, ": not a .npy file (bad magic string)");
  const int major = static_cast<unsigned char>(magic[kMagicSize]);
  FT_CHECK(major >= 1 && major <= 3, path, ": unsupported .npy format version ", major,
           " (supported: 1, 2, 3)");
  const uint32_t header_length = read_header_length(in, major, path);
  const int64_t preamble = static_cast<int64_t>(kMagicSize) + 2 + (major == 1 ? 2 : 4);
  FT_CHECK(header_length <= file_bytes - preamble, path, ": truncated .npy file (the header says ",
           header_length, " bytes, the file has ", file_bytes - preamble, " after the preamble)");
  std::string dict(header_length, '\0');
  in.read(dict.data(), header_length);
  FT_CHECK(in.gcount() == static_cast<std::streamsize>(header_length), path,
           ": truncated .npy file (header of ", header_length, " bytes is cut short)");
  a.header = parse_header(dict, path);
  FT_CHECK(!a.header.fortran_order, path,
           ": Fortran-order arrays are not supported; save a C-order array "
           "(numpy.ascontiguousarray)");
  a.held = file_bytes - preamble - header_length;
  return a;
}

// Refuses a shape whose `element_bytes`-sized elements the file does not hold.
void check_held(const OpenArray& a, int64_t element_bytes, const std::string& path) {
  int64_t data_bytes = element_bytes;
  for (int64_t d : a.header.shape) {
    if (d != 0 && data_bytes > std::numeric_limits<int64_t>::max() / d) {
      data_bytes = -1;
      break;
    }
    data_bytes *= d;
  }
  FT_CHECK(data_bytes >= 0 && data_bytes <= a.held, path, ": truncated .npy file: shape ",
           shape_str(a.header.shape), " needs ",
           data_bytes >= 0 ? std::to_string(data_bytes) : std::string("more than 2^63"),
           " data bytes, found ", a.held);
}

Tensor read_tensor(OpenArray& a, DType dtype, const std::string& path) {
  check_held(a, static_cast<int64_t>(dtype_size(dtype)), path);
  Tensor t = Tensor::empty(a.header.shape, dtype);
  a.in.read(static_cast<char*>(t.raw()), static_cast<std::streamsize>(t.nbytes()));
  FT_CHECK(a.in.gcount() == static_cast<std::streamsize>(t.nbytes()), path,
           ": truncated .npy file: shape ", shape_str(a.header.shape), " needs ", t.nbytes(),
           " data bytes, found ", a.in.gcount());
  return t;
}

}  // namespace

Tensor load(const std::string& path) {
  OpenArray a = open_array(path);
  return read_tensor(a, dtype_from_descr(a.header.descr, path), path);
}

Tensor load_ids(const std::string& path) {
  OpenArray a = open_array(path);
  if (a.header.descr == "<i4") return read_tensor(a, DType::i32, path);
  FT_CHECK(a.header.descr == "<i8", path,
           ": token ids must be integers ('<i4' int32 or '<i8' int64), got .npy dtype '",
           a.header.descr, "'");
  check_held(a, 8, path);
  const int64_t n = shape_numel(a.header.shape);
  std::vector<int64_t> wide(static_cast<size_t>(n));
  a.in.read(reinterpret_cast<char*>(wide.data()), static_cast<std::streamsize>(n * 8));
  FT_CHECK(a.in.good() || n == 0, path, ": read failed");
  Tensor t = Tensor::empty(a.header.shape, DType::i32);
  int32_t* out = t.data<int32_t>();
  for (int64_t i = 0; i < n; ++i) {
    const int64_t v = wide[static_cast<size_t>(i)];
    FT_CHECK(v >= std::numeric_limits<int32_t>::min() && v <= std::numeric_limits<int32_t>::max(),
             path, ": id ", v, " at index ", i, " does not fit in int32");
    out[i] = static_cast<int32_t>(v);
  }
  return t;
}

namespace {

std::string header_text(const Tensor& tensor) {
  std::string shape = "(";
  for (size_t i = 0; i < tensor.shape().size(); ++i) {
    shape += std::to_string(tensor.shape()[i]) + (tensor.shape().size() == 1 ? "," : "");
    if (i + 1 < tensor.shape().size()) shape += ", ";
  }
  shape += ")";
  std::string dict = str("{'descr': '", descr_from_dtype(tensor.dtype()),
                         "', 'fortran_order': False, 'shape': ", shape, ", }");
  // Pad so that magic (6) + version (2) + length (2) + dict + '\n' is a multiple of 64.
  const size_t unpadded = kMagicSize + 2 + 2 + dict.size() + 1;
  dict.append((64 - unpadded % 64) % 64, ' ');
  dict += '\n';
  return dict;
}

}  // namespace

void save(const std::string& path, const Tensor& tensor) {
  FT_CHECK(tensor.defined(), path, ": cannot save an undefined tensor");
  FT_CHECK(tensor.device() == Device::cpu, path, ": .npy save needs a CPU tensor, got ",
           device_name(tensor.device()));
  const std::string dict = header_text(tensor);
  FT_CHECK(dict.size() <= 65535, path, ": .npy header too long for format 1.0");
  AtomicFile out(path);
  out.write(kMagic, kMagicSize);
  const char version[2] = {1, 0};
  out.write(version, 2);
  const unsigned char length[2] = {static_cast<unsigned char>(dict.size() & 0xff),
                                   static_cast<unsigned char>(dict.size() >> 8)};
  out.write(length, 2);
  out.write(dict.data(), dict.size());
  out.write(tensor.raw(), tensor.nbytes());
  out.commit();
}

}  // namespace ft::npy
