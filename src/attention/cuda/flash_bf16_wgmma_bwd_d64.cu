// wgmma backward kernels of every compiled tile for head dim 64 (one file per head dim and
// direction, so that the instantiations compile in parallel).
#include "attention/cuda/flash_wgmma.cuh"

namespace ft::attention::cuda {

void add_wgmma_backward_d64(Bf16Kernels& k) {
  add_wgmma_backward_kernels<64>(k);
}

}  // namespace ft::attention::cuda
