"""The ``posttrain`` command.

  posttrain train [--preset NAME] [key=value ...]    train (PPO/GRPO, synchronous) on local Ray or a cluster
  posttrain sft [--preset NAME] [key=value ...]      supervised fine-tuning on chat transcripts, exported for train
  posttrain eval [--preset NAME] [--checkpoint DIR] [--dump-episodes F.jsonl] [--by KEY] [key=value ...]
                                                     validation only, from a checkpoint or the base model
  posttrain recipe NAME|list [--dir DIR] [--use STAGE=PATH] [--report] [key=value ...] [STAGE:key=value ...]
                                                     a multi-stage recipe (prepare, sft, train, eval, export)
                                                     command, ending with base → SFT → RL and 95% intervals
                                                     (--report: the table of the stages that finished, none run)
  posttrain compare A.jsonl B.jsonl [--by KEY]      two evaluations' accuracies on the same items (95% intervals)
                                                     and B - A with a paired bootstrap interval
  posttrain export CHECKPOINT --out DIR [--average K] [--with RUN] [--weight W [--toward MODEL]]
                                                     a checkpoint's policy as a Hugging Face directory (--average:
                                                     the mean of the run's last K checkpoints; --with: other runs
                                                     of the same model in that mean; --weight: moved back
                                                     toward the model it was trained from, or MODEL; above 1: carried
                                                     on past the policy)
  posttrain config [--preset NAME] [--for train|sft|eval] [key=value ...]
                                                     print the resolved config, or every problem the command it is
                                                     for would refuse (default: sft when the sft section is set)
  posttrain prepare NAME [--in FILE] --out DIR [key=value ...]
                                                     write a dataset (gsm8k, arithmetic, synthetic-search, synthetic-doctor, tool-arithmetic,
                                                     bfcl, reasoning-gym tasks=A,B, doctor --in FILE.json) as verl-format Parquet
  posttrain serve-retriever --corpus FILE [--index bm25|dense] [--port P] [--host H --token T]
                                                     the search agent's retriever (Search-R1's HTTP API)
  posttrain tools SPEC... [--model M] [--format F]   the tools' JSON schemas as the model receives them, then
                                                     the prompt the model sees (SPEC: FILE.py:FUNCTION, FILE.py:CLASS or
                                                     module:FUNCTION); --parsers, --formats: what env.tool_parser and
                                                     env.tool_format accept
  posttrain demo                                     the single controller at work on local Ray
  posttrain setup [--dry-run] [--machine cpu|gpu]    install what posttrain needs beyond its package's dependencies,
                                                     for this machine (the vLLM build, the default model, BFCL, OpenEnv)
  posttrain --version                                posttrain's version (and git commit, run from a checkout)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from posttrain import install
from posttrain.cli.preflight import COMMANDS, load_run_config
from posttrain.cli.report import report_error
from posttrain.config import preset_names, preset_path, to_yaml
from posttrain.config.loader import DEFAULT_PRESET
from posttrain.errors import InputError, PosttrainError


def _resolved_config(args: argparse.Namespace):
    """The config, checked as the command that runs it checks it (``config``: as ``--for``'s, or the
    command it implies)."""
    files = [preset_path(args.preset)] if args.preset else []
    command = args.for_command if args.command == "config" else args.command
    return load_run_config(files + (args.config or []), args.overrides, command=command)


def _config_command(args: argparse.Namespace) -> int:
    print(to_yaml(_resolved_config(args)), end="")
    return 0


def _train_command(args: argparse.Namespace) -> int:
    from posttrain.cli.train import run_training

    return run_training(_resolved_config(args))


def _sft_command(args: argparse.Namespace) -> int:
    from posttrain.cli.train import run_sft

    return run_sft(_resolved_config(args))


def _eval_command(args: argparse.Namespace) -> int:
    from posttrain.cli.evaluate import run_evaluation

    return run_evaluation(_resolved_config(args), args.checkpoint, args.dump_episodes, args.by)


def _recipe_command(args: argparse.Namespace) -> int:
    from posttrain.recipes import list_recipes, run_recipe

    if args.name == "list":
        print(list_recipes())
        return 0
    return run_recipe(args.name, args.overrides, args.dir, args.use, report_only=args.report)


def _compare_command(args: argparse.Namespace) -> int:
    from posttrain.cli.compare import compare_evaluations

    return compare_evaluations(args.first, args.second, args.by)


def _export_command(args: argparse.Namespace) -> int:
    from posttrain.cli.export import export_checkpoint

    print(export_checkpoint(args.checkpoint, args.out, args.toward, args.weight, args.average, tuple(args.with_runs)))
    return 0


def _prepare_command(args: argparse.Namespace) -> int:
    from posttrain.data import prepare

    for path in prepare(args.name, args.out, **_prepare_options(args)):
        print(path)
    return 0


def _prepare_options(args: argparse.Namespace) -> dict:
    """The preparer's options: the key=value ones, and ``--in FILE`` as its source file."""
    from posttrain.data import parse_options
    from posttrain.data.preparers import SOURCE_FILE_OPTION, reads_source_file

    options = parse_options(args.name, args.options)
    if args.source_file is None:
        if reads_source_file(args.name) and SOURCE_FILE_OPTION not in options:
            raise InputError(f"dataset {args.name!r} is read from a file: pass --in FILE")
        return options
    if not reads_source_file(args.name):
        raise InputError(f"dataset {args.name!r} reads no input file, so --in {args.source_file} has no use; leave --in out")
    if SOURCE_FILE_OPTION in options:
        raise InputError(f"both --in and {SOURCE_FILE_OPTION}= name the input file; pass only --in FILE")
    return options | {SOURCE_FILE_OPTION: args.source_file}


