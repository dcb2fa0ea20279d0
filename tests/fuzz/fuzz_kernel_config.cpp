// Kernel-configuration strings (attention/kernel_config.h), as --config and the default table
// give them: KernelConfig::parse either throws ft::Error or returns a configuration whose
// str() parses back to itself.
// Seeds: the documented forms (forward only, backward only, both, each path).
#include <cstdlib>
#include <string>

#include "attention/kernel_config.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  ft::attention::KernelConfig c;
  try {
    c = ft::attention::KernelConfig::parse(text);
  } catch (const ft::Error&) {
    return 0;
  }
  if (ft::attention::KernelConfig::parse(c.str()).str() != c.str()) std::abort();
  return 0;
}
