#include "gpu/cublas_api.h"

#include <dlfcn.h>

#include <type_traits>

namespace specserve {

const CublasApi& cublas_api() {
  static const CublasApi api = [] {
    CublasApi a;
    void* lib = nullptr;
    std::string tried;
    for (const char* name : {SPECSERVE_CUBLAS_PATH, "libcublas.so.13", "libcublas.so"}) {
      lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
      if (lib) break;
      const char* e = dlerror();
      tried += std::string(tried.empty() ? "" : "; ") + (e ? e : name);
    }
    if (!lib) {
      a.error = "cannot load cuBLAS: " + tried;
      return a;
    }
    auto sym = [&](const char* name, auto* fn) {
      *fn = reinterpret_cast<std::remove_pointer_t<decltype(fn)>>(dlsym(lib, name));
      if (!*fn && a.error.empty()) a.error = std::string("cuBLAS lacks ") + name;
    };
    sym("cublasCreate_v2", &a.create);
    sym("cublasDestroy_v2", &a.destroy);
    sym("cublasSetStream_v2", &a.set_stream);
    sym("cublasSetMathMode", &a.set_math_mode);
    sym("cublasGemmEx", &a.gemm_ex);
    sym("cublasSetWorkspace_v2", &a.set_workspace);
    return a;
  }();
  return api;
}

}  // namespace specserve
