"""Starts `flatshard up` for a Python test and stops it, leaving nothing behind."""
from __future__ import annotations

import os
import signal
import subprocess
import time
import unittest
from typing import List


class LocalCluster:
    """A coordinator and N worker daemons (real processes) via `flatshard up`."""

    def __init__(self, bin_dir: str, work: str, workers: int = 4, extra: List[str] = (),
                 data_dir: str = "") -> None:
        os.makedirs(work, exist_ok=True)
        self.work = work
        self.checkpoint_dir = os.path.join(work, "ckpt")
        address_file = os.path.join(work, "coordinator")
        if os.path.exists(address_file):
            os.remove(address_file)
        self.log_path = os.path.join(work, "up.log")
        env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                [os.path.join(bin_dir, "flatshard"), "up", "--workers", str(workers),
                 "--listen", "127.0.0.1:0", "--address-file", address_file,
                 "--checkpoint-dir", self.checkpoint_dir, "--data-dir", data_dir or work, *extra],
                stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        # `up` writes the address file once every worker registered; bounded.
        deadline = time.monotonic() + 120
        while not (os.path.exists(address_file) and os.path.getsize(address_file) > 0):
            if self.process.poll() is not None:
                raise RuntimeError(f"flatshard up exited {self.process.returncode}:\n{self.log()}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"flatshard up did not come up in 120 s:\n{self.log()}")
            time.sleep(0.05)
        with open(address_file) as f:
            self.address = f.read().strip()
        self.security_dir = os.path.join(self.checkpoint_dir, ".security")

    def log(self) -> str:
        with open(self.log_path, errors="replace") as f:
            return f.read()[-4000:]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()


class ClusterTestCase(unittest.TestCase):
    """Tests sharing one plaintext local cluster (BIN and WORK set by the
    subclass's module), each starting without a job."""

    BIN = ""
    WORK = ""
    WORKERS = 4

    @classmethod
    def setUpClass(cls) -> None:
        import flatshard  # the venv's package; this module is imported by its tests only

        cls.local = LocalCluster(cls.BIN, os.path.join(cls.WORK, cls.__name__), cls.WORKERS)
        cls.cluster = flatshard.Cluster(cls.local.address)

    @classmethod
    def tearDownClass(cls) -> None:
        cls.cluster.close()
        cls.local.stop()

    def tearDown(self) -> None:
        for job in self.cluster.jobs():
            self.cluster.job(job.name).delete()
