// specserve gpu: cuBLAS entry points, opened with dlopen (internal to gpu/).
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <string>

namespace specserve {

// NOTE: cuBLAS is opened with dlopen when the first CudaBackend is made, not linked: loading
// libcublas + libcublasLt costs ~0.25 s at every process start (measured here), which every
// `specserve` run and test process would pay on a CUDA build even on the CPU.
struct CublasApi {
  cublasStatus_t (*create)(cublasHandle_t*) = nullptr;
  cublasStatus_t (*destroy)(cublasHandle_t) = nullptr;
  cublasStatus_t (*set_stream)(cublasHandle_t, cudaStream_t) = nullptr;
  cublasStatus_t (*set_math_mode)(cublasHandle_t, cublasMath_t) = nullptr;
  cublasStatus_t (*set_workspace)(cublasHandle_t, void*, size_t) = nullptr;
  cublasStatus_t (*gemm_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void*,
                            const void*, cudaDataType, int, const void*, cudaDataType, int, const void*, void*,
                            cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t) = nullptr;
  std::string error;  // why it could not be loaded; empty when loaded
};

/// The entry points, loaded once (SPECSERVE_CUBLAS_PATH, then libcublas.so.13 by name); `error`
/// says why they are not.
const CublasApi& cublas_api();

}  // namespace specserve
