// Real processes for integration tests: spawn with arguments and extra
// environment, capture stdout+stderr, wait for a line of output or for exit
// with a deadline, send signals.
#ifndef DP_TESTS_SUBPROCESS_H_
#define DP_TESTS_SUBPROCESS_H_

#include <sys/types.h>

#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace dp {

class Subprocess {
 public:
  // argv[0] is the program path. env entries are "NAME=value", added to the
  // current environment.
  Subprocess(std::vector<std::string> argv, std::vector<std::string> env = {});
  ~Subprocess();  // kills the process (SIGKILL) if it still runs

  Subprocess(const Subprocess&) = delete;
  Subprocess& operator=(const Subprocess&) = delete;

  // Exit code (or 128 + signal) once the process ends, nullopt on timeout.
  std::optional<int> Wait(absl::Duration timeout);
  // Blocks until the output contains `text` (returns true), the process
  // closes its output, or the timeout passes.
  bool WaitForOutput(const std::string& text, absl::Duration timeout);
  // The text following the first occurrence of `prefix` up to the end of
  // that line, once it has appeared.
  std::optional<std::string> Field(const std::string& prefix) const;
  void Signal(int sig);
  std::string output() const;
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
  std::optional<int> exit_code_;
  std::thread reader_;
  mutable absl::Mutex mu_;
  std::string output_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
};

// A fresh empty directory under TMPDIR, removed by the destructor.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::string& path() const { return path_; }
  std::string File(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

}  // namespace dp

#endif  // DP_TESTS_SUBPROCESS_H_
