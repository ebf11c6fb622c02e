// Tests for HTTPS (HttpServerOptions::ssl_certfile / ssl_keyfile, vLLM's --ssl-certfile /
// --ssl-keyfile): a server with a certificate serves the API over TLS to a client that verifies
// it, refuses plain HTTP on that port, and bad TLS files are refused before it listens, naming
// the field and the file. The certificates are made here with OpenSSL (EC P-256, self-signed for
// 127.0.0.1), so no private key is committed.
#include <openssl/ec.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <csignal>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "tests/server/http_server_fixture.h"

namespace specserve {
namespace {

using namespace http_testing;

// A self-signed certificate for IP 127.0.0.1 and its key, written as PEM into `dir`.
struct TlsFiles {
  std::string cert, key;
};

TlsFiles make_tls_files(const std::filesystem::path& dir, const std::string& stem) {
  std::filesystem::create_directories(dir);
  EVP_PKEY* pkey = EVP_EC_gen("P-256");
  EXPECT_NE(pkey, nullptr);
  X509* x = X509_new();
  X509_set_version(x, 2);
  ASN1_INTEGER_set(X509_get_serialNumber(x), 1);
  X509_gmtime_adj(X509_getm_notBefore(x), -3600);
  X509_gmtime_adj(X509_getm_notAfter(x), 3600L * 24);
  X509_set_pubkey(x, pkey);
  X509_NAME* name = X509_get_subject_name(x);
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC, reinterpret_cast<const unsigned char*>("127.0.0.1"), -1, -1, 0);
  X509_set_issuer_name(x, name);
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, x, x, nullptr, nullptr, 0);
  X509_EXTENSION* san = X509V3_EXT_conf_nid(nullptr, &ctx, NID_subject_alt_name, "IP:127.0.0.1");
  EXPECT_NE(san, nullptr);
  X509_add_ext(x, san, -1);
  X509_EXTENSION_free(san);
  EXPECT_GT(X509_sign(x, pkey, EVP_sha256()), 0);
  TlsFiles f{(dir / (stem + ".crt")).string(), (dir / (stem + ".key")).string()};
  FILE* c = std::fopen(f.cert.c_str(), "w");
  PEM_write_X509(c, x);
  std::fclose(c);
  FILE* k = std::fopen(f.key.c_str(), "w");
  PEM_write_PrivateKey(k, pkey, nullptr, nullptr, 0, nullptr, nullptr);
  std::fclose(k);
  ::chmod(f.key.c_str(), 0600);
  X509_free(x);
  EVP_PKEY_free(pkey);
  return f;
}

// True when a TLS handshake with 127.0.0.1:port succeeds for a client limited to TLS versions
// [min_version, max_version] (no certificate check: only the protocol is tested).
bool tls_handshake(uint16_t port, int min_version, int max_version) {
  SSL_CTX* ctx = SSL_CTX_new(TLS_client_method());
  SSL_CTX_set_min_proto_version(ctx, min_version);
  SSL_CTX_set_max_proto_version(ctx, max_version);
  SSL_CTX_set_security_level(ctx, 0);  // let the client offer old versions at all
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bool ok = false;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) {
    SSL* ssl = SSL_new(ctx);
    SSL_set_fd(ssl, fd);
    ok = SSL_connect(ssl) == 1;
    if (ok) SSL_shutdown(ssl);
    SSL_free(ssl);
  }
  ::close(fd);
  SSL_CTX_free(ctx);
  return ok;
}

class HttpsServerTest : public HttpServerTest {
 protected:
  void SetUp() override {
    // OpenSSL writes without MSG_NOSIGNAL (HttpServerOptions::ssl_certfile): as the commands do.
    std::signal(SIGPIPE, SIG_IGN);
    HttpServerTest::SetUp();
    dir_ = std::filesystem::temp_directory_path() / ("specserve-tls-" + std::to_string(::getpid()));
    files_ = make_tls_files(dir_, "server");
  }
  void TearDown() override {
    HttpServerTest::TearDown();
    std::filesystem::remove_all(dir_);
  }
  std::filesystem::path dir_;
  TlsFiles files_;
};

