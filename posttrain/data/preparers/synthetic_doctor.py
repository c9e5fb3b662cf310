"""Synthetic consultations: a patient names a complaint, and two or three questions find the cause.

The world is a table of 8 clusters of 4 conditions (32 in all), one cluster per chief complaint
(:data:`CLUSTERS`: chest pain, headache, cough, abdominal pain, rash, joint pain, dizziness,
fatigue). Each cluster has exactly 3 yes/no findings, always asked in the same order Q1, Q2, Q3;
each finding holds the question a good doctor asks, the patient's "yes" and "no" replies, and a
"yes" and a "no" statement for the hidden description. The 4 conditions of a cluster, in table
order, answer with the patterns (:data:`PATTERNS`)

    A = (yes, yes, yes)   B = (yes, yes, no)   C = (yes, no, no)   D = (no, no, yes)

so Q1 alone singles out D, Q1 and Q2 single out C, and only Q3 tells A from B. Each condition has
a name and aliases (e.g. "gastro-oesophageal reflux disease", "GERD", "acid reflux"); any of them
is a right diagnosis.

A case is a condition, an age (18 to 80), a sex, one of the cluster's 3 self-report phrasings and
one of its 5 durations; no ``(condition, age, sex, phrasing, duration)`` appears twice in the
dataset. The self-report, shown to the doctor, names only the complaint and its duration ("I've had
chest pain for three days."), so it fits all 4 conditions of its cluster. The hidden description
holds the age, sex, complaint and duration and the 3 finding statements of the condition, shuffled
per case ("A 45-year-old man. He has had chest pain for three days. Sitting up does not ease the
pain. ..."), so it supports every reply. ``extra_info.qa`` holds the cluster's 3 questions, in order,
with this case's replies.

The split: ``test.parquet`` (``val_size`` cases) and ``train.parquet`` (``train_size`` cases) never
share a case, and each spreads its cases over the conditions as evenly as the size allows (64 test
cases: 2 per condition). Each condition's cases are drawn from its own shuffled list, test first,
so the held-out split does not change with ``train_size``. Rows follow verl's format with
``data_source="synthetic_doctor"``; the prompt is one user message, :func:`doctor_instruction` of the
self-report; the ground truth and ``extra_info`` are :class:`Case`'s (see agents/doctor/case.py),
with ``split, index, condition, cluster, pattern`` beside them. The same arguments give
byte-identical files; another seed gives other files.

Expert transcripts (``sft_size > 0``): ``sft.parquet`` (``sft_size`` rows) and, unless
``sft_val_size`` is 0, ``sft_val.parquet``, each a ``messages`` column for ``posttrain sft``, made
from TRAIN cases only (``sft_val`` from the first ``sft_val_size`` of the shuffled train split,
``sft`` from the next ``sft_size``). The expert plays the real :class:`DoctorEnv` with the rule
patient. It is honest but not perfect: it asks the cluster's questions in order and stops after
``sft_questions`` (default 2), except in ``round(n * sft_extra_question_fraction)`` transcripts of each
file (picked by a seeded rng), where it asks all 3; then it names the first condition in table order
(A, B, C, D) that fits the answers it heard. With 2 questions it calls every B case A, which is
wrong: RL has something left to learn (ask Q3 when Q1 and Q2 are both yes).

Patient transcripts (``patient_sft_size > 0``): ``patient_sft.parquet``, a ``messages`` column of the
Env-LLM's own prompt (:func:`~posttrain.agents.doctor.prompts.patient_messages`: the hidden description,
0 to 2 earlier questions of the case with their answers, a question) and the reply the case supports,
over TRAIN cases only; a fifth of the questions come from another cluster and are answered "I don't
know.". ``posttrain sft`` on them turns a small chat model into a faithful patient for ``env.llm.model_path``
(a stock 135M model answers the case's yes/no findings about as often wrongly as rightly).
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from posttrain.agents.doctor.case import QA, Case
from posttrain.agents.doctor.prompts import doctor_instruction
from posttrain.data.format import write_conversations, write_rows
from posttrain.data.preparers.doctor_json import case_row
from posttrain.data.preparers.options import check_counts
from posttrain.errors import InputError

DATA_SOURCE = "synthetic_doctor"
PATTERNS = {"A": (True, True, True), "B": (True, True, False), "C": (True, False, False), "D": (False, False, True)}
AGES = range(18, 81)
SEXES = ("man", "woman")


@dataclass(frozen=True)
class Finding:
    """One yes/no finding: the doctor's question, the patient's replies, the description's statements."""

    question: str
    yes_reply: str
    no_reply: str
    yes_statement: str
    no_statement: str

    def reply(self, present: bool) -> str:
        return self.yes_reply if present else self.no_reply

    def statement(self, present: bool) -> str:
        return self.yes_statement if present else self.no_statement


