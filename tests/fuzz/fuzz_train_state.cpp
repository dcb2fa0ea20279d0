// The resume state (train/train_state.h) as `train --resume` reads it: the header, then the
// weights and moments into a fixed small model.
// Seeds: a state of that model written by save_train_state (format 2), and regression inputs.
#include "fuzz_util.h"
#include "models/config.h"
#include "train/train_state.h"

namespace {

ft::models::Transformer& model() {
  static ft::models::Transformer m = [] {
    ft::models::ModelOverrides o;
    o.layers = 1;
    o.width = 8;
    o.heads = 2;
    o.vocab = 2;
    o.context = 2;
    return ft::models::Transformer(ft::models::apply_overrides(ft::models::preset("gpt2-tiny"), o),
                                   ft::DType::f32, {});
  }();
  return m;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = ft::fuzz::write_input(data, size, "ckpt.state");
  try {
    ft::train::read_train_state(path);
    ft::train::load_train_state(path, model());
  } catch (const ft::Error&) {
  }
  return 0;
}
