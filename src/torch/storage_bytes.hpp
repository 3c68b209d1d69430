// A tensor's storage bytes released and allocated again in place: the storage object stays
// (views of it, autograd's saved tensors among them, and an optimizer's state keyed by the
// tensor keep pointing at it) and sees new bytes when they come back. What FSDP's gathered
// units and ZeRO-1's slice use to hold memory only while it is needed. Reading a released
// tensor is undefined: its owner allocates before any use.
#pragma once

#include <cstddef>

#include <torch/types.h>

namespace braid::torch::detail {

inline void release_bytes(const at::Tensor& tensor) {
  c10::StorageImpl* storage = tensor.storage().unsafeGetStorageImpl();
  storage->set_data_ptr_noswap(at::DataPtr(nullptr, tensor.device()));
  storage->set_nbytes(0);
}

inline void allocate_bytes(const at::Tensor& tensor) {
  c10::StorageImpl* storage = tensor.storage().unsafeGetStorageImpl();
  const std::size_t bytes = static_cast<std::size_t>(tensor.numel()) * tensor.element_size();
  if (storage->nbytes() == bytes) return;
  storage->set_data_ptr_noswap(storage->allocator()->allocate(bytes));
  storage->set_nbytes(bytes);
}

}  // namespace braid::torch::detail
