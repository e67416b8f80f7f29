// run_self: run this program again in a child process with one more setting in its environment, for a
// peer that needs a process of its own (PeerKind::child).
#pragma once

#include <string>
#include <vector>

namespace streamalloc::bench {

// The exit status of a child that could not exec this program.
inline constexpr int kExecFailed = 127;

struct ChildOutput {
  int exit_status = -1;  // the child's exit status; -1 when a signal ended it
  std::string stdout_text;
};

// Runs this program's executable (/proc/self/exe) with `args` (argv[1]...) and `variable` set to
// `value`, what the variable holds already (if anything) followed by "," and `value`. The child's
// stderr is this process's; its stdout is returned. Throws std::runtime_error when the child cannot be
// started.
ChildOutput run_self(const std::vector<std::string>& args, const std::string& variable, const std::string& value);

}  // namespace streamalloc::bench
