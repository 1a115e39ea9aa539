"""slime: a rollout function to pass to ``--rollout-function-path`` (and ``--eval-function-path``).

::

    python train.py ... --rollout-function-path rollout_mock.adapters.slime.generate_rollout \\
                        --eval-function-path rollout_mock.adapters.slime.generate_rollout
    # with, in the environment of the rollout manager (Ray: runtime_env env_vars):
    ROLLOUT_MOCK_CONFIG=rollout_mock.yaml         # a YAML file holding the rollout_mock: block
    # or, without a file:
    ROLLOUT_MOCK_MODE=dump|mock ROLLOUT_MOCK_DUMP_DIR=./rollout_dumps/run1

:func:`generate_rollout` has slime's signature ``(args, rollout_id, data_source, evaluation=False)``.
Dump mode calls the real rollout (``ROLLOUT_MOCK_SLIME_ROLLOUT``, default slime's
``slime.rollout.sglang_rollout.generate_rollout``), records its output and returns it unchanged;
mock mode returns the recorded output (``RolloutFnTrainOutput`` / ``RolloutFnEvalOutput`` of
``Sample`` objects) and never imports or starts the real rollout, so sglang is not needed (run
slime with ``--debug-train-only`` so it does not start the engines either). The step is
``rollout_id``; evaluation rollouts go to the ``val`` split. Configuration can also come from
``args`` fields: ``args.rollout_mock_config`` (path or mapping) and ``args.rollout_mock_rollout``
(the wrapped function's path) win over the environment.

The record is plain data (``Sample.to_dict()`` dicts, nested as the rollout returned them), so a
dump replays in safe mode; ``rollout-mock import`` converts slime's own
``--save-debug-rollout-data`` files into the same record.

Partial rollouts (``--partial-rollout``): a sample aborted at a weight update is continued later
under the new weights, so its tokens come from several weight versions; slime appends the
version of each generation segment to ``Sample.weight_versions`` (e.g. ``["2", "4", "6"]``).
The record holds every sample's ``weight_versions`` as slime wrote them (replayed exactly, in
order), and :func:`segment_versions` (per sample: the segments' versions, first and last) is the
record's provenance.

Faithful replay: the rollout settings in ``args`` (:data:`SETTINGS`: batch size, samples per
prompt, sampling parameters, lengths, data keys, shuffling and its seed, the ``--prompt-data``
file by content — size and SHA-256, not its path —, the tokenizer files of ``hf_checkpoint``)
are recorded with the dump and compared when a mock run starts; what slime fills in at start-up
(a random ``sglang_router_port``, a ``wandb_run_id``) and the ``--save`` paths are not. A
request is ``(evaluation, the data source's position)``: slime's
``RolloutDataSource`` counts the prompts it hands out (``epoch_id``, ``sample_offset``,
``sample_index``, ``sample_group_index``); the dump records the position each rollout left it
at, and mock mode, whose rollouts do not read the data source, moves it there after serving
each record, so the next request, and the data-source state slime checkpoints, are the dump
run's. Resume: slime restores the data source's position from its checkpoint (``--load``), so a
resumed mock run asks for, and is served, the records of the rollouts it resumes at.
"""

from __future__ import annotations

import importlib
import itertools
import os
import threading
from collections.abc import Mapping
from typing import Any

from rollout_mock.adapters.frameworks import SLIME_RECORD_FORMAT, file_fingerprint
from rollout_mock.config import RolloutMockConfig, load_config
from rollout_mock.errors import ConfigError
from rollout_mock.wrap.scheduler import MockScheduler

__all__ = [
    "DATA_SOURCE_STATE", "DEFAULT_ROLLOUT", "FILE_SETTINGS", "RECORD_FORMAT", "SETTINGS", "TOKENIZER_FILES",
    "generate_rollout", "output_from_record", "record_from_flat", "record_from_output", "reset", "restore_data_source",
    "segment_versions", "slime_request", "slime_settings",
]

