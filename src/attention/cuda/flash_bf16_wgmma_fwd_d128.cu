// wgmma forward kernels of every compiled tile for head dim 128 (one file per head dim and
// direction, so that the instantiations compile in parallel).
#include "attention/cuda/flash_wgmma.cuh"

namespace ft::attention::cuda {

void add_wgmma_forward_d128(Bf16Kernels& k) {
  add_wgmma_forward_kernels<128>(k);
}

}  // namespace ft::attention::cuda
