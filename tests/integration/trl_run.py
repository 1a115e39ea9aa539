"""A tiny, fully local TRL GRPO run (used by test_frameworks_trl.py in a subprocess).

python trl_run.py OUT_JSON MODE DUMP_DIR [--max-steps N] [--lr LR] [--forbid] [--metrics PATH]

Builds a LlamaForCausalLM from a LlamaConfig and a word-level tokenizer (nothing downloaded),
wraps the GRPOTrainer with rollout_mock.wrap_trl, trains, and writes log_history as JSON.
With --forbid, model.generate and the reward function raise if called.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_DISABLED", "true")

WORDS = ["red", "green", "blue", "cat", "dog", "sun", "moon", "tree", "sky", "sea", "one", "two"]


def build_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3}
    for word in WORDS:
        vocab[word] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>",
                                   eos_token="</s>", unk_token="<unk>")


def reward_len(completions, **kwargs):
    if os.environ.get("TRL_RUN_FORBID") == "1":
        raise AssertionError("reward function called in mock mode")
    return [float(len(c.split())) - 0.5 * c.count("red") for c in completions]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("mode", choices=["dump", "mock", "off"])
    parser.add_argument("dump_dir")
    parser.add_argument("--max-steps", type=int, default=3)
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--forbid", action="store_true")
    parser.add_argument("--metrics", default=None)
    args = parser.parse_args()

    import torch
    from datasets import Dataset
    from transformers import LlamaConfig, LlamaForCausalLM
    from trl import GRPOConfig, GRPOTrainer

    import rollout_mock

    torch.manual_seed(0)
    tokenizer = build_tokenizer()
    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64,
        pad_token_id=0, bos_token_id=1, eos_token_id=2, attention_dropout=0.1))
    prompts = [" ".join(WORDS[(i + k) % len(WORDS)] for k in range(3)) for i in range(16)]
    dataset = Dataset.from_dict({"prompt": prompts})
    config = GRPOConfig(
        output_dir=os.path.join(os.path.dirname(args.out), "trl_out_" + args.mode), use_cpu=True,
        report_to=[], max_steps=args.max_steps, learning_rate=args.lr, logging_steps=1,
        per_device_train_batch_size=4, num_generations=4, gradient_accumulation_steps=2,
        steps_per_generation=2, max_completion_length=6, save_strategy="no", seed=0,
        beta=0.04, temperature=1.0, disable_tqdm=True, dataloader_num_workers=0,
    )
    model_dir = os.path.join(os.path.dirname(args.out), "tiny_llama_" + args.mode)
    model.save_pretrained(model_dir)  # a local path: GRPO builds the reference model from it
    tokenizer.save_pretrained(model_dir)
    trainer = GRPOTrainer(model=model_dir, reward_funcs=reward_len, args=config, train_dataset=dataset,
                          processing_class=tokenizer)
    if args.mode != "off":
        rollout_mock.wrap_trl(trainer, {"enable": True, "mode": args.mode, "dump_dir": args.dump_dir})
    if args.forbid:
        os.environ["TRL_RUN_FORBID"] = "1"

        def forbidden(*a, **k):
            raise AssertionError("model.generate called in mock mode")

        trainer.model.generate = forbidden
    trainer.train()
    if args.metrics:
        with rollout_mock.MetricsWriter(args.metrics) as writer:
            for entry in trainer.state.log_history:
                if "step" in entry and "loss" in entry:
                    writer.log(int(entry["step"]), {k: v for k, v in entry.items()
                                                    if isinstance(v, (int, float)) and k not in ("step", "step_time")
                                                    and not math.isnan(v)})
    with open(args.out, "w") as f:
        json.dump({"log_history": trainer.state.log_history}, f)


if __name__ == "__main__":
    sys.exit(main())
