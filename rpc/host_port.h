// A host and a port as one address, and a host without its brackets, for
// hosts given as names, IPv4 or IPv6 addresses. An IPv6 address goes in brackets in an address
// ("[::1]:7000", as gRPC and URLs want it) and without them where a bare
// host is wanted (getaddrinfo, which Gloo resolves its hostname with).
#ifndef FLATSHARD_RPC_HOST_PORT_H_
#define FLATSHARD_RPC_HOST_PORT_H_

#include <string>

#include "absl/strings/string_view.h"

namespace flatshard {

// "host:port"; an IPv6 `host` ("::1", or "[::1]" already) as "[::1]:port".
std::string JoinHostPort(absl::string_view host, int port);

// `host` without the brackets an IPv6 address may be given in.
std::string BareHost(absl::string_view host);

}  // namespace flatshard

#endif  // FLATSHARD_RPC_HOST_PORT_H_
