// .npy files (core/npy.h), as `flashtrain attention` and debug-step read them: npy::load either
// throws ft::Error or returns a tensor, which saves and loads back to the same bytes.
// Seeds: arrays of every supported dtype, versions 1 and 2, 0-d and empty shapes.
#include <cstring>

#include "core/npy.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = ft::fuzz::write_input(data, size, "input.npy");
  ft::Tensor t;
  try {
    t = ft::npy::load(path);
  } catch (const ft::Error&) {
    return 0;
  }
  const std::string again = (ft::fuzz::scratch_dir() / "again.npy").string();
  ft::npy::save(again, t);
  const ft::Tensor back = ft::npy::load(again);
  if (back.shape() != t.shape() || back.dtype() != t.dtype() ||
      std::memcmp(back.raw(), t.raw(), t.nbytes()) != 0) {
    std::abort();
  }
  return 0;
}
