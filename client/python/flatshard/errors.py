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


def from_rpc_error(error: grpc.RpcError, call: str) -> FlatshardError:
    code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN
    details = error.details() if hasattr(error, "details") else str(error)
    return FlatshardError(code, details or "", call)
