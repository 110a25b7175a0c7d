// Argument checks whose messages carry numbers: the message is formatted here and raised as one
// C string. TORCH_CHECK with several arguments formats them through an ostringstream compiled
// into the extension, and on the GPU box (its own torch 2.11 and compiler) every such failed
// check crashed the process, where checks with a plain string raised RuntimeError (2026-12-07).
#pragma once
#include <c10/util/Exception.h>
#include <cstdio>

#define KERNEL_CHECK(cond, ...)                                   \
  do {                                                            \
    if (!(cond)) {                                                \
      char kernel_check_message[256];                             \
      std::snprintf(kernel_check_message, sizeof(kernel_check_message), __VA_ARGS__); \
      TORCH_CHECK(false, static_cast<const char*>(kernel_check_message)); \
    }                                                             \
  } while (0)
