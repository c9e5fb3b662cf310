"""Hostile programs under the built-in ``python`` tool, each refused or contained by the bubblewrap sandbox
(issue 37): reading the home directory or the checkout, writing outside the scratch dir, the network, a fork
bomb, 100 MB of output, sleeping forever, a child that outlives its parent. And, without bwrap, the fallback
that still runs the code and warns once.

Each sandbox test was seen to fail with its containment taken out of ``sandbox.py`` (binding / instead of the
listed directories; no --unshare-net; no task limit; reading with ``communicate()``; no kill at the
timeout; no --unshare-pid and no --die-with-parent)."""

from __future__ import annotations

import logging
import os
import shutil
import socket
import tempfile
import time
import tracemalloc
import uuid
from pathlib import Path

import pytest

import posttrain
from posttrain.tools import python, sandbox
from tests.optional import missing

CHECKOUT = Path(posttrain.__file__).resolve().parents[1]
PROBLEM = sandbox.bwrap_problem()


@pytest.fixture
def bwrap():
    """The bubblewrap sandbox can start here: or a skip saying why (a failure under CI)."""
    if PROBLEM is not None:
        missing(f"no bubblewrap sandbox here: {PROBLEM}"
                + (f"; {sandbox.INSTALL_HINT}" if shutil.which("bwrap") is None else ""))


needs_bwrap = pytest.mark.usefixtures("bwrap")


@pytest.fixture
def marker() -> str:
    """A string to put in a program's command line, to find its processes on the host afterwards."""
    return f"posttrain-sandbox-test-{uuid.uuid4().hex}"


def processes_with(marker: str, grace_s: float = 2.0) -> list[int]:
    """Host pids whose command line holds ``marker``, once none is left or after ``grace_s``."""
    deadline = time.monotonic() + grace_s
    while True:
        found = []
        for entry in os.scandir("/proc"):
            try:
                if entry.name.isdigit() and marker.encode() in Path(entry.path, "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:  # it ended meanwhile
                continue
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.1)


READ = """
import os
for path in {paths!r}:
    try:
        print(path, "READ", os.listdir(path) if os.path.isdir(path) else open(path).read())
    except OSError as error:
        print(path, "REFUSED", type(error).__name__)
"""


@needs_bwrap
def test_home_and_checkout_files_cannot_be_read():
    """A file in the real home directory, ~/.ssh and the checkout's own files, by absolute path: not there."""
    secret = Path.home() / f".posttrain-sandbox-test-{uuid.uuid4().hex}"
    secret.write_text("hunter2")
    readme, source = CHECKOUT / "README.md", CHECKOUT / "posttrain" / "__init__.py"
    assert readme.is_file() and source.is_file()
    try:
        output = python(READ.format(paths=[str(secret), str(Path.home() / ".ssh"), str(readme), str(source)]))
    finally:
        secret.unlink()
    lines = output.splitlines()
    assert len(lines) == 4 and all(" REFUSED " in line for line in lines), output
    assert "hunter2" not in output and readme.read_text().splitlines()[0] not in output


WRITE = """
import os
for path in {paths!r}:
    try:
        with open(path, "w") as handle:
            handle.write("written")
        print(path, "WRITTEN")
    except OSError as error:
        print(path, "REFUSED", type(error).__name__)
print(sorted(os.listdir(".")))
"""


@needs_bwrap
def test_writes_outside_the_scratch_dir_never_reach_the_host(marker):
    """Writes to the host's /tmp, the checkout and the home directory are refused or land in the sandbox's own
    tmpfs; none appears on the host. The scratch dir itself is writable."""
    targets = [Path("/tmp") / marker, CHECKOUT / marker, Path.home() / marker, CHECKOUT / ".venv" / marker]
    try:
        output = python(WRITE.format(paths=[*map(str, targets), "inside"]))
        assert [path for path in targets if path.exists()] == [], output
    finally:
        for path in targets:
            path.unlink(missing_ok=True)
    assert "inside WRITTEN" in output and "'inside'" in output.splitlines()[-1]


