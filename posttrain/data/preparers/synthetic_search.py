"""A procedurally generated encyclopedia and questions that need a search engine to answer.

The world, drawn from ``random.Random(seed)``, holds fictional people, cities and organisations
whose names are built from syllables (``"Velnor Kastrin"``, ``"Dunmaro"``, ``"Haltor Guild"``), so no
model can know them: every answer has to be looked up. Every word of every name is unique in the
world, and so are the names themselves.

- a person has a birth year, a birthplace (a city), an occupation and an employer (an organisation);
- a city has a country (fictional), a founding year and a river that runs through it;
- an organisation has a founding year, headquarters (a city), a founder (a person) and an industry.

``corpus.jsonl`` holds one document per person, city and organisation, one JSON object a line,
``{"id": "12", "contents": "\\"<Name>\\"\\n<sentences>"}`` — Search-R1's convention (title line in
quotes, then the text). A document states every attribute of its entity and nothing about any other
entity's attributes: a person's document names the birthplace but not its country.

Questions ask for one attribute of one entity, answered in a few words (a name, a year, a country):

- single-hop (``hops=1``, ``relation="birthplace"``): "In which city was Velnor Kastrin born?" — the
  answer is in the subject's document;
- two-hop (``hops=2``, ``relation="birthplace.country"``): "In which country was Velnor Kastrin
  born?" — the subject's document names the bridge entity (the city), whose document holds the answer.

The split: every (subject entity, relation) pair gives exactly one question. The single-hop and the
two-hop pairs are shuffled apart; the held-out split (``test.parquet``) takes the first
``round(val_size * two_hop_fraction)`` two-hop pairs and the first of the rest single-hop pairs,
train takes the next ones, so train and test never ask the same (entity, relation). They may ask
about the same entity (its birthplace in train, its birth year in test), as a retrieval task should.

Rows follow verl's format with Search-R1's layout: ``data_source="synthetic_search"``, the prompt is
one user message, :func:`search_instruction` of the question (:func:`tool_instruction` with
``tool_format=True``, for the ``search`` tool of a tool-calling agent), and the ground truth is
``{"target": [answer, *aliases]}`` (a river also answers to ``"<Name> River"``). ``extra_info`` holds
``split, index, question, hops, relation, subject, bridge`` (``bridge`` is ``""`` for one hop).
The same arguments always give byte-identical files.

Expert transcripts (``sft_size > 0``): ``sft.parquet`` (``sft_size`` rows) and, unless
``sft_val_size`` is 0, ``sft_val.parquet`` (``sft_val_size`` rows), each a ``messages`` column for ``posttrain sft``, made from TRAIN questions
only (the held-out split never appears). A scripted expert plays the real :class:`SearchEnv` over a
real BM25 index of this corpus (``sft_topk`` hits, as the environment shows them): it searches the
name of the question's subject; on a two-hop question it then searches the bridge entity named in
the subject's document; then it answers. With ``tool_format=True`` it does the same as a tool-calling
agent: a ``<tool_call>`` to the built-in ``search`` tool per hop, the tool's own result (its
``SEARCH_TOPK`` hits, ``sft_topk`` is unused) in ``<tool_response>``, the answer in plain text.
``sft_two_hop_fraction`` of the transcripts are two-hop. A question whose searches do not
retrieve the answer's evidence is skipped, so the expert never answers what it has not read.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from posttrain.data.format import make_row, write_conversations, write_rows
from posttrain.data.preparers.options import check_counts
from posttrain.errors import InputError

DATA_SOURCE = "synthetic_search"
ABILITY = "fact-reasoning"
CORPUS_FILE = "corpus.jsonl"

PERSON, CITY, ORGANISATION = "person", "city", "organisation"
_SYLLABLES = (
    "ka", "lo", "mir", "tan", "vel", "dor", "sa", "bri", "fen", "gar", "hol", "kor", "lin", "mar",
    "nor", "pel", "quin", "ros", "sel", "tam", "var", "wen", "yor", "zel", "bas", "dal", "fal", "gil",
    "har", "jor", "ne", "ru", "vo", "ti", "lu", "be", "dra", "sto", "mek", "thal",
)
_COUNTRY_ENDINGS = ("ia", "land", "mora", "stan")
_ORGANISATION_KINDS = ("Works", "Group", "Guild", "Company", "Trust", "Institute")
_OCCUPATIONS = (
    "engineer", "painter", "surveyor", "chemist", "architect", "teacher", "sailor", "botanist",
    "cartographer", "composer", "physician", "weaver", "astronomer", "lawyer", "baker",
)
_INDUSTRIES = (
    "shipbuilding", "textiles", "mining", "publishing", "brewing", "glassmaking", "clockmaking",
    "banking", "printing", "pottery", "insurance", "tanning",
)
# Words of the documents and questions that a generated name must never equal.
_RESERVED_WORDS = frozenset(w.lower() for w in (*_ORGANISATION_KINDS, "river", "city", "the", "a", "an"))

# (subject kind, relation) -> question; relations are single-hop.
_SINGLE_HOP_QUESTIONS = {
    (PERSON, "birth_year"): "In what year was {} born?",
    (PERSON, "birthplace"): "In which city was {} born?",
    (PERSON, "occupation"): "What is the occupation of {}?",
    (PERSON, "employer"): "Which organisation does {} work for?",
    (CITY, "country"): "In which country is the city of {}?",
    (CITY, "founded"): "In what year was the city of {} founded?",
    (CITY, "river"): "Which river runs through {}?",
    (ORGANISATION, "founded"): "In what year was {} founded?",
    (ORGANISATION, "headquarters"): "In which city does {} have its headquarters?",
    (ORGANISATION, "founder"): "Who founded {}?",
    (ORGANISATION, "industry"): "In which industry does {} work?",
}
# (subject kind, "link.attribute") -> question; the link names the bridge entity.
_TWO_HOP_QUESTIONS = {
    (PERSON, "birthplace.country"): "In which country was {} born?",
    (PERSON, "birthplace.river"): "Which river runs through the city where {} was born?",
    (PERSON, "employer.founder"): "Who founded the organisation that {} works for?",
    (PERSON, "employer.headquarters"): "In which city does the organisation that {} works for have its headquarters?",
    (ORGANISATION, "headquarters.country"): "In which country does {} have its headquarters?",
    (ORGANISATION, "founder.birthplace"): "In which city was the founder of {} born?",
    (ORGANISATION, "founder.birth_year"): "In what year was the founder of {} born?",
}


def search_instruction(question: str) -> str:
    """The user message of a row: Search-R1's instruction, shortened for a small model, then the question.

    No placeholder words or example answers inside the tags: SmolLM2-135M copied both literally
    ("<search> query </search>", "<answer> answer </answer>") to collect the format score.
    """
    return (
        "Answer the question. Think briefly first. If you need facts, write a search query between <search> and </search>; "
        "the results come back between <information> and </information>. You may search several times. "
        "Give the final answer between <answer> and </answer>, a few words without explanation. "
        f"Question: {question}\n"
    )


@dataclass(frozen=True)
class Entity:
    """One person, city or organisation; ``facts`` maps a relation to its value as written in the corpus."""

    kind: str
    name: str
    facts: dict[str, str]


@dataclass(frozen=True)
class Question:
    subject: str
    relation: str  # "birthplace" (one hop) or "birthplace.country" (two hops)
    text: str
    answers: tuple[str, ...]  # the answer first, then its aliases
    bridge: str = ""

    @property
    def hops(self) -> int:
        return 2 if self.bridge else 1


@dataclass(frozen=True)
class World:
    entities: list[Entity]  # people, then cities, then organisations

    def entity(self, name: str) -> Entity:
        return next(e for e in self.entities if e.name == name)


class _NameMaker:
    """Words made of syllables, none made twice (case-insensitive) and none a reserved word."""

    def __init__(self, rng: random.Random) -> None:
        self._rng, self._used = rng, set(_RESERVED_WORDS)

    def word(self, syllables: int, ending: str = "") -> str:
        while True:
            parts = [self._rng.choice(_SYLLABLES) for _ in range(syllables)]
            if any(a == b for a, b in zip(parts, parts[1:])):
                continue  # "Pelpel" reads like a stutter
            word = ("".join(parts) + ending).capitalize()
            if word.lower() not in self._used:
                self._used.add(word.lower())
                return word


def build_world(num_people: int, num_places: int, num_organisations: int, seed: int) -> World:
    """The seeded world: ``num_places`` cities in about one country per six cities, rivers shared by about two."""
    rng = random.Random(seed)
    names = _NameMaker(rng)
    countries = [names.word(2, rng.choice(_COUNTRY_ENDINGS)) for _ in range(max(2, round(num_places / 6)))]
    rivers = [names.word(2) for _ in range(max(1, num_places // 2))]
    cities = [
        Entity(CITY, names.word(rng.choice((2, 3))), {
            "country": rng.choice(countries), "founded": str(rng.randint(1100, 1800)), "river": rng.choice(rivers),
        })
        for _ in range(num_places)
    ]
    organisation_names = [f"{names.word(rng.choice((2, 3)))} {rng.choice(_ORGANISATION_KINDS)}" for _ in range(num_organisations)]
    people = [
        Entity(PERSON, f"{names.word(2)} {names.word(rng.choice((2, 3)))}", {
            "birth_year": str(rng.randint(1820, 1970)), "birthplace": rng.choice(cities).name,
            "occupation": rng.choice(_OCCUPATIONS), "employer": rng.choice(organisation_names),
        })
        for _ in range(num_people)
    ]
    organisations = []
    for name in organisation_names:
        founder = rng.choice(people)
        organisations.append(Entity(ORGANISATION, name, {
            # founded when the founder was 25 to 55, so the world stays plausible
            "founded": str(int(founder.facts["birth_year"]) + rng.randint(25, 55)),
            "headquarters": rng.choice(cities).name, "founder": founder.name, "industry": rng.choice(_INDUSTRIES),
        }))
    return World(people + cities + organisations)


def document_text(entity: Entity) -> str:
    """The document of ``entity``: its quoted name on the first line, then sentences stating every fact."""
    name, f = entity.name, entity.facts
    if entity.kind == PERSON:
        body = (f"{name} is {_with_article(f['occupation'])} born in {f['birth_year']} in {f['birthplace']}. "
                f"{name} works for {f['employer']}.")
    elif entity.kind == CITY:
        body = (f"{name} is a city in {f['country']}, founded in {f['founded']}. "
                f"The {f['river']} River runs through {name}.")
    else:
        body = (f"{name} is {_with_article(f['industry'])} organisation founded in {f['founded']} by {f['founder']}. "
                f"Its headquarters are in {f['headquarters']}.")
    return f'"{name}"\n{body}'


def _with_article(word: str) -> str:
    return f"{'an' if word[0] in 'aeiou' else 'a'} {word}"


def corpus_documents(world: World) -> list[dict[str, str]]:
    """``[{"id": "0", "contents": ...}, ...]``, one per entity in the world's order."""
    return [{"id": str(i), "contents": document_text(e)} for i, e in enumerate(world.entities)]


