// A real compute kernel for GPU tests, without nvcc: a PTX kernel that spins for a given
// number of GPU clock cycles, JIT-compiled by the driver and launched through the CUDA
// driver API. The driver (libcuda.so.1) is opened with dlopen, so test binaries still
// start on machines without one, where GPU tests skip.
#pragma once

#include <cstdint>
#include <dlfcn.h>
#include <stdexcept>
#include <string>

#include <cuda.h>
#include <cuda_runtime_api.h>

namespace braid::testing {

class SpinKernel {
 public:
  // Loads the kernel into the current device's primary context (call cudaSetDevice and
  // touch the runtime first, as creating a stream does).
  SpinKernel() {
    driver_ = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (driver_ == nullptr) throw std::runtime_error("no CUDA driver (libcuda.so.1)");
    load_module_ = symbol<LoadData>("cuModuleLoadData");
    get_function_ = symbol<GetFunction>("cuModuleGetFunction");
    launch_ = symbol<Launch>("cuLaunchKernel");
    check(load_module_(&module_, kPtx), "cuModuleLoadData");
    check(get_function_(&function_, module_, "spin"), "cuModuleGetFunction");
  }
  SpinKernel(const SpinKernel&) = delete;
  SpinKernel& operator=(const SpinKernel&) = delete;

  // Enqueues one thread that spins for `cycles` GPU clock cycles (about 1.5-2 per ns).
  void launch(cudaStream_t stream, std::uint64_t cycles) {
    void* arguments[] = {&cycles};
    check(launch_(function_, 1, 1, 1, 1, 1, 1, 0, reinterpret_cast<CUstream>(stream), arguments,
                  nullptr),
          "cuLaunchKernel");
  }

 private:
  using LoadData = CUresult (*)(CUmodule*, const void*);
  using GetFunction = CUresult (*)(CUfunction*, CUmodule, const char*);
  using Launch = CUresult (*)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                              unsigned, unsigned, CUstream, void**, void**);

  template <class F>
  F symbol(const char* name) {
    void* found = ::dlsym(driver_, name);
    if (found == nullptr) throw std::runtime_error(std::string("libcuda has no ") + name);
    return reinterpret_cast<F>(found);
  }
  static void check(CUresult result, const char* call) {
    if (result != CUDA_SUCCESS) {
      throw std::runtime_error(std::string(call) + " failed with CUresult " +
                               std::to_string(result));
    }
  }

  static constexpr const char* kPtx = R"(
.version 8.0
.target sm_80
.address_size 64
.visible .entry spin(.param .u64 cycles)
{
  .reg .pred %p;
  .reg .b64 %limit, %start, %now, %elapsed;
  ld.param.u64 %limit, [cycles];
  mov.u64 %start, %clock64;
LOOP:
  mov.u64 %now, %clock64;
  sub.u64 %elapsed, %now, %start;
  setp.lt.u64 %p, %elapsed, %limit;
  @%p bra LOOP;
  ret;
}
)";

  void* driver_ = nullptr;
  LoadData load_module_ = nullptr;
  GetFunction get_function_ = nullptr;
  Launch launch_ = nullptr;
  CUmodule module_ = nullptr;
  CUfunction function_ = nullptr;
};

}  // namespace braid::testing
