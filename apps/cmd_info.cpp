// `flashtrain info`: what this build runs on (processor, OpenBLAS core type, OpenMP threads,
// CUDA), so that a test log or a bug report says which CPU kernels produced its numbers.
#include <cstdio>

#include "commands.h"
#include "core/blas.h"
#include "core/device.h"

namespace ft::cli {

void add_info_command(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand(
      "info",
      "Print the processor, the OpenBLAS core type (OPENBLAS_CORETYPE forces one), the "
      "OpenMP threads and the CUDA devices this build uses");
  cmd->callback([]() {
    std::printf("processor: %s\n", cpu_model_name().c_str());
    std::printf("openblas:  core %s (%s)\n", cpu::blas_core_name().c_str(),
                cpu::blas_config().c_str());
    std::printf("openmp:    %d threads\n", cpu::num_threads());
    const int gpus = cuda_device_count();
    if (!cuda_training_supported()) {
      std::printf("cuda:      not built\n");
    } else if (gpus == 0) {
      std::printf("cuda:      no GPU (%s)\n", cuda_unavailable_reason().c_str());
    }
    for (int d = 0; d < gpus; ++d) {
      std::printf("cuda:      GPU %d %s (sm%d)\n", d, cuda_device_name(d).c_str(),
                  cuda_compute_capability(d));
    }
  });
}

}  // namespace ft::cli
