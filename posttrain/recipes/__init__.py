"""``posttrain recipe NAME``: a multi-stage recipe (prepare, SFT, RL, evaluations) as one command.

A recipe is a YAML file (the built-in ones are beside this file; ``posttrain recipe list``)::

    description: one line, shown by `posttrain recipe list`
    overrides: [data.builtin_options.val_size=100]   # for every stage that takes a config
    stages:
      - name: sft                       # runs/<project>/<recipe>/sft/
        command: sft                    # prepare | sft | train | eval | export
        preset: search_sft
        overrides: [sft.total_epochs=1]
      - name: rl
        command: train
        preset: search_grpo
        inputs: {actor_rollout_ref.model.path: sft}   # a config key ← an earlier stage's output
        overrides: [sft.train_files=[{stage:data}/sft.parquet]]  # {stage:NAME}: that stage's directory
      - name: rl_eval
        command: eval
        preset: search_grpo
        checkpoint: rl                  # eval: the policy of a train stage's last checkpoint
      - name: mean                      # export: a train stage's last checkpoint as a model (<dir>/export),
        command: export                 #   with `posttrain export`'s options, e.g. the mean with another
        checkpoint: rl                  #   seed's run, a train stage rl_seed2 defined above it (not shown);
        options: [--with, "{stage:rl_seed2}"]   # a later stage's input, as an SFT export is
    table:
      rows: {base: base_eval, SFT: sft_eval, RL: rl_eval}   # label: an eval stage
      compare: [sft_eval, rl_eval]      # the paired difference of two rows (or a list of such pairs)
      by: hops                          # also per value of extra_info[hops] (source: a mixture's sources)

Each stage is a normal run of ``posttrain <command>`` in its own process and directory. A stage's
output is its directory (prepare: the dataset; train: the run, whose latest checkpoint ``checkpoint:``
names), and for sft and export the exported policy (``<dir>/export``). A stage that finished is skipped when
the recipe runs again with the same command and the same stages before it (its ``DONE`` file holds
their fingerprint); a train or sft stage that was interrupted (a crash, or Ctrl-C: the stage stops at
a clean point and the recipe with it) resumes from its checkpoint; a prepare, eval or export stage runs
again; a stage whose command or earlier stages changed starts over (its old directory moved aside), but a
train stage whose only change is more steps or epochs trains further from its checkpoint (recipes/further.py);
``--report`` runs no stage and writes the table of those that finished (a stage that finished with other
``--use`` arguments, which its ``DONE`` records, is left out and named with them). ``key=value`` arguments go
to every stage that takes a config, and ``STAGE:key=value`` to that stage only. ``--use STAGE=PATH`` takes an output made elsewhere (an
exported model, a run directory, a dataset) in place of running that stage, e.g. a patient trained
before: later stages read PATH (their fingerprints hold it and its modification time), and earlier
stages that only the given ones need are not run either. An eval stage is given as a finished
evaluation's directory, and taken only if it ran the very command this recipe would (e.g. the base
model's evaluation from an earlier run: ``--use base_eval=runs/old/base_eval``).
The recipe ends with a table — each row's accuracy with its
95 % Wilson interval, and the paired bootstrap interval of the compared rows' difference — and, for
rows whose data source can say what kind of mistake each answer is (``MISTAKES`` in
rewards/registry.py: BFCL's mistakes by kind and call rates, how TextArena's games ended), those tables; printed and written to
``<recipe dir>/report.md`` with each stage's wall time.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import yaml

from posttrain.errors import PosttrainError
from posttrain.recipes.checks import check_stages
from posttrain.recipes.further import fingerprint as stage_fingerprint
from posttrain.recipes.further import runs_so_far

BUILTIN_DIR = Path(__file__).parent
COMMANDS = ("prepare", "sft", "train", "eval", "export")
DONE = "DONE"        # a stage that finished: its fingerprint (its command and every earlier stage's), its wall time
STARTED = "STARTED"  # a stage that began: its fingerprint, so that a changed stage starts over rather than resume
EPISODES = "episodes.jsonl"


class RecipeError(PosttrainError):
    """A recipe that cannot run as written (an unknown stage, command or key), or a stage that failed."""

    exit_code = 2


@dataclass
class Stage:
    name: str
    command: str
    preset: str | None = None
    overrides: list[str] = field(default_factory=list)
    inputs: dict[str, str] = field(default_factory=dict)  # config key → an earlier stage
    checkpoint: str | None = None  # eval, export: a train stage whose latest checkpoint is evaluated or exported
    dataset: str | None = None  # prepare: the dataset name
    options: list[str] = field(default_factory=list)  # prepare: key=value options; export: posttrain export's options


@dataclass
class Recipe:
    name: str
    description: str
    stages: list[Stage]
    rows: dict[str, str] = field(default_factory=dict)  # table label → eval stage
    compare: list[list[str]] = field(default_factory=list)  # pairs of eval stages: (before, after)
    by: str | None = None
    overrides: list[str] = field(default_factory=list)  # for every stage that takes a config, before the stage's own


def builtin_names() -> list[str]:
    return sorted(path.stem for path in BUILTIN_DIR.glob("*.yaml"))


def recipe_path(name: str) -> Path:
    """A built-in recipe's file, or a path to one."""
    if (BUILTIN_DIR / f"{name}.yaml").is_file():
        return BUILTIN_DIR / f"{name}.yaml"
    path = Path(name)
    if path.suffix in (".yaml", ".yml") and path.is_file():
        return path
    raise RecipeError(f"no recipe {name!r}: the built-in ones are {', '.join(builtin_names())} (posttrain recipe list), "
                      "or give the path of your own .yaml")


