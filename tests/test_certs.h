// Throw-away certificates for TLS tests, made by tests/make_test_certs.sh
// with the openssl CLI (see that script for the list of files).
#ifndef DP_TESTS_TEST_CERTS_H_
#define DP_TESTS_TEST_CERTS_H_

#include <memory>
#include <string>

#include "proto/security.h"
#include "tests/subprocess.h"

namespace dp {

class TestCerts {
 public:
  // Runs the script into a fresh directory; null (and a test failure) if it
  // fails.
  static std::unique_ptr<TestCerts> Make();

  // Path of e.g. "ca.pem".
  std::string File(const std::string& name) const { return dir_.File(name); }
  // Flags of dp-ps with TLS, and with mTLS when mutual.
  SecurityFlags Server(bool mutual) const;
  // Flags of a worker that trusts `ca` and presents `client` ("client",
  // "other_client", "expired_client"; "" for none).
  SecurityFlags Client(const std::string& client,
                       const std::string& ca = "ca") const;
  // The same as command-line arguments.
  static std::vector<std::string> Args(const SecurityFlags& flags);

 private:
  TempDir dir_;
};

}  // namespace dp

#endif  // DP_TESTS_TEST_CERTS_H_