def _answers(relation: str, answer: str) -> tuple[str, ...]:
    return (answer, f"{answer} River") if relation.endswith("river") else (answer,)


def all_questions(world: World) -> tuple[list[Question], list[Question]]:
    """Every single-hop and every two-hop question the world supplies, in a fixed order."""
    by_name = {e.name: e for e in world.entities}
    single, two = [], []
    for entity in world.entities:
        for (kind, relation), template in _SINGLE_HOP_QUESTIONS.items():
            if kind == entity.kind:
                answer = entity.facts[relation]
                single.append(Question(entity.name, relation, template.format(entity.name), _answers(relation, answer)))
        for (kind, relation), template in _TWO_HOP_QUESTIONS.items():
            if kind == entity.kind:
                link, attribute = relation.split(".")
                bridge = by_name[entity.facts[link]]
                answer = bridge.facts[attribute]
                two.append(Question(entity.name, relation, template.format(entity.name), _answers(relation, answer), bridge.name))
    return single, two


def split_questions(world: World, train_size: int, val_size: int, two_hop_fraction: float,
                    rng: random.Random) -> dict[str, list[Question]]:
    """``{"train": [...], "test": [...]}`` with no (subject, relation) in both; see the module docstring."""
    single, two = all_questions(world)
    rng.shuffle(single)
    rng.shuffle(two)
    two_counts = {"test": round(val_size * two_hop_fraction), "train": round(train_size * two_hop_fraction)}
    sizes = {"test": val_size, "train": train_size}
    _check_supply(len(single), sum(sizes[s] - two_counts[s] for s in sizes), "single-hop", world)
    _check_supply(len(two), sum(two_counts.values()), "two-hop", world)
    splits = {}
    for split in ("test", "train"):
        single_count = sizes[split] - two_counts[split]
        chosen = two[:two_counts[split]] + single[:single_count]
        two, single = two[two_counts[split]:], single[single_count:]
        rng.shuffle(chosen)
        splits[split] = chosen
    return {"train": splits["train"], "test": splits["test"]}