def load_recipe(name: str) -> Recipe:
    path = recipe_path(name)
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as err:
        raise RecipeError(f"{path} is not valid YAML: {err}") from err
    unknown = set(raw) - {"description", "overrides", "stages", "table"}
    if unknown:
        raise RecipeError(f"{path}: unknown key(s) {sorted(unknown)}; a recipe has description, overrides, stages and table")
    stages = []
    for number, entry in enumerate(raw.get("stages") or [], start=1):
        try:
            stage = Stage(**entry)
        except TypeError as err:
            raise RecipeError(f"{path}: stage {number} ({entry.get('name', '?') if isinstance(entry, dict) else entry}): {err}") from err
        stages.append(stage)
    table = raw.get("table") or {}
    if not isinstance(table, dict) or set(table) - {"rows", "compare", "by"}:
        unknown = sorted(set(table) - {"rows", "compare", "by"}) if isinstance(table, dict) else table
        raise RecipeError(f"{path}: table: unknown key(s) {unknown}; a table has rows, compare and by, nothing else")
    compare = list(table.get("compare") or [])
    pairs = [compare] if compare and all(isinstance(item, str) for item in compare) else [list(pair) for pair in compare]
    recipe = Recipe(path.stem, str(raw.get("description", "")), stages, dict(table.get("rows") or {}),
                    pairs, table.get("by"), [str(o) for o in raw.get("overrides") or []])
    check_recipe(recipe, path)
    return recipe


def check_recipe(recipe: Recipe, path: Path) -> None:
    """Every problem of the recipe at once: names, commands, references to earlier stages."""
    problems, seen = [], {}
    if not recipe.stages:
        problems.append("it has no stages")
    for stage in recipe.stages:
        where = f"stage {stage.name!r}"
        if stage.name in seen:
            problems.append(f"{where} is named twice")
        if stage.command not in COMMANDS:
            problems.append(f"{where}: command {stage.command!r} is not one of {', '.join(COMMANDS)}")
        if stage.command == "prepare" and not stage.dataset:
            problems.append(f"{where}: a prepare stage names its dataset (dataset: synthetic-search)")
        if stage.command == "export" and (stage.checkpoint is None or stage.preset or stage.overrides or stage.inputs):
            problems.append(f"{where}: an export stage names the train stage it exports (checkpoint: rl) and takes no preset, "
                            "overrides or inputs (its options are posttrain export's, e.g. [--with, \"{stage:rl_seed2}\"])")
        for name in _placeholders(stage):
            if name not in seen:
                problems.append(f"{where}: {{stage:{name}}} is not an earlier stage")
        for key, source in stage.inputs.items():
            if source not in seen:
                problems.append(f"{where}: input {key} comes from {source!r}, which is not an earlier stage")
            elif seen[source] == "eval":
                problems.append(f"{where}: input {key} comes from {source!r}, an eval stage, which has no output to use")
        if stage.checkpoint is not None and seen.get(stage.checkpoint) != "train":
            problems.append(f"{where}: checkpoint {stage.checkpoint!r} must name an earlier train stage")
        seen[stage.name] = stage.command
    for label, source in recipe.rows.items():
        if seen.get(source) != "eval":
            problems.append(f"table row {label!r}: {source!r} is not an eval stage")
    for pair in recipe.compare:
        if len(pair) != 2 or any(seen.get(s) != "eval" for s in pair):
            problems.append(f"table compare {pair}: name two eval stages (or give a list of such pairs)")
    if problems:
        raise RecipeError(f"{path}: " + "; ".join(problems))