#: slime arguments that decide what a rollout generates (absent ones are left out). What slime
#: fills in at start-up (a random ``sglang_router_port``, a generated ``wandb_run_id``), the
#: ``--save``/``--load`` paths, ports and resource settings are not compared.
SETTINGS = (
    "rollout_batch_size", "n_samples_per_prompt", "over_sampling_batch_size", "rollout_temperature",
    "rollout_top_p", "rollout_top_k", "rollout_max_prompt_len", "rollout_max_response_len",
    "rollout_max_context_len", "rollout_stop", "rollout_stop_token_ids", "rollout_skip_special_tokens",
    "rollout_seed", "rollout_shuffle", "input_key", "label_key", "tool_key", "apply_chat_template",
    "apply_chat_template_kwargs", "rm_type", "n_samples_per_eval_prompt", "eval_temperature", "eval_top_p",
    "eval_top_k", "eval_max_response_len",
    # what decides the data: the prompt files by content, the data source and its keys, the
    # sample filters, the custom generation and reward functions, the tokenizer's files
    "prompt_data", "eval_prompt_data", "metadata_key", "multimodal_keys", "data_source_path",
    "rollout_global_dataset", "balance_data", "dynamic_sampling_filter_path", "custom_generate_function_path",
    "custom_rm_path", "eval_input_key", "eval_label_key", "eval_tool_key", "hf_checkpoint",
)
#: Arguments holding data file paths: compared by content (:func:`~rollout_mock.adapters.frameworks.file_fingerprint`).
FILE_SETTINGS = frozenset({"prompt_data", "eval_prompt_data"})
#: The files of a Hugging Face checkpoint that make its tokenizer and chat template (``hf_checkpoint``
#: is compared by these, not by its path or its weights).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
                   "chat_template.json", "vocab.json", "merges.txt", "tokenizer.model", "added_tokens.json")
#: The position of slime's ``RolloutDataSource`` in its data (what a request is matched on).
DATA_SOURCE_STATE = ("epoch_id", "sample_offset", "sample_group_index", "sample_index")


def _checkpoint_tokenizer(path: Any) -> Any:
    """A checkpoint directory as the fingerprints of its tokenizer files (:data:`TOKENIZER_FILES`);
    anything else (a hub name) as it is."""
    if not isinstance(path, str) or not os.path.isdir(path):
        return path
    return {name: file_fingerprint(os.path.join(path, name)) for name in TOKENIZER_FILES
            if os.path.isfile(os.path.join(path, name))}


def slime_settings(args: Any) -> dict[str, Any]:
    """The rollout settings (:data:`SETTINGS`) of slime's ``args``: the prompt files by content
    (``--eval-prompt-data name path ...``: the paths), ``hf_checkpoint`` by its tokenizer files."""
    out: dict[str, Any] = {}
    for name in SETTINGS:
        if not hasattr(args, name):
            continue
        value = getattr(args, name)
        if name in FILE_SETTINGS:
            value = file_fingerprint(value) if not isinstance(value, list | tuple) else [
                file_fingerprint(v) if isinstance(v, str) and os.path.exists(v) else v for v in value]
        elif name == "hf_checkpoint":
            value = _checkpoint_tokenizer(value)
        out[name] = value
    return out


def _data_source_state(data_source: Any) -> dict[str, int]:
    out = {}
    for name in DATA_SOURCE_STATE:
        value = getattr(data_source, name, None)
        if type(value) is int:
            out[name] = value
    return out


def slime_request(arguments: dict[str, Any]) -> dict[str, Any]:
    """The match key of ``generate_rollout``: evaluation or not, and the data source's position
    (never ``args``: slime fills in random ports and run ids at start-up; what of it decides the
    data is the pre-flight check's, :func:`slime_settings`)."""
    return {"evaluation": bool(arguments.get("evaluation", False)),
            "data_source": _data_source_state(arguments.get("data_source"))}


_request = slime_request


def restore_data_source(data_source: Any, record: Any) -> None:
    """Move ``data_source`` to where the dump run's rollout left it (the position a record holds:
    :func:`record_from_output` with ``data_source=``). Mock mode's rollouts never read the data
    source: without this, the next request and the state slime checkpoints would be stale."""
    position = record.get("data_source") if isinstance(record, Mapping) else None
    if isinstance(position, Mapping):
        for name, value in position.items():
            if name in DATA_SOURCE_STATE and type(value) is int and hasattr(data_source, name):
                setattr(data_source, name, value)

