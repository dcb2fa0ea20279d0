// TMA backward kernels of every compiled plan (tma_plans.h) for head dim 256 (one file per head
// dim, so that the instantiations compile in parallel).
#include "attention/cuda/flash_tma_backward.cuh"

namespace ft::attention::cuda {

void add_tma_backward_d256(Bf16Kernels& k) {
  add_tma_backward_kernels<256>(k);
}

}  // namespace ft::attention::cuda