def _check_supply(available: int, wanted: int, hops: str, world: World) -> None:
    if wanted > available:
        counts = {kind: sum(e.kind == kind for e in world.entities) for kind in (PERSON, CITY, ORGANISATION)}
        raise InputError(
            f"asked for {wanted} {hops} questions but a world of {counts[PERSON]} people, {counts[CITY]} places "
            f"and {counts[ORGANISATION]} organisations supplies only {available}; lower train_size/val_size, "
            "change two_hop_fraction, or raise num_people/num_places/num_organisations"
        )


def checked_options(given: dict[str, Any]) -> None:
    """InputError for what prepare_synthetic_search's arguments alone call for (also ``preparers.check_options``'s)."""
    check_counts(1, **{key: given[key] for key in ("num_people", "num_places", "num_organisations", "train_size", "val_size", "sft_topk")})
    check_counts(0, sft_size=given["sft_size"], sft_val_size=given["sft_val_size"])
    for key in ("two_hop_fraction", "sft_two_hop_fraction"):
        if not 0.0 <= given[key] <= 1.0:
            raise InputError(f"{key}={given[key]}: must lie in [0, 1], e.g. {key}=0.5")


def prepare_synthetic_search(
    out_dir: Path,
    *,
    num_people: int = 200,
    num_places: int = 60,
    num_organisations: int = 40,
    train_size: int = 1000,
    val_size: int = 100,
    two_hop_fraction: float = 0.5,
    seed: int = 0,
    sft_size: int = 0,
    sft_val_size: int = 50,
    sft_two_hop_fraction: float = 0.0,
    sft_topk: int = 2,
    tool_format: bool = False,
) -> list[Path]:
    """Write ``train.parquet`` and ``test.parquet`` (returned) and, beside them, ``corpus.jsonl`` (:data:`CORPUS_FILE`);
    with ``sft_size > 0`` also ``sft.parquet`` and ``sft_val.parquet`` (returned after them)."""
    checked_options(dict(locals()))
    world = build_world(num_people, num_places, num_organisations, seed)
    # questions draw from their own stream, so the world does not change with the split sizes
    splits = split_questions(world, train_size, val_size, two_hop_fraction, random.Random(f"questions-{seed}"))
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    with open(out_dir / CORPUS_FILE, "w", encoding="utf-8") as corpus:
        corpus.writelines(json.dumps(doc, ensure_ascii=False) + "\n" for doc in corpus_documents(world))
    paths = [write_rows([_row(q, split, i, tool_format) for i, q in enumerate(questions)], out_dir / f"{split}.parquet")
             for split, questions in splits.items()]
    for stale in ("sft.parquet", "sft_val.parquet"):  # a directory reused with other options keeps no old transcripts
        (out_dir / stale).unlink(missing_ok=True)
    if sft_size:
        paths += write_expert_transcripts(world, splits["train"], out_dir, sft_size, sft_val_size, sft_two_hop_fraction, sft_topk, tool_format)
    return paths


