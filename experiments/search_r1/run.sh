#!/usr/bin/env bash
# FTW on Search-R1's retrieval QA, one GPU node (README.md beside this script). DATA and MODEL name the files;
# arguments after the script's name are added to the command (e.g. --algorithm grpo --episodes-per-iteration 60).
# The retriever, first match:
#   SEARCH_R1=path/to/Search-R1  start its retrieval server here (E5 over wiki-18, as its retrieval_launch.sh does,
#                                with RETRIEVER_PYTHON, its own environment's python), stopped when the run ends
#   RETRIEVER_URL=http://...     a retrieval server already running
#   neither                      BM25 over $DATA/wiki-18.jsonl in this process (the no-GPU alternative)
set -euo pipefail
: "${DATA:?set DATA to the folder with wiki-18.jsonl and nq_hotpotqa_train/}"
: "${MODEL:?set MODEL to the Qwen2.5-3B-Instruct folder}"
OUT="${OUT:-runs}"
NAME="${NAME:-search-r1-ftw-qwen2.5-3b}"
mkdir -p "$OUT"

if [[ -n "${SEARCH_R1:-}" ]]; then
    port="${RETRIEVER_PORT:-8000}"
    echo "starting Search-R1's retrieval server (log: $OUT/retriever.log)"
    (cd "$SEARCH_R1" && exec "${RETRIEVER_PYTHON:-python}" search_r1/search/retrieval_server.py \
        --index_path "${INDEX:-$DATA/e5_Flat.index}" --corpus_path "$DATA/wiki-18.jsonl" --topk 3 \
        --retriever_name e5 --retriever_model "${RETRIEVER_MODEL:-intfloat/e5-base-v2}" \
        ${RETRIEVER_FLAGS---faiss_gpu}) >"$OUT/retriever.log" 2>&1 &
    server=$!
    trap 'kill "$server" 2>/dev/null || true' EXIT
    RETRIEVER_URL="http://127.0.0.1:$port/retrieve"
    # Loading E5 and a 60 GiB flat index takes minutes: wait until the server answers a query, or gives up.
    for ((waited = 0; ; waited += 5)); do
        if curl -sf -X POST -H 'Content-Type: application/json' -d '{"queries": ["probe"], "topk": 1}' \
            "$RETRIEVER_URL" >/dev/null; then
            break
        fi
        if ! kill -0 "$server" 2>/dev/null; then
            echo "the retrieval server stopped; the end of $OUT/retriever.log:" >&2
            tail -n 20 "$OUT/retriever.log" >&2
            exit 1
        fi
        if ((waited >= ${RETRIEVER_WAIT:-1800})); then
            echo "the retrieval server did not answer $RETRIEVER_URL within ${RETRIEVER_WAIT:-1800} s" >&2
            exit 1
        fi
        sleep 5
    done
fi

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
    --out "$OUT" --name "$NAME" "$@"
)
if [[ -d "$OUT/$NAME" ]]; then
    args+=(--resume "$OUT/$NAME")
fi
ftw-jax "${args[@]}"
