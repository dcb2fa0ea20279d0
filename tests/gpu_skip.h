// SKIP_WITHOUT_GPU(): the first line of a test that needs a GPU. It skips, saying why, when the
// build has no CUDA or the machine no usable GPU (CI), so the suite stays green there and the
// same binary runs the test on the GPU machine.
#pragma once

#include <gtest/gtest.h>

#include "core/device.h"

#ifdef FLASHTRAIN_WITH_CUDA
#define SKIP_WITHOUT_GPU() \
  if (::ft::cuda_device_count() == 0) GTEST_SKIP() << ::ft::cuda_unavailable_reason()
#else
#define SKIP_WITHOUT_GPU() GTEST_SKIP() << "built without CUDA"
#endif
