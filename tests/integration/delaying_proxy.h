// A TCP proxy on a loopback port chosen at run time that holds back what
// the server sends on each connection for a while, as a worker under load
// (or a coordinator busy with thousands of handshakes) is slow to answer a
// new connection: the server's first bytes (HTTP/2 SETTINGS) arrive `delay`
// after the connection was accepted; the client's bytes pass at once. It
// counts the connections it accepted. Threads: one accepting, one per
// connection; all stop and are joined in the destructor.
#ifndef FLATSHARD_TESTS_INTEGRATION_DELAYING_PROXY_H_
#define FLATSHARD_TESTS_INTEGRATION_DELAYING_PROXY_H_

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace flatshard::testing {

class DelayingProxy {
 public:
  // Forwards to 127.0.0.1:`upstream_port`.
  DelayingProxy(int upstream_port, absl::Duration delay)
      : upstream_port_(upstream_port), delay_(delay) {
    listener_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr = Loopback(0);
    socklen_t len = sizeof(addr);
    if (listener_ < 0 || bind(listener_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
        listen(listener_, 16) != 0 ||
        getsockname(listener_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      return;  // port() stays 0: the test asserts on it
    }
    port_ = ntohs(addr.sin_port);
    acceptor_ = std::thread([this] { Accept(); });
  }
  ~DelayingProxy() {
    stop_ = true;
    if (acceptor_.joinable()) acceptor_.join();
    std::vector<std::thread> pumps;
    {
      std::lock_guard<std::mutex> lock(mu_);
      pumps.swap(pumps_);
    }
    for (std::thread& t : pumps) t.join();
    if (listener_ >= 0) close(listener_);
  }
  DelayingProxy(const DelayingProxy&) = delete;
  DelayingProxy& operator=(const DelayingProxy&) = delete;

  int port() const { return port_; }
  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }
  int accepted() const { return accepted_.load(); }

 private:
  static sockaddr_in Loopback(int port) {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(static_cast<uint16_t>(port));
    return addr;
  }

  // Polls in slices of 50 ms so that the destructor's stop is seen.
  void Accept() {
    while (!stop_) {
      pollfd ready{listener_, POLLIN, 0};
      if (poll(&ready, 1, 50) <= 0) continue;
      const int client = accept(listener_, nullptr, nullptr);
      if (client < 0) continue;
      ++accepted_;
      std::lock_guard<std::mutex> lock(mu_);
      pumps_.emplace_back([this, client] { Pump(client); });
    }
  }

  // Copies both ways until either side closes; the server's bytes only
  // from `delay_` after the accept.
  void Pump(int client) {
    const absl::Time release = absl::Now() + delay_;
    const int server = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr = Loopback(upstream_port_);
    if (server < 0 || connect(server, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
      if (server >= 0) close(server);
      close(client);
      return;
    }
    char buffer[16384];
    bool open = true;
    while (open && !stop_) {
      const bool held = absl::Now() < release;
      pollfd fds[2] = {{client, POLLIN, 0}, {server, static_cast<int16_t>(held ? 0 : POLLIN), 0}};
      if (poll(fds, 2, 50) <= 0) continue;
      for (int i = 0; i < 2 && open; ++i) {
        if ((fds[i].revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
        const ssize_t n = read(fds[i].fd, buffer, sizeof(buffer));
        open = n > 0 && write(fds[1 - i].fd, buffer, static_cast<size_t>(n)) == n;
      }
    }
    close(server);
    close(client);
  }

  const int upstream_port_;
  const absl::Duration delay_;
  int listener_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int> accepted_{0};
  std::thread acceptor_;
  std::mutex mu_;
  std::vector<std::thread> pumps_;
};

}  // namespace flatshard::testing

#endif  // FLATSHARD_TESTS_INTEGRATION_DELAYING_PROXY_H_
