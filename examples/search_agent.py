"""A search agent written as a user writes one: a plain ``openai`` loop whose ``search`` tool asks a
retriever over HTTP, nothing from posttrain. Trained unchanged through the run's endpoint, with the run's
retriever (started over the dataset's corpus) at ``$POSTTRAIN_RETRIEVER_URL`` (docs/programs.md):

    posttrain train --preset search_tools env.name=program env.tools=[] \
        "env.options={entry: examples/search_agent.py:rollout, use_retriever: true}"

The tool's schema and its result's layout are the built-in ``posttrain.tools:search``'s (``posttrain tools
posttrain.tools:search`` prints the schema), and after its last search turn it tells the model to answer, in the
built-in tool agent's words: the model sees what the built-in tool agent would show it (with a tool format
whose results are a user turn, as the preset's; docs/programs.md).
"""

import json
import os

import httpx

TOOLS = [{
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search the document collection and return the best-matching passages.",
        "parameters": {
            "type": "object",
            "properties": {"query": {"type": "string", "description": "What to look for, e.g. a name or a question."}},
            "required": ["query"],
        },
    },
}]
MAX_TOOL_TURNS = 3  # then one last request for the answer
LAST_TURN = "You have no tool calls left. Give your final answer now, without calling a tool."
TOP_K = 3


async def search(http: httpx.AsyncClient, query: str) -> str:
    """The best passages for ``query``: ``<information>Doc 1 (Title: ...) ...</information>``."""
    token = os.environ.get("POSTTRAIN_RETRIEVER_TOKEN")
    response = await http.post(f"{os.environ['POSTTRAIN_RETRIEVER_URL']}/retrieve", json={"queries": [query.strip()[:300]], "topk": TOP_K},
                               headers={"Authorization": f"Bearer {token}"} if token else None)
    response.raise_for_status()
    lines = []
    for rank, hit in enumerate(response.json()["result"][0], start=1):
        title, newline, text = hit["document"]["contents"].partition("\n")
        title, text = (title.strip().strip('"'), text.strip()) if newline else ("", title.strip())
        lines.append(f"Doc {rank} (Title: {title}) {text}")
    return "<information>" + ("\n".join(lines) or "No documents found.") + "</information>"


async def rollout(client, row):
    """One episode: ask, search for each call, give the passages back, until the model answers without a
    call. Returns None: the row's own score function judges the last reply."""
    messages = list(row["messages"])
    async with httpx.AsyncClient(timeout=30) as http:
        for turn in range(MAX_TOOL_TURNS + 1):
            reply = await client.chat.completions.create(model="policy", messages=messages, tools=TOOLS)
            message = reply.choices[0].message
            if turn == MAX_TOOL_TURNS or not message.tool_calls:
                return None
            messages.append(message.model_dump(exclude_none=True))
            for call in message.tool_calls:
                try:
                    result = await search(http, **json.loads(call.function.arguments))
                except Exception as error:  # the model reads what went wrong
                    result = f"Error: {error}"
                messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
            if turn == MAX_TOOL_TURNS - 1:
                messages.append({"role": "user", "content": LAST_TURN})
    return None
