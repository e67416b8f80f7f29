// expect_backend_error: the check the backend tests share, that a call fails with a backend error
// naming what went wrong.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "streamalloc/types.hpp"

namespace streamalloc::testing {

// Runs `fn`, expecting Error(kBackend) whose message contains every one of `fragments`.
template <typename Fn>
void expect_backend_error(Fn fn, const std::vector<std::string>& fragments) {
  try {
    fn();
    ADD_FAILURE() << "expected streamalloc::Error(kBackend)";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kBackend) << e.what();
    for (const std::string& fragment : fragments) {
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos)
          << "message \"" << e.what() << "\" lacks \"" << fragment << "\"";
    }
  }
}

}  // namespace streamalloc::testing
