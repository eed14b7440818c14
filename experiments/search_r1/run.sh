#!/usr/bin/env bash
# FTW on Search-R1's retrieval QA, one GPU node (README.md beside this script). DATA and MODEL name the files;
# RETRIEVER_URL, where set, is Search-R1's retrieval server (its retrieval_launch.sh: E5, as the paper's numbers
# were made), else BM25 over $DATA/wiki-18.jsonl runs in this process.
set -euo pipefail
: "${DATA:?set DATA to the folder with wiki-18.jsonl and nq_hotpotqa_train/}"
: "${MODEL:?set MODEL to the Qwen2.5-3B-Instruct folder}"
OUT="${OUT:-runs}"
if [[ -n "${RETRIEVER_URL:-}" ]]; then
    retriever=(--retriever-url "$RETRIEVER_URL")
else
    retriever=(--corpus "$DATA/wiki-18.jsonl")
fi
args=(
    lm retrieval-qa --model "$MODEL"
    --questions "$DATA/nq_hotpotqa_train/train.parquet" --test-questions "$DATA/nq_hotpotqa_train/test.parquet"
    "${retriever[@]}"
    --iterations 1005 --eval-every 50 --eval-questions 1000 --save-every 50
    --out "$OUT" --name search-r1-ftw-qwen2.5-3b
)
if [[ -d "$OUT/search-r1-ftw-qwen2.5-3b" ]]; then
    exec ftw-jax "${args[@]}" --resume "$OUT/search-r1-ftw-qwen2.5-3b"
fi
exec ftw-jax "${args[@]}"