def split_overrides(recipe: Recipe, arguments: list[str]) -> tuple[list[str], dict[str, list[str]]]:
    """``key=value`` for every stage, ``STAGE:key=value`` for one."""
    names = {stage.name for stage in recipe.stages}
    exports = {stage.name for stage in recipe.stages if stage.command == "export"}
    common, per_stage = [], {name: [] for name in names}
    for argument in arguments:
        head, _, rest = argument.partition("=")
        if "=" not in argument:
            raise RecipeError(f"{argument!r}: overrides are key=value, or STAGE:key=value for one stage")
        if ":" in head:
            stage, key = head.split(":", 1)
            if stage not in names:
                raise RecipeError(f"{argument!r}: the recipe {recipe.name} has no stage {stage!r} ({', '.join(sorted(names))})")
            if stage in exports:
                raise RecipeError(f"{argument!r}: {stage} is an export stage, which takes no key=value settings; "
                                  "give posttrain export's options in its options: in the recipe file")
            per_stage[stage].append(f"{key}={rest}")
        else:
            common.append(argument)
    return common, per_stage


def _placeholders(stage: Stage) -> set[str]:
    """The stages named by ``{stage:NAME}`` in ``stage``'s overrides and options."""
    return {name for item in stage.overrides + stage.options for name in re.findall(r"\{stage:([^}]*)\}", item)}


def stage_references(stage: Stage) -> set[str]:
    """The earlier stages whose output ``stage`` reads (inputs, checkpoint, ``{stage:NAME}``)."""
    return set(stage.inputs.values()) | ({stage.checkpoint} if stage.checkpoint else set()) | _placeholders(stage)


def check_given(recipe: Recipe, given: dict[str, Path]) -> None:
    """``--use STAGE=PATH``: the stage exists and PATH exists; for an eval stage, PATH is a finished
    evaluation (its ``DONE`` and episodes; :func:`check_same_evaluations` checks its command before any stage runs)."""
    commands = {stage.name: stage.command for stage in recipe.stages}
    problems = []
    for name, path in given.items():
        if name not in commands:
            problems.append(f"--use {name}=...: the recipe {recipe.name} has no stage {name!r} ({', '.join(commands)})")
        elif commands[name] == "eval" and not ((path / DONE).is_file() and (path / EPISODES).is_file()):
            problems.append(f"--use {name}={path}: an eval stage is given as the directory of a finished evaluation "
                            f"(an earlier recipe run's {name}/, with its {DONE} and {EPISODES}); {path} has not both")
        elif not path.exists():
            problems.append(f"--use {name}={path}: no such file or directory")
    if problems:
        raise RecipeError("; ".join(problems))


def check_same_evaluation(stage: Stage, directory: Path, dirs: dict[str, Path], overrides: list[str]) -> None:
    """A given eval stage is reused only if it ran the command this recipe would run in its directory: the
    same preset, overrides and inputs (a model or run given by the same path), so its table row is the one
    the recipe would measure (e.g. a base model's evaluation, whose inputs no other stage changes)."""
    expected = shlex.join(["posttrain", *stage_argv(stage, directory, dirs, overrides)[3:]])
    ran = json.loads((directory / DONE).read_text()).get("command")
    if ran is None:
        raise RecipeError(f"--use {stage.name}={directory}: its {DONE} records no command, so posttrain cannot tell whether it "
                          f"ran this recipe's evaluation. Leave --use {stage.name}= out to run it here.")
    if absolute_paths(ran) != absolute_paths(expected):
        raise RecipeError(f"--use {stage.name}={directory}: that evaluation ran another command, so its row would not be this "
                          f"recipe's. It ran:\n  {ran}\nThis recipe would run:\n  {expected}\n"
                          f"Leave --use {stage.name}= out to run it here.")


