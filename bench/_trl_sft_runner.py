"""TRL's SFTTrainer on the warm start's own token sequences; run by bench/_multiturn.py under .venv-trl.

    .venv-trl/bin/python bench/_trl_sft_runner.py --model DIR --data sft_sequences.jsonl --out result.json

Pre-tokenized rows (input_ids, completion_mask = agentrl's policy-token mask), completion-only
loss, one epoch, batch 8, lr 5e-5 on the CPU, fp32 or (`--bf16`) bf16 autocast: the precision of the
agentrl warm start it is compared with. Writes {"tokens_per_s", "train_s", "tokens",
"trl_version"}: tokens are the rows' lengths summed (what agentrl's SFT tokens/s counts).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--bf16", action="store_true", help="bf16 autocast over fp32 weights (agentrl's trainer.dtype)")
    args = ap.parse_args()

    import torch
    import trl
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    rows = [json.loads(x) for x in Path(args.data).read_text().splitlines() if x.strip()]
    tokens = sum(len(r["input_ids"]) for r in rows)
    model = AutoModelForCausalLM.from_pretrained(args.model, torch_dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(args.model)
    with tempfile.TemporaryDirectory() as work:
        cfg = SFTConfig(output_dir=work, per_device_train_batch_size=8, num_train_epochs=1, learning_rate=5e-5,
                        completion_only_loss=True, max_length=None, report_to=[], save_strategy="no",
                        logging_steps=1, use_cpu=True, dataloader_num_workers=0, bf16=args.bf16)
        trainer = SFTTrainer(model=model, args=cfg, train_dataset=Dataset.from_list(rows), processing_class=tok)
        t0 = time.perf_counter()
        trainer.train()
        train_s = time.perf_counter() - t0
    with open(args.out, "w") as f:
        json.dump({"tokens_per_s": tokens / train_s, "train_s": train_s, "tokens": tokens,
                   "trl_version": trl.__version__}, f)


if __name__ == "__main__":
    main()
