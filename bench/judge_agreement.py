"""How often a judge model agrees with the doctor's rule on diagnoses the rule decides: the measurement
behind ``reward.judge.min_agreement``'s default (docs/rewards.md).

The judge part is the doctor's diagnosis check as a rubric part (the doctor's own question, parser
``yes_no``, rule ``synthetic_doctor``); the rows are ``--cases`` held-out synthetic-doctor cases. The check
is the one a run makes before training (``rewards/judge.py agreement``): each case's own diagnosis
(the rule says right) and the next case's that the rule rejects (wrong), one batched request to the Env-LLM
worker serving ``env.llm.model_path`` (SmolLM2-135M-Instruct by default) on local Ray, greedy.

Writes the figures to ``--out`` (docs/measured/judge_agreement.txt); the last line is
``judge_agreement: <share>``.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

DOCTOR_PART = {
    "name": "diagnosis",
    "judge": {"prompt": 'A doctor diagnosed: "{answer}". The correct diagnosis is: "{ground_truth}". '
                        "Do they name the same condition? Answer only yes or no.",
              "parser": "yes_no", "rule": "synthetic_doctor"},
}


def main() -> None:
    import ray

    from posttrain.config.loader import load_config, preset_path
    from posttrain.data import prepare, read_rows
    from posttrain.rewards.rubric import build_rubric
    from posttrain.rewards.judge import agreement
    from posttrain.rollout.env_llm import open_env_llm
    from posttrain.trainer.roles import start_roles

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cases", type=int, default=64)
    parser.add_argument("--out", default="docs/measured/judge_agreement.txt")
    parser.add_argument("overrides", nargs="*", help="config overrides, e.g. env.llm.model_path=DIR")
    args = parser.parse_args()
    config = load_config([preset_path("doctor_grpo")], args.overrides)
    _, test = prepare("synthetic-doctor", Path(tempfile.mkdtemp(prefix="judge-agreement-")), train_size=64, val_size=args.cases)
    rows = [(row.messages, row.ground_truth, row.data_source, row.extra_info) for row in read_rows([test])]
    (part,) = build_rubric([DOCTOR_PART]).judged
    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
    roles = start_roles(config, total_steps=1)
    try:
        client = open_env_llm(config.env.llm, roles.env_llm)
        found = agreement(part.judge, client, rows)
    finally:
        roles.release()
        ray.shutdown()
    lines = [
        "$ python -m bench.judge_agreement " + " ".join(sys.argv[1:]),
        f"# {datetime.date.today()}, at {_commit()}; {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs",
        f"judge model: {config.env.llm.model_path} ({config.env.llm.rollout}, greedy, max_tokens={config.env.llm.max_tokens})",
        f"rows: {len(rows)} held-out synthetic-doctor cases; asked {found.asked} (each case's own diagnosis, and another case's)",
        f"readable verdicts: {found.readable} of {found.asked} (an unreadable one counts as a disagreement)",
        f"agreement with the synthetic_doctor rule: {found.share:.3f} ({found.agreed} of {found.asked})",
        f"  on right diagnoses (rule: yes): {found.right[0]} of {found.right[1]} said yes",
        f"  on wrong diagnoses (rule: no): {found.wrong[0]} of {found.wrong[1]} said no",
        f"judge_agreement: {found.share:.3f}",
    ]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def _commit() -> str:
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return done.stdout.strip() or "an unknown commit"


if __name__ == "__main__":
    main()