@dataclass(frozen=True)
class Condition:
    name: str
    aliases: tuple[str, ...]


@dataclass(frozen=True)
class Cluster:
    """A chief complaint; ``conditions`` take the patterns A, B, C, D in this order."""

    name: str
    complaint: str  # as in "He has had <complaint> for three days."
    phrasings: tuple[str, ...]  # self-reports with a {duration} slot
    durations: tuple[str, ...]
    findings: tuple[Finding, Finding, Finding]
    conditions: tuple[Condition, Condition, Condition, Condition]

    def pattern(self, condition: Condition) -> str:
        return "ABCD"[self.conditions.index(condition)]


CLUSTERS = (
    Cluster("chest pain", "chest pain",
            ("I've had chest pain for {duration}.", "My chest has been hurting for {duration}.",
             "I've been getting pain in my chest for {duration}."),
            ("two days", "three days", "a week", "two weeks", "a month"),
            (Finding("Does the pain get worse when you are active or moving around?", "Yes, it gets worse when I move around or exert myself.",
                     "No, moving around does not make it worse.", "The pain gets worse with activity and movement.",
                     "Activity and movement do not make the pain worse."),
             Finding("Does the pain spread to your neck, shoulder or arm?", "Yes, it spreads to my neck and shoulder.",
                     "No, it stays in my chest.", "The pain spreads to the neck and shoulder.", "The pain stays in the chest and does not spread."),
             Finding("Does the pain ease when you sit up and lean forward?", "Yes, sitting up and leaning forward makes it better.",
                     "No, sitting up does not help.", "The pain eases on sitting up and leaning forward.", "Sitting up does not ease the pain.")),
            (Condition("pericarditis", ("acute pericarditis",)),
             Condition("angina", ("angina pectoris", "stable angina")),
             Condition("costochondritis", ("chest wall inflammation", "costosternal syndrome")),
             Condition("gastro-oesophageal reflux disease", ("GERD", "GORD", "acid reflux", "gastroesophageal reflux disease")))),
    Cluster("headache", "headaches",
            ("I've had headaches for {duration}.", "My head has been hurting for {duration}.", "I keep getting headaches, for {duration} now."),
            ("three days", "a week", "two weeks", "a month", "three months"),
            (Finding("Have you had headaches like this before?", "Yes, I get headaches like this from time to time.",
                     "No, this is the first time I've had a headache like this.", "Headaches like this have come before.",
                     "This is the first headache of its kind."),
             Finding("Is the pain on one side of your head only?", "Yes, it is only on one side.",
                     "No, it is on both sides of my head.", "The pain is on one side of the head only.", "The pain is on both sides of the head."),
             Finding("Does your nose run or feel blocked with the headache?", "Yes, my nose runs or gets blocked.",
                     "No, my nose is fine.", "The nose runs or feels blocked with the headache.", "The nose is clear.")),
            (Condition("cluster headache", ("cluster headaches",)),
             Condition("migraine", ("migraine headache", "migraines")),
             Condition("tension headache", ("tension-type headache", "stress headache")),
             Condition("sinusitis", ("acute sinusitis", "sinus infection", "rhinosinusitis")))),
    Cluster("cough", "a cough",
            ("I've had a cough for {duration}.", "I've been coughing for {duration}.", "This cough has been bothering me for {duration}."),
            ("three days", "five days", "a week", "ten days", "two weeks"),
            (Finding("Are you coughing up phlegm?", "Yes, I cough up phlegm.",
                     "No, it is a dry cough.", "The cough brings up phlegm.", "The cough is dry."),
             Finding("Have you had a fever?", "Yes, I've had a fever.",
                     "No, I haven't had a fever.", "There is a fever.", "There is no fever."),
             Finding("Do you get short of breath?", "Yes, I get short of breath easily.",
                     "No, my breathing is fine.", "There is shortness of breath.", "Breathing is normal.")),
            (Condition("pneumonia", ("lung infection", "community-acquired pneumonia")),
             Condition("acute bronchitis", ("bronchitis", "chest cold")),
             Condition("postnasal drip", ("post-nasal drip", "upper airway cough syndrome")),
             Condition("asthma", ("bronchial asthma", "cough-variant asthma")))),
    Cluster("abdominal pain", "abdominal pain",
            ("I've had stomach pain for {duration}.", "My tummy has been hurting for {duration}.", "I've had pain in my belly for {duration}."),
            ("a day", "two days", "three days", "a week", "two weeks"),
            (Finding("Have you felt sick or been vomiting?", "Yes, I've felt sick and have vomited.",
                     "No, I haven't felt sick at all.", "There is nausea and vomiting.", "There is no nausea or vomiting."),
             Finding("Is the pain in one particular spot?", "Yes, it is in one spot on the right side.",
                     "No, it is spread over my whole belly.", "The pain is in one spot on the right side of the abdomen.",
                     "The pain is spread across the whole abdomen."),
             Finding("Does the pain come on after eating?", "Yes, it comes on after I eat.",
                     "No, eating makes no difference.", "The pain comes on after eating.", "Eating makes no difference to the pain.")),
            (Condition("gallstones", ("biliary colic", "gallstone disease", "cholelithiasis")),
             Condition("appendicitis", ("acute appendicitis",)),
             Condition("gastroenteritis", ("stomach flu", "stomach bug", "gastro")),
             Condition("irritable bowel syndrome", ("IBS", "irritable bowel")))),
    Cluster("rash", "a rash",
            ("I've had a rash for {duration}.", "A rash came up on my skin {duration} ago.", "My skin has broken out in a rash, for {duration} now."),
            ("two days", "four days", "a week", "two weeks", "three weeks"),
            (Finding("Is the rash itchy?", "Yes, it is very itchy.",
                     "No, it doesn't itch.", "The rash is itchy.", "The rash is not itchy."),
             Finding("Did the rash start after contact with something new, like a soap, plant, food or medicine?",
                     "Yes, it started after I used something new.", "No, I can't think of anything new.",
                     "The rash started after contact with something new.", "Nothing new came before the rash."),
             Finding("Is the rash only on one part of your body?", "Yes, it is just on one part of my body.",
                     "No, it is in several places.", "The rash is on one part of the body only.", "The rash is in several places on the body.")),
            (Condition("contact dermatitis", ("allergic contact dermatitis", "irritant contact dermatitis")),
             Condition("hives", ("urticaria", "nettle rash")),
             Condition("eczema", ("atopic dermatitis", "atopic eczema")),
             Condition("shingles", ("herpes zoster", "zoster")))),
    Cluster("joint pain", "joint pain",
            ("I've had joint pain for {duration}.", "My joint has been hurting for {duration}.", "The pain in my joint started {duration} ago."),
            ("a day", "two days", "a week", "three weeks", "two months"),
            (Finding("Is the joint swollen or warm?", "Yes, it is swollen and feels warm.",
                     "No, it looks and feels normal.", "The joint is swollen and warm.", "The joint is not swollen or warm."),
             Finding("Did the pain come on suddenly, within a day?", "Yes, it came on suddenly over a few hours.",
                     "No, it built up slowly.", "The pain came on suddenly, within a day.", "The pain built up slowly."),
             Finding("Is it a large joint, such as your knee or hip?", "Yes, it is my knee.",
                     "No, it is a small joint in my hand or foot.", "The painful joint is a large one, the knee.",
                     "The painful joint is a small one in the hand or foot.")),
            (Condition("septic arthritis", ("infective arthritis", "joint infection")),
             Condition("gout", ("gouty arthritis", "acute gout")),
             Condition("rheumatoid arthritis", ("RA",)),
             Condition("osteoarthritis", ("OA", "degenerative joint disease", "wear and tear arthritis")))),
    Cluster("dizziness", "dizziness",
            ("I've been feeling dizzy for {duration}.", "I've had dizziness for {duration}.", "I keep feeling dizzy, for {duration} now."),
            ("two days", "four days", "a week", "two weeks", "a month"),
            (Finding("Does the room seem to spin around you?", "Yes, everything spins around me.",
                     "No, I feel light-headed but nothing spins.", "The dizziness is a spinning sensation.",
                     "The dizziness is light-headedness without spinning."),
             Finding("Have you noticed hearing loss or ringing in one ear?", "Yes, my hearing is muffled and my ear rings.",
                     "No, my hearing is fine.", "There is hearing loss and ringing in one ear.", "Hearing is normal."),
             Finding("Does the dizziness come and go in separate spells?", "Yes, it comes in spells and I'm fine in between.",
                     "No, it has been there all the time since it started.", "The dizziness comes in separate spells, normal in between.",
                     "The dizziness has been constant since it started.")),
            (Condition("Meniere's disease", ("Ménière's disease", "Meniere disease", "endolymphatic hydrops")),
             Condition("labyrinthitis", ("inner ear infection",)),
             Condition("vestibular neuritis", ("vestibular neuronitis",)),
             Condition("orthostatic hypotension", ("postural hypotension", "low blood pressure on standing")))),
    Cluster("fatigue", "tiredness",
            ("I've been tired all the time for {duration}.", "I've felt exhausted for {duration}.", "I've had no energy for {duration}."),
            ("three weeks", "a month", "two months", "three months", "six months"),
            (Finding("Have you noticed changes in your skin, hair or nails?", "Yes, my skin and hair have changed.",
                     "No, they are the same as always.", "There are changes in the skin, hair and nails.", "Skin, hair and nails are unchanged."),
             Finding("Do you feel the cold more than other people?", "Yes, I'm always cold.",
                     "No, I don't feel the cold more than usual.", "The cold is felt more than by other people.", "Cold is tolerated normally."),
             Finding("Have you put on weight recently?", "Yes, I've gained weight.",
                     "No, my weight has not gone up.", "There has been recent weight gain.", "There has been no weight gain.")),
            (Condition("hypothyroidism", ("underactive thyroid", "hypothyroid")),
             Condition("iron-deficiency anaemia", ("iron deficiency anemia", "anaemia", "anemia")),
             Condition("type 2 diabetes", ("diabetes", "type 2 diabetes mellitus", "diabetes mellitus")),
             Condition("obstructive sleep apnoea", ("sleep apnea", "sleep apnoea", "OSA", "obstructive sleep apnea")))),
)