def check_same_evaluations(recipe: Recipe, given: dict[str, Path], dirs: dict[str, Path], overrides: list[str]) -> None:
    """:func:`check_same_evaluation` for each given eval stage."""
    for stage in recipe.stages:
        if stage.name in given and stage.command == "eval":
            check_same_evaluation(stage, dirs[stage.name], dirs, overrides)


def absolute_paths(command: str) -> list[str]:
    """A stage's command with each relative path that exists here made absolute (``--dir runs/x`` and
    ``--use ...=/abs/runs/x/...`` name the same directories), to compare two commands."""
    words = []
    for word in shlex.split(command):
        key, sep, value = word.rpartition("=") if "=" in word else ("", "", word)
        if "/" in value and not value.startswith("/") and Path(value).exists():
            value = str(Path(value).resolve())
        words.append(f"{key}{sep}{value}")
    return words


def parse_given(items: list[str]) -> dict[str, Path]:
    given = {}
    for item in items:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise RecipeError(f"--use {item!r}: write STAGE=PATH, e.g. --use patient=runs/old/patient/export")
        if name in given:
            raise RecipeError(f"--use {name}=... is given twice ({given[name]} and {path}); give each stage once")
        given[name] = Path(path).expanduser().resolve()
    return given


def given_stamp(path: Path) -> str:
    """What a given output's fingerprint holds: its path and the latest change to it or to anything
    directly in it, so that a model exported again to the same path runs the later stages again. A link is
    read as itself: a run directory's ``ray_logs`` points at a session that is gone once Ray stops."""
    entries = path.iterdir() if path.is_dir() else []
    times = [path.stat().st_mtime_ns, *(entry.lstat().st_mtime_ns for entry in entries)]
    return f"{path} @ {max(times)}"


def plan_given(recipe: Recipe, use: list[str], per_stage: dict[str, list[str]]) -> tuple[dict[str, Path], set[str]]:
    """``--use`` arguments checked: (stage → given path, stages that need not run); an override for
    a stage that will not run is refused."""
    given = parse_given(use)
    check_given(recipe, given)
    unneeded = unneeded_stages(recipe, given)
    idle = sorted(name for name in set(given) | unneeded if per_stage[name])
    if idle:
        raise RecipeError(f"overrides for {', '.join(idle)}, which will not run (given with --use, or read only by given stages)")
    return given, unneeded


def unneeded_stages(recipe: Recipe, given: dict[str, Path]) -> set[str]:
    """Stages read only by given (or themselves unneeded) stages: with their readers given, they need not run."""
    readers: dict[str, list[str]] = {stage.name: [] for stage in recipe.stages}
    for stage in recipe.stages:
        for name in stage_references(stage):
            readers.setdefault(name, []).append(stage.name)
    unneeded: set[str] = set()
    for stage in reversed(recipe.stages):
        users = readers[stage.name]
        if stage.name not in given and users and all(user in given or user in unneeded for user in users):
            unneeded.add(stage.name)
    return unneeded


def stage_argv(stage: Stage, directory: Path, dirs: dict[str, Path], overrides: list[str], own: list[str] = ()) -> list[str]:
    """The ``posttrain`` command line of ``stage``, run in ``directory``; ``{stage:NAME}`` in its
    overrides and options is stage NAME's directory. Its inputs come after ``overrides`` (for every
    stage: a base model given to all must not replace the SFT export) and before ``own`` (its own)."""
    def placed(items: list[str]) -> list[str]:
        for name, path in dirs.items():
            items = [item.replace(f"{{stage:{name}}}", str(path)) for item in items]
        return items

    argv = [sys.executable, "-m", "posttrain.cli", stage.command]
    if stage.command == "prepare":
        return argv + [stage.dataset, "--out", str(directory), *placed(stage.options), *placed(list(own))]
    if stage.command == "export":
        # no settings of its own: split_overrides refuses STAGE:key=value for an export stage
        return argv + [str(dirs[stage.checkpoint]), "--out", str(directory / "export"), *placed(stage.options)]
    if stage.preset:
        argv += ["--preset", stage.preset]
    if stage.command == "eval":
        argv += ["--dump-episodes", str(directory / EPISODES)]
        if stage.checkpoint:
            argv += ["--checkpoint", str(dirs[stage.checkpoint])]
    inputs = [f"{key}={stage_output(dirs[source])}" for key, source in stage.inputs.items()]
    return argv + [f"trainer.default_local_dir={directory}", *placed(stage.overrides), *placed(overrides), *inputs, *placed(list(own))]


