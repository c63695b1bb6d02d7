"""`flatshard up` as a context manager for the observability tests: starts a
local cluster (optionally with Prometheus), reads the addresses it prints,
and stops it with SIGINT on exit, failing if it did not stop cleanly."""
import json
import os
import re
import selectors
import signal
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request


class LocalCluster:
    def __init__(self, bin_dir, args, timeout=180):
        self.bin_dir = bin_dir
        self.args = args
        self.timeout = timeout
        self.lines = []
        self.coordinator = None
        self.coordinator_metrics = None
        self.worker_metrics = []
        self.prometheus = None

    def __enter__(self):
        env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
        self.proc = subprocess.Popen([f"{self.bin_dir}/flatshard", "up", *self.args],
                                     stdout=subprocess.PIPE, env=env)
        try:
            self._read_banner()
        except BaseException:
            self._stop()
            raise
        return self

    def _read_banner(self):
        # Event-driven: each line arrives when `up` prints it; the deadline
        # only bounds a hang. Read the raw pipe: a buffered reader would hold
        # lines that select() no longer reports.
        fd = self.proc.stdout.fileno()
        sel = selectors.DefaultSelector()
        sel.register(fd, selectors.EVENT_READ)
        deadline = time.monotonic() + self.timeout
        pending = b""
        while True:
            while b"\n" in pending:
                raw, pending = pending.split(b"\n", 1)
                if self._take(raw.decode()):
                    self._rest = pending
                    return
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not sel.select(remaining):
                raise TimeoutError("flatshard up printed no 'cluster is up' line:\n" +
                                   "\n".join(self.lines))
            chunk = os.read(fd, 65536)
            if not chunk:
                raise RuntimeError(f"flatshard up exited ({self.proc.wait()}):\n" +
                                   "\n".join(self.lines))
            pending += chunk

    def _take(self, line):
        """Records one line of `up`'s output; True at the last one of its banner."""
        self.lines.append(line)
        if m := re.match(r"coordinator: (\S+)$", line):
            self.coordinator = m.group(1)
        elif m := re.match(r"coordinator metrics: (\S+)$", line):
            self.coordinator_metrics = m.group(1)
        elif m := re.search(r", metrics on (\S+)$", line):
            self.worker_metrics.append(m.group(1))
        elif m := re.match(r"prometheus: (\S+)", line):
            self.prometheus = m.group(1)
        return line.startswith("The cluster is up")

    def flatshard(self, *args, check=True):
        """Runs a `flatshard` client command against this cluster."""
        env = dict(os.environ, FLATSHARD_COORDINATOR=self.coordinator)
        return subprocess.run([f"{self.bin_dir}/flatshard", *args], env=env, check=check,
                              capture_output=True, text=True, timeout=300)

    def _stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        try:
            rest, _ = self.proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rest, _ = self.proc.communicate()
        self.lines.extend((rest or b"").decode(errors="replace").splitlines())
        return self.proc.returncode

    def __exit__(self, exc_type, exc, tb):
        code = self._stop()
        if exc_type is None and code != 0:
            raise AssertionError(f"flatshard up exited {code} (not cleanly):\n" +
                                 "\n".join(self.lines))
        return False


def http_get(url, timeout=10):
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.read().decode()


def prometheus_api(base, path, **params):
    """GET /api/v1/<path>; the `data` of a successful answer."""
    query = urllib.parse.urlencode(params, doseq=True)
    try:
        body = json.loads(http_get(f"{base}/api/v1/{path}?{query}"))
    except urllib.error.HTTPError as e:  # a bad query: 400 with the error in JSON
        body = json.loads(e.read().decode() or "{}")
    if body.get("status") != "success":
        raise AssertionError(f"{path} {params}: {body}")
    return body["data"]
