// specserve kv: which network interface of this machine holds a host's address, as UCX names
// it in UCX_NET_DEVICES (the KV data plane pins UCX's network transports to it on a loopback
// cluster: actors/kv_data_plane.h).
#pragma once

#include <string>

namespace specserve {

/// The network interface of this machine that holds `host`'s address, as UCX_NET_DEVICES names
/// it: the loopback interface ("lo") for "localhost", 127.0.0.0/8 and ::1; the interface with
/// that address for a numeric address or a name that resolves to one. Empty when `host` is
/// empty, a wildcard (0.0.0.0, ::), does not resolve, is on no interface here, or is a name
/// other than "localhost" that resolves to loopback (as Debian's /etc/hosts maps the hostname:
/// other hosts may reach the machine by that name); the caller then leaves UCX its default,
/// every interface.
std::string ucx_net_device_for_host(const std::string& host);

}  // namespace specserve
