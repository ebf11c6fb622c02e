#include "tools/cli/cluster_client_lib.h"

#include <cstdio>

#include "actors/runtime.h"
#include "config/topology.h"
#include "tools/cli/common.h"

namespace specserve::cli {

Expected<std::unique_ptr<Client>> connect_client(const std::string& connect, const std::string& token_file,
                                                 const std::string& config) {
  std::string endpoint = connect, tf = token_file;
  if (!config.empty()) {
    auto t = load_topology_endpoint(config);  // this host may lack the models the nodes load
    if (!t.ok()) return t.status();
    if (endpoint.empty()) endpoint = t->head.host + ":" + std::to_string(t->head.actor_port);
    if (tf.empty()) tf = t->cluster.token_file;
  }
  if (endpoint.empty()) return invalid_argument("--connect HOST:PORT (or --config cluster.yaml) is required");
  if (tf.empty()) tf = kDefaultTokenFile;
  auto hp = parse_host_port(endpoint, "--connect");
  if (!hp.ok()) return hp.status();
  auto token = read_cluster_token(tf);
  if (!token.ok()) return token.status();
  return Client::connect(hp->first, hp->second, *token);
}

std::string json_escape(const std::string& s) {
  std::string o;
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') o += '\\', o += static_cast<char>(c);
    else if (c == '\n') o += "\\n";
    else if (c < 0x20) { char b[8]; std::snprintf(b, sizeof b, "\\u%04x", c); o += b; }
    else o += static_cast<char>(c);
  }
  return o;
}

}  // namespace specserve::cli