@dataclass(frozen=True)
class CaseKey:
    """What makes a case unique: indexes into its cluster's phrasings and durations."""

    cluster: Cluster
    condition: Condition
    age: int
    sex: str
    phrasing: int
    duration: int


def conditions() -> list[tuple[Cluster, Condition]]:
    """Every (cluster, condition) of the table, in table order."""
    return [(cluster, condition) for cluster in CLUSTERS for condition in cluster.conditions]


def cases_per_condition() -> int:
    """How many distinct cases one condition supplies (ages x sexes x phrasings x durations)."""
    return len(AGES) * len(SEXES) * len(CLUSTERS[0].phrasings) * len(CLUSTERS[0].durations)


def build_case(key: CaseKey, seed: int) -> Case:
    """The case of ``key``; its description's statements are shuffled by a stream of ``seed`` and the case id."""
    cluster, condition = key.cluster, key.condition
    present = PATTERNS[cluster.pattern(condition)]
    duration = cluster.durations[key.duration]
    slug = condition.name.lower().replace("'", "").replace(" ", "-")
    case_id = f"{slug}-{key.sex[0]}{key.age}-p{key.phrasing}-d{key.duration}"
    statements = [finding.statement(p) for finding, p in zip(cluster.findings, present)]
    random.Random(f"description-{seed}-{case_id}").shuffle(statements)
    pronoun = "He" if key.sex == "man" else "She"
    description = " ".join([f"A {key.age}-year-old {key.sex}.", f"{pronoun} has had {cluster.complaint} for {duration}.", *statements])
    return Case(
        case_id=case_id,
        self_report=cluster.phrasings[key.phrasing].format(duration=duration),
        description=description,
        diagnosis=condition.name,
        aliases=condition.aliases,
        qa=tuple(QA(finding.question, finding.reply(p)) for finding, p in zip(cluster.findings, present)),
    )


