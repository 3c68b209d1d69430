// A libtorch user's program, built against an installed braid through pkg-config
// braid-torch alone: it must find braid's, libtorch's and the adapter's headers and libraries.
#include <iostream>

#include <ATen/ATen.h>

#include <braid/torch/tensor_buffer.hpp>

int main() {
  const at::Tensor tensor = at::arange(6, at::kFloat);
  const braid::Buffer buffer = braid::torch::as_buffer(tensor);
  std::cout << "torch consumer: " << buffer.count() << " " << braid::to_string(buffer.dtype())
            << "\n";
  return buffer.count() == 6 && buffer.data() == tensor.data_ptr() ? 0 : 1;
}
