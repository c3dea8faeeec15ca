"""Prompt datasets (jsonl / parquet) and the resumable data source that feeds rollouts.

A row becomes a :class:`Sample` with ``prompt`` from ``--input-key``, ``label`` from ``--label-key`` and
``metadata`` from ``--metadata-key``. A top-level ``expert_actions`` field (TCOD's B2F prefix) is kept in
``metadata["expert_actions"]``. A bad row fails with the file, the line and the field named.
"""

from __future__ import annotations

import copy
import json
import random
from pathlib import Path

from slime.utils.types import Sample


class DataError(ValueError):
    """A row of a prompt file that cannot be used; the message names file, line and field."""


def _read_rows(path: Path):
    """Yield (line_number, row) pairs; line numbers are 1-based (row numbers for parquet)."""
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        try:
            table = pq.read_table(path)
        except Exception as err:  # noqa: BLE001 - pyarrow's errors for a file that is not parquet vary
            raise DataError(f"{path}: not a readable parquet file ({type(err).__name__}: {err})") from None
        for i, row in enumerate(table.to_pylist(), start=1):
            yield i, row
        return
    with path.open("rb") as handle:  # bytes: a line that is not UTF-8 is named with its number
        for i, raw in enumerate(handle, start=1):
            try:
                line = raw.decode("utf-8-sig" if i == 1 else "utf-8")
            except UnicodeDecodeError as err:
                raise DataError(f"{path}:{i}: not UTF-8 text (byte 0x{raw[err.start]:02x} at column {err.start + 1}); "
                                "write the file as UTF-8 JSON lines") from None
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                hint = (": the file looks like one JSON document, not JSON lines (one object per line)"
                        if i == 1 and line.strip() in ("[", "{") else "")
                raise DataError(f"{path}:{i}: not valid JSON ({err.msg}){hint}") from None
            yield i, row


def _check_prompt(prompt, where: str, key: str):
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and all(isinstance(m, dict) and "role" in m and "content" in m for m in prompt):
        return prompt
    raise DataError(f"{where}: field {key!r} must be a string or a list of {{role, content}} messages")


class Dataset:
    """All rows of one prompt file, turned into template Samples (copied per request)."""

    def __init__(self, path, *, input_key="input", label_key=None, metadata_key="metadata",
                 tokenizer=None, apply_chat_template=False, apply_chat_template_kwargs=None):
        self.path = Path(path)
        if not self.path.exists():
            raise DataError(f"prompt data {self.path} does not exist")
        if self.path.suffix not in (".jsonl", ".json", ".parquet"):
            raise DataError(f"prompt data {self.path}: expected a .jsonl or .parquet file")
        if apply_chat_template and tokenizer is None:
            raise DataError("--apply-chat-template needs a tokenizer (from --hf-checkpoint)")
        self.samples: list[Sample] = []
        for line, row in _read_rows(self.path):
            where = f"{self.path}:{line}"
            if not isinstance(row, dict):
                raise DataError(f"{where}: each row must be a JSON object (JSON lines: one object per line), "
                                f"got a JSON {type(row).__name__}")
            if input_key not in row:
                raise DataError(f"{where}: missing field {input_key!r} (--input-key)")
            prompt = _check_prompt(row[input_key], where, input_key)
            if apply_chat_template:
                messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
                prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                                       **(apply_chat_template_kwargs or {}))
            label = None
            if label_key is not None:
                if label_key not in row:
                    raise DataError(f"{where}: missing field {label_key!r} (--label-key)")
                label = row[label_key]
            metadata = row.get(metadata_key) or {}
            if not isinstance(metadata, dict):
                raise DataError(f"{where}: field {metadata_key!r} (--metadata-key) must be an object")
            metadata = dict(metadata)
            if "expert_actions" in row:
                actions = row["expert_actions"]
                if not (isinstance(actions, list) and all(isinstance(a, str) for a in actions)):
                    raise DataError(f"{where}: field 'expert_actions' must be a list of strings")
                metadata["expert_actions"] = actions
            self.samples.append(Sample(prompt=prompt, label=label, metadata=metadata))
        if not self.samples:
            raise DataError(f"prompt data {self.path} holds no rows")

    def __len__(self):
        return len(self.samples)


class RolloutDataSource:
    """Hands out groups of ``n_samples_per_prompt`` copies per prompt, epoch after epoch.

    The position (epoch, offset, running sample index) is a ``state_dict`` so a resumed run continues
    with exactly the prompts an uninterrupted run would have taken.
    """

    def __init__(self, dataset: Dataset, *, n_samples_per_prompt: int, shuffle: bool = False, seed: int = 0):
        self.dataset = dataset
        self.n_samples_per_prompt = n_samples_per_prompt
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.offset = 0
        self.sample_index = 0
        self.group_index = 0
        self._order = self._epoch_order()

    @classmethod
    def from_args(cls, args, tokenizer=None, path=None):
        dataset = Dataset(path or args.prompt_data, input_key=args.input_key, label_key=args.label_key,
                          metadata_key=args.metadata_key, tokenizer=tokenizer,
                          apply_chat_template=args.apply_chat_template,
                          apply_chat_template_kwargs=getattr(args, "apply_chat_template_kwargs", None))
        return cls(dataset, n_samples_per_prompt=args.n_samples_per_prompt, shuffle=args.rollout_shuffle,
                   seed=args.rollout_seed)

    def _epoch_order(self) -> list[int]:
        order = list(range(len(self.dataset)))
        if self.shuffle:
            random.Random(self.seed + self.epoch).shuffle(order)
        return order

    def _next_prompt(self) -> Sample:
        if self.offset >= len(self._order):
            self.epoch += 1
            self.offset = 0
            self._order = self._epoch_order()
        template = self.dataset.samples[self._order[self.offset]]
        self.offset += 1
        return template

    def get_samples(self, num_prompts: int) -> list[list[Sample]]:
        groups = []
        for _ in range(num_prompts):
            template = self._next_prompt()
            group = []
            for _ in range(self.n_samples_per_prompt):
                sample = copy.deepcopy(template)
                sample.group_index = self.group_index
                sample.index = self.sample_index
                self.sample_index += 1
                group.append(sample)
            self.group_index += 1
            groups.append(group)
        return groups

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "offset": self.offset, "sample_index": self.sample_index,
                "group_index": self.group_index}

    def load_state_dict(self, state: dict) -> None:
        self.epoch = int(state["epoch"])
        self.offset = int(state["offset"])
        self.sample_index = int(state["sample_index"])
        self.group_index = int(state["group_index"])
        self._order = self._epoch_order()
