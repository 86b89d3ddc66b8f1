"""Run in a Python with llama-cpp-python and without blockforge: how llama.cpp tokenizes texts, its greedy tokens and its
logits for a GGUF file, as JSON on the last line of stdout.

    python llama_cpp_generate.py MODEL.gguf REQUEST.json      (REQUEST: {"texts": [...], "prompts": [[ids]], "new": N})
"""

import json
import sys


def main() -> None:
    from llama_cpp import Llama

    request = json.loads(open(sys.argv[2]).read())
    f32 = 0  # GGML_TYPE_F32: a float32 KV cache (llama.cpp's default f16 cache rounds keys and values)
    llm = Llama(model_path=sys.argv[1], n_ctx=64, logits_all=True, verbose=False, seed=0, n_threads=2, type_k=f32, type_v=f32)
    texts = [llm.tokenize(text.encode(), add_bos=True, special=True) for text in request["texts"]]
    greedy, logits = [], []
    for prompt in request["prompts"]:
        llm.reset()
        llm.eval(prompt)
        logits.append([list(map(float, row)) for row in llm.scores[: len(prompt)]])
        ids = []
        for token in llm.generate(prompt, temp=0.0, top_k=1, reset=True):
            ids.append(int(token))
            if len(ids) == request["new"]:
                break
        greedy.append(ids)
    print(json.dumps({"texts": texts, "greedy": greedy, "logits": logits}))


if __name__ == "__main__":
    main()
