"""How close ftw_jax's BM25 comes to Lucene's as pyserini runs it (Search-R1's BM25 retriever): the words each
analyzer makes of every passage, and each query's top 3, on a corpus of English prose anyone can rebuild.

    pip download --no-deps -d /tmp/pyserini pyserini==0.21.0     # its wheel carries Anserini's jar (Lucene 9.4)
    unzip -q /tmp/pyserini/pyserini-0.21.0-py3-none-any.whl 'pyserini/resources/jars/*' -d /tmp/pyserini
    python experiments/search_r1/bm25_vs_lucene.py \\
        --jar /tmp/pyserini/pyserini/resources/jars/anserini-0.21.0-fatjar.jar

Needs Java 11 or newer (`java` runs lucene/LuceneBM25.java as a script). The passages are the paragraphs of the
docstrings in this Python's standard library (read with `ast`, nothing imported), each titled with its module and
function as wiki-18's are with their article; the queries are 3 to 8 consecutive words of random passages. Both
sides read the same passages and queries; both analyzers are compared word for word, and the rankings of ftw_jax's
defaults (Lucene's analyzer) and of its earlier analyzer (bm25s's tokens, its English stop words, Snowball's
stemmer) against Lucene's.
"""

from __future__ import annotations

import argparse
import ast
import json
import pathlib
import subprocess
import sys
import sysconfig
import tempfile

import numpy as np

from ftw_jax.agent.retrieval_qa.retriever import BM25Retriever, RetrieverSettings

HERE = pathlib.Path(__file__).parent
EARLIER = RetrieverSettings(words="bm25s", stopwords="en", stemmer="english")  # ftw_jax 0.8.0's analyzer


def stdlib_passages(count: int) -> list[str]:
    """`count` passages '"module.name"\\nparagraph' from the standard library's docstrings, in file order."""
    found = []
    stdlib = pathlib.Path(sysconfig.get_paths()["stdlib"])
    for path in sorted(stdlib.rglob("*.py")):
        if {"test", "tests", "idlelib", "site-packages"} & set(path.relative_to(stdlib).parts):
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef)) and ast.get_docstring(node):
                module = ".".join(path.relative_to(stdlib).with_suffix("").parts)
                title = module + ("" if isinstance(node, ast.Module) else f".{node.name}")
                for paragraph in (ast.get_docstring(node) or "").split("\n\n"):
                    text = " ".join(paragraph.split())
                    if len(text.split()) >= 8:
                        found.append(f'"{title}"\n{text}')
                        if len(found) == count:
                            return found
    return found


def queries_from(passages: list[str], count: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    queries = []
    for index in rng.integers(len(passages), size=count):
        words = passages[index].split("\n", 1)[1].split()
        length = int(rng.integers(3, 9))
        start = int(rng.integers(max(1, len(words) - length)))
        queries.append(" ".join(words[start : start + length]))
    return queries


def lucene(jar: str, mode: str, *paths: str) -> list[str]:
    command = ["java", "-cp", jar, str(HERE / "lucene" / "LuceneBM25.java"), mode, *paths]
    return subprocess.run(command, check=True, capture_output=True, text=True).stdout.splitlines()


def compare(lucene_top: list[list[str]], ours: list[list[str]]) -> dict:
    both = [(a, b) for a, b in zip(lucene_top, ours) if a]
    return {
        "queries": len(both),
        "top1_same": float(np.mean([a[0] == (b[0] if b else None) for a, b in both])),
        "top3_overlap": float(np.mean([len(set(a) & set(b)) / len(a) for a, b in both])),
        "top3_same_order": float(np.mean([a == b for a, b in both])),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jar", required=True, help="Anserini's fatjar (from pyserini's wheel)")
    parser.add_argument("--passages", type=int, default=20000)
    parser.add_argument("--queries", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    passages = stdlib_passages(args.passages)
    queries = queries_from(passages, args.queries, args.seed)
    folder = pathlib.Path(tempfile.mkdtemp())
    corpus = folder / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": str(i), "contents": p}) + "\n" for i, p in enumerate(passages)))
    tsv = folder / "passages.tsv"  # Lucene's side: one line a passage, its newline a space as Lucene reads it
    tsv.write_text("".join(f"{i}\t{' '.join(p.split())}\n" for i, p in enumerate(passages)))
    (folder / "queries.txt").write_text("".join(query + "\n" for query in queries))
    lucene_words = [line.split() for line in lucene(args.jar, "analyze", str(tsv))]
    lucene_top = [
        line.split("\t")[0].split() for line in lucene(args.jar, "search", str(tsv), str(folder / "queries.txt"), "3")
    ]
    result = {"python": sys.version.split()[0], "passages": len(passages)}
    for name, settings in (("ftw_jax", RetrieverSettings()), ("earlier", EARLIER)):
        retriever = BM25Retriever.open(corpus, folder / f"{name}.bm25", settings)
        analyzed = retriever.tokenizer.tokenize(passages, update_vocab=False, return_as="string", show_progress=False)
        same = float(np.mean([list(a) == b for a, b in zip(analyzed, lucene_words)]))
        ours = [[p.id for p in found] for found in retriever.search(queries, 3)]
        result[name] = {"passages_analyzed_alike": same, **compare(lucene_top, ours)}
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
