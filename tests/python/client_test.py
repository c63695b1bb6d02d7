"""The Python client against real local clusters (issue #13 §1).

    client_test.py BIN_DIR SOURCE_DIR WORK_DIR     (run by run_in_venv.sh in the test venv)

The cluster tests talk to a coordinator and worker daemons started by `flatshard up`:
plaintext for the job lifecycle, mutual TLS with tokens for the security paths.
The client's own checks on what a server sends (a sharded checkpoint's pieces,
a summon stream's chunks) are tested offline and against a crafted gRPC server.
"""
from __future__ import annotations

import json
import math
import os
import shutil
import struct
import subprocess
import sys
import unittest
from concurrent import futures
from unittest import mock

import grpc
import numpy as np

import flatshard
from flatshard import checkpoint
from flatshard.v1 import common_pb2, job_pb2, job_pb2_grpc
from local_cluster import ClusterTestCase, LocalCluster

BIN, SOURCE, WORK = sys.argv[1:4]
del sys.argv[1:4]
MLP_JOB = os.path.join(SOURCE, "examples", "mlp-job.yaml")


def small_job(name: str = "py-dict", world_size: int = 2) -> dict:
    """A job as a dict, the model inline."""
    return {
        "name": name, "world_size": world_size, "wrap_policy": "module-type:Residual",
        "model": {"root": {"type": "Sequential", "children": [
            {"name": "input", "type": "Linear", "in_features": 8, "out_features": 16},
            {"name": "blocks", "repeat": 2, "template": {"type": "Residual", "children": [
                {"name": "fc", "type": "Linear", "in_features": 16, "out_features": 16},
                {"name": "act", "type": "GELU"}]}},
            {"name": "output", "type": "Linear", "in_features": 16, "out_features": 4}]}},
        "data": {"kind": "regression", "global_batch_size": 8},
        "optimizer": {"kind": "adamw", "lr": 0.01},
    }


