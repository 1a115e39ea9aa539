"""A tiny, fully local TRL GRPO run (used by test_frameworks_trl.py in a subprocess).

python trl_run.py OUT_JSON MODE DUMP_DIR [--max-steps N] [--lr LR] [--forbid] [--metrics PATH]
    [--num-generations N] [--batch-size N] [--save-steps N] [--resume CHECKPOINT] [--output-dir DIR]
    [--eval-steps N] [--trainer grpo|rloo] [--conversational] [--rollout-func] [--config-json JSON]
    [--plant-overflow]

Builds a LlamaForCausalLM from a LlamaConfig and a word-level tokenizer (nothing downloaded),
wraps the GRPOTrainer (or RLOOTrainer) with rollout_mock.wrap_trl, trains, and writes
log_history as JSON. With --forbid, model.generate and the reward function raise if called.
A rollout_mock error is written to OUT_JSON as {"error": class name, "message": ...} (exit 3).
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
    texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]  # conversational: messages
    return [float(len(c.split())) - 0.5 * c.count("red") for c in texts]


def fixed_rollout(prompts, trainer):
    """A ``rollout_func``: deterministic completions from the prompt's words (no model)."""
    if os.environ.get("TRL_RUN_FORBID") == "1":
        raise AssertionError("rollout_func called in mock mode")
    tok = trainer.processing_class
    prompt_ids, completion_ids, logprobs = [], [], []
    for i, prompt in enumerate(prompts):
        text = prompt if isinstance(prompt, str) else prompt[-1]["content"]
        ids = tok(text)["input_ids"]
        prompt_ids.append(ids)
        completion_ids.append([4 + (len(text) + i + k) % len(WORDS) for k in range(1 + i % 3)] + [2])
        logprobs.append([-0.5] * len(completion_ids[-1]))
    return {"prompt_ids": prompt_ids, "completion_ids": completion_ids, "logprobs": logprobs}


def failed(out: str, exc: BaseException) -> int:
    with open(out, "w") as f:
        json.dump({"error": type(exc).__name__, "message": str(exc), "step": getattr(exc, "step", None)}, f)
    print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
    return 3


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("mode", choices=["dump", "mock", "check", "off"])
    parser.add_argument("dump_dir")
    parser.add_argument("--max-steps", type=int, default=3)
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--forbid", action="store_true")
    parser.add_argument("--metrics", default=None)
    parser.add_argument("--num-generations", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--save-steps", type=int, default=0)
    parser.add_argument("--resume", default=None)
    parser.add_argument("--output-dir", default=None)
    parser.add_argument("--eval-steps", type=int, default=0)
    parser.add_argument("--trainer", choices=["grpo", "rloo"], default="grpo")
    parser.add_argument("--conversational", action="store_true")
    parser.add_argument("--rollout-func", action="store_true")
    parser.add_argument("--config-json", default="{}")
    parser.add_argument("--steps-per-generation", type=int, default=2)
    parser.add_argument("--num-iterations", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-shuffle", action="store_true")
    parser.add_argument("--chat-template", default="{% for m in messages %}{{ m['content'] }} {% endfor %}")
    parser.add_argument("--plant-overflow", action="store_true",
                        help="scale layer 0's input norm weights to 1e30 before training: attention overflows")
    args = parser.parse_args()

    import torch
    from datasets import Dataset
    from transformers import LlamaConfig, LlamaForCausalLM
    from trl import GRPOConfig, GRPOTrainer, RLOOConfig, RLOOTrainer

    import rollout_mock

    torch.manual_seed(0)
    tokenizer = build_tokenizer()
    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64,
        pad_token_id=0, bos_token_id=1, eos_token_id=2, attention_dropout=0.1))
    prompts = [" ".join(WORDS[(i + k) % len(WORDS)] for k in range(3)) for i in range(16)]
    if args.conversational:
        tokenizer.chat_template = args.chat_template
        dataset = Dataset.from_dict({"prompt": [[{"role": "user", "content": p}] for p in prompts]})
    else:
        dataset = Dataset.from_dict({"prompt": prompts})
    Config, Trainer = (GRPOConfig, GRPOTrainer) if args.trainer == "grpo" else (RLOOConfig, RLOOTrainer)
    options = {
        "output_dir": args.output_dir or os.path.join(os.path.dirname(args.out), "trl_out_" + args.mode),
        "use_cpu": True, "report_to": [], "max_steps": args.max_steps, "learning_rate": args.lr, "logging_steps": 1,
        "per_device_train_batch_size": args.batch_size, "num_generations": args.num_generations,
        "gradient_accumulation_steps": 2, "steps_per_generation": args.steps_per_generation,
        "num_iterations": args.num_iterations, "max_completion_length": 6,
        "save_strategy": "steps" if args.save_steps else "no", "save_steps": args.save_steps or 500, "seed": args.seed,
        "beta": 0.04, "temperature": 1.0, "disable_tqdm": True, "dataloader_num_workers": 0,
    }
    if args.no_shuffle:
        options["shuffle_dataset"] = False
    if args.eval_steps:
        options.update(eval_strategy="steps", eval_steps=args.eval_steps, per_device_eval_batch_size=4)
    config = Config(**options)
    model_dir = os.path.join(os.path.dirname(args.out), "tiny_llama_" + args.mode)
    model.save_pretrained(model_dir)  # a local path: GRPO builds the reference model from it
    tokenizer.save_pretrained(model_dir)
    extra = {}
    if args.rollout_func:
        extra["rollout_func"] = fixed_rollout
    trainer = Trainer(model=model_dir, reward_funcs=reward_len, args=config, train_dataset=dataset,
                      eval_dataset=dataset.select(range(4)) if args.eval_steps else None,
                      processing_class=tokenizer, **extra)
    try:
        if args.mode != "off":
            block = {"enable": True, "mode": args.mode, "dump_dir": args.dump_dir, **json.loads(args.config_json)}
            rollout_mock.wrap_trl(trainer, block)
    except rollout_mock.RolloutMockError as exc:
        return failed(args.out, exc)
    if args.plant_overflow:
        with torch.no_grad():
            trainer.model.model.layers[0].input_layernorm.weight.fill_(1e30)
    if args.forbid:
        os.environ["TRL_RUN_FORBID"] = "1"

        def forbidden(*a, **k):
            raise AssertionError("model.generate called in mock mode")

        trainer.model.generate = forbidden
    try:
        trainer.train(resume_from_checkpoint=args.resume)
    except rollout_mock.RolloutMockError as exc:
        return failed(args.out, exc)
    if args.metrics:
        with rollout_mock.MetricsWriter(args.metrics) as writer:
            for entry in trainer.state.log_history:
                if "step" in entry and "loss" in entry:
                    writer.log(int(entry["step"]), {k: v for k, v in entry.items()
                                                    if isinstance(v, (int, float)) and k not in ("step", "step_time")
                                                    and not math.isnan(v)})
    with open(args.out, "w") as f:
        json.dump({"log_history": trainer.state.log_history}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
