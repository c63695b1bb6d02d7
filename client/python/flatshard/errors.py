"""One exception type for everything the coordinator refuses or fails."""
from __future__ import annotations

import grpc


class FlatshardError(Exception):
    """A call the coordinator answered with an error, or that could not reach it.

    ``code`` is the gRPC status code (``grpc.StatusCode``) the server mapped its
    ``absl::Status`` onto one-to-one, ``message`` the server's own words (they
    name the field and the problem), ``call`` the RPC that failed.
    """

    def __init__(self, code: grpc.StatusCode, message: str, call: str = "") -> None:
        self.code = code
        self.message = message
        self.call = call
        where = f"{call}: " if call else ""
        super().__init__(f"{where}{code.name}: {message}")


class JobFailed(FlatshardError):
    """The job reached FAILED, or was stopped (deleted: STOPPED), while the client
    waited on it; the message says which."""


# The name the Python client dials the coordinator by under the cluster's CA
# (cluster.py): in the reserved domain .invalid, so that no host is ever
# called so; only the coordinator's certificate carries it
# (rpc/tls_credentials.h RoleHostName).
COORDINATOR_NAME = "flatshard-coordinator.invalid"

# How gRPC's versions say a server's certificate lacked the name dialed.
_NAME_MISMATCH = ("Hostname Verification Check failed", "is not in peer certificate",
                  COORDINATOR_NAME)


def from_rpc_error(error: grpc.RpcError, call: str, role_checked: bool = False) -> FlatshardError:
    """``role_checked``: the channel dialed COORDINATOR_NAME, so a name
    mismatch means the server did not prove it is the coordinator."""
    code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN
    details = (error.details() if hasattr(error, "details") else str(error)) or ""
    if (role_checked and code == grpc.StatusCode.UNAVAILABLE
            and any(m in details for m in _NAME_MISMATCH)):
        details += (f" (the server's certificate lacks {COORDINATOR_NAME}: it is not the "
                    "coordinator, or its certificate was issued before flatshard checked the "
                    "role; `flatshard certs renew DIR` issues it again from the same CA)")
    return FlatshardError(code, details, call)