DEFAULT_ROLLOUT = "slime.rollout.sglang_rollout.generate_rollout"
RECORD_FORMAT = SLIME_RECORD_FORMAT  # the batch type of these records: adapters/frameworks.py
_lock = threading.Lock()
_wrappers: dict[tuple[Any, ...], Any] = {}


# ---------------------------------------------------------------------------- record format
def _to_dict(sample: Any) -> Any:
    if isinstance(sample, list):
        return [_to_dict(s) for s in sample]
    if isinstance(sample, Mapping):
        return dict(sample)
    return sample.to_dict()


def record_from_output(output: Any, *, evaluation: bool, data_source: Any = None) -> dict[str, Any]:
    """slime's rollout output (new-style or legacy bare list/dict) as a plain-data record; with
    ``data_source``, where the rollout left it (:func:`restore_data_source`)."""
    metrics = getattr(output, "metrics", None)
    position = {} if data_source is None else {"data_source": _data_source_state(data_source)}
    if evaluation:
        data = getattr(output, "data", output)
        return {
            "format": RECORD_FORMAT, "kind": "eval", "metrics": metrics,
            "data": {name: {k: (_to_dict(v) if k == "samples" else v) for k, v in info.items()}
                     for name, info in data.items()}, **position,
        }
    samples = getattr(output, "samples", output)
    return {"format": RECORD_FORMAT, "kind": "train", "metrics": metrics, "samples": _to_dict(samples), **position}


def record_from_flat(samples: list[dict[str, Any]], *, evaluation: bool) -> dict[str, Any]:
    """A record from slime's debug file (flat ``Sample.to_dict()`` list)."""
    if evaluation:
        return {"format": RECORD_FORMAT, "kind": "eval", "metrics": None, "data": {"debug": {
            "rewards": [s.get("reward") for s in samples],
            "truncated": [s.get("status") == "truncated" for s in samples],
            "samples": list(samples)}}}
    groups = [list(g) for _, g in itertools.groupby(samples, key=lambda s: s.get("group_index"))]
    return {"format": RECORD_FORMAT, "kind": "train", "metrics": None, "samples": groups}


def _samples_of(record: Mapping[str, Any]) -> list[Any]:
    if record.get("kind") == "eval":
        return [s for info in record.get("data", {}).values() for s in info.get("samples", [])]
    flat: list[Any] = []
    for item in record.get("samples") or []:
        flat.extend(item if isinstance(item, list) else [item])
    return flat


def segment_versions(record: Mapping[str, Any]) -> dict[str, Any]:
    """Provenance of a slime record: per sample (groups flattened, in order), the weight
    version of each generation segment (``Sample.weight_versions``; several after partial
    rollouts), and its first and last. A sample without versions has ``[]`` and ``None``."""
    segments = [list(s.get("weight_versions") or []) if isinstance(s, Mapping) else [] for s in _samples_of(record)]
    return {"segments": segments, "first": [v[0] if v else None for v in segments],
            "last": [v[-1] if v else None for v in segments]}


def _provenance_option() -> dict[str, Any]:
    import inspect

    if "provenance" in inspect.signature(MockScheduler.__init__).parameters:
        return {"provenance": segment_versions}
    return {}


def _sample_class() -> Any:
    from slime.utils.types import Sample  # type: ignore[import-not-found]

    return Sample


def _from_dict(item: Any, sample_cls: Any) -> Any:
    if isinstance(item, list):
        return [_from_dict(i, sample_cls) for i in item]
    return sample_cls.from_dict(item)


def output_from_record(record: Mapping[str, Any]) -> Any:
    """The record as slime's output: ``RolloutFnTrainOutput``/``RolloutFnEvalOutput`` of Samples
    (bare list / dict with an older slime that lacks ``slime.rollout.base_types``)."""
    if record.get("format") != RECORD_FORMAT:
        raise ConfigError(f"not a rollout_mock slime record (format={record.get('format')!r})")
    sample_cls = _sample_class()
    try:
        from slime.rollout.base_types import RolloutFnEvalOutput, RolloutFnTrainOutput  # type: ignore[import-not-found]
    except ImportError:  # older slime: legacy returns
        RolloutFnEvalOutput = RolloutFnTrainOutput = None
    if record.get("kind") == "eval":
        data = {name: {k: (_from_dict(v, sample_cls) if k == "samples" else v) for k, v in info.items()}
                for name, info in record["data"].items()}
        return data if RolloutFnEvalOutput is None else RolloutFnEvalOutput(data=data, metrics=record.get("metrics"))
    samples = _from_dict(record["samples"], sample_cls)
    if RolloutFnTrainOutput is None:
        return samples
    return RolloutFnTrainOutput(samples=samples, metrics=record.get("metrics"))