// Over TLS, verifying the certificate (and that it names 127.0.0.1): the model list and a chat
// completion answer; the API key is still asked for.
TEST_F(HttpsServerTest, ServesTheApiOverTlsToAClientThatVerifiesTheCertificate) {
  opts_.ssl_certfile = files_.cert;
  opts_.ssl_keyfile = files_.key;
  opts_.api_key = "sk-tls";
  start();
  httplib::SSLClient c("127.0.0.1", server_->port());
  c.set_ca_cert_path(files_.cert.c_str());
  c.enable_server_certificate_verification(true);
  c.set_read_timeout(30, 0);
  auto unauth = c.Get("/v1/models");
  ASSERT_TRUE(unauth) << "TLS handshake failed: " << httplib::to_string(unauth.error()) << ", verify result "
                      << c.get_openssl_verify_result();
  EXPECT_EQ(unauth->status, 401);
  c.set_bearer_token_auth("sk-tls");
  auto models = c.Get("/v1/models");
  ASSERT_TRUE(models);
  EXPECT_EQ(models->status, 200);
  EXPECT_EQ(json::parse(models->body)["data"][0]["id"], "fake");
  auto r = c.Post("/v1/chat/completions", R"({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3})",
                  "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
  const json j = json::parse(r->body);
  EXPECT_EQ(j["choices"][0]["message"]["content"], "aaa");
  EXPECT_EQ(j["usage"]["completion_tokens"], 3);
  // Streaming goes over the same TLS connection type.
  auto s = c.Post("/v1/completions", R"({"prompt": "hi", "max_tokens": 2, "stream": true})", "application/json");
  ASSERT_TRUE(s);
  EXPECT_EQ(s->status, 200);
  EXPECT_NE(s->body.find("data: [DONE]"), std::string::npos) << s->body;
}

// A plain-HTTP request to the TLS port gets no API answer, and a client that trusts another
// certificate refuses the server.
TEST_F(HttpsServerTest, PlainHttpAndAnUntrustedCertificateGetNoAnswer) {
  opts_.ssl_certfile = files_.cert;
  opts_.ssl_keyfile = files_.key;
  start();
  auto plain = client().Get("/v1/models");
  EXPECT_TRUE(!plain || plain->status != 200) << "plain HTTP answered on the TLS port";
  const TlsFiles other = make_tls_files(dir_, "other");
  httplib::SSLClient c("127.0.0.1", server_->port());
  c.set_ca_cert_path(other.cert.c_str());
  c.enable_server_certificate_verification(true);
  auto r = c.Get("/v1/models");
  EXPECT_FALSE(r) << "a certificate the client does not trust was accepted";
  // The server keeps serving clients that trust it.
  httplib::SSLClient ok("127.0.0.1", server_->port());
  ok.set_ca_cert_path(files_.cert.c_str());
  ok.enable_server_certificate_verification(true);
  auto good = ok.Get("/health");
  ASSERT_TRUE(good) << httplib::to_string(good.error());
}

// A connection that never starts its TLS handshake holds an HTTP thread for the 5 s read bound
// only, as an idle plain-HTTP connection does (it held one for 30 s: 64 idle sockets froze the
// API that long). One HTTP thread here: the second client waits behind the idle one.
TEST_F(HttpsServerTest, AnIdleConnectionReleasesItsThreadWithinTheReadBound) {
  opts_.ssl_certfile = files_.cert;
  opts_.ssl_keyfile = files_.key;
  opts_.threads = 1;
  start();
  const int idle = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(server_->port());
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::connect(idle, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the thread is on it
  httplib::SSLClient c("127.0.0.1", server_->port());
  c.set_ca_cert_path(files_.cert.c_str());
  c.enable_server_certificate_verification(true);
  c.set_read_timeout(60, 0);
  c.set_connection_timeout(60, 0);
  const auto t0 = std::chrono::steady_clock::now();
  auto r = c.Get("/health");
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ::close(idle);
  ASSERT_TRUE(r) << httplib::to_string(r.error());
  EXPECT_LT(waited, 15.0) << "the idle connection held the only thread past the 5 s bound";
}

// TLS 1.2 and 1.3 only (cpp-httplib's own set-up allows 1.1).
TEST_F(HttpsServerTest, OnlyTls12AndLaterAreSpoken) {
  opts_.ssl_certfile = files_.cert;
  opts_.ssl_keyfile = files_.key;
  start();
  EXPECT_TRUE(tls_handshake(server_->port(), TLS1_2_VERSION, TLS1_2_VERSION));
  EXPECT_TRUE(tls_handshake(server_->port(), TLS1_3_VERSION, TLS1_3_VERSION));
  EXPECT_FALSE(tls_handshake(server_->port(), TLS1_VERSION, TLS1_1_VERSION)) << "the server spoke TLS 1.1 or older";
}

// Bad TLS options are refused before the server listens, naming the field and the file.
TEST_F(HttpsServerTest, BadTlsFilesAreRefusedNamingTheFieldAndFile) {
  auto refused = [&](const HttpServerOptions& o) {
    auto s = HttpServer::start(o, rt_->system(), scheduler_, "token", PromptCodec(*gguf_, *tok_));
    EXPECT_FALSE(s.ok());
    const Status st = HttpServer::check_tls(o);
    EXPECT_FALSE(st.ok());
    EXPECT_EQ(st.message(), s.ok() ? std::string() : s.status().message()) << "check_tls and start disagree";
    return st.message();
  };
  HttpServerOptions o = opts_;
  o.ssl_certfile = files_.cert;
  EXPECT_NE(refused(o).find("ssl_certfile = \"" + files_.cert + "\" without ssl_keyfile"), std::string::npos);
  o = opts_;
  o.ssl_keyfile = files_.key;
  EXPECT_NE(refused(o).find("ssl_keyfile = \"" + files_.key + "\" without ssl_certfile"), std::string::npos);
  o.ssl_certfile = (dir_ / "missing.crt").string();
  EXPECT_NE(refused(o).find("ssl_certfile = \"" + o.ssl_certfile + "\": not a readable file"), std::string::npos);
  o.ssl_certfile = dir_.string();  // a directory
  EXPECT_NE(refused(o).find("not a readable file"), std::string::npos);
  // Not PEM.
  const std::string junk = (dir_ / "junk.crt").string();
  std::ofstream(junk) << "not a certificate\n";
  o.ssl_certfile = junk;
  std::string m = refused(o);
  EXPECT_NE(m.find("ssl_certfile = \"" + junk + "\""), std::string::npos) << m;
  EXPECT_NE(m.find("OpenSSL refused them"), std::string::npos) << m;
  // A key that is not the certificate's.
  const TlsFiles other = make_tls_files(dir_, "other");
  o.ssl_certfile = files_.cert;
  o.ssl_keyfile = other.key;
  m = refused(o);
  EXPECT_NE(m.find("OpenSSL refused them"), std::string::npos) << m;
  EXPECT_NE(m.find(other.key), std::string::npos) << m;
  // A key that needs a passphrase: refused at once (OpenSSL would ask on the terminal).
  const std::string locked = (dir_ / "locked.key").string();
  {
    FILE* in = std::fopen(files_.key.c_str(), "r");
    EVP_PKEY* pkey = PEM_read_PrivateKey(in, nullptr, nullptr, nullptr);
    std::fclose(in);
    ASSERT_NE(pkey, nullptr);
    FILE* out = std::fopen(locked.c_str(), "w");
    static char pass[] = "secret";
    PEM_write_PrivateKey(out, pkey, EVP_aes_256_cbc(), nullptr, 0, nullptr, pass);
    std::fclose(out);
    EVP_PKEY_free(pkey);
  }
  o.ssl_certfile = files_.cert;
  o.ssl_keyfile = locked;
  m = refused(o);
  EXPECT_NE(m.find("OpenSSL refused them"), std::string::npos) << m;
  EXPECT_NE(m.find("no passphrase"), std::string::npos) << m;
  // Without TLS files, nothing to check.
  EXPECT_TRUE(HttpServer::check_tls(opts_).ok());
}

}  // namespace
}  // namespace specserve