def _serve_retriever_command(args: argparse.Namespace) -> int:
    import os

    from posttrain.agents.retriever import serve
    from posttrain.agents.retriever.types import TOKEN_ENV

    limits = {name: getattr(args, name) for name in ("max_body_bytes", "max_queries", "max_query_chars")}
    serve(args.corpus, args.index, host=args.host, port=args.port, cache_dir=args.cache_dir,
          token=args.token or os.environ.get(TOKEN_ENV) or None, latency_ms=args.latency_ms,
          **{name: value for name, value in limits.items() if value is not None})
    return 0


def _tools_command(args: argparse.Namespace) -> int:
    import json

    from posttrain.models.tool_formats import format_class, format_names, parser_names
    from posttrain.tools import load_tools

    if args.parsers:
        print("\n".join(parser_names()))
        return 0
    if args.formats:
        print("\n".join(format_names()))
        return 0
    if not args.specs:
        raise InputError("name at least one tool, e.g. `posttrain tools posttrain.tools:calculator my_tools.py:lookup`")
    schemas = [tool.schema for tool in load_tools(args.specs)]
    from posttrain.models import load_tokenizer, resolve_model
    from posttrain.models.tool_format import render_with_tools

    print(json.dumps(schemas, indent=2, ensure_ascii=False))
    tokenizer = load_tokenizer(resolve_model(args.model))
    tool_format = format_class(args.format, tokenizer)(tokenizer)
    print(f"\n# the prompt {args.model} sees, with the tools told in the {tool_format.name} format (docs/tools.md):")
    print(render_with_tools([[{"role": "user", "content": "<the task>"}]], tokenizer, schemas, tool_format=tool_format)[0])
    return 0


def _demo_command(args: argparse.Namespace) -> int:
    from posttrain.demo import run_demo

    run_demo(ranks=args.ranks)
    return 0


def _add_export_command(commands) -> None:
    export = commands.add_parser("export", help="write a checkpoint's policy as a Hugging Face directory")
    export.add_argument("checkpoint", help="a global_step_N directory or a run directory (its latest checkpoint)")
    export.add_argument("--out", required=True, type=Path)
    export.add_argument("--weight", type=float, metavar="W",
                        help="write the policy moved back toward the model the run was trained from: MODEL + W * (policy - "
                             "MODEL), weight by weight (WiSE-FT); 0 is MODEL, 1 the checkpoint's policy, above 1 past it (ExPO)")
    export.add_argument("--average", type=int, default=1, metavar="K",
                        help="write the mean, weight by weight, of the run's last K checkpoints up to CHECKPOINT (before any --weight)")
    export.add_argument("--with", dest="with_runs", action="append", default=[], metavar="RUN",
                        help="another run (or its global_step_N) of the same model to put in the mean: its last K checkpoints "
                             "beside CHECKPOINT's (e.g. the final policies of other seeds); repeatable")
    export.add_argument("--toward", metavar="MODEL",
                        help="with --weight: another MODEL to move toward (a model directory, an SFT run's directory, a Hub id)")
    export.set_defaults(run=_export_command)