def write_expert_transcripts(world: World, train: list[Question], out_dir: Path, size: int, val_size: int,
                             two_hop_fraction: float, topk: int, tool_format: bool = False) -> list[Path]:
    """``sft.parquet`` and ``sft_val.parquet`` of expert transcripts over ``train`` questions (module docstring)."""
    from posttrain.agents.retriever.index import BM25Index
    from posttrain.agents.retriever.types import Document

    index = BM25Index([Document(d["id"], d["contents"]) for d in corpus_documents(world)])
    wanted = {2: round(size * two_hop_fraction) + round(val_size * two_hop_fraction)}
    wanted[1] = size + val_size - wanted[2]
    made: dict[int, list[list[dict[str, str]]]] = {1: [], 2: []}
    skipped = 0
    retriever = _IndexRetriever(index)
    for question in train:
        if len(made[question.hops]) >= wanted[question.hops]:
            continue
        messages = expert_tool_transcript(question, retriever) if tool_format else expert_transcript(question, retriever, topk)
        if messages is None:
            skipped += 1
        else:
            made[question.hops].append(messages)
    for hops, count in wanted.items():
        if len(made[hops]) < count:
            raise InputError(
                f"asked for {count} {hops}-hop expert transcripts but the training split yields only {len(made[hops])} "
                f"({skipped} questions skipped: their searches missed the evidence); raise train_size or lower sft_size"
            )
    val_two = round(val_size * two_hop_fraction)
    val = made[2][:val_two] + made[1][: val_size - val_two]
    train_rows = made[2][val_two:] + made[1][val_size - val_two:]
    random.Random(f"sft-{len(train_rows)}").shuffle(train_rows)
    paths = [write_conversations(train_rows, out_dir / "sft.parquet")]
    return paths + ([write_conversations(val, out_dir / "sft_val.parquet")] if val else [])


