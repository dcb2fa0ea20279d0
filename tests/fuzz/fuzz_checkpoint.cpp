// llm.c model checkpoints (models/checkpoint.h), GPT-2 and LLaMA-3 headers: the header alone,
// then what `train --load` and debug-step do with it, building the model the header describes
// and loading the weights. A header may only ask for as much memory as the file backs.
// Seeds: fp32 and bf16 checkpoints of a 1-layer GPT-2 and LLaMA-3 (save_checkpoint).
#include "fuzz_util.h"
#include "models/checkpoint.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = ft::fuzz::write_input(data, size, "model.bin");
  try {
    const ft::models::ModelConfig config = ft::models::read_checkpoint_config(path);
    ft::models::Transformer model(config, ft::DType::f32, {});
    ft::models::load_checkpoint(path, model);
  } catch (const ft::Error&) {
  }
  return 0;
}
