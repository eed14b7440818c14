"""Writes a small world in Search-R1's formats and a tiny chat checkpoint whose tokenizer is trained on it: what
`ftw-jax lm retrieval-qa` runs on where the real data and a GPU are not at hand.

    python experiments/search_r1/make_tiny.py /tmp/tiny-qa         # corpus.jsonl, train/test .parquet, model/

Then (docs/results.md's CPU run):

    ftw-jax lm retrieval-qa --model /tmp/tiny-qa/model --questions /tmp/tiny-qa/train.parquet \\
        --test-questions /tmp/tiny-qa/test.parquet --corpus /tmp/tiny-qa/corpus.jsonl \\
        --demonstrations /tmp/tiny-qa/demonstrations.parquet ...
"""

import argparse
import pathlib

from ftw_jax.agent.retrieval_qa.synthetic import tokenizer_texts, write_synthetic
from ftw_jax.lm.memory import QWEN2_5
from ftw_jax.lm.tiny import write_tiny_checkpoint


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=pathlib.Path)
    parser.add_argument("--people", type=int, default=280, help="people in the world (at most 1,200)")
    parser.add_argument("--vocab-size", type=int, default=1024, help="the BPE tokenizer's vocabulary at most")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--shape", choices=sorted(QWEN2_5), help="random weights of this Qwen2.5 shape, to time it")
    args = parser.parse_args()
    paths = write_synthetic(args.folder, people=args.people, seed=args.seed)
    shape = QWEN2_5[args.shape] if args.shape else None
    write_tiny_checkpoint(args.folder / "model", tokenizer_texts(paths), args.vocab_size, args.seed, shape)
    print(f"wrote {', '.join(sorted(path.name for path in paths.values()))} and model/ in {args.folder}")


if __name__ == "__main__":
    main()
