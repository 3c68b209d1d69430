// The torch unit tests' common headers, compiled once for the one binary they share (see
// tests/torch/meson.build): libtorch's <torch/torch.h> and GoogleTest.

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <braid/collectives/communicator.hpp>