def _add_recipe_commands(commands) -> None:
    """``posttrain recipe`` and ``posttrain compare``: stages run as one command, and two evaluations set side by side."""
    recipe = commands.add_parser("recipe", help="run a multi-stage recipe (e.g. search, doctor) as one command; `list` shows them")
    recipe.add_argument("name", help="a built-in recipe (posttrain recipe list), the path of your own .yaml, or list")
    recipe.add_argument("--dir", type=Path, help="where its stages run (default runs/posttrain/<recipe>)")
    recipe.add_argument("--use", action="append", default=[], metavar="STAGE=PATH",
                        help="take PATH (e.g. a patient exported before) as that stage's output instead of running it; repeatable")
    recipe.add_argument("--report", action="store_true",
                        help="run no stage: write the table (report.md) of the stages that finished, e.g. of a recipe under way")
    recipe.add_argument("overrides", nargs="*", help="key=value for every stage, STAGE:key=value for one")
    recipe.set_defaults(run=_recipe_command)

    compare = commands.add_parser("compare", help="two evaluations of the same items: accuracies and their difference, with 95%% intervals")
    compare.add_argument("first", type=Path, metavar="A.jsonl", help="episodes of one evaluation (`posttrain eval --dump-episodes`, or validation/step_N.jsonl)")
    compare.add_argument("second", type=Path, metavar="B.jsonl", help="episodes of the other, on the same items")
    compare.add_argument("--by", metavar="KEY", help="also compare per value of extra_info[KEY], e.g. hops (source: a mixture's sources)")
    compare.set_defaults(run=_compare_command)


def _add_service_commands(commands) -> None:
    """``posttrain serve-retriever``, ``tools`` and ``demo``: the services and tools beside training."""
    retriever = commands.add_parser("serve-retriever", help="serve a corpus over HTTP for search agents (Search-R1's /retrieve API)")
    retriever.add_argument("--corpus", required=True, type=Path, help='JSON lines, one {"id": ..., "contents": ...} a line')
    retriever.add_argument("--index", default="bm25", choices=["bm25", "dense"], help="bm25 (sparse) or dense (MiniLM + faiss); default bm25")
    retriever.add_argument("--host", default="127.0.0.1", help="default 127.0.0.1 (this machine only); any other host needs a token")
    retriever.add_argument("--port", type=int, default=8000)
    retriever.add_argument("--cache-dir", type=Path, help="where dense indexes are cached (default ~/.cache/posttrain/retriever)")
    retriever.add_argument("--token", help="require `Authorization: Bearer TOKEN` on every request (default: $POSTTRAIN_RETRIEVER_TOKEN)")
    retriever.add_argument("--max-body-bytes", type=int, help="larger request bodies get 413 (default 8 MiB)")
    retriever.add_argument("--max-queries", type=int, help="more queries in one request get 422 (default 1024)")
    retriever.add_argument("--max-query-chars", type=int, help="a longer query gets 422 (default 1024)")
    retriever.add_argument("--latency-ms", type=float, default=0.0,
                           help="every search answers after this many ms, like a remote service (benchmarks); default 0")
    retriever.set_defaults(run=_serve_retriever_command)

    tools = commands.add_parser("tools", help="print tools' JSON schemas and the prompt a model sees with them")
    tools.add_argument("specs", nargs="*", metavar="SPEC", help="FILE.py:FUNCTION, FILE.py:CLASS (its public methods) or module:FUNCTION, e.g. posttrain.tools:calculator")
    tools.add_argument("--model", default="smollm2-135m-instruct", help="whose chat template renders the prompt (default smollm2-135m-instruct)")
    tools.add_argument("--parsers", action="store_true", help="list the tool-call parsers env.tool_parser accepts, and stop")
    tools.add_argument("--format", default="auto", help="the tool format (env.tool_format) the prompt is rendered in (default auto)")
    tools.add_argument("--formats", action="store_true", help="list the tool formats env.tool_format accepts, and stop")
    tools.set_defaults(run=_tools_command)

    setup = commands.add_parser("setup", help="install what posttrain needs beyond its package's dependencies, for this machine "
                                              "(the vLLM build, the default model, BFCL's checker, OpenEnv); --dry-run prints the plan")
    install.add_arguments(setup)
    setup.set_defaults(run=install.run_arguments)

    demo = commands.add_parser("demo", help="run the single-controller demo on local Ray")
    demo.add_argument("--ranks", type=int, default=2)
    demo.set_defaults(run=_demo_command)


