// `specserve serve --device` on a device this machine lacks: refused as bad input before the
// HTTP front end starts (runs the real binary).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <string>

namespace specserve {
namespace {

TEST(ServeDevice, ServeOnAGpuThatDoesNotExistFailsBeforeListening) {
  // `serve --device cuda:63` is refused as bad input (exit 2) naming the flag and the value,
  // before the HTTP front end starts or prints its address.
  const std::string dir = ::testing::TempDir() + "specserve_serve_gpu_" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  const std::string cmd = std::string(SPECSERVE_BIN) + " serve --device cuda:63 --port 0 --actor-port 0 --token-file " + dir +
                          "/token 2>&1";
  std::string out;
  FILE* f = ::popen(cmd.c_str(), "r");
  ASSERT_NE(f, nullptr);
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, n);
  const int status = ::pclose(f);
  std::filesystem::remove_all(dir);
  ASSERT_TRUE(WIFEXITED(status)) << out;
  EXPECT_EQ(WEXITSTATUS(status), 2) << out;
  EXPECT_NE(out.find("--device"), std::string::npos) << out;
  EXPECT_NE(out.find("cuda:63"), std::string::npos) << out;
  EXPECT_EQ(out.find("http://"), std::string::npos) << "the HTTP banner came before the device error:\n" << out;
}

}  // namespace
}  // namespace specserve
