"""The Python client's own side of a training and of its channel, against a
real gRPC server that answers with crafted responses.

    train_client_test.py BIN_DIR SOURCE_DIR WORK_DIR   (run by run_in_venv.sh in the test venv)

- Ctrl-C (a real SIGINT to this process) in the training loop's body stops
  the training on the coordinator, as Ctrl-C in `flatshard train` does, and
  the KeyboardInterrupt reaches the caller even when the stop is refused.
- A user without a passwd entry (a container's arbitrary uid) can train.
- A client certificate without a CA turns TLS on: the token never goes out
  over plaintext.
- With the cluster's CA the coordinator is known by its role: a server with a
  worker's certificate (same CA, same hosts) gets no call, so no token.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import unittest
import warnings
from concurrent import futures
from unittest import mock

import grpc

import flatshard
from flatshard.v1 import job_pb2, job_pb2_grpc

BIN, SOURCE, WORK = sys.argv[1:4]
del sys.argv[1:4]

# Bounds every wait on the server's side, so that no test can hang.
_WAIT_S = 30


class _TrainingServer(job_pb2_grpc.JobServiceServicer):
    """Streams a step, then one more once it was asked to stop (or the
    bound passed), as the coordinator ends a training after its step in flight."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.stopped = threading.Event()
        self.stop_calls = 0
        self.refuse_stop = False
        self.started_by = []
        self.get_jobs = 0

    def Train(self, request, context):  # noqa: N802 (the RPC's name)
        with self.lock:
            self.started_by.append(request.started_by)
        if request.detach:
            return
        yield job_pb2.StepResult(step=1, loss=1.0)
        self.stopped.wait(_WAIT_S)
        yield job_pb2.StepResult(step=2, loss=0.5)

    def StopTraining(self, request, context):  # noqa: N802
        with self.lock:
            self.stop_calls += 1
        if self.refuse_stop:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                          f"job '{request.job}' is not training")
        self.stopped.set()
        return job_pb2.StopTrainingResponse(was_running=True, step=1)

    def GetJob(self, request, context):  # noqa: N802
        with self.lock:
            self.get_jobs += 1
        return job_pb2.GetJobResponse(job=job_pb2.Job(spec=job_pb2.JobSpec(name=request.name)))


class TrainingClientTest(unittest.TestCase):
    def setUp(self) -> None:
        self.servicer = _TrainingServer()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        job_pb2_grpc.add_JobServiceServicer_to_server(self.servicer, self.server)
        port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()
        self.address = f"127.0.0.1:{port}"
        self.cluster = flatshard.Cluster(self.address, token="")
        self.job = flatshard.Job(self.cluster, "j")

    def tearDown(self) -> None:
        self.servicer.stopped.set()
        self.cluster.close()
        self.server.stop(grace=None).wait()

    def test_ctrl_c_in_the_loops_body_stops_the_training(self) -> None:
        seen = []
        with self.assertRaises(KeyboardInterrupt):
            for result in self.job.train(100):
                seen.append(result.step)
                os.kill(os.getpid(), signal.SIGINT)  # handled before the next bytecode
                for _ in range(1000):  # bounded: where the interrupt lands
                    pass
        self.assertEqual(seen, [1])
        self.assertEqual(self.servicer.stop_calls, 1)
        # Python's own handler is back.
        self.assertIs(signal.getsignal(signal.SIGINT), signal.default_int_handler)

    def test_leaving_the_loop_leaves_the_training_running(self) -> None:
        for _ in self.job.train(100):
            break
        self.assertEqual(self.servicer.stop_calls, 0)
        self.assertIs(signal.getsignal(signal.SIGINT), signal.default_int_handler)

    def test_a_refused_stop_does_not_replace_the_interrupt(self) -> None:
        self.servicer.refuse_stop = True
        with warnings.catch_warnings(record=True) as caught, \
                self.assertRaises(KeyboardInterrupt):
            warnings.simplefilter("always")
            for _ in self.job.train(100):
                os.kill(os.getpid(), signal.SIGINT)
                for _ in range(1000):
                    pass
        self.assertEqual(self.servicer.stop_calls, 1)
        messages = [str(w.message) for w in caught if w.category is RuntimeWarning]
        self.assertTrue(any("could not stop the training of job 'j'" in m and
                            "not training" in m for m in messages), messages)

    def test_a_user_without_a_passwd_entry_can_train(self) -> None:
        with mock.patch("getpass.getuser", side_effect=OSError("No username set")):
            self.job.train(1, detach=True)
        self.assertEqual(len(self.servicer.started_by), 1)
        self.assertTrue(self.servicer.started_by[0].startswith("unknown@"),
                        self.servicer.started_by)