class _IndexRetriever:
    """The retriever protocol over an in-process index: the service's own BM25, without HTTP."""

    def __init__(self, index) -> None:
        self.index = index

    def retrieve(self, queries: list[str], topk: int):
        return self.index.search(queries, topk)


def expert_transcript(question: Question, retriever, topk: int) -> list[dict[str, str]] | None:
    """The scripted expert's episode in :class:`SearchEnv` as chat messages, or None when its
    searches did not retrieve the evidence holding the answer."""
    from posttrain.agents.env import EpisodeSample
    from posttrain.agents.search import SearchEnv

    prompt = [{"role": "user", "content": search_instruction(question.text)}]
    env = SearchEnv(retriever, topk=topk)
    env.reset(EpisodeSample(prompt, {"target": list(question.answers)}))
    messages, found = list(prompt), False
    for query in (question.subject, question.bridge)[: question.hops]:
        action = f"<search> {query} </search>"
        result = env.step(action)
        found = bool(result.info.counts.get("evidence_found")) or found
        messages += [{"role": "assistant", "content": action}, {"role": "user", "content": result.observation}]
    answer = env.step(f"<answer> {question.answers[0]} </answer>")
    if not (found and answer.info.success):
        return None
    return messages + [{"role": "assistant", "content": f"<answer> {question.answers[0]} </answer>"}]


def expert_tool_transcript(question: Question, retriever) -> list[dict[str, str]] | None:
    """The scripted expert's episode as a tool-calling agent (``tool_format=True``): a call to the built-in
    ``search`` tool per hop, each result exactly as that tool returns it, then the answer in plain text;
    None when its searches did not retrieve the evidence holding the answer."""
    from posttrain.agents.search import holds_answer
    from posttrain.models.tool_formats.builtin import tool_calls_text, tool_responses
    from posttrain.tools.builtin import SEARCH_TOPK, shown_hits

    messages, found = [{"role": "user", "content": tool_instruction(question.text)}], False
    for query in (question.subject, question.bridge)[: question.hops]:
        hits = retriever.retrieve([query], SEARCH_TOPK)[0]
        found = found or holds_answer(hits, question.answers)
        messages += [{"role": "assistant", "content": tool_calls_text([{"name": "search", "arguments": {"query": query}}])},
                     {"role": "user", "content": tool_responses([("search", shown_hits(hits))])}]
    return messages + [{"role": "assistant", "content": question.answers[0]}] if found else None


def tool_instruction(question: str) -> str:
    """The user message of a row for a tool-calling agent (``tool_format=True``): the tools are told by
    the tool format, so only the task and the answer's form are said here."""
    return f"Answer the question with a few words, using the search tool to find the facts. Question: {question}"


def _row(question: Question, split: str, index: int, tool_format: bool = False) -> dict:
    return make_row(
        data_source=DATA_SOURCE,
        messages=[{"role": "user", "content": (tool_instruction if tool_format else search_instruction)(question.text)}],
        ground_truth={"target": list(question.answers)},
        ability=ABILITY,
        extra_info={"split": split, "index": index, "question": question.text, "hops": question.hops,
                    "relation": question.relation, "subject": question.subject, "bridge": question.bridge},
    )
