"""The retriever service as a child process, for a training run or a test that needs one.

``RetrieverProcess(corpus, "bm25")`` runs ``python -m posttrain.cli serve-retriever`` with this
interpreter on 127.0.0.1 (a free port unless one is given), its stdout and stderr going to a log
file (``log_path``, or ``retriever.log`` in a fresh temporary directory), and returns once
``/health`` answers ok, with ``.url`` set. If the process exits first, or is not healthy within
``startup_timeout_s`` (building a dense index of a large corpus takes minutes the first time), it
is stopped and a ``RetrieverError`` carries the end of its log. ``stop()`` sends SIGTERM, then
SIGKILL after a few seconds; it is also called on interpreter exit and by the context manager. A
temporary log directory is removed by a clean stop, and kept when the service failed to start or had
died (an error names its log).

``token`` is handed to the child in ``POSTTRAIN_RETRIEVER_TOKEN`` (never on its command line, which
other users can read), and its health probes send it; without one the variable is removed from the
child's environment, so a token exported for some other service does not lock this one.
"""

from __future__ import annotations

import atexit
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import posttrain
from posttrain.agents.retriever.client import RetrieverClient
from posttrain.agents.retriever.types import TOKEN_ENV, RetrieverError

_POLL_S = 0.2
_TERMINATE_GRACE_S = 5.0
_LOG_TAIL_CHARS = 3000


class RetrieverProcess:
    def __init__(self, corpus: str | Path, index_kind: str, *, port: int | None = None, host: str = "127.0.0.1",
                 cache_dir: str | Path | None = None, startup_timeout_s: float = 300,
                 log_path: str | Path | None = None, token: str | None = None, latency_ms: float = 0.0):
        self.port = port or free_port(host)  # 0, like None, means any free port
        self.url = f"http://{host}:{self.port}"
        self.log_path = Path(log_path) if log_path else Path(tempfile.mkdtemp(prefix="posttrain-retriever-")) / "retriever.log"
        # a temporary log goes with a clean stop; kept where an error names it (a failed start, a service that died)
        self._temporary_log = log_path is None
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.command = [sys.executable, "-m", "posttrain.cli", "serve-retriever", "--corpus", str(corpus),
                        "--index", index_kind, "--host", host, "--port", str(self.port)]
        if cache_dir is not None:
            self.command += ["--cache-dir", str(cache_dir)]
        if latency_ms:
            self.command += ["--latency-ms", str(latency_ms)]
        self._log = self.log_path.open("wb")
        self._token = token
        self._process: subprocess.Popen[bytes] | None = subprocess.Popen(
            self.command, stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT, env=_child_env(token))
        atexit.register(self.stop)
        try:
            self._wait_until_healthy(startup_timeout_s)
        except BaseException:
            self._temporary_log = False
            self.stop()
            raise

    def stop(self) -> None:
        """Terminate the service (kill it if it does not stop in a few seconds); safe to call twice."""
        process, self._process = self._process, None
        if process is None:
            return
        atexit.unregister(self.stop)
        died = process.poll() is not None
        if not died:
            process.terminate()
            try:
                process.wait(timeout=_TERMINATE_GRACE_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self._log.close()
        if self._temporary_log and not died:
            shutil.rmtree(self.log_path.parent, ignore_errors=True)

    def exit_code(self) -> int | None:
        """The service's exit code once it has exited (None while it runs, or after :meth:`stop`)."""
        return self._process.poll() if self._process is not None else None

    def __enter__(self) -> RetrieverProcess:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _wait_until_healthy(self, timeout_s: float) -> None:
        give_up_at = time.monotonic() + timeout_s
        with RetrieverClient(self.url, timeout_s=2.0, retries=0, token=self._token) as client:
            while not client.is_healthy():
                exit_code = self._process.poll() if self._process else None
                if exit_code is not None:
                    raise RetrieverError(f"the retriever process exited with code {exit_code} before it was healthy "
                                         f"({' '.join(self.command)}); the end of its log {self.log_path}:\n{self.log_tail()}")
                if time.monotonic() >= give_up_at:
                    raise RetrieverError(f"the retriever at {self.url} was not healthy {timeout_s:g}s after it started; "
                                         f"raise startup_timeout_s if the index is still building. The end of its log "
                                         f"{self.log_path}:\n{self.log_tail()}")
                time.sleep(_POLL_S)

    def log_tail(self) -> str:
        """The last few thousand characters of the service's log."""
        text = self.log_path.read_bytes()[-_LOG_TAIL_CHARS:].decode("utf-8", errors="replace")
        return text or "(the log is empty)"


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that nothing listens on right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


def _child_env(token: str | None) -> dict[str, str]:
    env = dict(os.environ)
    env.pop(TOKEN_ENV, None)
    if token:
        env[TOKEN_ENV] = token
    env["PYTHONUNBUFFERED"] = "1"  # the startup line and errors reach the log at once
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TRANSFORMERS_OFFLINE", "1")
    # The child imports posttrain from the same tree as this process, installed or not.
    source_root = str(Path(posttrain.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [source_root, env.get("PYTHONPATH")]))
    return env
