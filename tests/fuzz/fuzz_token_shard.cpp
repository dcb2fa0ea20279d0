// llm.c token shards (train/data_loader.h): the header check, the loader's batches (in order
// and shuffled), the vocabulary check and a restore of the loader's position.
// Seeds: uint16 and uint32 shards of a few tokens (write_token_shard).
#include "fuzz_util.h"
#include "train/data_loader.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = ft::fuzz::write_input(data, size, "input.bin");
  try {
    ft::train::read_shard_header(path);
    for (const bool shuffle : {false, true}) {
      ft::train::DataLoader loader(path, 2, 3, shuffle, 7);
      ft::Tensor x, y;
      for (int i = 0; i < 5; ++i) loader.next_batch(x, y);
      ft::train::LoaderState s = loader.state();
      loader.restore(s);
      loader.next_batch(x, y);
      loader.check_vocab(50257);
    }
  } catch (const ft::Error&) {
  }
  return 0;
}
