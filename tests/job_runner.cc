// Real dp-ps and dp-worker processes for whole-job tests.
#include "tests/job_runner.h"

#include <grpcpp/grpcpp.h>
#include <signal.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <optional>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/file_util.h"
#include "gtest/gtest.h"
#include "proto/dp.grpc.pb.h"
#include "tests/raw_client.h"

namespace dp {

std::unique_ptr<Subprocess> StartServer(std::vector<std::string> args,
                                        int* port, int fixed_port) {
  std::vector<std::string> argv = {DP_PS_BINARY, "--host=127.0.0.1",
                                   absl::StrCat("--port=", fixed_port)};
  argv.insert(argv.end(), args.begin(), args.end());
  auto ps = std::make_unique<Subprocess>(argv);
  EXPECT_TRUE(ps->WaitForOutput(" workers\n", absl::Seconds(30)))
      << ps->output();
  auto field = ps->Field("listening on 127.0.0.1:");
  *port = 0;
  if (field.has_value()) {
    EXPECT_TRUE(absl::SimpleAtoi(field->substr(0, field->find(' ')), port));
  }
  return ps;
}

std::unique_ptr<Subprocess> StartWorker(int port, int rank,
                                        std::vector<std::string> args) {
  return StartWorker(absl::StrCat("127.0.0.1:", port), rank, std::move(args));
}

std::unique_ptr<Subprocess> StartWorker(const std::string& ps, int rank,
                                        std::vector<std::string> args) {
  std::vector<std::string> argv = {DP_WORKER_BINARY, absl::StrCat("--ps=", ps),
                                   absl::StrCat("--rank=", rank),
                                   "--backend=cpu"};
  argv.insert(argv.end(), args.begin(), args.end());
  return std::make_unique<Subprocess>(argv);
}

std::string PsList(const std::vector<int>& ports) {
  std::vector<std::string> list;
  for (int p : ports) list.push_back(absl::StrCat("127.0.0.1:", p));
  return absl::StrJoin(list, ",");
}

RestartableShards::RestartableShards(int count, std::vector<std::string> args,
                                     const TempDir& dir)
    : args_(count, args), ports_(count, 0), ps_(count) {
  for (int k = 0; k < count; ++k) {
    args_[k].push_back("--checkpoint_dir=" + dir.File(absl::StrCat("ckpt", k)));
  }
  // Shard 0 last: it is told the others' ports.
  for (int k = count - 1; k >= 0; --k) Start(k, 0);
}

void RestartableShards::Start(int k, int port) {
  const int count = static_cast<int>(ps_.size());
  ps_[k] = StartServer(count > 1 ? ShardArgs(args_[k], k, ports_) : args_[k],
                       &ports_[k], port);
}

bool RestartableShards::KillAndRestart(int k) {
  ps_[k]->Signal(SIGKILL);
  ps_[k]->Wait(absl::Seconds(30));
  const int port = ports_[k];
  Start(k, port);
  EXPECT_EQ(ports_[k], port) << ps_[k]->output();
  return ports_[k] == port;
}

void RestartableShards::ExpectAllExitZero() {
  for (auto& p : ps_) EXPECT_EQ(p->Wait(kJobTimeout), 0) << p->output();
}

std::vector<std::string> ShardArgs(std::vector<std::string> args, int shard,
                                   const std::vector<int>& ports) {
  args.push_back(absl::StrCat("--shards=", ports.size()));
  args.push_back(absl::StrCat("--shard=", shard));
  if (shard == 0 && ports.size() > 1) {
    args.push_back(
        absl::StrCat("--shard_addresses=",
                     PsList(std::vector<int>(ports.begin() + 1, ports.end()))));
  }
  return args;
}

std::vector<std::unique_ptr<Subprocess>> StartShards(
    int shards, const std::vector<std::string>& args, std::vector<int>* ports) {
  ports->assign(shards, 0);
  std::vector<std::unique_ptr<Subprocess>> ps(shards);
  for (int k = shards - 1; k >= 0; --k) {
    ps[k] = StartServer(ShardArgs(args, k, *ports), &(*ports)[k]);
  }
  return ps;
}

JobResult RunJob(std::vector<std::string> ps_args, int workers,
                 std::vector<std::string> worker_args, int shards) {
  ps_args.push_back(absl::StrCat("--workers=", workers));
  std::vector<int> ports;
  auto ps = StartShards(shards, ps_args, &ports);
  std::vector<std::unique_ptr<Subprocess>> ws;
  for (int r = 0; r < workers; ++r) {
    ws.push_back(StartWorker(PsList(ports), r, worker_args));
  }
  JobResult result;
  for (auto& w : ws) {
    result.worker_exits.push_back(w->Wait(kJobTimeout).value_or(-1));
    if (result.worker_exits.back() != 0) ADD_FAILURE() << w->output();
  }
  bool failed = false;
  for (int e : result.worker_exits) failed = failed || e != 0;
  for (size_t k = 0; k < ps.size(); ++k) {
    const int exit = ps[k]->Wait(kJobTimeout).value_or(-1);
    result.ps_exit = std::max(result.ps_exit, exit);
    // A failed worker's story often ends in a shard's log: print them all.
    if (failed || exit != 0) {
      ADD_FAILURE() << "shard " << k << " (exit " << exit << "):\n"
                    << ps[k]->output();
    }
  }
  result.ps_output = ps[0]->output();
  return result;
}

std::optional<dp::v1::GetStatusResponse> StatusAt(int port) {
  static auto* stubs =
      new std::map<int, std::unique_ptr<dp::v1::ParameterServer::Stub>>();
  auto& stub = (*stubs)[port];
  if (stub == nullptr) {
    stub = ConnectRaw(port);
  }
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(1)));
  dp::v1::GetStatusRequest req;
  dp::v1::GetStatusResponse resp;
  if (!stub->GetStatus(&ctx, req, &resp).ok()) return std::nullopt;
  return resp;
}

