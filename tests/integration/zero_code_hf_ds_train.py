"""A Hugging Face Trainer script with DeepSpeed ZeRO that knows nothing about ccoll (used by
test_zero_code_deepspeed_config.py): ``script.py STAGE STEPS OUT.json [--deepspeed ds.json]``. Without
``--deepspeed`` it builds the DeepSpeed config in code, with a ``"ccoll"`` block holding the policy inline
(dp int8 after 2 warm-up steps). A tiny GPT-2 built from a config (no download); Trainer makes two
parameter groups (decay / no decay), so ZeRO steps its inner optimizer twice per training step. Rank 0
writes Trainer's step counter and ccoll's to OUT.json."""
import json
import sys

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

stage, steps, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
ds = sys.argv[sys.argv.index("--deepspeed") + 1] if "--deepspeed" in sys.argv else {
    "train_micro_batch_size_per_gpu": "auto", "train_batch_size": "auto", "gradient_accumulation_steps": "auto",
    "zero_optimization": {"stage": stage}, "steps_per_print": 10 ** 9,
    "ccoll": {"policy": {"version": 1, "default": {"codec": "native"},
                         "dp": {"codec": "int8:block=256", "warmup_steps": 2, "min_bytes": 0}}}}
torch.set_num_threads(1)
torch.manual_seed(0)
model = GPT2LMHeadModel(GPT2Config(vocab_size=128, n_positions=32, n_embd=64, n_layer=2, n_head=2))
data = [{"input_ids": t, "labels": t} for t in torch.randint(0, 128, (64, 32), generator=torch.Generator().manual_seed(0))]
args = TrainingArguments(output_dir="out", per_device_train_batch_size=4, max_steps=steps, logging_steps=2,
                         deepspeed=ds, report_to=[], save_strategy="no", use_cpu=True, ddp_backend="gloo",
                         disable_tqdm=True)
trainer = Trainer(model=model, args=args, train_dataset=data)
trainer.train()
if args.process_index == 0:
    import ccoll.patch  # only to read what ccoll counted; the training above never touched it

    with open(out, "w") as f:
        json.dump({"global_step": trainer.state.global_step, "ccoll_steps": ccoll.patch.steps(),
                   "policy": str(ccoll.patch.current_policy().source)}, f)
