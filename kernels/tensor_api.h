// The few pieces of ATen the kernels use: the Tensor class, the empty / zeros factories and
// parallel_for. Not <ATen/ATen.h>, which declares every operator: on a 2-core EPYC its headers
// were 17 s of the kernel's 28 s build, these and pybind 12 s (2026-12-07), a build every cold
// cache (make install, the README's first command) pays.
#pragma once

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>
