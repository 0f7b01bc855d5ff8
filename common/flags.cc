// Flags with DP_<NAME> environment fallback.
#include "common/flags.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <type_traits>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/types/span.h"
#include "common/log.h"
#include "common/status_macros.h"

extern char** environ;

namespace dp {

Flags::Flags(std::string program, std::string summary)
    : program_(std::move(program)), summary_(std::move(summary)) {}

namespace {

// "--flag must be a, b or c, got 'v'".
absl::Status ChoiceError(const char* flag, absl::string_view value,
                         absl::Span<const absl::string_view> choices) {
  return absl::InvalidArgumentError(
      absl::StrFormat("--%s must be %s or %s, got '%s'", flag,
                      absl::StrJoin(choices.first(choices.size() - 1), ", "),
                      choices.back(), value));
}

template <typename T>
bool ParseValue(const std::string& text, void* value) {
  T* v = static_cast<T*>(value);
  if constexpr (std::is_same_v<T, std::string>) {
    *v = text;
    return true;
  } else if constexpr (std::is_same_v<T, bool>) {
    return absl::SimpleAtob(text, v);
  } else if constexpr (std::is_floating_point_v<T>) {
    return absl::SimpleAtod(text, v);
  } else {
    return absl::SimpleAtoi(text, v);
  }
}

template <typename T>
std::string PrintValue(const void* value) {
  const T& v = *static_cast<const T*>(value);
  if constexpr (std::is_same_v<T, bool>) {
    return v ? "true" : "false";
  } else {
    return absl::StrCat(v);
  }
}

template <typename T>
constexpr const char* TypeName() {
  if constexpr (std::is_same_v<T, std::string>) return "a string";
  if constexpr (std::is_same_v<T, bool>) return "true or false";
  if constexpr (std::is_floating_point_v<T>) return "a number";
  return "an integer";
}

}  // namespace

template <typename T>
Flags::Checks Flags::Add(const char* name, T* value, const char* help,
                         std::vector<std::string> extra_env) {
  Flag f{name,
         value,
         std::is_same_v<T, bool>,
         TypeName<T>(),
         &ParseValue<T>,
         &PrintValue<T>,
         nullptr,
         nullptr,
         help,
         {"DP_" + absl::AsciiStrToUpper(name)}};
  if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
    f.integer = [](const void* v) -> int64_t {
      return *static_cast<const T*>(v);
    };
  }
  if constexpr (std::is_floating_point_v<T>) {
    f.real = [](const void* v) -> double { return *static_cast<const T*>(v); };
  }
  for (auto& e : extra_env) f.env.push_back(std::move(e));
  f.default_text = ValueText(f);
  flags_.push_back(std::move(f));
  return Checks(&flags_.back());
}

Flags::Checks Flags::AddString(const char* name, std::string* value,
                               const char* help,
                               std::vector<std::string> extra_env) {
  return Add(name, value, help, std::move(extra_env));
}
Flags::Checks Flags::AddInt(const char* name, int64_t* value, const char* help,
                            std::vector<std::string> extra_env) {
  return Add(name, value, help, std::move(extra_env));
}
Flags::Checks Flags::AddInt(const char* name, int* value, const char* help,
                            std::vector<std::string> extra_env) {
  return Add(name, value, help, std::move(extra_env));
}
Flags::Checks Flags::AddDouble(const char* name, double* value,
                               const char* help) {
  return Add(name, value, help, {});
}
Flags::Checks Flags::AddBool(const char* name, bool* value, const char* help) {
  return Add(name, value, help, {});
}

Flags::Checks& Flags::Checks::InRange(int64_t lo, int64_t hi,
                                      const char* note) {
  Flag* f = flag_;
  return Satisfies(
      [name = f->name, get = f->integer, value = f->value, lo, hi, note] {
        return CheckRanges({{name.c_str(), get(value), lo, hi, note}});
      });
}

Flags::Checks& Flags::Checks::Above(double bound) {
  Flag* f = flag_;
  return Satisfies([name = f->name, get = f->real, value = f->value, bound] {
    return CheckBounds({{name.c_str(), get(value), bound}});
  });
}

