"""A Hugging Face Trainer script that knows nothing about ccoll (used by test_zero_code_report.py).

    torchrun --nproc_per_node 2 zero_code_hf_train.py OUT_DIR

A tiny GPT-2 trained 4 steps with plain DDP on CPU (gloo), logging every 2 steps with no ``report_to``
integration. Each rank writes ``trainer.state.log_history`` to OUT_DIR/log_history.rank<R>.json: under
``ccoll-run`` the entries carry ccoll's figures (ccoll.hf, attached by ccoll.auto).
"""
import json
import os
import sys

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

out = sys.argv[1]
torch.set_num_threads(1)
torch.manual_seed(0)
model = GPT2LMHeadModel(GPT2Config(vocab_size=128, n_positions=32, n_embd=64, n_layer=2, n_head=2))
g = torch.Generator().manual_seed(0)
data = [{"input_ids": t, "labels": t} for t in torch.randint(0, 128, (64, 32), generator=g)]
args = TrainingArguments(output_dir=os.path.join(out, "trainer"), per_device_train_batch_size=4, max_steps=4,
                         logging_steps=2, report_to=[], save_strategy="no", use_cpu=True, ddp_backend="gloo",
                         disable_tqdm=True)
trainer = Trainer(model=model, args=args, train_dataset=data)
trainer.train()
with open(os.path.join(out, f"log_history.rank{args.process_index}.json"), "w") as f:
    json.dump(trainer.state.log_history, f)
print(f"rank {args.process_index} global_step {trainer.state.global_step}", flush=True)
