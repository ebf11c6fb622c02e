// specserve tools: `specserve dump-hidden`: the files it writes — NumPy .npy v1.0 (write, and read
// back for the tests and tools) and IEEE half <-> float (see dump_hidden_lib.h).
#include "tools/cli/dump_hidden_lib.h"

#include <cstdint>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace specserve::cli {
namespace {

std::string npy_header(const std::string& descr, const std::vector<int64_t>& shape) {
  std::string sh = "(";
  for (size_t i = 0; i < shape.size(); ++i) sh += (i ? ", " : "") + std::to_string(shape[i]);
  sh += shape.size() == 1 ? ",)" : ")";
  std::string h = "{'descr': '" + descr + "', 'fortran_order': False, 'shape': " + sh + ", }";
  // Magic (6) + version (2) + length (2) + header, padded with spaces to a multiple of 64, ending in '\n'.
  const size_t total = 10 + h.size() + 1;
  h.append((64 - total % 64) % 64, ' ');
  h += '\n';
  return h;
}

}  // namespace

uint16_t float_to_half(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t exp = (x >> 23) & 0xffu;
  uint32_t mant = x & 0x7fffffu;
  if (exp == 0xff) return static_cast<uint16_t>(sign | 0x7c00u | (mant ? 0x200u : 0));  // inf / nan
  int32_t e = static_cast<int32_t>(exp) - 127 + 15;
  if (e >= 31) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow -> inf
  if (e <= 0) {
    if (e < -10) return static_cast<uint16_t>(sign);  // underflow -> 0
    mant |= 0x800000u;                                 // subnormal: implicit bit made explicit
    const uint32_t shift = static_cast<uint32_t>(14 - e);
    uint32_t h = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (h & 1u))) ++h;
    return static_cast<uint16_t>(sign | h);
  }
  uint32_t h = (static_cast<uint32_t>(e) << 10) | (mant >> 13);
  const uint32_t rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;  // carry may round up into the exponent: correct
  return static_cast<uint16_t>(sign | h);
}

float half_to_float(uint16_t h) {
  const uint32_t sign = (h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu, x;
  if (exp == 0) {
    if (mant == 0) {
      x = sign;
    } else {
      exp = 127 - 15 + 1;
      while (!(mant & 0x400u)) {
        mant <<= 1;
        --exp;
      }
      x = sign | (exp << 23) | ((mant & 0x3ffu) << 13);
    }
  } else if (exp == 31) {
    x = sign | 0x7f800000u | (mant << 13);
  } else {
    x = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

Status write_npy(const std::string& path, const std::string& descr, const std::vector<int64_t>& shape, const void* data,
                 size_t num_bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) return internal_error("cannot write " + path);
  const std::string h = npy_header(descr, shape);
  const uint16_t len = static_cast<uint16_t>(h.size());
  f.write("\x93NUMPY\x01\x00", 8);
  const char lb[2] = {static_cast<char>(len & 0xff), static_cast<char>(len >> 8)};
  f.write(lb, 2);
  f.write(h.data(), static_cast<std::streamsize>(h.size()));
  f.write(static_cast<const char*>(data), static_cast<std::streamsize>(num_bytes));
  if (!f) return internal_error("short write to " + path);
  return Status();
}

Status read_npy(const std::string& path, std::string* descr, std::vector<int64_t>* shape, std::vector<uint8_t>* bytes) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return not_found("cannot open " + path);
  char magic[8];
  f.read(magic, 8);
  if (!f || std::memcmp(magic, "\x93NUMPY", 6) != 0) return corrupt_data(path + ": not a .npy file");
  uint32_t hlen = 0;
  if (magic[6] == 1) {
    unsigned char b[2];
    f.read(reinterpret_cast<char*>(b), 2);
    hlen = b[0] | (b[1] << 8);
  } else {
    unsigned char b[4];
    f.read(reinterpret_cast<char*>(b), 4);
    hlen = b[0] | (b[1] << 8) | (b[2] << 16) | (static_cast<uint32_t>(b[3]) << 24);
  }
  std::string h(hlen, '\0');
  f.read(h.data(), hlen);
  if (!f) return corrupt_data(path + ": truncated header");
  const auto d0 = h.find("'descr': '");
  const auto s0 = h.find("'shape': (");
  if (d0 == std::string::npos || s0 == std::string::npos || h.find("'fortran_order': False") == std::string::npos)
    return corrupt_data(path + ": unsupported header " + h);
  *descr = h.substr(d0 + 10, h.find('\'', d0 + 10) - (d0 + 10));
  shape->clear();
  std::string dims = h.substr(s0 + 10, h.find(')', s0) - (s0 + 10));
  std::stringstream ss(dims);
  std::string tok;
  int64_t n = 1;
  while (std::getline(ss, tok, ',')) {
    if (tok.find_first_not_of(' ') == std::string::npos) continue;
    shape->push_back(std::stoll(tok));
    n *= shape->back();
  }
  const size_t elem = (*descr == "<f2") ? 2 : (*descr == "<f4" || *descr == "<i4") ? 4 : 0;
  if (elem == 0) return corrupt_data(path + ": unsupported dtype " + *descr);
  bytes->resize(static_cast<size_t>(n) * elem);
  f.read(reinterpret_cast<char*>(bytes->data()), static_cast<std::streamsize>(bytes->size()));
  if (!f) return corrupt_data(path + ": data shorter than its shape");
  return Status();
}

}  // namespace specserve::cli