def stage_output(directory: Path) -> Path:
    """What a later stage uses of an earlier one: an SFT or export stage's exported policy, else its directory."""
    return directory / "export" if (directory / "export").is_dir() else directory


def run_recipe(name: str, arguments: list[str], root: Path | None = None, use: list[str] | None = None,
               report_only: bool = False) -> int:
    """Run the recipe's stages that have not finished, then write its table. ``report_only``: run none,
    and write the table of the stages that finished (a recipe under way, or stopped)."""
    from rich.console import Console
    from rich.markup import escape

    console = Console(highlight=False)
    say = functools.partial(console.print, soft_wrap=True)
    recipe = load_recipe(name)
    common, per_stage = split_overrides(recipe, arguments)
    given, unneeded = plan_given(recipe, use or [], per_stage)
    root = root or Path("runs") / "posttrain" / recipe.name
    dirs = {stage.name: given.get(stage.name, root / stage.name) for stage in recipe.stages}
    seconds: dict[str, float] = {}
    again = shlex.join(["posttrain", "recipe", *sys.argv[2:]]) if sys.argv[1:2] == ["recipe"] else f"posttrain recipe {name}"
    say(f"[bold]posttrain recipe {recipe.name}[/]: {len(recipe.stages)} stages → {escape(str(root))}")
    upstream = ""  # what the stages before produced: a change there runs every later stage again
    check_before_running(recipe, given, unneeded, dirs, recipe.overrides + common, per_stage, stages=not report_only)
    for number, stage in enumerate(recipe.stages, start=1):
        directory = dirs[stage.name]
        if stage.name in given or stage.name in unneeded:
            what = f"given, not run ({directory})" if stage.name in given else "not run: only given stages read it"
            stamp = given_stamp(directory) if stage.name in given else what
            upstream = stage_fingerprint(upstream, f"{stage.name}: {stamp}")
            say(f"stage {number}/{len(recipe.stages)} {stage.name}: {escape(what)}")
            continue
        takes_config = stage.command not in ("prepare", "export")
        argv = stage_argv(stage, directory, dirs, recipe.overrides + common if takes_config else [], per_stage[stage.name])
        command = shlex.join(["posttrain", *argv[3:]])
        before = upstream  # what the stages before produced: to tell whether the stage's only change is its own
        upstream = fingerprint = stage_fingerprint(upstream, command)
        started, done, log = directory / STARTED, directory / DONE, directory / "stage.log"
        if done.is_file() and json.loads(done.read_text()).get("fingerprint") == fingerprint:
            seconds[stage.name] = json.loads(done.read_text()).get("seconds", 0.0)
            say(f"stage {number}/{len(recipe.stages)} {stage.name}: done before, skipped ({escape(str(directory))})")
            continue
        if report_only:
            say(f"stage {number}/{len(recipe.stages)} {stage.name}: {escape(unfinished(done, given))}, left out of the table")
            continue
        earlier, runs = runs_so_far(stage.command, started, done, log, fingerprint, before, command,
                                    lambda what: say(f"stage {stage.name}: {escape(what)}"))
        say(f"stage {number}/{len(recipe.stages)} [bold]{stage.name}[/]: {escape(command)}")  # escaped: [a,b] is no markup
        directory.mkdir(parents=True, exist_ok=True)
        started.write_text(json.dumps(record := {"fingerprint": fingerprint, "command": command, "began": time.time(),
                                                 "earlier_seconds": earlier, "earlier_runs": runs}))
        start = time.perf_counter()
        code, stopped = run_stage(argv, log)
        seconds[stage.name] = earlier + time.perf_counter() - start
        started.write_text(json.dumps(record | {"ended": time.time()}))  # a run killed outright ends at its log's last line
        if stopped or code == 130:
            say(f"posttrain: the recipe stopped in stage {stage.name!r}. To continue: {escape(again)}")
            return 0 if code == 0 else code
        if code != 0:
            raise RecipeError(f"stage {stage.name!r} failed (exit {code}); its output is in {directory / 'stage.log'}. Fix the cause "
                              f"and run the same recipe command again: finished stages are skipped, a train or sft stage resumes")
        done.write_text(json.dumps({"fingerprint": fingerprint, "command": command, "seconds": seconds[stage.name],
                                    "runs": runs + 1, "use": uses(given)}))
    write_report(recipe, root, dirs, seconds, given, console, report_only)
    return 0


