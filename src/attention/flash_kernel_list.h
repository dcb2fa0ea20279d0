// The one list of compiled CUDA flash kernel tiles. X(block_m, block_n, threads) per tile.
//
// mma.sync kernels (flash_bf16.cuh, sm80 and newer): every tile is compiled for each head dim of
// FT_FLASH_HEAD_DIMS, and each backward tile for both of its paths (single, double). The
// default build compiles the tiles of the default-config table (kernel_config.cpp);
// -DFLASHTRAIN_SWEEP_KERNELS=ON compiles the tile sweep's candidates that have a valid warp
// layout (the others are refused by can_implement before any lookup).
//
// wgmma kernels (flash_wgmma.cuh, sm_90a only): one warpgroup (128 threads) per 64 query rows
// forward and per 64 keys backward; head dims of FT_FLASH_WGMMA_HEAD_DIMS.
#pragma once

// clang-format off
#define FT_FLASH_HEAD_DIMS(X) X(32) X(64) X(128)
#define FT_FLASH_WGMMA_HEAD_DIMS(X) X(64) X(128)

#define FT_FLASH_FORWARD_DEFAULT_TILES(X) X(128, 64, 128) X(64, 64, 128)
#define FT_FLASH_BACKWARD_DEFAULT_TILES(X) X(64, 128, 256) X(64, 64, 128)
#define FT_FLASH_WGMMA_FORWARD_DEFAULT_TILES(X) X(128, 128, 256) X(64, 128, 128) X(64, 64, 128)
#define FT_FLASH_WGMMA_BACKWARD_DEFAULT_TILES(X) X(64, 128, 256) X(64, 64, 128)

#define FT_FLASH_FORWARD_SWEEP_TILES(X) \
  X(64, 64, 128) X(64, 128, 128)        \
  X(128, 32, 128) X(128, 64, 128) X(128, 64, 256) X(128, 128, 256) \
  X(192, 64, 192) X(256, 64, 256)
#define FT_FLASH_BACKWARD_SWEEP_TILES(X) \
  X(64, 64, 128) X(64, 128, 128) X(64, 128, 256) \
  X(128, 64, 128) X(128, 128, 128) X(128, 128, 256) \
  X(192, 64, 128) X(256, 64, 128)
#define FT_FLASH_WGMMA_FORWARD_SWEEP_TILES(X) X(64, 64, 128) X(64, 128, 128) X(128, 128, 256)
#define FT_FLASH_WGMMA_BACKWARD_SWEEP_TILES(X) X(64, 64, 128) X(64, 128, 256)
// clang-format on

#ifdef FLASHTRAIN_SWEEP_KERNELS
#define FT_FLASH_FORWARD_TILES(X) FT_FLASH_FORWARD_SWEEP_TILES(X)
#define FT_FLASH_BACKWARD_TILES(X) FT_FLASH_BACKWARD_SWEEP_TILES(X)
#define FT_FLASH_WGMMA_FORWARD_TILES(X) FT_FLASH_WGMMA_FORWARD_SWEEP_TILES(X)
#define FT_FLASH_WGMMA_BACKWARD_TILES(X) FT_FLASH_WGMMA_BACKWARD_SWEEP_TILES(X)
#else
#define FT_FLASH_FORWARD_TILES(X) FT_FLASH_FORWARD_DEFAULT_TILES(X)
#define FT_FLASH_BACKWARD_TILES(X) FT_FLASH_BACKWARD_DEFAULT_TILES(X)
#define FT_FLASH_WGMMA_FORWARD_TILES(X) FT_FLASH_WGMMA_FORWARD_DEFAULT_TILES(X)
#define FT_FLASH_WGMMA_BACKWARD_TILES(X) FT_FLASH_WGMMA_BACKWARD_DEFAULT_TILES(X)
#endif
