"""Running a model's Python program: in a bubblewrap sandbox where ``bwrap`` works, else with limits only.

**Under bubblewrap** (``bwrap``, the ``bubblewrap`` package, 0.8 or newer) the program runs in new mount,
pid, network, IPC and UTS namespaces (cgroup too where the kernel allows) and a session of its own, and sees:

- read-only: ``/usr`` (with ``/bin``, ``/lib``, ``/lib64``, ... as on the host), the dynamic loader's files of
  ``/etc``, and the Python installation that runs posttrain (its prefix and, for a virtual environment, the
  environment, so installed packages import);
- writable: ``/tmp``, an empty tmpfs of 64 MiB, gone when it ends, where ``/tmp/work`` (empty) is its working
  directory, ``$HOME`` and ``$TMPDIR`` (a Python installation under the host's ``/tmp`` shows in it, read-only);
- its own ``/proc`` (its processes only) and a minimal ``/dev``; nothing else of the host's file system (no
  home directory, no checkout, no host ``/tmp``), no network but its own loopback, no host process.

Limits: ``setrlimit`` CPU seconds, 1 GiB of address space and 1 MiB per written file per process; at most
``MAX_TASKS`` processes and threads; a wall-clock timeout; output read up to ``MAX_OUTPUT_BYTES``, then the
program is stopped. However it ends, ``bwrap`` is killed and with it (``--die-with-parent``) the init of the
program's pid namespace, and the kernel kills every process left in that namespace: a daemon that left its
session ends with the call, and with the process that made the call.

The task limit is ``RLIMIT_NPROC``, which the kernel never applies to uid 0, in any user namespace. So as root
the sandbox is built without a user namespace and, before the program starts, drops to a fresh uid (random,
2**30 to 2**31): the limit then counts that program's tasks only, and it owns no host file and may signal no
host process. As another user, bwrap builds a user namespace and the limit is the user's running tasks plus
``MAX_TASKS`` (the kernel counts all of a user's tasks).

Not isolated even so: the kernel (every system call is allowed; there is no seccomp filter), memory as a whole
(1 GiB per process, not per program), the CPU (shared with everything else), and what the read-only parts show
(the installed packages, ``/proc``'s system-wide files such as ``/proc/cpuinfo``).

**Without a working bwrap** the program runs in an empty temporary directory with the same limits (the task
limit only for a user other than root), in a new network namespace where ``unshare --net --map-root-user``
works, and it can read and write what its user can. A warning says so once per process.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import resource
import secrets
import selectors
import shutil
import subprocess
import sys
import tempfile
import time

from posttrain.deadlines import kill_group

logger = logging.getLogger(__name__)

SCRATCH = "/tmp/work"  # the program's working directory, $HOME and $TMPDIR: empty, in the sandbox's own /tmp
SCRATCH_BYTES = 64 << 20
MAX_TASKS = 32
MAX_OUTPUT_BYTES = 1 << 20
INSTALL_HINT = "install bubblewrap (apt-get install bubblewrap, or dnf install bubblewrap) to run it in a sandbox"
# Runs as root inside the sandbox, with only CAP_SETUID and CAP_SETGID: drop to the fresh uid, then run the program.
_DROP_TO_UID = (
    "import os, sys\nuid = int(sys.argv[1])\nos.setgroups([])\nos.setresgid(uid, uid, uid)\nos.setresuid(uid, uid, uid)\n"
    "os.execv(sys.argv[2], [sys.argv[2], '-I', '-c', sys.argv[3]])"
)


@dataclasses.dataclass(frozen=True)
class Finished:
    """How a program ended: its output (what was read before it was stopped: about ``MAX_OUTPUT_BYTES`` at most),
    its exit code (``None`` when it was stopped), why it was stopped, if it was, and whether its network was cut."""

    stdout: bytes
    stderr: bytes
    returncode: int | None
    timed_out: bool = False
    output_cut: bool = False
    network_cut: bool = True


def run_python(code: str, timeout_s: float) -> Finished:
    """Run ``python -I -c code`` under bubblewrap where it works, else with limits only (warned once)."""
    problem = bwrap_problem()
    if problem is None:
        return run_limited(bwrap_command(code, _fresh_uid() if os.geteuid() == 0 else None), timeout_s, cwd="/")
    _warn_once(problem)
    network_cut = can_cut_network()
    command = [sys.executable, "-I", "-c", code]
    if network_cut:
        command = ["unshare", "--net", "--map-root-user", *command]
    with tempfile.TemporaryDirectory(prefix="posttrain-python-") as directory:
        finished = run_limited(command, timeout_s, cwd=directory, env={"PATH": "/usr/bin:/bin", "HOME": directory})
    return dataclasses.replace(finished, network_cut=network_cut)


def bwrap_command(code: str, sandbox_uid: int | None) -> list[str]:
    """The ``bwrap`` command line that runs ``code``; as root, ``sandbox_uid`` is the uid it drops to."""
    # the namespaces are listed: --unshare-all would add a user namespace, in which root's fresh uid has no mapping
    command = ["bwrap", "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
               "--die-with-parent", "--new-session", *_file_system(), "--clearenv"]
    for name, value in (("PATH", "/usr/bin:/bin"), ("HOME", SCRATCH), ("TMPDIR", SCRATCH),
                        # a thread pool of one thread per core (numpy's OpenBLAS) would run into the task limit
                        ("OMP_NUM_THREADS", "1"), ("OPENBLAS_NUM_THREADS", "1")):
        command += ["--setenv", name, value]
    if sandbox_uid is None:  # not root: a user namespace, where the program is the same user
        return [*command, "--unshare-user", "--", sys.executable, "-I", "-c", code]
    return [*command, "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "--",
            sys.executable, "-I", "-c", _DROP_TO_UID, str(sandbox_uid), sys.executable, code]


def _file_system() -> list[str]:
    """Mounts: the system and the Python installation read-only, a tmpfs scratch dir, its own /proc and /dev."""
    args = ["--ro-bind", "/usr", "/usr"]
    for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        path = f"/{name}"
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    for path in ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/localtime", "/etc/alternatives"):
        args += ["--ro-bind-try", path, path]
    # the scratch tmpfs before the installation: one under /tmp (a virtual environment in a clone there) is
    # bound inside it, read-only
    args += ["--perms", "1777", "--size", str(SCRATCH_BYTES), "--tmpfs", "/tmp", "--perms", "1777", "--dir", SCRATCH]
    made: set[str] = {"/tmp"}
    for prefix in _python_prefixes():
        for parent in _parents(prefix):
            if parent not in made:  # bwrap would make them 0700, which the fresh uid could not enter
                args += ["--perms", "0755", "--dir", parent]
                made.add(parent)
        args += ["--ro-bind", prefix, prefix]
    return [*args, "--proc", "/proc", "--dev", "/dev", "--chdir", SCRATCH]


def _python_prefixes() -> list[str]:
    """The directories the interpreter runs from, outside /usr, none inside another (parents first)."""
    prefixes: list[str] = []
    for path in sorted({sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}):
        if path == "/usr" or path.startswith("/usr/") or any(path.startswith(p.rstrip("/") + "/") for p in prefixes):
            continue
        prefixes.append(path)
    return prefixes


def _parents(path: str) -> list[str]:
    parts = path.strip("/").split("/")[:-1]
    return ["/" + "/".join(parts[: i + 1]) for i in range(len(parts))]


def _fresh_uid() -> int:
    return (1 << 30) + secrets.randbelow(1 << 30)


def run_limited(command: list[str], timeout_s: float, *, cwd: str, env: dict[str, str] | None = None) -> Finished:
    """Run ``command`` in a session of its own with the rlimits, reading its output up to ``MAX_OUTPUT_BYTES``
    until it exits or ``timeout_s`` passes; then kill its process group, whatever happened."""
    deadline = time.monotonic() + timeout_s
    process = subprocess.Popen(command, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, preexec_fn=_limits(timeout_s, _task_limit()))
    try:
        stdout, stderr, timed_out, output_cut = _read_capped(process, deadline)
        if not (timed_out or output_cut):
            try:
                process.wait(timeout=max(deadline - time.monotonic(), 0.01))
            except subprocess.TimeoutExpired:  # it closed its output and went on running
                timed_out = True
    finally:
        kill_group(process.pid)  # its session's, whatever is left of it (unreaped, its group id cannot have been reused)
        process.wait()
        process.stdout.close()
        process.stderr.close()
    stopped = timed_out or output_cut
    return Finished(stdout, stderr, None if stopped else process.returncode, timed_out, output_cut)


def _read_capped(process: subprocess.Popen, deadline: float) -> tuple[bytes, bytes, bool, bool]:
    """stdout and stderr until both close; stops early at the deadline or past ``MAX_OUTPUT_BYTES`` in all."""
    chunks: dict[int, list[bytes]] = {process.stdout.fileno(): [], process.stderr.fileno(): []}
    total, timed_out, output_cut = 0, False, False
    with selectors.DefaultSelector() as selector:
        for fd in chunks:
            selector.register(fd, selectors.EVENT_READ)
        while selector.get_map() and not (timed_out or output_cut):
            ready = selector.select(max(deadline - time.monotonic(), 0))
            timed_out = not ready and time.monotonic() >= deadline
            for key, _ in ready:
                data = os.read(key.fd, 65536)
                if not data:
                    selector.unregister(key.fd)
                chunks[key.fd].append(data)
                total += len(data)
                output_cut = output_cut or total > MAX_OUTPUT_BYTES
    out, err = (b"".join(parts) for parts in chunks.values())
    return out, err, timed_out, output_cut


def _limits(cpu_s: float, tasks: int):
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_CPU, (int(cpu_s) + 1, int(cpu_s) + 1))
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))        # 1 GiB of address space
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))     # 1 MiB per written file
        resource.setrlimit(resource.RLIMIT_NPROC, (tasks, tasks))
        os.setsid()  # its own session: the final kill reaches it and nothing else
    return apply


def _task_limit() -> int:
    """``MAX_TASKS`` for root (whose program runs as a fresh uid), else the user's running tasks plus that."""
    uid = os.getuid()
    if uid == 0:
        return MAX_TASKS
    running = 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/status") as handle:
                status = handle.read()
        except OSError:  # it ended meanwhile
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        if fields and int(fields["Uid"].split()[0]) == uid:
            running += int(fields["Threads"])
    hard = resource.getrlimit(resource.RLIMIT_NPROC)[1]
    return running + MAX_TASKS if hard == resource.RLIM_INFINITY else min(running + MAX_TASKS, hard)


@functools.cache
def bwrap_problem() -> str | None:
    """Why the sandbox cannot be used here (bwrap missing, or failing to run the interpreter), or None if it can.
    Tried once per process."""
    if shutil.which("bwrap") is None:
        return "bwrap is not installed"
    tried = run_limited(bwrap_command("print('ok')", _fresh_uid() if os.geteuid() == 0 else None), 20.0, cwd="/")
    if tried.returncode == 0 and tried.stdout.strip() == b"ok":
        return None
    said = (tried.stderr or tried.stdout).decode(errors="replace").strip().splitlines()
    return f"bwrap could not run Python ({said[-1] if said else f'exit code {tried.returncode}'})"


_warned = False


def _warn_once(problem: str) -> None:
    global _warned
    if not _warned:
        _warned = True
        logger.warning("posttrain.tools:python runs code without isolation: %s; %s (docs/tools.md)", problem, INSTALL_HINT)


@functools.cache
def can_cut_network() -> bool:
    """Whether ``unshare --net --map-root-user`` works here (the network cut without bubblewrap)."""
    tool = shutil.which("unshare")
    return tool is not None and subprocess.run(
        [tool, "--net", "--map-root-user", "true"], check=False, capture_output=True, timeout=10,
    ).returncode == 0
