// Test certificates from tests/make_test_certs.sh.
#include "tests/test_certs.h"

#include "gtest/gtest.h"

namespace dp {

std::unique_ptr<TestCerts> TestCerts::Make() {
  auto certs = std::unique_ptr<TestCerts>(new TestCerts());
  Subprocess script({"/bin/bash", DP_MAKE_TEST_CERTS, certs->dir_.path()});
  const std::optional<int> rc = script.Wait(absl::Seconds(60));
  if (rc != 0) {
    ADD_FAILURE() << "make_test_certs.sh failed: " << script.output();
    return nullptr;
  }
  return certs;
}

SecurityFlags TestCerts::Server(bool mutual) const {
  SecurityFlags f;
  f.tls_cert = File("server.pem");
  f.tls_key = File("server.key");
  if (mutual) f.tls_ca = File("ca.pem");
  return f;
}

SecurityFlags TestCerts::Client(const std::string& client,
                                const std::string& ca) const {
  SecurityFlags f;
  f.tls_ca = File(ca + ".pem");
  if (!client.empty()) {
    f.tls_cert = File(client + ".pem");
    f.tls_key = File(client + ".key");
  }
  return f;
}

std::vector<std::string> TestCerts::Args(const SecurityFlags& f) {
  std::vector<std::string> args;
  auto add = [&](const char* name, const std::string& value) {
    if (!value.empty()) args.push_back(std::string("--") + name + "=" + value);
  };
  add("tls_cert", f.tls_cert);
  add("tls_key", f.tls_key);
  add("tls_ca", f.tls_ca);
  add("auth_token_file", f.auth_token_file);
  add("tls_server_name", f.tls_server_name);
  return args;
}

}  // namespace dp