class _Version(argparse.Action):
    """``--version``: computed only when asked (the commit comes from git)."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        from posttrain.trainer.provenance import version_line

        print(version_line())
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="posttrain", description="RL post-training of language models on Ray.")
    parser.add_argument("--version", action=_Version, help="print posttrain's version (and git commit, from a checkout) and exit")
    commands = parser.add_subparsers(dest="command", required=True)

    for name, run, help_text, default in (
        ("train", _train_command, "train a policy (PPO/GRPO)", DEFAULT_PRESET),
        ("sft", _sft_command, "supervised fine-tuning on chat transcripts (the sft.* section), exported for train", None),
        ("eval", _eval_command, "validate a policy (a checkpoint's, or the configured model)", DEFAULT_PRESET),
        ("config", _config_command, "print the resolved config as YAML, or every problem the command it is for would refuse", None),
    ):
        command = commands.add_parser(name, help=help_text, description=help_text)
        command.add_argument(
            "--preset", default=default,
            help=f"start from a preset: {', '.join(preset_names())}" + (f" (default {default})" if default else ""),
        )
        command.add_argument("--config", action="append", help="a YAML file merged over the preset (repeatable)")
        command.add_argument("overrides", nargs="*", help="dotted key=value overrides, e.g. data.train_batch_size=16")
        command.set_defaults(run=run)
        if name == "config":
            command.add_argument(
                "--for", dest="for_command", choices=COMMANDS, metavar="COMMAND",
                help="report every problem `posttrain COMMAND` (train, sft or eval) would refuse; default: sft when the "
                     "config's sft section differs from the defaults (a preset such as doctor_sft, a --config file or an "
                     "sft.* override sets it), else train",
            )
        if name == "eval":
            command.add_argument("--checkpoint", help="a global_step_N directory or a run directory (its latest checkpoint)")
            command.add_argument("--dump-episodes", metavar="FILE.jsonl",
                                 help="write every validation episode (messages, reward, success, stats) to this file; `posttrain sft` reads it")
            command.add_argument("--by", metavar="KEY", help="also summarise the episodes per value of extra_info[KEY], e.g. hops (source: a mixture's sources)")

    _add_recipe_commands(commands)

    _add_export_command(commands)

    prep = commands.add_parser(
        "prepare", help="write a dataset (gsm8k, arithmetic, synthetic-search, synthetic-doctor, doctor, tool-arithmetic, bfcl, reasoning-gym) as verl-format Parquet")
    prep.add_argument("name", help="gsm8k, arithmetic, synthetic-search, synthetic-doctor, tool-arithmetic, bfcl, reasoning-gym "
                      "(with tasks=NAME[,NAME...]), or doctor (with --in FILE)")
    prep.add_argument("--in", dest="source_file", type=Path, metavar="FILE",
                      help="the input file of a dataset read from one (doctor: a JSON list of cases, or JSON lines)")
    prep.add_argument("--out", required=True, type=Path, help="directory for train.parquet and test.parquet")
    prep.add_argument("options", nargs="*", help="key=value options, e.g. train_size=100 operators=+-")
    prep.set_defaults(run=_prepare_command)

    _add_service_commands(commands)
    return parser



def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    # key=value items after an option (``prepare x --out d k=v``) land in `extra`; they belong to
    # the command's own key=value list.
    listed = "overrides" if hasattr(args, "overrides") else "options" if hasattr(args, "options") else None
    if extra and (listed is None or not all("=" in item and not item.startswith("-") for item in extra)):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if extra:
        setattr(args, listed, [*getattr(args, listed), *extra])
    try:
        return args.run(args)
    except PosttrainError as err:  # every command's known errors: one line and the exit code (a bug keeps its traceback)
        return report_error(err)
    except KeyboardInterrupt:  # before a run's own handling starts (it reads data, loads the model): nothing to save
        print("\nposttrain: interrupted", file=sys.stderr)
        return 130



if __name__ == "__main__":
    sys.exit(main())