def draw_splits(train_size: int, val_size: int, seed: int) -> dict[str, list[CaseKey]]:
    """``{"train": [...], "test": [...]}``: disjoint, each spread evenly over the conditions (module docstring).

    Each random choice draws from its own stream of ``seed``, so the test split is the same whatever ``train_size``.
    """
    table = conditions()
    counts = {split: _even_counts(size, len(table), random.Random(f"counts-{split}-{seed}"))
              for split, size in (("test", val_size), ("train", train_size))}
    wanted = max(counts["test"][i] + counts["train"][i] for i in range(len(table)))
    if wanted > cases_per_condition():
        raise InputError(
            f"train_size={train_size} and val_size={val_size} need {wanted} cases of one condition, but each of the "
            f"{len(table)} conditions has only {cases_per_condition()} ({len(AGES)} ages x {len(SEXES)} sexes x 3 phrasings "
            f"x 5 durations); lower train_size + val_size to at most {cases_per_condition() * len(table)}"
        )
    splits: dict[str, list[CaseKey]] = {"test": [], "train": []}
    for i, (cluster, condition) in enumerate(table):
        keys = [CaseKey(cluster, condition, age, sex, p, d) for age, sex, p, d in itertools.product(
            AGES, SEXES, range(len(cluster.phrasings)), range(len(cluster.durations)))]
        random.Random(f"cases-{seed}-{condition.name}").shuffle(keys)
        splits["test"] += keys[: counts["test"][i]]
        splits["train"] += keys[counts["test"][i]: counts["test"][i] + counts["train"][i]]
    for split, keys in splits.items():
        random.Random(f"order-{split}-{seed}").shuffle(keys)
    return {"train": splits["train"], "test": splits["test"]}


