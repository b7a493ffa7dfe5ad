// encode(): the driver's cuTensorMapEncodeTiled, looked up through the runtime (no -lcuda), for
// the standalone micro programs that build TMA tensor maps (sm90_probe.cu, tma_stream.cu).
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>

#include "cuda_check.h"

static PFN_cuTensorMapEncodeTiled_v12000 encode() {
  void* ptr = nullptr;
  cudaDriverEntryPointQueryResult status;
  CK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &ptr, 12000, cudaEnableDefault, &status));
  if (status != cudaDriverEntryPointSuccess || ptr == nullptr) std::exit(2);
  return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(ptr);
}
