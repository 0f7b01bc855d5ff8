// dp-worker: parses and checks flags (worker/worker_flags.h), runs a Worker
// (worker/worker.h) until the job ends, forwards SIGTERM/SIGINT to it, and
// turns the result into the exit code.
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>

#include "absl/strings/str_format.h"
#include "absl/synchronization/notification.h"
#include "common/flags.h"
#include "common/job_failure.h"
#include "common/log.h"
#include "common/malloc_tuning.h"
#include "proto/grpc_server.h"
#include "proto/security.h"
#include "worker/exit_code.h"
#include "worker/worker.h"
#include "worker/worker_flags.h"

namespace dp {
namespace {

// SIGTERM/SIGINT: the handler only writes the signal number to a pipe that
// a watcher thread reads. (sigwait would not do: OpenBLAS starts its threads
// before main, with the signals unblocked.)
int stop_pipe[2] = {-1, -1};
void OnStopSignal(int sig) {
  const char byte = static_cast<char>(sig);
  [[maybe_unused]] ssize_t n = write(stop_pipe[1], &byte, 1);
}

// Parses and checks the command line into *o and *stop_timeout_s; the exit
// code main must return at once (help, version, dry run, a bad flag), or
// nullopt to go on.
std::optional<int> Configure(int argc, char** argv, WorkerOptions* o,
                             int* stop_timeout_s) {
  WorkerFlags f;
  Flags flags("dp-worker",
              "Worker of a dp-ps job: computes gradients on its data shard.");
  AddWorkerFlags(&flags, &f);
  if (std::optional<int> exit =
          ParseCommandLine(&flags, &f.dry_run, argc, argv)) {
    return *exit;
  }
  SetLogTag(f.rank >= 0 ? absl::StrFormat("worker %d", f.rank)
                        : absl::StrFormat("worker %d", getpid()));
  absl::StatusOr<WorkerOptions> options = WorkerOptionsFromFlags(flags, f);
  if (!options.ok()) {
    Log("configuration error: %s", options.status().message());
    return kExitConfigError;
  }
  if (f.dry_run) return FinishDryRun(flags);
  WarnUnknownEnvironment(flags);
  auto security = LoadClientSecurity(f.security);
  if (!security.ok()) {
    Log("configuration error: %s", security.status().message());
    return kExitConfigError;
  }
  Log("dp-worker %s starting: %s", DP_VERSION, flags.Effective());
  Log("security: %s", security->Describe());
  *o = *std::move(options);
  o->client.credentials = security->credentials;
  o->client.tls_server_name = security->server_name;
  o->client.auth_token = security->auth_token;
  *stop_timeout_s = f.stop_timeout_s;
  return std::nullopt;
}

// SIGTERM and SIGINT into stop_pipe; false (logged) if there is no pipe.
bool CatchStopSignals() {
  if (pipe(stop_pipe) != 0) {
    Log("error: pipe: %s", std::strerror(errno));
    return false;
  }
  struct sigaction on_stop = {};
  on_stop.sa_handler = OnStopSignal;
  on_stop.sa_flags = SA_RESTART;
  sigemptyset(&on_stop.sa_mask);
  sigaction(SIGTERM, &on_stop, nullptr);
  sigaction(SIGINT, &on_stop, nullptr);
  return true;
}

// Runs the worker to its end while a watcher thread turns a stop signal
// into Stop() (and into an exit once stop_timeout_s pass); its exit code.
int RunToTheEnd(Worker* w, int stop_timeout_s) {
  // Joined before the worker goes, so it never outlives what it uses; a
  // byte 0 on the pipe tells it to return. (A signal that came earlier
  // waits in the pipe.)
  absl::Notification finished;
  std::thread watcher([w, &finished, stop_timeout_s] {
    char sig = 0;
    while (read(stop_pipe[0], &sig, 1) < 0 && errno == EINTR) {
    }
    if (sig == 0) return;
    Log("signal %d: stopping after the current step", sig);
    w->Stop();
    if (!finished.WaitForNotificationWithTimeout(
            absl::Seconds(stop_timeout_s))) {
      Log("the current step did not end within %d s; exiting", stop_timeout_s);
      std::_Exit(kExitInterrupted);
    }
  });
  const absl::Status s = w->Run();
  finished.Notify();
  const char exit_watcher = 0;
  [[maybe_unused]] ssize_t n = write(stop_pipe[1], &exit_watcher, 1);
  watcher.join();
  const int code = WorkerExitCode(s, w->stopped());
  if (code == kExitInterrupted) {
    if (s.code() != absl::StatusCode::kCancelled)
      Log("stopped: %s", s.ToString());
  } else if (IsJobFailed(s)) {
    Log("%s", s.message());  // "the job failed: <dp-ps's reason>"
  } else if (!s.ok()) {
    Log("error: %s (exit %d)", s.ToString(), code);
  }
  return code;
}

int Run(int argc, char** argv) {
  WorkerOptions o;
  int stop_timeout_s = 0;
  if (std::optional<int> exit = Configure(argc, argv, &o, &stop_timeout_s)) {
    return *exit;
  }
  if (!CatchStopSignals()) return kExitFailure;
  absl::StatusOr<std::unique_ptr<Worker>> worker = Worker::Start(o);
  if (!worker.ok()) {
    const int code = WorkerExitCode(worker.status(), /*stopped=*/false);
    Log("%s: %s",
        code == kExitConfigError     ? "configuration error"
        : code == kExitCannotRunHere ? "cannot run on this node"
                                     : "error",
        worker.status().message());
    return code;
  }
  return RunToTheEnd(worker->get(), stop_timeout_s);
}

}  // namespace
}  // namespace dp

int main(int argc, char** argv) {
  dp::KeepLargeBuffersInHeap();
  dp::KeepGrpcForTheProcess();
  return dp::Run(argc, argv);
}
