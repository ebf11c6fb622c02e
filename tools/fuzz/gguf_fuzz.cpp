// libFuzzer target for the GGUF reader (model/gguf.cpp) and the tensor dequantiser.
// Built and run by scripts/fuzz-gguf.sh. Properties checked beyond "no crash, no sanitizer
// report": a failure carries a message; every tensor's data lies inside the input; a parsed
// tensor of a supported type dequantises without error.
#include <cstdint>
#include <cstdlib>
#include <utility>

#include "model/dequant.h"
#include "model/gguf.h"

namespace {

// NOTE: __builtin_trap rather than SPECSERVE_CHECK: libFuzzer reports it as a crash with the
// input saved, and the fuzz build has no logging.
void require(bool cond) {
  if (!cond) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace specserve;
  auto parsed = GgufFile::from_memory(data, size, "fuzz.gguf");
  if (!parsed.ok()) {
    require(!parsed.status().message().empty());
    return 0;
  }
  GgufFile f = std::move(*parsed);  // exercise the move
  volatile uint64_t sink = 0;
  for (const auto& [key, value] : f.metadata()) {
    require(f.find(key) == &value);
    sink = sink + value.array_size;
    (void)f.get_int(key);
    (void)f.get_float(key);
    (void)f.get_bool(key);
    (void)f.get_string(key);
    (void)f.get_string_array(key);
    (void)f.get_float_array(key);
    (void)f.get_int_array(key);
    (void)f.get_int_or(key, 0);
    (void)f.get_float_or(key, 0.0);
  }
  for (const GgufTensorInfo& t : f.tensors()) {
    require(f.find_tensor(t.name) == &t);
    require(t.num_elements > 0 && !t.shape.empty());
    require(t.data >= data && t.num_bytes <= size && t.data - data <= static_cast<ptrdiff_t>(size - t.num_bytes));
    if (t.num_bytes > 0) sink = sink + t.data[0] + t.data[t.num_bytes - 1];
    if (t.num_elements <= (int64_t(1) << 16) && dequant_supported(t.type())) {
      auto values = dequantize_tensor(t);
      require(values.ok());
      require(values->size() == static_cast<size_t>(t.num_elements));
    }
  }
  return 0;
}
