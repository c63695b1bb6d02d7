#include "metrics/metrics_server.h"

#include <atomic>
#include <exception>
#include <system_error>
#include <thread>
#include <vector>

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"

namespace flatshard {
namespace {

// Where a client reaches a server listening on `host`: a wildcard address
// and "localhost" through loopback. Empty for a host name, which would
// need a resolver, slow or down at a daemon's exit.
std::vector<char> ConnectAddress(absl::string_view host, int port, socklen_t& length) {
  host = absl::StripSuffix(absl::StripPrefix(host, "["), "]");
  std::string reach(host);
  if (reach.empty() || reach == "0.0.0.0" || reach == "localhost") reach = "127.0.0.1";
  if (reach == "::") reach = "::1";
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (getaddrinfo(reach.c_str(), std::to_string(port).c_str(), &hints, &found) != 0) return {};
  const auto* bytes = reinterpret_cast<const char*>(found->ai_addr);
  std::vector<char> address(bytes, bytes + found->ai_addrlen);
  length = found->ai_addrlen;
  freeaddrinfo(found);
  return address;
}

}  // namespace

MetricsServer::~MetricsServer() {
  // civetweb (1.15, Debian's) stops in mg_stop by setting a flag and waiting
  // for its master thread to see it, which that thread does only when its
  // poll of the listening socket returns: after a connection, or 2 s
  // (SOCKET_TIMEOUT_QUANTUM). Every daemon's exit waited those 2 s. A
  // connection closed at once wakes it; repeated until the stop is done,
  // since one that comes before the flag is set only starts another poll.
  socklen_t length = 0;
  const std::vector<char> address =
      ConnectAddress(address_.substr(0, address_.rfind(':')), port_, length);
  std::atomic<bool> stopped{false};
  std::thread waker;
  if (!address.empty()) {
    try {
      waker = std::thread([&] {
        const auto* to = reinterpret_cast<const sockaddr*>(address.data());
        while (!stopped.load()) {
          const int fd = socket(to->sa_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
          if (fd < 0) return;
          (void)connect(fd, to, length);
          close(fd);
          absl::SleepFor(absl::Milliseconds(10));  // bounded: until the stop returns
        }
      });
    } catch (const std::system_error&) {
      // No thread to spare: the stop takes civetweb's 2 s.
    }
  }
  exposer_.reset();
  stopped.store(true);
  if (waker.joinable()) waker.join();
}

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(const std::string& address) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon + 1 == address.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics address '", address, "' must be host:port (port 0: any free one)"));
  }
  std::unique_ptr<prometheus::Exposer> exposer;
  try {
    // One serving thread: a scrape is small and Prometheus scrapes serially.
    exposer = std::make_unique<prometheus::Exposer>(address, 1);
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("cannot serve metrics on '", address, "': ", e.what()));
  }
  const std::vector<int> ports = exposer->GetListeningPorts();
  if (ports.empty() || ports.front() <= 0) {
    return absl::UnavailableError(absl::StrCat("cannot serve metrics on '", address, "'"));
  }
  const std::string host = address.substr(0, colon);
  return std::unique_ptr<MetricsServer>(
      new MetricsServer(std::move(exposer), ports.front(), absl::StrCat(host, ":", ports.front())));
}

std::string MetricsServer::DefaultAddress(const std::string& listen) {
  const size_t colon = listen.rfind(':');
  return absl::StrCat(colon == std::string::npos ? listen : listen.substr(0, colon), ":0");
}

void MetricsServer::Serve(std::shared_ptr<prometheus::Collectable> collectable) {
  exposer_->RegisterCollectable(collectable);
  served_.push_back(std::move(collectable));
}

}  // namespace flatshard
