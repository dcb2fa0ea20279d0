// Kernel-config files (attention/kernel_config_file.h), as `train --kernel-config` reads them:
// read_kernel_config_file either throws ft::Error or returns rows whose configurations print and
// parse back to themselves, no two of them for the same architecture, bound and mask class, and
// each found by the lookup at its own bound.
// Seeds: a file as `sweep --emit-kernel-config` writes it, a hand-written one, an empty one, and
// refused forms (a newer version, a duplicate row).
#include <cstdlib>
#include <string>

#include "attention/kernel_config_file.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ft::attention;
  const std::string path = ft::fuzz::write_input(data, size, "kernel_config.json");
  KernelConfigFile file;
  try {
    file = read_kernel_config_file(path);
  } catch (const ft::Error&) {
    return 0;
  }
  for (const KernelConfigRow& row : file.rows) {
    if (KernelConfig::parse(row.config.str()) != row.config) std::abort();
    if (file.find(row.arch, row.max_head_dim, row.mask_class) != &row) std::abort();
  }
  return 0;
}
