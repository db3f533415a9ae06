"""Runs the real ringpostd for the Python suite and the Python client's benchmark: on free ports,
from a data directory of its own, with Google Cloud Pub/Sub's gRPC API on, so that Google's
client reaches it through PUBSUB_EMULATOR_HOST exactly as it would reach the emulator."""

import os
import pathlib
import shutil
import signal
import subprocess
import tempfile
import time

# How long ringpostd may take to write its ready file (a debug build, beside other tests).
START_TIMEOUT_SECONDS = 60
# Where the daemons' directories go: a real filesystem, not tmpfs, so O_DIRECT works as in
# production (the Rust harness uses the same parent).
TEMPORARY_PARENT = pathlib.Path("/var/tmp/ringpost-tests")
# The tail of the daemon's log that a failure shows.
LOG_TAIL_BYTES = 8000
REPOSITORY = pathlib.Path(__file__).resolve().parents[2]


def binary_path():
    """The ringpostd to run: $RINGPOSTD (the Rust test sets it), else the debug build."""
    path = pathlib.Path(os.environ.get("RINGPOSTD", REPOSITORY / "target" / "debug" / "ringpostd"))
    if not path.exists():
        raise RuntimeError(f"{path} does not exist: build it (cargo build -p ringpost-daemon) or set RINGPOSTD")
    return path


class Daemon:
    """One ringpostd process. `start` picks a free gRPC port the first time; `restart` keeps it,
    and the data directory, so that a client reconnects to the same address and finds its data."""

    def __init__(self, label, extra_args=(), http_listen="off"):
        TEMPORARY_PARENT.mkdir(parents=True, exist_ok=True)
        self.http_listen = http_listen
        self.directory = pathlib.Path(tempfile.mkdtemp(prefix=f"python-{label}-", dir=TEMPORARY_PARENT))
        self.data_directory = self.directory / "data"
        self.ready_file = self.directory / "ready"
        self.log_path = self.directory / "ringpostd.log"
        self.extra_args = list(extra_args)
        self.grpc_address = None
        self.router_address = None
        self.process = None

    def start(self):
        if self.ready_file.exists():
            self.ready_file.unlink()
        grpc_listen = self.grpc_address or "127.0.0.1:0"
        command = [
            str(binary_path()),
            "--listen", "127.0.0.1:0",
            "--grpc-listen", grpc_listen,
            # Suites run beside each other: no monitoring endpoint on its one default port,
            # unless a test names a free one.
            "--http-listen", self.http_listen,
            "--shards", "2",
            "--no-pin",
            "--data-dir", str(self.data_directory),
            "--ready-file", str(self.ready_file),
            *self.extra_args,
        ]
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log)
        self._wait_until_ready()
        return self

    def _wait_until_ready(self):
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        while True:
            lines = self.ready_file.read_text().splitlines() if self.ready_file.exists() else []
            grpc = [line.split(" ", 1)[1].strip() for line in lines if line.startswith("grpc ")]
            if grpc:
                self.router_address = lines[0].strip()
                self.grpc_address = grpc[0]
                return
            status = self.process.poll()
            if status is not None:
                raise RuntimeError(f"ringpostd exited with {status} while starting; log:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"ringpostd did not start in {START_TIMEOUT_SECONDS} s; log:\n{self.log_tail()}")
            time.sleep(0.02)

    def kill(self):
        """SIGKILL: no chance to flush anything."""
        if self.process is not None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()
            self.process = None

    def restart(self):
        self.kill()
        return self.start()

    def stop(self):
        """SIGTERM, then SIGKILL if it does not exit in time."""
        if self.process is None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.process = None

    def remove(self):
        self.stop()
        shutil.rmtree(self.directory, ignore_errors=True)

    @property
    def pid(self):
        return self.process.pid if self.process is not None else None

    def log_tail(self):
        try:
            return self.log_path.read_bytes()[-LOG_TAIL_BYTES:].decode(errors="replace")
        except OSError as error:
            return f"(no log: {error})"


def cpu_seconds(pid):
    """User plus system CPU time a process has used, from /proc/<pid>/stat."""
    fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    # After the command's closing parenthesis, utime and stime are the 12th and 13th fields.
    ticks = int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")
