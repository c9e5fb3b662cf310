"""A calculator agent written as a user writes one: a plain ``openai`` loop, its own tool, nothing from
posttrain. Trained unchanged through the run's endpoint (docs/programs.md):

    posttrain train --preset tool_grpo env.name=program env.tools=[] \
        "env.options={entry: examples/calculator_agent.py:rollout}"

The tool's schema is the one ``posttrain tools posttrain.tools:calculator`` prints (the built-in tool's),
so the model sees the prompt its warm-up (``posttrain sft --preset tool_sft``) taught it.
"""

import ast
import json
import operator

TOOLS = [{
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression exactly and return its value.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {
                "type": "string",
                "description": "The expression, with numbers, + - * / // % ** and parentheses, e.g. \"(1234 + 5) * 678\"."}},
            "required": ["expression"],
        },
    },
}]
MAX_TOOL_TURNS = 2  # then one last request for the answer

OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
             ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow, ast.USub: operator.neg, ast.UAdd: operator.pos}


def calculator(expression: str) -> str:
    def value(node):
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in OPERATORS:
            return OPERATORS[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.UnaryOp) and type(node.op) in OPERATORS:
            return OPERATORS[type(node.op)](value(node.operand))
        raise ValueError(f"{expression!r} is not an arithmetic expression")

    result = value(ast.parse(expression.strip(), mode="eval").body)
    return str(int(result) if isinstance(result, float) and result.is_integer() else result)


async def rollout(client, row):
    """One episode: ask, run the calls, give the results back, until the model answers without a call.
    Returns None: the row's own score function judges the last reply."""
    messages = list(row["messages"])
    for turn in range(MAX_TOOL_TURNS + 1):
        last = turn == MAX_TOOL_TURNS
        reply = await client.chat.completions.create(model="policy", messages=messages, tools=TOOLS)
        message = reply.choices[0].message
        if last or not message.tool_calls:
            return None
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls:
            try:
                result = calculator(**json.loads(call.function.arguments))
            except Exception as error:  # the model reads what went wrong
                result = f"Error: {error}"
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    return None
