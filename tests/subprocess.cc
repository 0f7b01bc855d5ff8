// Process spawning for integration tests.
#include "tests/subprocess.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "absl/time/clock.h"

extern char** environ;

namespace dp {

Subprocess::Subprocess(std::vector<std::string> argv,
                       std::vector<std::string> env) {
  int pipe_fds[2];
  if (pipe(pipe_fds) != 0) std::abort();
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, pipe_fds[1], STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, pipe_fds[1], STDERR_FILENO);
  posix_spawn_file_actions_addclose(&actions, pipe_fds[0]);
  std::vector<char*> args;
  for (auto& a : argv) args.push_back(a.data());
  args.push_back(nullptr);
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) env_strings.push_back(*e);
  for (auto& e : env) env_strings.push_back(e);
  std::vector<char*> envp;
  for (auto& e : env_strings) envp.push_back(e.data());
  envp.push_back(nullptr);
  if (posix_spawn(&pid_, args[0], &actions, nullptr, args.data(),
                  envp.data()) != 0) {
    pid_ = -1;
    exit_code_ = 127;
  }
  posix_spawn_file_actions_destroy(&actions);
  close(pipe_fds[1]);
  const int fd = pipe_fds[0];
  reader_ = std::thread([this, fd] {
    char buf[4096];
    for (;;) {
      const ssize_t n = read(fd, buf, sizeof(buf));
      if (n < 0 && errno == EINTR) continue;
      absl::MutexLock lock(&mu_);
      if (n <= 0) {
        closed_ = true;
        break;
      }
      output_.append(buf, n);
    }
    close(fd);
  });
}

Subprocess::~Subprocess() {
  if (!exit_code_.has_value() && pid_ > 0) {
    kill(pid_, SIGKILL);
    int status;
    waitpid(pid_, &status, 0);
  }
  if (reader_.joinable()) reader_.join();
}

std::optional<int> Subprocess::Wait(absl::Duration timeout) {
  if (exit_code_.has_value()) return exit_code_;
  // The reader sees end-of-file when the process (and any child holding the
  // pipe) exits; then waitpid does not block.
  {
    absl::MutexLock lock(&mu_);
    auto closed = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return closed_; };
    if (!mu_.AwaitWithTimeout(absl::Condition(&closed), timeout)) {
      return std::nullopt;
    }
  }
  int status = 0;
  if (waitpid(pid_, &status, 0) != pid_) return std::nullopt;
  exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status)
                                 : 128 + WTERMSIG(status);
  return exit_code_;
}

bool Subprocess::WaitForOutput(const std::string& text,
                               absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto ready = [this, &text]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return closed_ || output_.find(text) != std::string::npos;
  };
  mu_.AwaitWithTimeout(absl::Condition(&ready), timeout);
  return output_.find(text) != std::string::npos;
}

std::optional<std::string> Subprocess::Field(const std::string& prefix) const {
  absl::MutexLock lock(&mu_);
  const size_t at = output_.find(prefix);
  if (at == std::string::npos) return std::nullopt;
  const size_t begin = at + prefix.size();
  const size_t end = output_.find('\n', begin);
  if (end == std::string::npos) return std::nullopt;
  return output_.substr(begin, end - begin);
}

void Subprocess::Signal(int sig) {
  if (pid_ > 0 && !exit_code_.has_value()) kill(pid_, sig);
}

std::string Subprocess::output() const {
  absl::MutexLock lock(&mu_);
  return output_;
}

TempDir::TempDir() {
  const char* base = std::getenv("TMPDIR");
  std::string pattern = std::string(base ? base : "/tmp") + "/dp-test-XXXXXX";
  if (mkdtemp(pattern.data()) == nullptr) std::abort();
  path_ = pattern;
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

}  // namespace dp
