"""The ``posttrain`` command.

  posttrain config [--preset NAME] [key=value ...]   print the resolved config (or every problem in it)
  posttrain demo                                     the single controller at work on local Ray
"""

from __future__ import annotations

import argparse
import sys

from posttrain.config import ConfigError, load_config, preset_names, preset_path, to_yaml


def _config_command(args: argparse.Namespace) -> int:
    files = [preset_path(args.preset)] if args.preset else []
    files += args.config or []
    print(to_yaml(load_config(files, args.overrides)), end="")
    return 0


def _demo_command(args: argparse.Namespace) -> int:
    from posttrain.demo import run_demo

    run_demo(ranks=args.ranks)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="posttrain", description="RL post-training of language models on Ray.")
    commands = parser.add_subparsers(dest="command", required=True)

    config = commands.add_parser("config", help="print the resolved config", description="Print the resolved config as YAML.")
    config.add_argument("--preset", help=f"start from a preset ({', '.join(preset_names()) or 'none yet'})")
    config.add_argument("--config", action="append", help="a YAML file merged over the preset (repeatable)")
    config.add_argument("overrides", nargs="*", help="dotted key=value overrides, e.g. data.train_batch_size=16")
    config.set_defaults(run=_config_command)

    demo = commands.add_parser("demo", help="run the single-controller demo on local Ray")
    demo.add_argument("--ranks", type=int, default=2)
    demo.set_defaults(run=_demo_command)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except ConfigError as err:
        print(f"posttrain: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
