// specserve CLI: what the actor client commands (`client`, `status`) share: reaching a head and
// writing JSON strings.
#pragma once

#include <memory>
#include <string>

#include "actors/client.h"
#include "core/status.h"

namespace specserve::cli {

/// Where `up`, `client` and `status` look for the cluster token when no flag or topology names it.
inline constexpr const char* kDefaultTokenFile = "~/.config/specserve/token";

/// A client of the head at --connect HOST:PORT with the token of --token-file; either may come
/// from the --config topology (its head endpoint and cluster.token_file); the token file defaults
/// to ~/.config/specserve/token. Errors: kInvalidArgument naming --connect (missing or malformed)
/// or the topology's error; the token file's (actors/runtime.h read_cluster_token); kUnavailable
/// when the head does not answer.
Expected<std::unique_ptr<Client>> connect_client(const std::string& connect, const std::string& token_file,
                                                 const std::string& config);

/// `s` as the inside of a JSON string: quote and backslash escaped, newline as \n, other control
/// bytes as \u00XX; other bytes as they are (UTF-8 passes through).
std::string json_escape(const std::string& s);

}  // namespace specserve::cli
