// run_self(): fork, then exec this program's own executable with its stdout on a pipe.
#include "run_self.hpp"

#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

extern char** environ;

namespace streamalloc::bench {

ChildOutput run_self(const std::vector<std::string>& args, const std::string& variable, const std::string& value) {
  const char* held = std::getenv(variable.c_str());
  const std::string setting = held != nullptr && held[0] != '\0' ? std::string(held) + "," + value : value;

  // The child's environment is built here: between fork and exec a multi-threaded process (the CUDA
  // runtime starts threads) may only make async-signal-safe calls, and setenv allocates.
  std::vector<std::string> env_text;
  for (char** entry = environ; *entry != nullptr; ++entry) {
    if (std::strncmp(*entry, variable.c_str(), variable.size()) == 0 && (*entry)[variable.size()] == '=') continue;
    env_text.emplace_back(*entry);
  }
  env_text.push_back(variable + "=" + setting);
  std::vector<char*> envp;
  for (std::string& entry : env_text) envp.push_back(entry.data());
  envp.push_back(nullptr);

  std::vector<std::string> argv_text = {"/proc/self/exe"};
  argv_text.insert(argv_text.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& arg : argv_text) argv.push_back(arg.data());
  argv.push_back(nullptr);

  int pipe_ends[2];
  if (pipe(pipe_ends) != 0) throw std::runtime_error(std::string("run_self: pipe: ") + std::strerror(errno));
  std::fflush(nullptr);  // what this process buffered must not be written twice
  const pid_t pid = fork();
  if (pid < 0) {
    close(pipe_ends[0]);
    close(pipe_ends[1]);
    throw std::runtime_error(std::string("run_self: fork: ") + std::strerror(errno));
  }
  if (pid == 0) {
    // In the child: async-signal-safe calls only, and no return into the caller.
    dup2(pipe_ends[1], STDOUT_FILENO);
    close(pipe_ends[0]);
    close(pipe_ends[1]);
    execve("/proc/self/exe", argv.data(), envp.data());
    _exit(kExecFailed);
  }
  close(pipe_ends[1]);
  ChildOutput out;
  char buffer[4096];
  for (;;) {
    const ssize_t n = read(pipe_ends[0], buffer, sizeof buffer);
    if (n > 0) {
      out.stdout_text.append(buffer, static_cast<std::size_t>(n));
    } else if (n == 0 || errno != EINTR) {
      break;
    }
  }
  close(pipe_ends[0]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) throw std::runtime_error(std::string("run_self: waitpid: ") + std::strerror(errno));
  }
  out.exit_status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return out;
}

}  // namespace streamalloc::bench