Flags::Checks& Flags::Checks::NotBelow(double bound) {
  Flag* f = flag_;
  return Satisfies([name = f->name, get = f->real, value = f->value, bound] {
    return CheckBounds({{name.c_str(), get(value), bound, /*or_equal=*/true}});
  });
}

Flags::Checks& Flags::Checks::Below(double bound) {
  Flag* f = flag_;
  return Satisfies([name = f->name, get = f->real, value = f->value, bound] {
    return CheckBounds({{name.c_str(), get(value), bound, /*or_equal=*/false,
                         /*upper=*/true}});
  });
}

Flags::Checks& Flags::Checks::NotAbove(double bound) {
  Flag* f = flag_;
  return Satisfies([name = f->name, get = f->real, value = f->value, bound] {
    return CheckBounds({{name.c_str(), get(value), bound, /*or_equal=*/true,
                         /*upper=*/true}});
  });
}

Flags::Checks& Flags::Checks::OneOf(
    std::initializer_list<absl::string_view> choices) {
  Flag* f = flag_;
  return Satisfies([name = f->name, value = f->value,
                    options = std::vector<absl::string_view>(choices)] {
    const std::string& v = *static_cast<const std::string*>(value);
    for (absl::string_view c : options) {
      if (v == c) return absl::OkStatus();
    }
    return ChoiceError(name.c_str(), v, options);
  });
}

Flags::Checks& Flags::Checks::Satisfies(std::function<absl::Status()> check) {
  flag_->checks.push_back(std::move(check));
  return *this;
}

absl::Status Flags::Validate() const {
  for (const Flag& f : flags_) {
    for (const auto& check : f.checks) RETURN_IF_ERROR(check());
  }
  return absl::OkStatus();
}

Flags::Flag* Flags::Find(const std::string& name) {
  for (Flag& f : flags_) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

absl::Status Flags::Set(const Flag& flag, const std::string& text,
                        const std::string& source) {
  if (!flag.parse(text, flag.value)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: invalid value '%s' for %s (expected %s)", program_,
                        text, source, flag.type_name));
  }
  return absl::OkStatus();
}

std::string Flags::ValueText(const Flag& f) const { return f.print(f.value); }

absl::StatusOr<Flags::Action> Flags::Parse(int argc, char** argv) {
  // The environment first, so that flags parsed afterwards win.
  for (const Flag& f : flags_) {
    for (const std::string& var : f.env) {
      const char* v = std::getenv(var.c_str());
      if (v != nullptr && *v != '\0') {
        RETURN_IF_ERROR(Set(f, v, "environment variable " + var));
        break;
      }
    }
  }
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::fputs(Usage().c_str(), stdout);
      return Action::kExit;
    }
    if (arg == "--version") {
      std::printf("%s %s\n", program_.c_str(), DP_VERSION);
      return Action::kExit;
    }
    if (!absl::StartsWith(arg, "--")) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: unexpected argument '%s' (flags are --name=value; see --help)",
          program_, arg));
    }
    std::string body = arg.substr(2);
    std::string name = body, value;
    bool has_value = false;
    if (size_t eq = body.find('='); eq != std::string::npos) {
      name = body.substr(0, eq);
      value = body.substr(eq + 1);
      has_value = true;
    }
    Flag* f = Find(name);
    if (f == nullptr && !has_value && absl::StartsWith(name, "no")) {
      Flag* negated = Find(name.substr(2));
      if (negated != nullptr && negated->is_bool) {
        *static_cast<bool*>(negated->value) = false;
        continue;
      }
    }
    if (f == nullptr) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: unknown flag --%s (see --help)", program_, name));
    }
    if (!has_value) {
      if (f->is_bool) {
        value = "true";
      } else if (i + 1 < argc) {
        value = argv[++i];
      } else {
        return absl::InvalidArgumentError(
            absl::StrFormat("%s: flag --%s needs a value", program_, name));
      }
    }
    RETURN_IF_ERROR(Set(*f, value, "--" + name));
  }
  return Action::kRun;
}

std::string Flags::Effective() const {
  std::vector<std::string> parts;
  for (const Flag& f : flags_) {
    parts.push_back(absl::StrCat("--", f.name, "=", ValueText(f)));
  }
  return absl::StrJoin(parts, " ");
}

