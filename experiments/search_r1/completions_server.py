"""A small OpenAI-compatible completions server over PyTorch transformers, the engine side of the retrieval-QA
driver on a CPU (`engine_driver.py`). It runs in the parity venv (`experiments/lm/lm_parity.py` builds it: torch CPU
and transformers, never dependencies of ftw_jax):

    runs/parity-venv/bin/python experiments/search_r1/completions_server.py --model DIR --port 8011

It speaks the part of vLLM's `/v1/completions` an RL rollout uses: `prompt` as token ids (a list, or a list of
lists), `max_tokens`, `temperature` (1: the plain model's distribution; 0: greedy), `stop` strings kept in the
output (`include_stop_str_in_output`), `seed`, and `logprobs` with `return_tokens_as_token_ids`: each choice's
`logprobs.tokens` are "token_id:N" and `logprobs.token_logprobs` the log-probability of each under the
distribution it was drawn from (a log-softmax of the raw logits at temperature 1). `POST
/update_weights_from_disk {"model_path": DIR}` reloads the weights, as SGLang's endpoint of that name does.
Generation is transformers' `generate` (one prompt at a time, `stop_strings`, `output_logits`).
"""

import argparse
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import torch
import transformers


class Engine:
    def __init__(self, path: str):
        self.lock = threading.Lock()
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(path)
        self.load(path)

    def load(self, path: str) -> None:
        model = transformers.AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32)
        with self.lock:
            self.model, self.path = model.eval(), path

    def complete(self, request: dict) -> dict:
        prompts = request["prompt"]
        if prompts and isinstance(prompts[0], int):
            prompts = [prompts]
        if not all(isinstance(p, list) and p and all(isinstance(t, int) for t in p) for p in prompts):
            raise ValueError("prompt must be token ids: a list of ints, or a list of such lists")
        temperature = float(request.get("temperature", 1.0))
        if temperature not in (0.0, 1.0):
            raise ValueError("temperature must be 1 (the plain model) or 0 (greedy) here")
        generator_seed = request.get("seed")
        if generator_seed is not None:
            torch.manual_seed(int(generator_seed))
        choices = []
        with self.lock, torch.no_grad():
            for index, prompt in enumerate(prompts):
                choices.append(self._one(index, prompt, request, temperature))
        return {"object": "text_completion", "model": self.path, "choices": choices}

    def _one(self, index: int, prompt: list, request: dict, temperature: float) -> dict:
        stop = request.get("stop") or None
        output = self.model.generate(
            torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            max_new_tokens=int(request.get("max_tokens", 16)),
            do_sample=temperature > 0,
            temperature=1.0 if temperature > 0 else None,
            top_k=0 if temperature > 0 else None,
            top_p=1.0 if temperature > 0 else None,
            stop_strings=stop,
            tokenizer=self.tokenizer if stop else None,
            output_logits=True,
            return_dict_in_generate=True,
            pad_token_id=self.tokenizer.pad_token_id,
        )
        tokens = output.sequences[0, len(prompt) :].tolist()
        logits = torch.stack(output.logits, dim=1)[0].float()  # [new, V], raw
        log_probs = torch.log_softmax(logits, dim=-1)
        chosen = [float(log_probs[i, token]) for i, token in enumerate(tokens)]
        text = self.tokenizer.decode(tokens)
        eos = self.tokenizer.eos_token_id
        stopped = bool(tokens) and (tokens[-1] == eos or any(text.endswith(s) or s in text for s in (stop or [])))
        return {
            "index": index,
            "text": text,
            "finish_reason": "stop" if stopped else "length",
            "logprobs": {"tokens": [f"token_id:{t}" for t in tokens], "token_logprobs": chosen},
        }


def serve(engine: Engine, host: str, port: int) -> None:
    class Handler(BaseHTTPRequestHandler):
        def _send(self, status: int, payload: dict) -> None:
            body = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            if self.path in ("/health", "/v1/models"):
                self._send(200, {"object": "list", "data": [{"id": engine.path}]})
            else:
                self._send(404, {"error": f"no GET {self.path}"})

        def do_POST(self):
            try:
                request = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                if self.path == "/v1/completions":
                    self._send(200, engine.complete(request))
                elif self.path == "/update_weights_from_disk":
                    engine.load(request["model_path"])
                    self._send(200, {"success": True, "message": f"loaded {engine.path}"})
                else:
                    self._send(404, {"error": f"no POST {self.path}"})
            except (ValueError, KeyError, TypeError) as error:
                self._send(400, {"error": str(error)})

        def log_message(self, *args):  # quiet: the driver reports
            pass

    ThreadingHTTPServer((host, port), Handler).serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="a Hugging Face folder")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8011)
    args = parser.parse_args()
    engine = Engine(args.model)
    print(f"serving {args.model} on http://{args.host}:{args.port}", flush=True)
    serve(engine, args.host, args.port)


if __name__ == "__main__":
    main()
