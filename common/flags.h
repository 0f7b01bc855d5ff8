// Command-line flags with an environment fallback, as docs/command-line.md
// specifies:
// `--name=value` or `--name value` on the command line; otherwise DP_<NAME>
// (upper case) from the environment, or extra environment names given per
// flag (e.g. RANK, JOB_COMPLETION_INDEX); flags win over the environment.
// Booleans also take `--name` and `--noname`.
#ifndef DP_COMMON_FLAGS_H_
#define DP_COMMON_FLAGS_H_

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace dp {

// Process exit codes shared by dp-ps and dp-worker (docs/command-line.md).
// Each outcome that a Kubernetes Job should treat differently has its own
// (deploy/k8s: podFailurePolicy).
inline constexpr int kExitOk = 0;           // training finished
inline constexpr int kExitFailure = 1;      // runtime failure
inline constexpr int kExitConfigError = 2;  // bad flags or configuration
inline constexpr int kExitInterrupted =
    3;  // stopped by a signal before the end
// dp-worker: no dp-ps answered for --retry_for_s (an outage of dp-ps, not
// the worker's fault; a TLS mismatch looks the same from here).
inline constexpr int kExitPsUnreachable = 4;
// dp-worker: this node cannot run the chosen backend (no CUDA driver, one
// too old, no GPU visible, no kernel image for its GPU); another node may.
inline constexpr int kExitCannotRunHere = 5;

inline constexpr int64_t kNoUpperBound = std::numeric_limits<int64_t>::max();

class Flags {
  struct Flag;

 public:
  Flags(std::string program, std::string summary);

  // What Add* return: the flag just added, to state the values it takes
  // beside its definition. Validate checks them, in the order the flags
  // were added. Use it at once: a later Add* may move the flag.
  class Checks {
   public:
    explicit Checks(Flag* flag) : flag_(flag) {}
    // An integer flag: "--name must be in lo..hi (note), got v", or
    // "must be >= lo" when hi is kNoUpperBound (CheckRanges).
    Checks& InRange(int64_t lo, int64_t hi, const char* note = nullptr);
    Checks& AtLeast(int64_t lo) { return InRange(lo, kNoUpperBound); }
    // A floating-point flag: finite and > bound (Above) or >= bound
    // (NotBelow): "--name must be a number > bound, got v" (CheckBounds).
    Checks& Above(double bound);
    Checks& NotBelow(double bound);
    // An upper bound of a floating-point flag, < bound (Below) or <= bound
    // (NotAbove): "--name must be a number < bound, got v".
    Checks& Below(double bound);
    Checks& NotAbove(double bound);
    // A string flag: one of `choices` (CheckChoice).
    Checks& OneOf(std::initializer_list<absl::string_view> choices);
    // Any other check of the flag's value: OK, or INVALID_ARGUMENT naming
    // the flag.
    Checks& Satisfies(std::function<absl::Status()> check);

   private:
    Flag* flag_;
  };

  Checks AddString(const char* name, std::string* value, const char* help,
                   std::vector<std::string> extra_env = {});
  Checks AddInt(const char* name, int64_t* value, const char* help,
                std::vector<std::string> extra_env = {});
  Checks AddInt(const char* name, int* value, const char* help,
                std::vector<std::string> extra_env = {});
  Checks AddDouble(const char* name, double* value, const char* help);
  Checks AddBool(const char* name, bool* value, const char* help);

  // The first flag, in the order they were added, whose value fails the
  // checks given with it: INVALID_ARGUMENT naming it; or OK.
  [[nodiscard]] absl::Status Validate() const;

  enum class Action { kRun, kExit };
  // Applies the environment, then argv. Returns kExit after printing --help
  // or --version to stdout; INVALID_ARGUMENT naming the flag and the value
  // for unknown flags, malformed values or positional arguments.
  absl::StatusOr<Action> Parse(int argc, char** argv);

  // "--a=1 --b=x ..." with every flag's effective value, for the start log.
  std::string Effective() const;
  // The same, one "--name=value" per line (the --dry_run output).
  std::string EffectiveLines() const;
  // Environment variables named DP_<SOMETHING> that match no flag: typos,
  // or variables meant for the other program, which are otherwise ignored.
  std::vector<std::string> UnknownEnvironment() const;
  std::string Usage() const;

 private:
  // A flag of value type T (std::string, int64_t, int, double or bool) reads
  // and prints its value through the functions of T that Add picks.
  struct Flag {
    std::string name;
    void* value;
    bool is_bool;           // takes --name and --noname without a value
    const char* type_name;  // "an integer": what a malformed value should be
    bool (*parse)(const std::string& text, void* value);
    std::string (*print)(const void* value);
    int64_t (*integer)(const void* value);  // integer flags only
    double (*real)(const void* value);      // floating-point flags only
    std::string help;
    std::vector<std::string> env;  // looked up in this order
    std::string default_text;
    std::vector<std::function<absl::Status()>> checks;  // Validate's
  };
  template <typename T>
  Checks Add(const char* name, T* value, const char* help,
             std::vector<std::string> extra_env);
  absl::Status Set(const Flag& flag, const std::string& text,
                   const std::string& source);
  std::string ValueText(const Flag& flag) const;
  Flag* Find(const std::string& name);

  std::string program_;
  std::string summary_;
  std::vector<Flag> flags_;
};

// The end of every program's flag setup: adds --dry_run (into *dry_run),
// parses argv, and returns the exit code main must return at once - kExitOk
// after --help or --version, kExitConfigError (printed) for a bad flag - or
// nullopt to go on.
std::optional<int> ParseCommandLine(Flags* flags, bool* dry_run, int argc,
                                    char** argv);

// The end of a --dry_run, after the program validated its configuration:
// kExitConfigError naming every unknown DP_* variable, otherwise prints the
// effective configuration (EffectiveLines) on stdout and returns kExitOk.
int FinishDryRun(const Flags& flags);

// Logs a warning naming each unknown DP_* variable (a normal run still
// starts: a shell may export variables meant for the other program).
void WarnUnknownEnvironment(const Flags& flags);

// The checks of a program's flag values, written as tables: each returns
// INVALID_ARGUMENT naming the first flag out of bounds, its bounds and its
// value, or OK.

// An integer flag and the range it must lie in.
struct IntRange {
  const char* flag;  // without the dashes
  int64_t value;
  int64_t lo;
  int64_t hi;  // kNoUpperBound: at least lo
  // After the range in the message, e.g. "--workers" gives
  // "must be in 1..4 (--workers)".
  const char* note = nullptr;
};
// "--flag must be in lo..hi (note), got v", or "must be >= lo, got v".
absl::Status CheckRanges(std::initializer_list<IntRange> rows);

// A floating-point flag and the bound it must be above (finite, too).
struct RealBound {
  const char* flag;
  double value;
  double bound;
  bool or_equal = false;  // >= bound rather than > bound
  bool upper = false;     // below the bound: < (or <=) rather than > (>=)
};
// "--flag must be a number > b, got v" (or >=, <, <= b).
absl::Status CheckBounds(std::initializer_list<RealBound> rows);

// "--flag must be a, b or c, got 'v'" unless value is one of `choices`.
absl::Status CheckChoice(const char* flag, absl::string_view value,
                         std::initializer_list<absl::string_view> choices);

}  // namespace dp

#endif  // DP_COMMON_FLAGS_H_
