# SPDX-License-Identifier: BSD-3-Clause
"""Oracle: lm-eval-harness (the pinned lm_eval) with its Hugging Face backend, on the CPU in fp32, offline.

  lm_eval_oracle.py HF_DIR TASK_DIR MAX_LENGTH OUT TASK [TASK ...]

Runs the tasks of TASK_DIR (lm-eval task YAMLs, read with --include_path; their data_files are relative to
TASK_DIR, so it runs there) on the model and tokenizer of HF_DIR with max_length=MAX_LENGTH and batch size 1,
and writes OUT (JSON): for each task its aggregated metrics and, per document, the (log-likelihood, is_greedy)
of each request and lm-eval's per-document metric values; under "tokenizer", a text and the ids
AutoTokenizer.from_pretrained(HF_DIR) encodes it to (the export's own tokenizer files). Log-softmax runs in
float64 (softmax_dtype), so lm-eval's sums carry no float32 rounding.
"""
import json
import os
import sys


def main(argv):
    if len(argv) < 6:
        raise SystemExit(__doc__)
    hf_dir, task_dir, max_length, out = os.path.abspath(argv[1]), os.path.abspath(argv[2]), int(argv[3]), argv[4]
    tasks = argv[5:]
    # No network: the datasets library reads the local json files, and nothing asks a hub.
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.chdir(task_dir)
    import lm_eval
    from lm_eval.tasks import TaskManager

    results = lm_eval.simple_evaluate(
        model="hf",
        model_args=f"pretrained={hf_dir},dtype=float32,device=cpu,max_length={max_length},softmax_dtype=float64",
        tasks=tasks,
        task_manager=TaskManager(include_path=task_dir),
        batch_size=1,
        log_samples=True,
        num_fewshot=0,
        random_seed=0,
        numpy_random_seed=0,
        torch_random_seed=0,
        fewshot_random_seed=0,
    )
    report = {}
    for task in tasks:
        metrics = {key.split(",")[0]: value for key, value in results["results"][task].items()
                   if "," in key and isinstance(value, (int, float))}
        samples = sorted(results["samples"][task], key=lambda s: s["doc_id"])
        docs = []
        for s in samples:
            # resps: one [response] per request; a response is (loglikelihood, is_greedy), or a float (rolling).
            responses = [[float(r[0][0]), bool(r[0][1])] if isinstance(r[0], (list, tuple)) else [float(r[0]), False]
                         for r in s["resps"]]
            values = {m: s[m] for m in ("acc", "acc_norm", "acc_bytes") if m in s}
            docs.append({"doc_id": s["doc_id"], "responses": responses, "metrics": values})
        report[task] = {"metrics": metrics, "docs": docs}
    from transformers import AutoTokenizer
    text = "To be, or not to be: that is the question.\nROMEO: Wherefore art thou?"
    report["tokenizer"] = {"text": text, "ids": AutoTokenizer.from_pretrained(hf_dir).encode(text)}
    tmp = f"{out}.tmp.{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(report, f, indent=1)
    os.replace(tmp, out)


if __name__ == "__main__":
    main(sys.argv)
