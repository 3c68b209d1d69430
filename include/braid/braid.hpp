// The one header users include.
#pragma once

#include <braid/build_config.hpp>
#include <braid/core/buffer.hpp>
#include <braid/core/config.hpp>
#include <braid/core/deadline.hpp>
#include <braid/core/dtype.hpp>
#include <braid/core/enforce.hpp>
#include <braid/core/error.hpp>
#include <braid/core/future.hpp>
#include <braid/core/log.hpp>
#include <braid/core/reduce_op.hpp>
#include <braid/core/runtime.hpp>
