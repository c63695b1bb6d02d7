// Helpers for tests that take part in a rendezvous as a worker would: a
// registered session for the coordinator's store, and the record a Gloo rank
// leaves when it publishes its addresses and then never connects.
#ifndef FLATSHARD_TESTS_INTEGRATION_RENDEZVOUS_TEST_UTIL_H_
#define FLATSHARD_TESTS_INTEGRATION_RENDEZVOUS_TEST_UTIL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <arpa/inet.h>
#include <gloo/transport/tcp/address.h>
#include <grpcpp/channel.h>
#include <grpcpp/client_context.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <netinet/in.h>

#include "absl/status/statusor.h"
#include "rpc/call_metadata.h"

#include "flatshard/v1/membership.grpc.pb.h"
#include "proto/grpc_status.h"
#include "worker/comm/grpc_store.h"

namespace flatshard::testing {

// Registers `worker_id` as a spare (no job rank asked for); its session,
// which store calls carry.
inline absl::StatusOr<std::string> RegisterSpare(const std::shared_ptr<grpc::Channel>& channel,
                                                 const std::string& worker_id) {
  grpc::ClientContext context;
  v1::RegisterRequest request;
  request.set_worker_id(worker_id);
  request.set_address("127.0.0.1:1");
  request.set_requested_rank(-1);
  v1::RegisterResponse response;
  const grpc::Status registered =
      v1::Membership::NewStub(channel)->Register(&context, request, &response);
  if (!registered.ok()) return FromGrpcStatus(registered);
  return response.session();
}

// The coordinator's store at `address` as a worker registered as spare
// `worker_id` sees it: what a test sets there, a rank reads.
inline absl::StatusOr<std::unique_ptr<GrpcStore>> StoreAsSpare(const std::string& address,
                                                               const std::string& worker_id) {
  std::shared_ptr<grpc::Channel> channel =
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  absl::StatusOr<std::string> session = RegisterSpare(channel, worker_id);
  if (!session.ok()) return session.status();
  auto credentials = std::make_shared<WorkerCallCredentials>("");
  credentials->set_session(*session);
  return std::make_unique<GrpcStore>(channel, credentials);
}

// The value a rank of a `world`-rank Gloo group that published its addresses
// and then never connected leaves under its rank's key: one listening
// address per other rank, on the highest IPv4 address a rank could have, so
// that every real rank takes the listening side of its pair and waits for it
// (Gloo's lower address listens).
inline std::string PeerAddresses(int world, uint32_t ip, uint16_t port_as_stored) {
  sockaddr_storage storage{};
  auto* in = reinterpret_cast<sockaddr_in*>(&storage);
  in->sin_family = AF_INET;
  in->sin_port = port_as_stored;
  in->sin_addr.s_addr = htonl(ip);
  const std::vector<char> one = gloo::transport::tcp::Address(storage).bytes();
  std::string all;
  for (int i = 0; i < world - 1; ++i) all.append(one.begin(), one.end());
  return all;
}

inline std::string AbsentPeerAddresses(int world) {
  return PeerAddresses(world, 0xfffffffe, htons(9));  // 255.255.255.254
}

// The value a rank leaves whose every pair listens on 127.0.0.1:256, where
// nothing listens: a real rank on 127.0.0.1 takes the connecting side (the
// port as stored, 1, is below any other) and its connection is refused, as
// when a rank's port was handed to another listener or its process is gone.
inline std::string RefusingPeerAddresses(int world) {
  return PeerAddresses(world, 0x7f000001, 1);  // stored 1: port 256 in network order
}

}  // namespace flatshard::testing

#endif  // FLATSHARD_TESTS_INTEGRATION_RENDEZVOUS_TEST_UTIL_H_