class PlaintextClusterTest(ClusterTestCase):
    BIN, WORK = BIN, WORK

    def test_lifecycle_train_checkpoint_summon_load(self) -> None:
        self.assertEqual(self.cluster.jobs(), [])
        workers = self.cluster.workers()
        self.assertEqual(len(workers), 4)
        self.assertTrue(all(w.device == "cpu" for w in workers), workers)

        job = self.cluster.create_job(MLP_JOB)
        self.assertEqual(job.name, "mlp-demo")
        status = job.status()
        self.assertEqual((status.state, status.step, status.world_size), ("READY", 0, 4))
        self.assertEqual([j.name for j in self.cluster.jobs()], ["mlp-demo"])
        self.assertEqual(sorted(w.rank for w in self.cluster.workers("mlp-demo")), [0, 1, 2, 3])

        steps = list(job.train(3))
        self.assertEqual([s.step for s in steps], [1, 2, 3])
        for s in steps:
            self.assertTrue(math.isfinite(s.loss) and s.loss > 0, s)
            self.assertEqual(len(s.rank_losses), 4)
            self.assertAlmostEqual(s.loss, sum(s.rank_losses) / 4, places=5)
            self.assertGreater(s.samples_per_second, 0)
            self.assertEqual(s.target_step, 3)

        plan = job.plan()
        self.assertEqual(len(plan["units"]), status.units)

        full = job.save_checkpoint("py-full", type="full")
        self.assertEqual(full.step, 3)
        sharded = job.save_checkpoint("py-sharded", type="sharded")
        self.assertEqual(sharded.step, 3)
        names = {c.name: c for c in job.checkpoints()}
        self.assertEqual(names["py-full"].state_dict_type, "FULL_STATE_DICT")
        self.assertEqual(names["py-sharded"].state_dict_type, "SHARDED_STATE_DICT")
        self.assertTrue(names["py-sharded"].latest)
        self.assertTrue(names["py-sharded"].recovery_target)
        self.assertFalse(names["py-full"].recovery_target)
        self.assertLess(names["py-full"].created_unix_micros, names["py-sharded"].created_unix_micros)
        self.assertEqual(names["py-full"].converted_from, "")
        # A copy `flatshard ckpt consolidate` writes into the job's directory
        # names its source, and has its time.
        ckpt_root = os.path.join(self.local.checkpoint_dir, "mlp-demo")
        subprocess.run([os.path.join(BIN, "flatshard"), "ckpt", "consolidate",
                        os.path.join(ckpt_root, "py-sharded"), "-o",
                        os.path.join(ckpt_root, "py-sharded-full")],
                       check=True, capture_output=True, timeout=120)
        names = {c.name: c for c in job.checkpoints()}
        self.assertEqual(names["py-sharded-full"].converted_from, "py-sharded")
        self.assertEqual(names["py-sharded-full"].created_unix_micros,
                         names["py-sharded"].created_unix_micros)
        self.assertTrue(names["py-sharded"].recovery_target)
        # After a load of the older one, a recovery restores it, not the latest.
        job.load_checkpoint("py-full")
        names = {c.name: c for c in job.checkpoints()}
        self.assertTrue(names["py-full"].recovery_target)
        self.assertTrue(names["py-sharded"].latest)
        self.assertFalse(names["py-sharded"].recovery_target)

        weights = job.summon()
        self.assertIn("blocks.0.fc1.weight", weights)
        self.assertEqual(weights["blocks.0.fc1.weight"].shape, (512, 256))
        ckpt_dir = os.path.join(self.local.checkpoint_dir, "mlp-demo")
        for loaded in (checkpoint.load_full(os.path.join(ckpt_dir, "py-full")),
                       checkpoint.load(os.path.join(ckpt_dir, "py-sharded"))):
            self.assertEqual(loaded.step, 3)
            self.assertEqual(loaded.model.keys(), weights.keys())
            for fqn, value in weights.items():
                np.testing.assert_array_equal(loaded.model[fqn], value, err_msg=fqn)
            # AdamW: exp_avg, exp_avg_sq per parameter, and its step count.
            self.assertEqual(loaded.optim["blocks.0.fc1.weight.exp_avg"].shape, (512, 256))
            self.assertEqual(float(loaded.optim["blocks.0.fc1.weight.step"]), 3.0)

        list(job.train(2))
        self.assertEqual(job.status().step, 5)
        self.assertFalse(np.array_equal(job.summon()["output.weight"], weights["output.weight"]))
        self.assertEqual(job.load_checkpoint("py-full").step, 3)
        self.assertEqual(job.status().step, 3)
        np.testing.assert_array_equal(job.summon()["output.weight"], weights["output.weight"])

        job.delete_checkpoint("py-sharded")
        self.assertNotIn("py-sharded", {c.name for c in job.checkpoints()})
        states = []
        for event in job.watch(timeout=5):
            states.append(event.state)
            if event.state == "IDLE":
                break
        self.assertIn("READY", states)

    def test_training_outlives_the_loop_and_attach_follows_it(self) -> None:
        job = self.cluster.create_job(small_job())
        # Leave the loop: the training goes on. Far more steps than the test
        # runs, so that attaching cannot race its end; a stop from inside the
        # attached loop ends it after the step in flight.
        first = next(iter(job.train(100000)))
        self.assertEqual(first.step, 1)
        followed = []
        for result in job.attach():
            followed.append(result.step)
            if len(followed) == 2:
                self.assertTrue(job.stop().was_running)
        self.assertGreaterEqual(len(followed), 2, followed)
        self.assertGreater(followed[0], 1, followed)  # from the current step on
        self.assertEqual(followed, list(range(followed[0], followed[-1] + 1)))
        end = followed[-1]
        self.assertEqual(job.status().step, end)  # it streamed the step in flight
        self.assertFalse(job.status().training.running)
        self.assertIn("(python)", job.status().training.started_by)
        with self.assertRaises(flatshard.FlatshardError) as caught:
            job.stop()
        self.assertEqual(caught.exception.code, grpc.StatusCode.FAILED_PRECONDITION)
        self.assertIn("not training", caught.exception.message)
        # Detached, as a plain statement: it starts at once and runs on.
        job.train(4, detach=True)
        for event in job.watch(timeout=120):  # DEADLINE_EXCEEDED if it never ends
            if event.state == "IDLE" and event.message == f"training trained to step {end + 4}":
                break
        self.assertEqual(job.status().step, end + 4)
        with self.assertRaises(flatshard.FlatshardError) as caught:
            job.train(0, detach=True)  # refused at the call, not at a first next()
        self.assertEqual(caught.exception.code, grpc.StatusCode.INVALID_ARGUMENT)

    def test_plan_of_a_dict_and_of_a_file(self) -> None:
        plan = self.cluster.plan(small_job(world_size=4))
        self.assertEqual(plan["format"], "flatshard.plan/v1")
        self.assertEqual(plan["config"]["world_size"], 4)
        self.assertEqual(len(plan["units"]), 3)  # two Residual blocks and the root
        self.assertEqual(self.cluster.plan(MLP_JOB)["model"], "mlp")

    def test_errors_carry_the_code_and_the_servers_words(self) -> None:
        bad = os.path.join(WORK, "bad-job.yaml")
        with open(bad, "w") as f:
            f.write("name: bad\nmodel: mlp.yaml\nwrold_size: 4\n")
        shutil.copy(os.path.join(SOURCE, "examples", "mlp.yaml"), WORK)
        with self.assertRaises(flatshard.FlatshardError) as caught:
            self.cluster.create_job(bad)
        self.assertEqual(caught.exception.code, grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn(f"{bad}:3: wrold_size: unknown field", caught.exception.message)
        self.assertEqual(caught.exception.call, "CreateJob")

        broken_model = small_job("py-bad-model")
        broken_model["model"]["root"]["children"][0]["in_features"] = -3
        with self.assertRaises(flatshard.FlatshardError) as caught:
            self.cluster.create_job(broken_model)
        self.assertEqual(caught.exception.code, grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("in_features", caught.exception.message)

        uneven = small_job("py-uneven", world_size=3)
        with self.assertRaises(flatshard.FlatshardError) as caught:
            self.cluster.plan(uneven)
        self.assertIn("global_batch_size", caught.exception.message)

        with self.assertRaises(flatshard.FlatshardError) as caught:
            self.cluster.job("ghost")
        self.assertEqual(caught.exception.code, grpc.StatusCode.NOT_FOUND)

        job = self.cluster.create_job(small_job())
        with self.assertRaises(ValueError):
            job.save_checkpoint("x", type="everything")
        with self.assertRaises(flatshard.FlatshardError) as caught:
            job.save_checkpoint("../escape")
        self.assertEqual(caught.exception.code, grpc.StatusCode.INVALID_ARGUMENT)
        with self.assertRaises(flatshard.FlatshardError) as caught:
            job.load_checkpoint("never-saved")
        self.assertEqual(caught.exception.code, grpc.StatusCode.NOT_FOUND)
        with self.assertRaises(flatshard.FlatshardError) as caught:
            list(job.train(0))
        self.assertEqual(caught.exception.code, grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("train.steps", caught.exception.message)

        with self.assertRaises(FileNotFoundError):
            self.cluster.create_job(dict(small_job("py-missing"), model="no-such-model.yaml"))
        with self.assertRaises(FileNotFoundError):
            checkpoint.load(os.path.join(WORK, "no-checkpoint-here"))

    def test_unreachable_coordinator_is_unavailable(self) -> None:
        with flatshard.Cluster("127.0.0.1:1", timeout=2) as nowhere:
            with self.assertRaises(flatshard.FlatshardError) as caught:
                nowhere.workers()
        self.assertIn(caught.exception.code,
                      (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED))


def write_safetensors(path: str, tensors: dict, metadata: dict) -> int:
    """A float32 safetensors file, as the reference format lays it out."""
    header: dict = {"__metadata__": metadata} if metadata else {}
    blobs, offset = [], 0
    for name, value in tensors.items():
        blob = np.ascontiguousarray(value, dtype=np.float32).tobytes()
        header[name] = {"dtype": "F32", "shape": list(value.shape),
                        "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    encoded = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(encoded)) + encoded + b"".join(blobs))
    return os.path.getsize(path)


class OfflineShardedCheckpointTest(unittest.TestCase):
    """checkpoint.load_sharded on files written here: format version 2's
    element pieces (any tiling, rows cut anywhere), version 1's row chunks, and
    pieces that do not tile a tensor refused."""

    WEIGHT = np.arange(6, dtype=np.float32).reshape(3, 2)

    def write(self, name: str, version: int, pieces: list) -> str:
        """pieces[r]: (begin, end) of the weight's 6 elements in rank r's files."""
        path = os.path.join(WORK, "offline", name)
        shutil.rmtree(path, ignore_errors=True)
        os.makedirs(path)
        files, world = [], len(pieces)
        for rank, (begin, end) in enumerate(pieces):
            flat = self.WEIGHT.reshape(-1)[begin:end]
            for kind, tensor in (("model", "w"), ("optim", "w.exp_avg")):
                value = flat + (0 if kind == "model" else 100)
                tensors = {tensor: value if version == 2 else value.reshape(-1, 2)}
                metadata = {"element_offsets": json.dumps({tensor: begin})} if version == 2 else {}
                if kind == "optim":
                    tensors["w.step"] = np.array(3.0, dtype=np.float32)
                file = f"{kind}-rank{rank:05d}-of-{world:05d}.safetensors"
                files.append({"name": file, "rank": rank,
                              "bytes": write_safetensors(os.path.join(path, file), tensors,
                                                         metadata)})
        manifest = {"format_version": version, "state_dict_type": "SHARDED_STATE_DICT",
                    "world_size": world, "step": 3, "files": files,
                    "params": {"w": {"dtype": "float32", "shape": [3, 2]}},
                    "optimizer_states": ["exp_avg"]}
        with open(os.path.join(path, "manifest.json"), "w", encoding="utf-8") as f:
            json.dump(manifest, f)
        return path

    def test_pieces_and_row_chunks_reassemble_the_same_tensors(self) -> None:
        for name, version, pieces in (("v2-cut-rows", 2, [(3, 6), (0, 3)]),
                                      ("v2-empty-rank", 2, [(0, 6), (6, 6)]),
                                      ("v1-rows", 1, [(0, 4), (4, 6)])):
            with self.subTest(name):
                loaded = checkpoint.load(self.write(name, version, pieces))
                np.testing.assert_array_equal(loaded.model["w"], self.WEIGHT)
                np.testing.assert_array_equal(loaded.optim["w.exp_avg"], self.WEIGHT + 100)
                self.assertEqual(float(loaded.optim["w.step"]), 3.0)

    def test_pieces_that_do_not_tile_the_tensor_are_refused(self) -> None:
        for name, pieces, says in (("gap", [(0, 2), (3, 6)], "do not tile"),
                                   ("overlap", [(0, 4), (3, 6)], "do not tile"),
                                   ("short", [(0, 2), (2, 5)], "hold 5 of its 6")):
            with self.subTest(name):
                with self.assertRaisesRegex(ValueError, says):
                    checkpoint.load(self.write(name, 2, pieces))


def _serve(servicer: job_pb2_grpc.JobServiceServicer) -> tuple:
    """A real gRPC server on 127.0.0.1 answering with `servicer`, and its address."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    job_pb2_grpc.add_JobServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, f"127.0.0.1:{port}"


class SummonStreamCheckTest(unittest.TestCase):
    """`Job.summon` against a real gRPC server that streams crafted chunks: the
    client's own checks on a stream a worker or a proxy got wrong (the CLI's
    `summon` makes the same ones)."""

    WEIGHT = np.arange(6, dtype=np.float32).reshape(3, 2)

    class _Server(job_pb2_grpc.JobServiceServicer):
        def __init__(self) -> None:
            self.chunks: list = []

        def SummonFullParams(self, request, context):  # noqa: N802 (the RPC's name)
            yield from self.chunks

    @classmethod
    def setUpClass(cls) -> None:
        cls.servicer = cls._Server()
        cls.server, address = _serve(cls.servicer)
        cls.job = flatshard.Job(flatshard.Cluster(address), "crafted")

    @classmethod
    def tearDownClass(cls) -> None:
        cls.server.stop(grace=None).wait()

    def chunk(self, begin: int, end: int, total: int = 24) -> job_pb2.TensorChunk:
        data = self.WEIGHT.tobytes()
        return job_pb2.TensorChunk(fqn="w", dtype=common_pb2.DTYPE_FLOAT32, shape=[3, 2],
                                   offset_bytes=begin, total_bytes=total, data=data[begin:end])

    def test_chunks_in_order_assemble_the_tensor(self) -> None:
        self.servicer.chunks = [self.chunk(0, 8), self.chunk(8, 20), self.chunk(20, 24)]
        np.testing.assert_array_equal(self.job.summon()["w"], self.WEIGHT)

    def test_gapped_overlapping_long_and_short_streams_are_data_loss(self) -> None:
        for name, chunks, says in (
                ("gap", [(0, 8), (12, 24)], r"at \[12, 24\) does not follow the 8 bytes"),
                ("overlap", [(0, 12), (8, 24)], r"at \[8, 24\) does not follow the 12 bytes"),
                ("past the end", [(0, 24), (24, 28)], r"does not follow the 24 bytes"),
                ("short", [(0, 8), (8, 20)], r"'w' ended after 20 of its 24 bytes")):
            with self.subTest(name):
                self.servicer.chunks = [self.chunk(b, e) for b, e in chunks]
                if name == "past the end":
                    self.servicer.chunks[1].data = b"\0" * 4
                with self.assertRaisesRegex(flatshard.FlatshardError, says) as caught:
                    self.job.summon()
                self.assertEqual(caught.exception.code, grpc.StatusCode.DATA_LOSS)

    def test_a_dtype_this_client_cannot_read_is_data_loss(self) -> None:
        self.servicer.chunks = [self.chunk(0, 24)]
        self.servicer.chunks[0].dtype = common_pb2.DTYPE_UNSPECIFIED
        with self.assertRaisesRegex(flatshard.FlatshardError, "dtype 0 this client cannot read"):
            self.job.summon()


class ReadRetryTest(unittest.TestCase):
    """The channel retries reads, never writes, that fail UNAVAILABLE (a
    client that outlived a coordinator restart meets the dead connection once),
    against a real gRPC server that fails each call's first attempts."""

    class _Server(job_pb2_grpc.JobServiceServicer):
        def __init__(self) -> None:
            self.failures_left = 0
            self.calls: dict = {}

        def _answer(self, method: str, context, response):
            self.calls[method] = self.calls.get(method, 0) + 1
            if self.failures_left > 0:
                self.failures_left -= 1
                context.abort(grpc.StatusCode.UNAVAILABLE, "Socket closed")
            return response

        def GetJob(self, request, context):  # noqa: N802 (the RPC's name)
            return self._answer("GetJob", context, job_pb2.GetJobResponse(
                job=job_pb2.Job(spec=job_pb2.JobSpec(name=request.name))))

        def DeleteJob(self, request, context):  # noqa: N802
            return self._answer("DeleteJob", context, job_pb2.DeleteJobResponse())

        def WatchEvents(self, request, context):  # noqa: N802
            self.calls["WatchEvents"] = self.calls.get("WatchEvents", 0) + 1
            if self.failures_left > 0:
                self.failures_left -= 1
                context.abort(grpc.StatusCode.UNAVAILABLE, "Socket closed")
            yield from self.events

    @classmethod
    def setUpClass(cls) -> None:
        cls.servicer = cls._Server()
        cls.server, address = _serve(cls.servicer)
        cls.cluster = flatshard.Cluster(address)

    @classmethod
    def tearDownClass(cls) -> None:
        cls.server.stop(grace=None).wait()

    def setUp(self) -> None:
        self.servicer.calls.clear()
        self.servicer.failures_left = 0
        self.servicer.events = []

    def test_a_read_is_retried_past_unavailable(self) -> None:
        self.servicer.failures_left = 2
        self.assertEqual(self.cluster.job("j").name, "j")
        self.assertEqual(self.servicer.calls["GetJob"], 3)

    def test_a_read_gives_up_after_four_attempts(self) -> None:
        self.servicer.failures_left = 10
        with self.assertRaises(flatshard.FlatshardError) as caught:
            self.cluster.job("j")
        self.assertEqual(caught.exception.code, grpc.StatusCode.UNAVAILABLE)
        self.assertEqual(self.servicer.calls["GetJob"], 4)

    def test_a_watch_is_retried_before_its_first_event(self) -> None:
        self.servicer.failures_left = 2
        self.servicer.events = [job_pb2.JobEvent(job="j", state=job_pb2.READY)]
        self.assertEqual(flatshard.Job(self.cluster, "j").wait_until({"READY"}, timeout=30),
                         "READY")
        self.assertEqual(self.servicer.calls["WatchEvents"], 3)

    def test_a_watch_the_server_ends_is_unavailable_not_a_timeout(self) -> None:
        with self.assertRaises(flatshard.FlatshardError) as caught:
            flatshard.Job(self.cluster, "j").wait_until({"READY"}, timeout=30)
        self.assertEqual(caught.exception.code, grpc.StatusCode.UNAVAILABLE)
        self.assertIn("the coordinator ended the watch of job 'j'", caught.exception.message)

    def test_a_write_is_not_retried(self) -> None:
        self.servicer.failures_left = 1
        with self.assertRaises(flatshard.FlatshardError) as caught:
            flatshard.Job(self.cluster, "j").delete()
        self.assertEqual(caught.exception.code, grpc.StatusCode.UNAVAILABLE)
        self.assertEqual(self.servicer.calls["DeleteJob"], 1)


class SecuredClusterTest(unittest.TestCase):
    """`flatshard up --tls`: mutual TLS on every channel, tokens for clients."""

    @classmethod
    def setUpClass(cls) -> None:
        cls.local = LocalCluster(BIN, os.path.join(WORK, "tls"), workers=2, extra=["--tls"])
        d = cls.local.security_dir
        cls.tls = flatshard.TlsConfig(ca=os.path.join(d, "ca.pem"),
                                      cert=os.path.join(d, "admin.pem"),
                                      key=os.path.join(d, "admin-key.pem"))
        with open(os.path.join(d, "admin.token")) as f:
            cls.token = f.read().strip()

    @classmethod
    def tearDownClass(cls) -> None:
        cls.local.stop()

    def test_token_and_client_certificate_are_accepted(self) -> None:
        with flatshard.Cluster(self.local.address, token=self.token, tls=self.tls) as cluster:
            self.assertEqual(len(cluster.workers()), 2)
            job = cluster.create_job(small_job())
            self.assertEqual([s.step for s in job.train(2)], [1, 2])
            self.assertEqual(job.save_checkpoint("secured").step, 2)
            job.delete()

    def test_wrong_token_is_unauthenticated(self) -> None:
        # The admin certificate alone is an admin (docs/security.md); a token
        # that is sent must be valid whatever the certificate.
        with flatshard.Cluster(self.local.address, token="", tls=self.tls) as by_certificate:
            self.assertEqual(len(by_certificate.workers()), 2)
        with flatshard.Cluster(self.local.address, token="not-a-token", tls=self.tls) as cluster:
            with self.assertRaises(flatshard.FlatshardError) as caught:
                cluster.workers()
            self.assertEqual(caught.exception.code, grpc.StatusCode.UNAUTHENTICATED)
        # $FLATSHARD_TOKEN_FILE, which `flatshard up --tls` tells users to export
        # for the CLI, is read the same way: a wrong token in it is refused.
        wrong = os.path.join(WORK, "wrong.token")
        with open(wrong, "w") as f:
            f.write("not-a-token\n")
        with mock.patch.dict(os.environ, {"FLATSHARD_TOKEN_FILE": wrong}):
            os.environ.pop("FLATSHARD_TOKEN", None)
            with flatshard.Cluster(self.local.address, tls=self.tls) as from_file:
                with self.assertRaises(flatshard.FlatshardError) as caught:
                    from_file.workers()
                self.assertEqual(caught.exception.code, grpc.StatusCode.UNAUTHENTICATED)

    def test_plaintext_and_certificateless_clients_are_refused(self) -> None:
        with flatshard.Cluster(self.local.address, token=self.token, timeout=5) as plain:
            with self.assertRaises(flatshard.FlatshardError) as caught:
                plain.workers()
            self.assertEqual(caught.exception.code, grpc.StatusCode.UNAVAILABLE)
        with flatshard.Cluster(self.local.address, token=self.token, timeout=5,
                               tls={"ca": self.tls.ca}) as no_cert:
            with self.assertRaises(flatshard.FlatshardError) as caught:
                no_cert.workers()
            self.assertEqual(caught.exception.code, grpc.StatusCode.UNAVAILABLE)
        with self.assertRaises(ValueError):
            flatshard.Cluster(self.local.address, tls={"ca": self.tls.ca, "cert": self.tls.cert})


if __name__ == "__main__":
    unittest.main(verbosity=2)