# ---------------------------------------------------------------------------- configuration
def _config(args: Any) -> RolloutMockConfig:
    source = getattr(args, "rollout_mock_config", None) or os.environ.get("ROLLOUT_MOCK_CONFIG")
    if source:
        return load_config(source)
    mode = os.environ.get("ROLLOUT_MOCK_MODE")
    if mode:
        block: dict[str, Any] = {"enable": True, "mode": mode}
        if os.environ.get("ROLLOUT_MOCK_DUMP_DIR"):
            block["dump_dir"] = os.environ["ROLLOUT_MOCK_DUMP_DIR"]
        return load_config(block)
    raise ConfigError(
        "rollout_mock.adapters.slime.generate_rollout: no configuration. Set ROLLOUT_MOCK_CONFIG="
        "<yaml with a rollout_mock: block>, or ROLLOUT_MOCK_MODE=dump|mock and ROLLOUT_MOCK_DUMP_DIR=<dir>, "
        "or args.rollout_mock_config"
    )


def _import_function(path: str) -> Any:
    module_name, _, attribute = path.rpartition(".")
    if not module_name:
        raise ConfigError(f"rollout function path {path!r}: expected module.function")
    if module_name == __name__ and attribute == "generate_rollout":
        raise ConfigError(f"rollout function path {path!r} points at this wrapper itself")
    return getattr(importlib.import_module(module_name), attribute)


class _Rollout:
    """What MockScheduler wraps: the real rollout, returning the plain-data record."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._function: Any = None
        self.last_output: Any = None

    def generate_rollout(self, args: Any, rollout_id: int, data_source: Any, evaluation: bool = False) -> Any:
        if self._function is None:
            self._function = _import_function(self.path)
        output = self._function(args, rollout_id, data_source, evaluation=evaluation)
        self.last_output = output
        return record_from_output(output, evaluation=evaluation, data_source=data_source)


def _wrapper(args: Any, evaluation: bool) -> tuple[Any, _Rollout]:
    config = _config(args)
    path = (getattr(args, "rollout_mock_rollout", None) or os.environ.get("ROLLOUT_MOCK_SLIME_ROLLOUT")
            or DEFAULT_ROLLOUT)
    split = "val" if evaluation else "train"
    key = (config.model_dump_json(), path, split)
    with _lock:
        if key not in _wrappers:
            inner = _Rollout(path)
            # The real rollout is only imported when called (dump mode, on_missing_step: record).
            _wrappers[key] = (MockScheduler(inner, config, split=split, methods=("generate_rollout",),
                                            rollout_settings=slime_settings(args),
                                            match_keys={"generate_rollout": _request}, framework="slime",
                                            **_provenance_option()), inner)
        return _wrappers[key]


def generate_rollout(args: Any, rollout_id: int, data_source: Any, evaluation: bool = False) -> Any:
    """slime's rollout-function contract, recorded or replayed (see the module docstring)."""
    mock, inner = _wrapper(args, evaluation)
    if not mock.enabled:
        return _import_function(inner.path)(args, rollout_id, data_source, evaluation=evaluation)
    inner.last_output = None
    record = mock.generate_rollout(args, rollout_id, data_source, evaluation=evaluation)
    if inner.last_output is not None and not mock.config.mode.replays:  # dump: hand back its own objects
        output, inner.last_output = inner.last_output, None
        return output
    inner.last_output = None
    if not mock.config.mode.runs_scheduler:  # where the dump run left it
        restore_data_source(data_source, record)
    return output_from_record(record)


def reset() -> None:
    """Close every wrapper (flushing pending dumps); the next call reads the configuration again."""
    with _lock:
        wrappers = list(_wrappers.values())
        _wrappers.clear()
    for mock, _ in wrappers:
        mock.close()
