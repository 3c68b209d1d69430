// Viewing libtorch tensors as braid Buffers, so a tensor can be sent, received or reduced
// in place. Built only when braid is built with libtorch (BRAID_WITH_TORCH).
//
//   at::Tensor grad = ...;
//   co_await world.send(peer, braid::torch::as_buffer(grad), tag);
//
// The Buffer aliases the tensor's storage: keep the tensor alive, and do not resize it,
// until every operation using the Buffer has completed.
#pragma once

#include <optional>

#include <c10/core/ScalarType.h>

#include <braid/core/buffer.hpp>
#include <braid/core/dtype.hpp>

namespace at {
class Tensor;
}  // namespace at

namespace braid::torch {

// The braid DType of a libtorch scalar type; nullopt for types braid does not move
// (bool, complex, quantised, int8, int16).
std::optional<DType> dtype_of(c10::ScalarType type) noexcept;
c10::ScalarType scalar_type_of(DType dtype) noexcept;

// A Buffer over all of `tensor`'s elements. Throws braid::Error(Errc::invalid_argument)
// for a tensor that is not contiguous, not on the CPU or a CUDA device, or of a type
// braid does not move; the message names the tensor's shape, strides, type and device.
Buffer as_buffer(const at::Tensor& tensor);

}  // namespace braid::torch
