"""reasoning-gym's procedural tasks as RL rows (``posttrain prepare reasoning-gym tasks=NAME[,NAME...]``).

The items are the library's own (:mod:`posttrain.rewards.reasoning_gym`, the adapter: installed
``reasoning-gym==0.1.25``), scored by its own ``score_answer`` through data_source ``reasoning_gym``.
Options (``key=value``, as every preparer takes them):

- ``tasks``: the library's task names, comma-separated (``chain_sum,leg_counting``);
- ``configs``: each task's config fields, JSON text ``{"chain_sum": {"max_terms": 3}}`` (in a preset's
  ``data.builtin_options`` also a mapping); a task not named keeps the library's defaults;
- ``size`` / ``seed``: training items per task, and their seed: items ``0 .. size-1`` of
  ``create_dataset(task, seed=seed, size=size, **config)``;
- ``test_size`` / ``test_seed``: held-out items per task, from another seed. The library draws item
  ``i`` of seed ``s`` from ``random.Random(s + i)``, so seeds ``seed .. seed+size-1`` and the test's
  ``test_seed .. test_seed + 10*test_size - 1`` must not meet (refused otherwise): no random state is
  shared. Easy configs repeat questions, so the test split also leaves out every question the training
  split asks, and each question after its first; up to ``10*test_size`` items are looked at per task;
- ``levels`` (0: none): training items at the library's own difficulty levels ``0 .. levels-1`` (each task's
  curriculum, ``reasoning_gym.factory.create_curriculum``, at that global level: its attributes' fields
  over the task's ``configs``), ``size`` items per level, ``extra_info.level`` the level (for
  ``data.sampler.curriculum.key=extra_info.level``). Level ``L``'s items use seeds from ``seed + L*size``; the
  held-out split keeps the task's ``configs`` and leaves out every training level's questions; SFT
  transcripts (``sft_size``) come from level 0's items;
- ``system_prompt``: which of the library's ``reasoning_gym.utils.SYSTEM_PROMPTS`` becomes the system
  message (``default``: think, then ``<answer>...</answer>``; ``direct``: only the tagged answer;
  ``none``: no system message). The tag is what the library's ``extract_answer`` reads;
- ``sft_size`` / ``sft_val_size`` (0: none): SFT transcripts for a warm-up on the answer format, from
  the first training items of each task: the row's messages, then an assistant turn with the library's own
  answer in the tag, ``<answer>ANSWER</answer>`` (with ``sft_solution=answer``: the format, no reasoning; pair it
  with ``system_prompt=direct``), after the worked steps with ``sft_solution=worked``. SmolLM2-135M-Instruct,
  greedy, wrote no answer tag under either the ``default`` or the ``direct`` prompt on 32 held-out items of four
  easy tasks, and so scores 0 without one;
- ``sft_solution``: what the transcripts' assistant turn holds: ``answer`` (the default; the tag alone) or
  ``worked`` (the steps first, one a line, then the tag: :mod:`posttrain.data.preparers.rg_worked`; pair it with a
  system prompt that asks for steps, ``simple`` or ``default``).

Files: ``train.parquet`` and ``test.parquet`` (and ``sft.parquet`` / ``sft_val.parquet``), one row per item: the user message is the library's
question unchanged; ``ground_truth`` is the item's reference (:class:`~posttrain.rewards.reasoning_gym.ItemRef`,
JSON text) from which the scorer regenerates it; ``ability`` is the library's category of the task
(``arithmetic``, ``algorithmic``); ``extra_info`` holds ``task``, ``index``, ``split`` and ``in_sft`` (true
where an SFT transcript asks the row's question: ``data.dev_size`` never holds such a row back, so the
development rows are questions the warm-up never saw; ``posttrain eval --by task`` gives each task's accuracy).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from posttrain.data.format import IN_SFT, make_row, write_conversations, write_rows
from posttrain.data.preparers import rg_worked
from posttrain.data.preparers.options import check_counts
from posttrain.errors import InputError
from posttrain.rewards import reasoning_gym as rg

TEST_SCAN_FACTOR = 10  # held-out items looked at per item kept, at most
NO_SYSTEM_PROMPT = "none"
SFT_SOLUTIONS = ("answer", "worked")
Config = dict[str, Any]  # a task's config fields, as reasoning-gym's dataset takes them


def prepare_reasoning_gym(
    out_dir: Path,
    *,
    tasks: str,
    configs: str | dict[str, Any] | None = None,
    size: int = 256,
    seed: int = 0,
    test_size: int = 64,
    test_seed: int = 1_000_000,
    system_prompt: str = "default",
    sft_size: int = 0,
    sft_val_size: int = 0,
    levels: int = 0,
    sft_solution: str = "answer",
) -> list[Path]:
    """Write the files of the module docstring into ``out_dir``; returns their paths."""
    names, task_configs, system, by_task_level = checked_options(dict(locals()))
    train_rows, test_rows, sft, sft_val = [], [], [], []
    for task in names:
        by_level = {level: [rg.ItemRef(task, seed + (level or 0) * size, size, index, config) for index in range(size)]
                    for level, config in by_task_level[task].items()}
        train = [item for items in by_level.values() for item in items]
        train_questions = {_question(item) for item in train}
        test = held_out_items(task, task_configs[task], test_seed, test_size, train_questions)
        sft_questions = {_question(item) for item in train[:sft_size]}
        train_rows += [_row(item, "train", system, level, in_sft=_question(item) in sft_questions)
                       for level, items in by_level.items() for item in items]
        test_rows += [_row(item, "test", system) for item in test]
        sft += [transcript(item, system, sft_solution) for item in train[:sft_size]]
        sft_val += [transcript(item, system, sft_solution) for item in train[sft_size:sft_size + sft_val_size]]
    out_dir = Path(out_dir)
    paths = [write_rows(train_rows, out_dir / "train.parquet"), write_rows(test_rows, out_dir / "test.parquet")]
    paths += [write_conversations(c, out_dir / f"{name}.parquet") for name, c in (("sft", sft), ("sft_val", sft_val)) if c]
    return paths


def checked_options(given: dict[str, Any]) -> tuple[list[str], dict[str, Config], list[dict[str, str]], dict[str, dict[int | None, Config]]]:
    """(the task names, each task's config, the system message, each task's config per level: ``{None: config}``
    without levels) from prepare_reasoning_gym's arguments, once every refusal they call for alone has passed
    (also ``preparers.check_options``'s: a run or a recipe refuses them before it prepares anything)."""
    size, levels, sft_size, sft_val_size = given["size"], given["levels"], given["sft_size"], given["sft_val_size"]
    check_counts(1, size=size, test_size=given["test_size"])
    check_counts(0, sft_size=sft_size, sft_val_size=sft_val_size, levels=levels)
    if levels == 1:
        raise InputError("levels=1: a curriculum steps between at least two levels; pass levels=N with N >= 2, or 0 for none")
    if sft_size + sft_val_size > size:
        raise InputError(f"sft_size + sft_val_size = {sft_size + sft_val_size} transcripts per task are drawn from its {size} training items; lower them")
    check_seeds(given["seed"], size * max(levels, 1), given["test_seed"], given["test_size"] * TEST_SCAN_FACTOR)
    names = parse_tasks(given["tasks"])
    task_configs = parse_configs(given["configs"], names)
    if given["sft_solution"] not in SFT_SOLUTIONS:
        raise InputError(f"sft_solution={given['sft_solution']!r}: pass one of {', '.join(SFT_SOLUTIONS)}")
    if given["sft_solution"] == "worked" and sft_size + sft_val_size:
        rg_worked.check_configs(task_configs)
    by_task_level = {task: level_configs(task, levels, task_configs[task]) if levels else {None: task_configs[task]} for task in names}
    return names, task_configs, system_message(given["system_prompt"]), by_task_level


def check_seeds(seed: int, size: int, test_seed: int, test_span: int) -> None:
    """Refuse seeds whose items would share the library's random states (module docstring)."""
    if seed < test_seed + test_span and test_seed < seed + size:
        raise InputError(
            f"seed={seed} size={size} and test_seed={test_seed} overlap: reasoning-gym draws item i of seed s from "
            f"Random(s + i), so the training items use {seed}..{seed + size - 1} and the held-out ones up to "
            f"{test_seed}..{test_seed + test_span - 1}; pass test_seed >= {seed + size} (or one whose range ends below {seed})")


def parse_tasks(tasks: str) -> list[str]:
    names = [name.strip() for name in str(tasks).split(",") if name.strip()]
    if not names:
        raise InputError("tasks=: name at least one reasoning-gym task, e.g. tasks=chain_sum,leg_counting")
    known = set(rg.task_names())
    unknown = [name for name in names if name not in known]
    if unknown:
        raise InputError(f"tasks={tasks}: reasoning-gym {rg.installed_version()} has no task {unknown}; its tasks are: {', '.join(sorted(known))}")
    if len(set(names)) < len(names):
        raise InputError(f"tasks={tasks} names a task twice; name each once")
    return names


def parse_configs(configs: str | dict[str, Any] | None, tasks: list[str]) -> dict[str, dict[str, Any]]:
    """Each task's config fields (JSON-normalised, so the preparer and the scorer build the same dataset)."""
    if configs is None or configs == "":
        given: Any = {}
    elif isinstance(configs, str):
        try:
            given = json.loads(configs)
        except json.JSONDecodeError as error:
            raise InputError(f"configs={configs!r} is not JSON ({error}); give {{\"TASK\": {{\"field\": value}}}}") from None
    else:
        given = json.loads(json.dumps(dict(configs)))
    if not isinstance(given, dict) or not all(isinstance(value, dict) for value in given.values()):
        raise InputError(f"configs={configs!r}: expected a mapping of task name to its config fields, e.g. {{\"chain_sum\": {{\"max_terms\": 3}}}}")
    extra = sorted(set(given) - set(tasks))
    if extra:
        raise InputError(f"configs names {extra}, which are not among tasks={','.join(tasks)}; add them to tasks or drop their configs")
    return {task: given.get(task, {}) for task in tasks}


def system_message(name: str) -> list[dict[str, str]]:
    """The library's system prompt ``name`` as a system message; none for ``none``."""
    if name == NO_SYSTEM_PROMPT:
        return []
    prompts = rg.library("reasoning_gym.utils").SYSTEM_PROMPTS
    if name not in prompts:
        raise InputError(f"system_prompt={name!r}: reasoning-gym's system prompts are {sorted(prompts)} (or {NO_SYSTEM_PROMPT!r})")
    return [{"role": "system", "content": prompts[name]}]


def held_out_items(task: str, config: dict[str, Any], test_seed: int, test_size: int, seen: set[str]) -> list[rg.ItemRef]:
    """``test_size`` items of seed ``test_seed`` whose questions are not in ``seen`` nor repeated."""
    span, seen = test_size * TEST_SCAN_FACTOR, set(seen)
    kept: list[rg.ItemRef] = []
    for index in range(span):
        item = rg.ItemRef(task, test_seed, span, index, config)
        question = _question(item)
        if question not in seen:
            seen.add(question)
            kept.append(item)
            if len(kept) == test_size:
                return kept
    raise InputError(
        f"reasoning-gym task {task!r} with config {config}: only {len(kept)} of {span} held-out items ask a question "
        f"the training split does not; lower test_size or size, or widen the config (more terms, digits, words)")


def transcript(item: rg.ItemRef, system: list[dict[str, str]], solution: str = "answer") -> list[dict[str, str]]:
    """The item's messages and the library's own answer in the tag its ``extract_answer`` reads (after the
    worked steps with ``solution="worked"``)."""
    entry = rg.regenerate(item)
    reply = rg_worked.worked_solution(entry, item.task) if solution == "worked" else f"<answer>{entry['answer']}</answer>"
    return [*system, {"role": "user", "content": entry["question"]}, {"role": "assistant", "content": reply}]


def _question(item: rg.ItemRef) -> str:
    return rg.regenerate(item)["question"]


def level_configs(task: str, levels: int, config: dict[str, Any]) -> dict[int, dict[str, Any]]:
    """Each level's config of ``task``; refused where the library's curriculum has fewer distinct levels."""
    configs = {level: level_config(task, level, config) for level in range(levels)}
    distinct = len({json.dumps(c, sort_keys=True) for c in configs.values()})
    if distinct < levels:
        raise InputError(f"levels={levels}: task {task!r}'s curriculum gives only {distinct} distinct configs over them "
                         f"(its hardest level repeats); lower levels to {distinct}")
    return configs


def level_config(task: str, level: int, config: dict[str, Any]) -> dict[str, Any]:
    """``config`` with the fields of ``task``'s curriculum at global level ``level`` (the library's difficulty)."""
    try:
        curriculum = rg.library("reasoning_gym.factory").create_curriculum(task)
    except Exception as error:  # the library raises its own error types for a task without a curriculum
        raise InputError(f"levels: reasoning-gym {rg.installed_version()} has no curriculum for task {task!r} ({error}); "
                         "prepare it without levels") from None
    try:
        curriculum.set_global_level(level)
    except Exception as error:
        raise InputError(f"levels: task {task!r}'s curriculum has no level {level} ({error}); lower levels") from None
    chosen = curriculum.generate_configuration({})
    fields = [name for attribute in curriculum.attributes.values()
              for name in (getattr(attribute, "lower_field_name", None), getattr(attribute, "upper_field_name", None),
                           getattr(attribute, "field_name", None)) if name]
    return json.loads(json.dumps(dict(config) | {name: getattr(chosen, name) for name in fields if hasattr(chosen, name)}))


def _row(item: rg.ItemRef, split: str, system: list[dict[str, str]], level: int | None = None, in_sft: bool = False) -> dict[str, Any]:
    question = _question(item)
    reference = rg.ItemRef(item.task, item.seed, item.size, item.index, item.config, rg.question_hash(question))
    return make_row(
        data_source=rg.DATA_SOURCE, messages=[*system, {"role": "user", "content": question}], ground_truth=reference.to_json(),
        ability=rg.dataset(item.task, item.config, item.seed, item.size).category,
        extra_info={"task": item.task, "index": item.index, "split": split, IN_SFT: in_sft} | ({} if level is None else {"level": level}),
    )
