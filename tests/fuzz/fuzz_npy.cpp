// .npy files (core/npy.h), as `flashtrain attention`, debug-step and the token readers read them:
// npy::load either throws ft::Error or returns a tensor, which saves and loads back to the same
// bytes; npy::load_ids either throws ft::Error or returns int32 ids of the file's shape, the same
// bits as npy::load for an int32 file.
// Seeds: arrays of every supported dtype, versions 1 and 2, 0-d and empty shapes, int64 ids in
// and out of int32's range.
#include <cstring>

#include "core/npy.h"
#include "fuzz_util.h"

namespace {

bool same(const ft::Tensor& a, const ft::Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() &&
         std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = ft::fuzz::write_input(data, size, "input.npy");
  ft::Tensor ids;
  bool have_ids = true;
  try {
    ids = ft::npy::load_ids(path);
  } catch (const ft::Error&) {
    have_ids = false;
  }
  if (have_ids && ids.dtype() != ft::DType::i32) std::abort();

  ft::Tensor t;
  try {
    t = ft::npy::load(path);
  } catch (const ft::Error&) {
    return 0;
  }
  if (t.dtype() == ft::DType::i32 && (!have_ids || !same(ids, t))) std::abort();
  const std::string again = (ft::fuzz::scratch_dir() / "again.npy").string();
  ft::npy::save(again, t);
  if (!same(ft::npy::load(again), t)) std::abort();
  return 0;
}