@needs_bwrap
def test_a_python_installation_under_tmp_is_bound_read_only_inside_the_scratch_dir(monkeypatch, marker):
    """A clone in /tmp with its virtual environment there (how a CI job often checks out): the sandbox still
    starts, the installation is readable and read-only, and the rest of /tmp is the sandbox's own: it lists
    exactly the installation, the scratch dir and what the program wrote, not the host's /tmp (a file put
    there for this test), and what the program writes there never reaches the host."""
    installation = Path(tempfile.mkdtemp(prefix="posttrain-sandbox-venv-", dir="/tmp"))
    installation.chmod(0o755)  # as a virtual environment's directory is
    (installation / "marker.txt").write_text("installed")
    (installation / "marker.txt").chmod(0o644)
    on_host = Path("/tmp") / f"{marker}-host"
    on_host.write_text("the host's")
    written = Path("/tmp") / f"{marker}-mine"
    real = sandbox._python_prefixes()
    monkeypatch.setattr(sandbox, "_python_prefixes", lambda: [*real, str(installation)])
    program = (f"import os\nprint(open({str(installation / 'marker.txt')!r}).read())\n"
               f"try:\n    open({str(installation / 'written')!r}, 'w')\nexcept OSError as error:\n"
               f"    print('REFUSED', type(error).__name__)\nopen({str(written)!r}, 'w').write('x')\n"
               f"print(sorted(os.listdir('/tmp')))\nprint(os.getcwd())")
    try:
        output = python(program)
        assert not (installation / "written").exists() and not written.exists(), output
    finally:
        shutil.rmtree(installation)
        on_host.unlink()
        written.unlink(missing_ok=True)
    assert "installed" in output and "REFUSED OSError" in output, output
    lines = output.splitlines()
    # the Python installations under /tmp show too (this one, and the clone's own venv where the checkout is in /tmp)
    installed = {Path(prefix).relative_to("/tmp").parts[0] for prefix in [*real, str(installation)] if prefix.startswith("/tmp/")}
    assert lines[-2] == str(sorted(installed | {"work", written.name})), output
    assert lines[-1] == "/tmp/work", output


CONNECT = """
import socket
print("interfaces", sorted(name for _, name in socket.if_nameindex()))
try:
    socket.create_connection(("127.0.0.1", {port}), timeout=3).close()
    print("CONNECTED")
except OSError as error:
    print("NO CONNECTION", type(error).__name__)
"""


@needs_bwrap
def test_a_network_connection_to_the_host_fails():
    """A server on the host's 127.0.0.1 is out of reach: the program's network namespace has only its loopback."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)
    server.settimeout(0.5)
    try:
        output = python(CONNECT.format(port=server.getsockname()[1]))
        with pytest.raises(TimeoutError):
            server.accept()
    finally:
        server.close()
    assert "interfaces ['lo']" in output and "NO CONNECTION ConnectionRefusedError" in output, output


FORK_BOMB = """
import os, time
# {marker}
for _ in range(8):  # parent and child both go on: 2**8 processes, were nothing to stop them
    try:
        os.fork()
    except BlockingIOError:
        print("fork refused", flush=True)
        break
time.sleep(1000)
"""


@needs_bwrap
def test_a_fork_bomb_is_held_to_the_task_limit_and_ends_with_the_call(marker):
    started = time.monotonic()
    output = python(FORK_BOMB.format(marker=marker), timeout_s=2)
    assert time.monotonic() - started < 10
    assert "fork refused" in output and "more than 2 s and was stopped" in output, output
    assert processes_with(marker) == []


@needs_bwrap
def test_100_mb_of_output_is_cut_without_being_held_in_memory():
    tracemalloc.start()
    try:
        started = time.monotonic()
        output = python("import sys\nsys.stdout.buffer.write(b'x' * (100 << 20))\nprint('END')")
        elapsed, peak = time.monotonic() - started, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert elapsed < 10 and peak < 8 << 20, (elapsed, peak)
    assert output.endswith("(the program printed more than 1 MiB and was stopped)") and "END" not in output
    assert len(output) < 8200


@needs_bwrap
def test_a_program_that_sleeps_forever_is_stopped_at_its_timeout(marker):
    started = time.monotonic()
    output = python(f"import time\n# {marker}\ntime.sleep(10 ** 9)", timeout_s=1)
    assert time.monotonic() - started < 5
    assert output == "(no output)\n(the program ran for more than 1 s and was stopped)"
    assert processes_with(marker) == []


ORPHAN = """
import os, sys
if os.fork() == 0:  # a daemon: a new session, stdio away from the tool's pipes, its parent gone
    os.setsid()
    if os.fork() == 0:
        null = os.open("/dev/null", os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        os.execv(sys.executable, [sys.executable, "-c", "import time; time.sleep(1000)", {marker!r}])
    os._exit(0)
os.wait()
print("spawned")
"""


@needs_bwrap
def test_a_child_that_outlives_its_parent_is_killed_with_the_call(marker):
    output = python(ORPHAN.format(marker=marker))
    assert output == "spawned"
    assert processes_with(marker) == []


def test_without_bwrap_the_code_still_runs_and_a_warning_says_so_once(monkeypatch, caplog):
    monkeypatch.setattr(sandbox, "bwrap_problem", lambda: "bwrap is not installed")
    monkeypatch.setattr(sandbox, "_warned", False)
    with caplog.at_level(logging.WARNING, logger=sandbox.__name__):
        assert python("print(6 * 7)").startswith("42")
        assert python("print('again')").startswith("again")
    warnings = [record.getMessage() for record in caplog.records if record.name == sandbox.__name__]
    assert len(warnings) == 1 and "without isolation: bwrap is not installed" in warnings[0]
    assert "apt-get install bubblewrap" in warnings[0]