def check_before_running(recipe: Recipe, given: dict[str, Path], unneeded: set[str], dirs: dict[str, Path],
                         overrides: list[str], per_stage: dict[str, list[str]], stages: bool = True) -> None:
    """RecipeError, before any stage runs, for a given evaluation that is not this recipe's, or (``stages``) a stage to
    run whose config is refused (``recipes/checks.py``)."""
    check_same_evaluations(recipe, given, dirs, overrides)
    to_run = [stage for stage in recipe.stages if stages and stage.name not in given and stage.name not in unneeded]
    refused = check_stages((stage.name, stage.command, stage_argv(stage, dirs[stage.name], dirs, overrides, per_stage[stage.name]))
                           for stage in to_run)
    if refused:
        raise RecipeError("no stage was run: fix these stages' settings first\n" + "\n".join(refused))


def uses(given: dict[str, Path]) -> list[str]:
    """The ``--use`` arguments of ``given`` (``STAGE=PATH``), as a stage's DONE records them."""
    return [f"{name}={path}" for name, path in given.items()]


def unfinished(done: Path, given: dict[str, Path]) -> str:
    """Why ``--report`` leaves out a stage that did not finish with this command: not finished; finished
    with another command or other earlier stages; or that, with other ``--use`` arguments than ``given``
    (its DONE records them: named, as the likely difference; a DONE from before they were recorded has none)."""
    if not done.is_file():
        return "not finished"
    then = json.loads(done.read_text()).get("use")
    if then is None or sorted(then) == sorted(uses(given)):
        return "finished with another command or other earlier stages"
    return (f"finished with another command or other inputs: it ran with {' '.join('--use ' + u for u in then) or 'no --use'}"
            f"; if that is the difference, give the same to include it")


def write_report(recipe: Recipe, root: Path, dirs: dict[str, Path], seconds: dict[str, float], given: dict[str, Path],
                 console, report_only: bool) -> None:
    """The recipe's table, shown and written to ``root/report.md``; ``report_only``: of the eval stages
    that finished, and of the pairs of them."""
    from rich.markup import escape

    if report_only:
        finished = set(seconds) | set(given)  # a given evaluation finished elsewhere
        recipe = replace(recipe, rows={label: stage for label, stage in recipe.rows.items() if stage in finished},
                         compare=[pair for pair in recipe.compare if set(pair) <= finished])
    from posttrain.recipes.table import recipe_table

    report = recipe_table(recipe, dirs, seconds, given)
    console.print(report, soft_wrap=True, markup=False)
    root.mkdir(parents=True, exist_ok=True)  # every stage given: no stage made it
    (root / "report.md").write_text(f"# Recipe {recipe.name}\n\n{recipe.description}\n\n{report}\n", encoding="utf-8")
    console.print(f"report: {escape(str(root / 'report.md'))}", soft_wrap=True)


def run_stage(argv: list[str], log: Path) -> tuple[int, bool]:
    """The stage's command, its output shown and kept in ``log``; returns its exit code and whether
    a person stopped it (its own "posttrain: stopped" line). Ctrl-C reaches the stage (the terminal
    sends it to the whole process group), which stops at a clean point; this process waits for it."""
    stopped = False
    # a handler, not SIG_IGN: an ignored SIGINT is inherited across exec, and the stage would never get Ctrl-C
    previous = signal.signal(signal.SIGINT, lambda signum, frame: None)
    try:
        with open(log, "a", encoding="utf-8", buffering=1) as out:  # line by line: a log followed while the stage runs
            # unbuffered: a stage's plain prints reach the log when made, not when a pipe's buffer fills
            process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
                                       env=os.environ | {"PYTHONUNBUFFERED": "1"})
            for line in process.stdout:
                sys.stdout.write(line)
                sys.stdout.flush()
                out.write(line)
                stopped = stopped or line.startswith("posttrain: stopped")
            return process.wait(), stopped
    finally:
        signal.signal(signal.SIGINT, previous)


def list_recipes() -> str:
    lines = []
    for name in builtin_names():
        recipe = load_recipe(name)
        lines.append(f"{name}: {recipe.description}")
        lines += [f"    {i}. {stage.name}: posttrain {stage.command}" + (f" {stage.dataset}" if stage.dataset else "")
                  + (f" --preset {stage.preset}" if stage.preset else "")
                  for i, stage in enumerate(recipe.stages, start=1)]
    return "\n".join(lines)
