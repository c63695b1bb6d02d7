// Who still dials a dead worker's address: a listener bound to the freed
// port, as another process's socket would be (a survivor's Gloo pair gets
// such a port from the kernel), accepting and closing every connection.
#ifndef FLATSHARD_TESTS_INTEGRATION_PORT_DIALS_H_
#define FLATSHARD_TESTS_INTEGRATION_PORT_DIALS_H_

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <vector>

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace flatshard::testing {

// Listens on each of `ports` (loopback) until `end`: when each was dialed,
// as offsets from `since`. An error when a port cannot be bound (taken
// again already).
inline absl::StatusOr<std::vector<std::vector<absl::Duration>>> DialsUntil(
    const std::vector<int>& ports, absl::Time since, absl::Time end) {
  std::vector<pollfd> listening;
  const auto close_all = [&listening] {
    for (const pollfd& p : listening) close(p.fd);
  };
  for (int port : ports) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) {
      close_all();
      return absl::InternalError(absl::StrCat("socket: ", std::strerror(errno)));
    }
    listening.push_back({fd, POLLIN, 0});
    int on = 1;
    (void)setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(static_cast<uint16_t>(port));
    if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || listen(fd, 16) != 0) {
      const int error = errno;
      close_all();
      return absl::UnavailableError(
          absl::StrCat("cannot listen on port ", port, ": ", std::strerror(error)));
    }
  }
  std::vector<std::vector<absl::Duration>> dials(ports.size());
  for (absl::Time now = absl::Now(); now < end; now = absl::Now()) {
    const int timeout_ms = static_cast<int>(absl::ToInt64Milliseconds(end - now));
    if (poll(listening.data(), listening.size(), timeout_ms) <= 0) continue;
    for (size_t i = 0; i < listening.size(); ++i) {
      if ((listening[i].revents & POLLIN) == 0) continue;
      const int conn = accept(listening[i].fd, nullptr, nullptr);
      if (conn < 0) continue;
      close(conn);
      dials[i].push_back(absl::Now() - since);
    }
  }
  close_all();
  return dials;
}

}  // namespace flatshard::testing

#endif  // FLATSHARD_TESTS_INTEGRATION_PORT_DIALS_H_
