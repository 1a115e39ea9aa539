"""One slime run's rollouts, from slime's start-up on (used by test_slime_by_hand.py in a subprocess).

python slime_startup_run.py OUT_JSON MODE DUMP_DIR PROMPT_DATA SAVE_DIR {adapter|by-hand}

``startup_args`` stands in for ``slime.utils.arguments.parse_args``'s output: the rollout and data
arguments with slime's defaults, and what slime fills in at start-up and differs from run to run:
a random ``sglang_router_port`` (``find_available_port(random.randint(3000, 4000))``), a
generated ``wandb_run_id`` (``wandb.run.id``) and the ``--save`` path. The data source reads its
prompts from ``--prompt-data`` (a JSONL file with ``input`` keys). Three training rollouts run
through the adapter (``--rollout-function-path rollout_mock.adapters.slime.generate_rollout``) or
the by-hand wrapper of docs/frameworks/slime.md; OUT_JSON gets the samples, or the rollout_mock
error ``{"error", "message"}``. The slime double must be on PYTHONPATH.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import sys
import types
import uuid
from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "docs" / "frameworks" / "slime.md"


def startup_args(prompt_data: str, save: str) -> argparse.Namespace:
    return argparse.Namespace(
        rollout_batch_size=3, n_samples_per_prompt=2, over_sampling_batch_size=None, rollout_temperature=1.0,
        rollout_top_p=1.0, rollout_top_k=-1, rollout_max_prompt_len=None, rollout_max_response_len=3,
        rollout_max_context_len=None, rollout_stop=None, rollout_stop_token_ids=None,
        rollout_skip_special_tokens=False, rollout_seed=42, rollout_shuffle=False, input_key="input",
        label_key=None, tool_key="tools", metadata_key="metadata", multimodal_keys=None,
        apply_chat_template=False, apply_chat_template_kwargs={}, rm_type=None, prompt_data=prompt_data,
        eval_prompt_data=None, data_source_path="slime.rollout.data_source.RolloutDataSourceWithBuffer",
        balance_data=False, dynamic_sampling_filter_path=None, custom_generate_function_path=None,
        custom_rm_path=None, hf_checkpoint="Qwen/Qwen3-0.6B", seed=1234, num_rollout=3,
        save=save, load=None, save_debug_rollout_data=None,
        sglang_router_ip="127.0.0.1", sglang_router_port=3000 + random.randint(100, 1000) + random.randint(0, 1000),
        wandb_run_id=uuid.uuid4().hex[:8], wandb_group=f"run-{uuid.uuid4().hex[:6]}",
        rollout_function_path="rollout_mock.adapters.slime.generate_rollout",
    )


def by_hand(config: Path) -> types.ModuleType:
    code = re.search(r"<!-- slime-by-hand -->\s*```python\n(.*?)```", DOC.read_text(encoding="utf-8"), re.DOTALL)
    assert code is not None
    module = types.ModuleType("my_rollout")
    source = code.group(1).replace('"rollout_mock.yaml"', repr(str(config)))
    exec(compile(source, str(DOC), "exec"), module.__dict__)  # noqa: S102 - the documented example itself
    return module


def main() -> int:
    out, mode, dump_dir, prompt_data, save, which = sys.argv[1:7]
    from slime.rollout.base_types import call_rollout_fn
    from slime.utils.types import RolloutDataSource

    import rollout_mock
    from rollout_mock.adapters import slime as adapter

    config = Path(out).with_suffix(".yaml")
    config.write_text(f"rollout_mock:\n  enable: true\n  mode: {mode}\n  dump_dir: {dump_dir}\n")
    os.environ["ROLLOUT_MOCK_CONFIG"] = str(config)
    args = startup_args(prompt_data, save)
    with open(prompt_data) as f:
        prompts = [json.loads(line)["input"] for line in f if line.strip()]
    source = RolloutDataSource(args, prompts)
    samples = []
    try:
        module = by_hand(config) if which == "by-hand" else None
        fn = adapter.generate_rollout if module is None else module.generate_rollout
        for rollout_id in range(3):
            output = call_rollout_fn(fn, args, rollout_id, source, evaluation=False)
            for group in output.samples:
                for sample in group:
                    data = sample.to_dict()
                    data.pop("non_generation_time", None)
                    samples.append(data)
    except rollout_mock.RolloutMockError as exc:
        Path(out).write_text(json.dumps({"error": type(exc).__name__, "message": str(exc)}))
        return 3
    finally:
        adapter.reset()
        for wrapper in (getattr(module, "_wrappers", {}) if "module" in locals() and module else {}).values():
            wrapper.close()
    Path(out).write_text(json.dumps({"samples": samples, "position": source.state_dict()}, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