def _even_counts(size: int, buckets: int, rng: random.Random) -> list[int]:
    """``size`` spread over ``buckets``: each gets ``size // buckets``, a random ``size % buckets`` of them one more."""
    extra = set(rng.sample(range(buckets), size % buckets))
    return [size // buckets + (i in extra) for i in range(buckets)]


def expert_diagnosis(cluster: Cluster, answers: tuple[bool, ...]) -> Condition:
    """The first condition in table order whose pattern starts with ``answers`` (the replies heard so far)."""
    return next(c for c in cluster.conditions if PATTERNS[cluster.pattern(c)][: len(answers)] == answers)


def expert_transcript(key: CaseKey, case: Case, questions: int) -> list[dict[str, str]]:
    """The expert's consultation of ``case`` in :class:`DoctorEnv` (rule patient) as chat messages."""
    from posttrain.agents.doctor import DoctorEnv
    from posttrain.agents.env import EpisodeSample

    prompt = [{"role": "user", "content": doctor_instruction(case.self_report)}]
    env = DoctorEnv(patient="rule")
    env.reset(EpisodeSample(prompt, case.ground_truth(), DATA_SOURCE, case.extra_info()))
    messages = list(prompt)
    for qa in case.qa[:questions]:
        action = f"<question> {qa.question} </question>"
        messages += [{"role": "assistant", "content": action}, {"role": "user", "content": env.step(action).observation}]
    # the replies the patient gave: the first `questions` findings of the case's condition
    heard = PATTERNS[key.cluster.pattern(key.condition)][:questions]
    name = expert_diagnosis(key.cluster, heard).name
    return messages + [{"role": "assistant", "content": f"<diagnosis> {name} </diagnosis>"}]


def write_expert_transcripts(train: list[tuple[CaseKey, Case]], out_dir: Path, size: int, val_size: int,
                             questions: int, extra_question_fraction: float, seed: int) -> list[Path]:
    """``sft.parquet`` and (unless ``val_size`` is 0) ``sft_val.parquet`` over ``train`` cases (module docstring)."""

    rng = random.Random(f"sft-{seed}")
    paths = []
    for name, chosen in (("sft", train[val_size: val_size + size]), ("sft_val", train[:val_size])):
        if not chosen:
            continue
        longer = set(rng.sample(range(len(chosen)), round(len(chosen) * extra_question_fraction)))
        transcripts = [expert_transcript(key, case, 3 if i in longer else questions) for i, (key, case) in enumerate(chosen)]
        paths.append(write_conversations(transcripts, out_dir / f"{name}.parquet"))
    return paths


def patient_transcript(case: Case, others: list[str], rng: random.Random, off_case_fraction: float) -> list[dict[str, str]]:
    """One reply of the patient as the Env-LLM is asked for it (``patient_messages``): an earlier part of
    the consultation (0 to 2 of the case's questions, answered), then a question and the case's answer to
    it, or, for ``off_case_fraction`` of them, another cluster's question and "I don't know."."""
    from posttrain.agents.doctor.prompts import DONT_KNOW, patient_messages

    order = rng.sample(case.qa, len(case.qa))
    earlier = order[: rng.randint(0, len(order) - 1)]
    if rng.random() < off_case_fraction:
        question, answer = rng.choice(others), DONT_KNOW
    else:
        asked = order[len(earlier)]
        question, answer = asked.question, asked.answer
    messages = patient_messages(case.description, [(pair.question, pair.answer) for pair in earlier], question)
    return messages + [{"role": "assistant", "content": answer}]


def write_patient_transcripts(train: list[tuple[CaseKey, Case]], out_dir: Path, size: int, seed: int) -> Path:
    """``patient_sft.parquet``: ``size`` patient replies over ``train`` cases (cycled), for fine-tuning the
    Env-LLM into a faithful patient with ``posttrain sft`` (module docstring)."""
    rng = random.Random(f"patient-{seed}")
    transcripts = []
    for i in range(size):
        key, case = train[i % len(train)]
        others = [f.question for cluster in CLUSTERS if cluster is not key.cluster for f in cluster.findings]
        transcripts.append(patient_transcript(case, others, rng, off_case_fraction=0.2))
    return write_conversations(transcripts, out_dir / "patient_sft.parquet")


def checked_options(given: dict[str, Any]) -> None:
    """InputError for what prepare_synthetic_doctor's arguments alone call for (also ``preparers.check_options``'s)."""
    train_size, val_size, sft_size, sft_val_size = given["train_size"], given["val_size"], given["sft_size"], given["sft_val_size"]
    sft_questions, sft_extra_question_fraction, patient_sft_size = given["sft_questions"], given["sft_extra_question_fraction"], given["patient_sft_size"]
    check_counts(1, train_size=train_size, val_size=val_size)
    check_counts(0, sft_size=sft_size, sft_val_size=sft_val_size, patient_sft_size=patient_sft_size)
    if sft_size and sft_size + sft_val_size > train_size:
        raise InputError(f"sft_size={sft_size} + sft_val_size={sft_val_size} transcripts need as many train cases, but "
                         f"train_size={train_size}; raise train_size or lower sft_size/sft_val_size")
    if sft_questions not in (1, 2, 3):
        raise InputError(f"sft_questions={sft_questions}: a cluster has 3 questions; pass 1, 2 or 3")
    if not 0.0 <= sft_extra_question_fraction <= 1.0:
        raise InputError(f"sft_extra_question_fraction={sft_extra_question_fraction}: must lie in [0, 1], e.g. 0.15")


def prepare_synthetic_doctor(
    out_dir: Path,
    *,
    train_size: int = 800,
    val_size: int = 64,
    seed: int = 0,
    sft_size: int = 0,
    sft_val_size: int = 32,
    sft_questions: int = 2,
    sft_extra_question_fraction: float = 0.15,
    patient_sft_size: int = 0,
) -> list[Path]:
    """Write ``train.parquet`` and ``test.parquet`` (returned); with ``sft_size > 0`` also ``sft.parquet``
    and ``sft_val.parquet``, with ``patient_sft_size > 0`` also ``patient_sft.parquet`` (returned after them)."""
    checked_options(dict(locals()))
    splits = draw_splits(train_size, val_size, seed)
    built = {split: [(key, build_case(key, seed)) for key in keys] for split, keys in splits.items()}
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [write_rows([case_row(case, DATA_SOURCE, split, i, condition=key.condition.name, cluster=key.cluster.name,
                                  pattern=key.cluster.pattern(key.condition)) for i, (key, case) in enumerate(cases)],
                        out_dir / f"{split}.parquet")
             for split, cases in built.items()]
    for stale in ("sft.parquet", "sft_val.parquet"):  # a directory reused with other options keeps no old transcripts
        (out_dir / stale).unlink(missing_ok=True)
    if sft_size:
        paths += write_expert_transcripts(built["train"], out_dir, sft_size, sft_val_size, sft_questions,
                                          sft_extra_question_fraction, seed)
    (out_dir / "patient_sft.parquet").unlink(missing_ok=True)
    if patient_sft_size:
        paths.append(write_patient_transcripts(built["train"], out_dir, patient_sft_size, seed))
    return paths