class TlsFromTheEnvironmentTest(unittest.TestCase):
    """FLATSHARD_TLS_CERT/KEY without FLATSHARD_TLS_CA: TLS against the
    system's roots, as the CLI does, not plaintext with the token."""

    def test_a_client_certificate_without_a_ca_is_not_sent_in_plaintext(self) -> None:
        certs = os.path.join(WORK, "certs")
        subprocess.run([os.path.join(BIN, "flatshard"), "certs", "init", certs,
                        "--hosts", "127.0.0.1"], check=True, capture_output=True,
                       timeout=_WAIT_S)
        servicer = _TrainingServer()
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        job_pb2_grpc.add_JobServiceServicer_to_server(servicer, server)
        port = server.add_insecure_port("127.0.0.1:0")  # a plaintext server
        server.start()
        environment = {"FLATSHARD_TLS_CERT": os.path.join(certs, "admin.pem"),
                       "FLATSHARD_TLS_KEY": os.path.join(certs, "admin-key.pem"),
                       "FLATSHARD_TOKEN": "secret-token"}
        try:
            with mock.patch.dict(os.environ, environment), \
                    mock.patch.dict(os.environ, {"FLATSHARD_TLS_CA": ""}), \
                    flatshard.Cluster(f"127.0.0.1:{port}", timeout=5) as cluster:
                with self.assertRaises(flatshard.FlatshardError) as caught:
                    cluster.job("j")
                self.assertEqual(caught.exception.code, grpc.StatusCode.UNAVAILABLE)
            self.assertEqual(servicer.get_jobs, 0)
        finally:
            server.stop(grace=None).wait()


class CoordinatorIdentityTest(unittest.TestCase):
    """The cluster's CA signs the workers' certificates too: a Python client
    must not take a worker's for the coordinator's."""

    @classmethod
    def setUpClass(cls) -> None:
        cls.certs = os.path.join(WORK, "identity-certs")
        # The hosts as docs/deploy.md's Kubernetes recipe gives them: the
        # coordinator's Service is called flatshard-coordinator, so the
        # workers' certificate carries that host name too.
        subprocess.run([os.path.join(BIN, "flatshard"), "certs", "init", cls.certs,
                        "--hosts", "flatshard-coordinator,flatshard-coordinator.flatshard.svc"],
                       check=True, capture_output=True, timeout=_WAIT_S)

    def _serve_and_ask(self, role: str, **tls: str) -> tuple:
        """One GetJob with a token to a mutual-TLS server holding `role`'s
        certificate; the call's error code (None: answered) and the calls the
        server saw."""
        def read(name: str) -> bytes:
            with open(os.path.join(self.certs, name), "rb") as f:
                return f.read()
        servicer = _TrainingServer()
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        job_pb2_grpc.add_JobServiceServicer_to_server(servicer, server)
        credentials = grpc.ssl_server_credentials(
            [(read(f"{role}-key.pem"), read(f"{role}.pem"))],
            root_certificates=read("ca.pem"), require_client_auth=True)
        port = server.add_secure_port("127.0.0.1:0", credentials)
        server.start()
        config = {"ca": os.path.join(self.certs, "ca.pem"),
                  "cert": os.path.join(self.certs, "admin.pem"),
                  "key": os.path.join(self.certs, "admin-key.pem"), **tls}
        self.message = ""
        code = None
        try:
            with flatshard.Cluster(f"127.0.0.1:{port}", token="secret-token",
                                   tls=config if config.get("ca") else None,
                                   timeout=5) as cluster:
                try:
                    cluster.job("j")
                except flatshard.FlatshardError as e:
                    code, self.message = e.code, e.message
        finally:
            server.stop(grace=None).wait()
        return code, servicer.get_jobs

    def test_the_coordinators_certificate_is_accepted(self) -> None:
        self.assertEqual(self._serve_and_ask("coordinator"), (None, 1))

    def test_a_workers_certificate_is_refused_before_any_call(self) -> None:
        self.assertEqual(self._serve_and_ask("worker"), (grpc.StatusCode.UNAVAILABLE, 0))
        self.assertIn("flatshard certs renew", self.message)

    def test_a_server_name_given_is_the_name_checked(self) -> None:
        # The name the user gives replaces the role's: here a host both carry.
        self.assertEqual(self._serve_and_ask("worker", server_name="localhost"), (None, 1))
        # From the environment too, with the other FLATSHARD_TLS_* variables.
        environment = {"FLATSHARD_TLS_CA": os.path.join(self.certs, "ca.pem"),
                       "FLATSHARD_TLS_CERT": os.path.join(self.certs, "admin.pem"),
                       "FLATSHARD_TLS_KEY": os.path.join(self.certs, "admin-key.pem"),
                       "FLATSHARD_TLS_SERVER_NAME": "localhost"}
        with mock.patch.dict(os.environ, environment):
            self.assertEqual(self._serve_and_ask("worker", ca=""), (None, 1))
        with mock.patch.dict(os.environ, {**environment, "FLATSHARD_TLS_SERVER_NAME": ""}):
            self.assertEqual(self._serve_and_ask("worker", ca=""),
                             (grpc.StatusCode.UNAVAILABLE, 0))


if __name__ == "__main__":
    unittest.main()
