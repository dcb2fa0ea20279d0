// llm.c tokenizer files (train/tokenizer.h), as sampling and --doc-mask read them: the header,
// then every token's bytes.
// Seeds: version 1 and 2 files of a few tokens.
#include "fuzz_util.h"
#include "train/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = ft::fuzz::write_input(data, size, "tokenizer.bin");
  try {
    const ft::train::Tokenizer tokenizer(path);
    for (int id = 0; id < tokenizer.vocab_size() && id < 64; ++id) tokenizer.decode(id);
    tokenizer.decode(tokenizer.eot_token());
  } catch (const ft::Error&) {
  }
  return 0;
}
