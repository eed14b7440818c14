"""A small world written in Search-R1's file formats, to try the task where the real data is not at hand.

    paths = write_synthetic(folder, people=200, seed=0)   # corpus.jsonl, train/test .parquet and .jsonl

P invented people, one passage each ('"Name"\\nName is a painter born in Lisbon. Name learned the craft from
Other Name.'), and distractor passages that share the words but answer nothing. Questions ask a person's city or
occupation (one hop: one search) or their teacher's city (two hops: the passage names the teacher, a second
search finds the city). Train, test and demonstrations ask about different people, so a model must learn to search
and read, not remember. Each question row also carries `demonstration`: the turns a demonstrator writes (searches,
then the answer), which `ftw-jax lm retrieval-qa --demonstrations` fits before reinforcement; the readers ignore it.
"""

from __future__ import annotations

import json
import pathlib

import numpy as np

from ftw_jax.agent.retrieval_qa.data import required

_FIRST = tuple(
    "ada bram cleo dara emil fenn gita hugo iris jorn kira lev mira nils odette pavel quin rosa sven tilde anouk "
    "bruno celia dmitri elin farah goran hana ilya jana kofi lena marek nora otto petra rafael sanna tomas una".split()
)
_LAST = tuple(
    "varden okafor lindqvist moreau tanaka brandt castell dunmore ekwueme falk garrow halloran ibsen jaramillo "
    "kowalski larsen mendel novak orsini petrov quiroga rask santos thorne ulrich vance weller yilmaz zeller "
    "abara".split()
)
# Enough cities and occupations that guessing rarely pays: a right answer mostly comes from reading a passage.
_CITIES = tuple(
    "lisbon oslo quito hanoi dakar perth sofia lima cairo riga porto kyoto tunis minsk accra hobart bergen cusco "
    "fresno gdansk harbin izmir jaffna kazan leeds malmo nantes odessa padua ravenna".split()
)
_JOBS = tuple(
    "painter baker sailor weaver surgeon poet mason chemist pilot farmer tailor potter cooper glazier jeweller "
    "brewer miller saddler tanner cartographer".split()
)


def _title(name: str) -> str:
    return " ".join(part.capitalize() for part in name.split())


def _world(people: int, rng: np.random.Generator) -> list[dict]:
    names = [f"{first} {last}" for first in _FIRST for last in _LAST]
    if people > len(names):
        raise ValueError(f"people must be at most {len(names)}, got {people}.")
    chosen = [names[i] for i in rng.permutation(len(names))[:people]]
    return [
        {
            "name": name,
            "city": _CITIES[rng.integers(len(_CITIES))],
            "job": _JOBS[rng.integers(len(_JOBS))],
            "teacher": chosen[(index + 1 + rng.integers(people - 1)) % people],
        }
        for index, name in enumerate(chosen)
    ]


def _question(person: dict, by_name: dict, kind: str, index: int, split: str) -> dict:
    name, search = _title(person["name"]), f"<search> {_title(person['name'])} </search>"
    if kind == "city":
        question, answer, turns = f"where was {name} born?", person["city"], [search]
    elif kind == "job":
        question, answer, turns = f"what is the occupation of {name}?", person["job"], [search]
    else:
        teacher = by_name[person["teacher"]]
        question, answer = f"where was the teacher of {name} born?", teacher["city"]
        turns = [search, f"<search> {_title(teacher['name'])} </search>"]
    answers = [_title(answer), answer] if kind != "job" else [answer, f"a {answer}"]
    return {
        "id": f"{split}_{index}",
        "question": question,
        "golden_answers": answers,
        "data_source": "synthetic-two-hop" if kind == "teacher" else "synthetic",
        "demonstration": [*turns, f"<answer> {_title(answer) if kind != 'job' else answer} </answer>"],
    }


def write_synthetic(
    folder: str | pathlib.Path, *, people: int = 200, distractors: int = 100, two_hop: float = 0.2, seed: int = 0
) -> dict[str, pathlib.Path]:
    """Writes corpus.jsonl and the questions of three splits of the people (test: a quarter, demonstrations: a
    quarter, train: the rest) as SPLIT.parquet and SPLIT.jsonl into `folder`; returns their paths by name (`corpus`,
    `train`, `train_jsonl`, ...)."""
    pyarrow, parquet = required("pyarrow"), required("pyarrow.parquet")

    folder = pathlib.Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    world = _world(people, rng)
    by_name = {person["name"]: person for person in world}
    passages = [
        f'"{_title(p["name"])}"\n{_title(p["name"])} is a {p["job"]} born in {_title(p["city"])}. '
        f"{_title(p['name'])} learned the craft from {_title(p['teacher'])}."
        for p in world
    ]
    for index in range(distractors):
        city, job = _CITIES[index % len(_CITIES)], _JOBS[index % len(_JOBS)]
        passages.append(f'"{_title(city)} ({index})"\nMany a {job} has lived in {_title(city)}, a city of the coast.')
    order = rng.permutation(len(passages))
    paths = {"corpus": folder / "corpus.jsonl"}
    with paths["corpus"].open("w") as file:
        for number, index in enumerate(order):
            file.write(json.dumps({"id": str(number), "contents": passages[index]}) + "\n")
    quarter = max(1, people // 4)
    splits = (
        ("test", world[:quarter]),
        ("demonstrations", world[quarter : 2 * quarter]),
        ("train", world[2 * quarter :]),
    )
    for split, group in splits:
        kinds = ["teacher" if rng.random() < two_hop else ("city" if rng.random() < 0.5 else "job") for _ in group]
        rows = [_question(person, by_name, kind, i, split) for i, (person, kind) in enumerate(zip(group, kinds))]
        paths[split] = folder / f"{split}.parquet"
        parquet.write_table(pyarrow.Table.from_pylist(rows), paths[split])
        paths[f"{split}_jsonl"] = folder / f"{split}.jsonl"
        paths[f"{split}_jsonl"].write_text("".join(json.dumps(row) + "\n" for row in rows))
    return paths


def tokenizer_texts(
    paths: dict[str, pathlib.Path], splits: tuple[str, ...] = ("train_jsonl", "demonstrations_jsonl")
) -> list[str]:
    """What a tokenizer for this world is trained on (`lm.tiny.write_tiny_checkpoint`): every passage, each question
    of `splits` (`write_synthetic`'s names) with its demonstration, and Search-R1's prompt and invalid-action
    reply; all of it twice."""
    from ftw_jax.agent.retrieval_qa.task import INVALID_ACTION, search_r1_prompt

    rows = [json.loads(line) for name in ("corpus", *splits) for line in paths[name].read_text().splitlines()]
    texts = [row.get("contents") or " ".join([row["question"], *row["demonstration"]]) for row in rows]
    return [*texts, search_r1_prompt(""), INVALID_ACTION] * 2