int64_t CurrentStep(int port) {
  const std::optional<dp::v1::GetStatusResponse> status = StatusAt(port);
  return status.has_value() ? status->step() : -1;
}

std::vector<int> RegisteredRanks(int port) {
  const std::optional<dp::v1::GetStatusResponse> status = StatusAt(port);
  if (!status.has_value()) return {};
  return std::vector<int>(status->registered_ranks().begin(),
                          status->registered_ranks().end());
}

bool PollUntil(const std::function<bool()>& done, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    if (done()) return true;
    absl::SleepFor(absl::Milliseconds(5));  // polling interval, not a sync
  }
  return false;
}

bool WaitForStep(int port, int64_t step, absl::Duration timeout) {
  return PollUntil([&] { return CurrentStep(port) >= step; }, timeout);
}

std::optional<dp::v1::GetStatusResponse> WaitForStatus(
    int port,
    const std::function<bool(const dp::v1::GetStatusResponse&)>& holds,
    absl::Duration timeout) {
  std::optional<dp::v1::GetStatusResponse> seen;
  if (!PollUntil(
          [&] {
            seen = StatusAt(port);
            return seen.has_value() && holds(*seen);
          },
          timeout)) {
    return std::nullopt;
  }
  return seen;
}

bool WaitForRegistered(int port, const std::vector<int>& ranks,
                       absl::Duration timeout) {
  return WaitForStatus(
             port,
             [&](const dp::v1::GetStatusResponse& s) {
               return std::all_of(ranks.begin(), ranks.end(), [&](int r) {
                 return std::find(s.registered_ranks().begin(),
                                  s.registered_ranks().end(),
                                  r) != s.registered_ranks().end();
               });
             },
             timeout)
      .has_value();
}

bool WaitForFile(const std::string& path, absl::Duration timeout) {
  return PollUntil([&] { return std::filesystem::exists(path); }, timeout);
}

std::string ReadModel(const std::string& path) {
  auto bytes = ReadFile(path);
  EXPECT_TRUE(bytes.ok()) << bytes.status();
  return bytes.value_or("");
}

std::string ReferenceModel(const std::vector<std::string>& ps_args,
                           int workers) {
  // What decides the model: the flags and the two programs' bytes.
  uint64_t key = std::hash<std::string>{}(absl::StrJoin(ps_args, " "));
  for (const char* binary : {DP_PS_BINARY, DP_WORKER_BINARY}) {
    auto bytes = ReadFile(binary);
    EXPECT_TRUE(bytes.ok()) << bytes.status();
    key = key * 31 + std::hash<std::string>{}(bytes.value_or(""));
  }
  const char* tmp = std::getenv("TMPDIR");
  const std::string path = absl::StrCat(
      tmp != nullptr && *tmp != '\0' ? tmp : "/tmp", "/dp-reference-",
      absl::Hex(key, absl::kZeroPad16), ".safetensors");
  if (auto cached = ReadFile(path); cached.ok()) return *std::move(cached);
  TempDir dir;
  std::vector<std::string> args = ps_args;
  args.push_back("--save_model=" + dir.File("model.safetensors"));
  const JobResult r = RunJob(args, workers);
  EXPECT_EQ(r.ps_exit, 0) << r.ps_output;
  const std::string bytes = ReadModel(dir.File("model.safetensors"));
  // Renamed into place whole: a test running beside this one reads either
  // no file or this one.
  if (!bytes.empty()) EXPECT_TRUE(WriteFileAtomic(path, bytes).ok()) << path;
  return bytes;
}

}  // namespace dp