std::string Flags::EffectiveLines() const {
  std::string out;
  for (const Flag& f : flags_) {
    absl::StrAppend(&out, "--", f.name, "=", ValueText(f), "\n");
  }
  return out;
}

std::vector<std::string> Flags::UnknownEnvironment() const {
  std::vector<std::string> unknown;
  for (char** e = environ; *e != nullptr; ++e) {
    absl::string_view entry(*e);
    const absl::string_view name = entry.substr(0, entry.find('='));
    if (!absl::StartsWith(name, "DP_")) continue;
    bool known = false;
    for (const Flag& f : flags_) {
      if (f.env.front() == name) known = true;
    }
    if (!known) unknown.emplace_back(name);
  }
  return unknown;
}

std::string Flags::Usage() const {
  std::string out =
      absl::StrCat("Usage: ", program_, " [--flag=value ...]\n", summary_,
                   "\n\nFlags (environment DP_<FLAG> "
                   "is used when a flag is absent):\n");
  for (const Flag& f : flags_) {
    absl::StrAppend(&out, "  --", f.name, "  ", f.help, " (default: '",
                    f.default_text, "'");
    if (f.env.size() > 1) {
      absl::StrAppend(&out, "; env ", absl::StrJoin(f.env, ", "));
    }
    absl::StrAppend(&out, ")\n");
  }
  absl::StrAppend(&out, "  --help, --version\n");
  return out;
}

std::optional<int> ParseCommandLine(Flags* flags, bool* dry_run, int argc,
                                    char** argv) {
  flags->AddBool("dry_run", dry_run,
                 "validate the flags and DP_* environment, print the "
                 "effective configuration and exit");
  absl::StatusOr<Flags::Action> action = flags->Parse(argc, argv);
  if (!action.ok()) {
    std::fprintf(stderr, "%s\n",
                 std::string(action.status().message()).c_str());
    return kExitConfigError;
  }
  if (*action == Flags::Action::kExit) return kExitOk;
  return std::nullopt;
}

int FinishDryRun(const Flags& flags) {
  const std::vector<std::string> unknown = flags.UnknownEnvironment();
  if (!unknown.empty()) {
    Log("configuration error: no flag reads %s", absl::StrJoin(unknown, ", "));
    return kExitConfigError;
  }
  std::fputs(flags.EffectiveLines().c_str(), stdout);
  std::fflush(stdout);
  return kExitOk;
}

void WarnUnknownEnvironment(const Flags& flags) {
  for (const std::string& name : flags.UnknownEnvironment()) {
    Log("warning: environment variable %s matches no flag; ignored", name);
  }
}

absl::Status CheckRanges(std::initializer_list<IntRange> rows) {
  for (const IntRange& r : rows) {
    if (r.value >= r.lo && r.value <= r.hi) continue;
    const std::string range = r.hi == kNoUpperBound
                                  ? absl::StrCat(">= ", r.lo)
                                  : absl::StrCat("in ", r.lo, "..", r.hi);
    return absl::InvalidArgumentError(
        absl::StrCat("--", r.flag, " must be ", range,
                     r.note != nullptr ? absl::StrCat(" (", r.note, ")") : "",
                     ", got ", r.value));
  }
  return absl::OkStatus();
}

absl::Status CheckBounds(std::initializer_list<RealBound> rows) {
  for (const RealBound& r : rows) {
    // NaN fails both comparisons, and infinity is no setting.
    const bool within =
        r.upper ? (r.or_equal ? r.value <= r.bound : r.value < r.bound)
                : (r.or_equal ? r.value >= r.bound : r.value > r.bound);
    if (within && std::isfinite(r.value)) continue;
    const char* relation =
        r.upper ? (r.or_equal ? "<=" : "<") : (r.or_equal ? ">=" : ">");
    return absl::InvalidArgumentError(
        absl::StrFormat("--%s must be a number %s %g, got %g", r.flag, relation,
                        r.bound, r.value));
  }
  return absl::OkStatus();
}

absl::Status CheckChoice(const char* flag, absl::string_view value,
                         std::initializer_list<absl::string_view> choices) {
  for (absl::string_view c : choices) {
    if (value == c) return absl::OkStatus();
  }
  return ChoiceError(flag, value, choices);
}

}  // namespace dp
