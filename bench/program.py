"""An agent program through the run's endpoint (``env.name: program``, rollout/program.py) against the
built-in tool agent (``env.name: tools``), episodes per second on the same rows, the same policy worker
(vLLM in a Ray actor, SmolLM2-135M-Instruct by default) and the same tool (the calculator).

    .venv/bin/python -m bench.program [--rows 32] [--n 4] [--rounds 2] [--model PATH]

``--model``: e.g. the export of ``posttrain sft --preset tool_sft`` (``posttrain recipe program_calculator``'s
sft stage), which calls the calculator in most episodes; the base model mostly answers at once.

Both sides run the tool_grpo preset's episodes (up to ``env.max_turns`` tool turns, then an answer) on
``--rows`` validation rows × ``--n`` samples, alternating, ``--rounds`` times each; the program is a plain
``openai`` loop with its own copy of the calculator, told the run's tool schema. Also printed: engine
calls and contexts per call on each side (the endpoint gathers requests that arrive together; the agent
loop sends each round's live episodes as one call), and requests per episode. Headline: the program's
episodes/s over the built-in's (median of the rounds): the issue's target is >= 0.8.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from posttrain import keys
from posttrain.config import load_config
from posttrain.config.loader import preset_path
from posttrain.metrics import values
from posttrain.models import resolve_model
from posttrain.rollout import RolloutRoles
from posttrain.rollout.batching import group_ids_of
from posttrain.rollout.toolbox import tool_schemas
from posttrain.trainer.setup import rollout_setup
from bench.common import start_policy

PROGRAM = '''
import json
from posttrain.tools import calculator  # the user's own copy of the tool; here the same function

TOOLS = SCHEMAS


async def rollout(client, row):
    messages = list(row["messages"])
    for _ in range(MAX_TURNS):
        reply = await client.chat.completions.create(model="policy", messages=messages, tools=TOOLS)
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            return None
        for call in message.tool_calls:
            try:
                result = calculator(**json.loads(call.function.arguments))
            except Exception as error:
                result = f"error: {error}"
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    reply = await client.chat.completions.create(model="policy", messages=messages)
    return None
'''


class Counting:
    """The policy worker group, counting engine calls and their contexts."""

    def __init__(self, group):
        self.group, self.calls, self.contexts = group, 0, 0

    def generate_turn(self, batch):
        self.calls += 1
        self.contexts += len(batch[keys.TURN_CONTEXT_IDS])
        return self.group.generate_turn(batch)

    def release_rollout(self):
        return self.group.release_rollout()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--model", default=None, help="the policy (default: the preset's, SmolLM2-135M-Instruct)")
    args = parser.parse_args()
    overrides = [f"data.val_batch_size={args.rows}", f"actor_rollout_ref.rollout.n={args.n}"]
    if args.model:
        overrides.append(f"actor_rollout_ref.model.path={args.model}")
    preset = [preset_path("tool_grpo")]
    builtin = load_config(preset, overrides)
    with tempfile.TemporaryDirectory() as folder:
        program_file = Path(folder) / "agent.py"
        program_file.write_text(PROGRAM.replace("SCHEMAS", json.dumps(tool_schemas(builtin.env))).replace("MAX_TURNS", str(builtin.env.max_turns)))
        program = load_config(preset, [*overrides, "env.name=program", f"env.options={{entry: {program_file}:rollout}}", "env.tools=[]"])
        sides = {"builtin": rollout_setup(builtin, training=False), "program": rollout_setup(program, training=False)}
        data = builtin.data
        group, _ = start_policy(resolve_model(builtin.actor_rollout_ref.model.path), data.max_prompt_length, data.max_response_length,
                                temperature=builtin.actor_rollout_ref.rollout.temperature)
        prompts = next(iter(sides["builtin"].data.val))
        batch = prompts.repeat(args.n, interleave=True)
        batch.tensors[keys.GROUP_IDS] = group_ids_of(batch[keys.UID])
        rates: dict[str, list[float]] = {name: [] for name in sides}
        for round_ in range(args.rounds):
            for name, setup in sides.items():
                actor = Counting(group)
                roles = RolloutRoles(actor=actor)
                setup.rollout.open(roles)
                try:
                    start = time.perf_counter()
                    _, metrics = setup.rollout(roles, batch, whole_batch=False)
                    seconds = time.perf_counter() - start
                finally:
                    setup.rollout.close()
                metrics = values(metrics)
                episodes = len(batch)
                rates[name].append(episodes / seconds)
                requests = metrics.get("program/requests", actor.contexts)
                print(f"round {round_} {name}: {episodes} episodes in {seconds:.1f} s = {episodes / seconds:.2f} episodes/s; "
                      f"{actor.calls} engine calls, {actor.contexts / max(actor.calls, 1):.1f} contexts per call, "
                      f"{requests / episodes:.2f} requests per episode", flush=True)
    ratio = statistics.median(rates["program"]) / statistics.median(rates["builtin"])
    print(f"program over builtin, episodes/s (median of {args.rounds} rounds): {ratio:.3f}")
    print(f"program_throughput_ratio: {ratio:.3f}")


if __name__ == "__main__":
    main()
