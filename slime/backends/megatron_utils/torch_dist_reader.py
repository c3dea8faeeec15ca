"""Read the model weights of a Megatron-core ``torch_dist`` checkpoint without Megatron or a process group.

This is the format upstream slime users hold (``tools/convert_hf_to_torch_dist.py``, Megatron-LM's
``save_checkpoint`` with ``--ckpt-format torch_dist``, ``dist_checkpointing.save``). What megatron-core
0.16.1 with torch 2.13 writes into one checkpoint folder:

* ``metadata.json``: ``{"sharded_backend": "torch_dist", "sharded_backend_version": 1, "common_backend":
  "torch", ...}``, written last, so its presence means the save finished;
* ``.metadata``: torch DCP's global ``Metadata`` dataclass, pickled. ``state_dict_metadata`` maps each
  ShardedTensor key to its global size, dtype and chunks (offsets, sizes); ``storage_data`` maps
  ``MetadataIndex(key, chunk offsets)`` to ``_StorageInfo(relative_path, offset, length)``. Megatron adds
  ``all_local_plans`` (the SavePlans of every rank), which is why planner classes appear in the pickle;
* ``__{rank}_{i}.distcp``: each chunk ``torch.save``-d (Megatron forces ``SerializationFormat.TORCH_SAVE``)
  back to back; a chunk is ``length`` bytes at ``offset``, one small zip archive holding one tensor;
* ``common.pt``: the non-sharded rest (args, iteration...), a pickle; never opened here.

Megatron-LM's ``save_checkpoint`` puts that folder under a save root as ``iter_XXXXXXX/`` (or ``release/``,
which ``convert_hf_to_torch_dist.py`` renames it to) named by ``latest_checkpointed_iteration.txt``; the
root, what ``--load``/``--ref-load`` point at, is accepted too.

How keys are laid out (``TransformerBlock.sharded_state_dict`` and ``apply_swiglu_sharded_factory``):

* keys are the ShardedTensor keys, not the nested dict path, so ``state_dict["model"] = ...`` in
  Megatron-LM adds no ``model.`` prefix; a leading ``model.`` is still accepted and removed;
* the layers of a block are stacked along a prepended axis of size ``num_layers`` (global layer index, so
  pipeline stages fill different rows) under a key without the layer number: TP-1's
  ``decoder.layers.{i}.self_attention.linear_qkv.weight`` of shape ``[rows, hidden]`` is row ``i`` of
  ``decoder.layers.self_attention.linear_qkv.weight`` of shape ``[num_layers, rows, hidden]``; blocks with
  non-homogeneous layers (``singleton_local_shards``, MoE frequency lists, hybrid) keep per-layer keys
  ``decoder.layers.{i}.`` instead; both are accepted;
* the layer norms carry TE's fused names whatever the spec: ``input_layernorm.`` is stored as
  ``self_attention.linear_qkv.layer_norm_`` and ``pre_mlp_layernorm.`` as ``mlp.linear_fc1.layer_norm_``
  (the local spec's ``sharded_state_dict_keys_map``); they are returned under the local spec's names,
  which is what our Megatron trainer builds;
* tensor-parallel shards are chunks of the global (TP-1) tensor. ``linear_qkv`` is cut along rows, and as
  its rows are grouped per query group, the chunks concatenate to the TP-1 interleaved layout. GLU
  ``linear_fc1`` is split into gate and up halves before sharding: rank r's gate rows land at
  ``r * gate/tp`` and its up rows at ``ffn + r * up/tp`` of the global ``[gate; up]`` tensor, so placing
  every chunk at its offsets gives the TP-1 weight (two chunks per layer even at TP 1). The
  ``singleton_local_shards`` variant stores the halves under ``..._w`` and ``..._v``; they are joined.

Loading is safe: ``.metadata`` goes through :class:`_MetadataUnpickler`, which resolves only the DCP
dataclasses, ``torch.Size``, torch dtypes and a few containers and refuses any other global; tensors load
with ``torch.load(weights_only=True)``. Optimizer state (``optimizer.*``), RNG and other byte entries,
and ``_extra_state`` are skipped. Tensors come back full and in their stored dtype.

MoE expert weights (``mlp.experts.``) carry a second, expert axis and are not supported: they raise.
"""

from __future__ import annotations

import importlib
import io
import json
import os
import pickle
import re
from pathlib import Path

import torch

from slime.checkpoint.files import CheckpointError

CONFIG_FILE = "metadata.json"
DCP_METADATA_FILE = ".metadata"
TRACKER_FILE = "latest_checkpointed_iteration.txt"


class TorchDistReadError(CheckpointError):
    """The folder is not a readable torch_dist checkpoint; the message names the folder or file."""


class UnsafeMetadataError(TorchDistReadError, pickle.UnpicklingError):
    """``.metadata`` asks for a class outside the allow-list."""


# ----------------------------------------------------------------------------------- restricted unpickling
_DCP = "torch.distributed.checkpoint"
_ALLOWED_GLOBALS = {
    f"{_DCP}.metadata": {"Metadata", "MetadataIndex", "StorageMeta", "TensorProperties", "TensorStorageMetadata",
                         "ChunkStorageMetadata", "BytesStorageMetadata", "_MEM_FORMAT_ENCODING"},
    f"{_DCP}.filesystem": {"_StorageInfo", "_StoragePrefix"},
    # Megatron stores every rank's SavePlan in the metadata (``all_local_plans``).
    f"{_DCP}.planner": {"SavePlan", "WriteItem", "WriteItemType", "TensorWriteData", "BytesIOWriteData"},
    "torch.serialization": {"_get_layout"},  # torch.layout pickles as _get_layout("torch.strided")
    "collections": {"OrderedDict"},
    "builtins": {"set", "frozenset"},
    "pathlib": {"PosixPath", "PurePosixPath"},  # StorageMeta.checkpoint_id may be a Path
}


class _MetadataUnpickler(pickle.Unpickler):
    """Unpickles DCP ``Metadata``; any global outside the allow-list raises :class:`UnsafeMetadataError`."""

    def __init__(self, handle, path):
        super().__init__(handle)
        self._path = path

    def find_class(self, module, name):
        if module == "torch":
            target = getattr(torch, name, None) if isinstance(name, str) else None
            if name == "Size" or isinstance(target, torch.dtype):
                return target
        elif name in _ALLOWED_GLOBALS.get(module, ()):
            return getattr(importlib.import_module(module), name)
        raise UnsafeMetadataError(f"{self._path}: refusing to unpickle {module}.{name} "
                                  "(not a torch.distributed.checkpoint metadata class)")

    def persistent_load(self, pid):
        raise UnsafeMetadataError(f"{self._path}: persistent ids are not expected in DCP metadata")


def read_dcp_metadata(path):
    """The DCP ``Metadata`` object of a ``.metadata`` file, unpickled with the allow-list."""
    path = Path(path)
    try:
        with open(path, "rb") as handle:
            metadata = _MetadataUnpickler(handle, path).load()
    except TorchDistReadError:
        raise
    except Exception as exc:  # a damaged pickle fails in many ways (EOFError, KeyError, TypeError...)
        raise TorchDistReadError(f"{path}: unreadable DCP metadata ({type(exc).__name__}: {exc})") from exc
    if not hasattr(metadata, "state_dict_metadata") or not isinstance(getattr(metadata, "storage_data", None), dict):
        raise TorchDistReadError(f"{path}: not a DCP Metadata object (got {type(metadata).__name__})")
    return metadata


# ------------------------------------------------------------------------------------------ folder checks
def _backend(folder: Path) -> str | None:
    try:
        with open(folder / CONFIG_FILE, encoding="utf-8") as handle:
            config = json.load(handle)
    except (OSError, ValueError):
        return None
    return config.get("sharded_backend") if isinstance(config, dict) else None


def _resolve(folder: Path) -> Path:
    """``folder`` itself, or the iteration folder a Megatron-LM save root's tracker file points at."""
    if (folder / CONFIG_FILE).is_file() or not (folder / TRACKER_FILE).is_file():
        return folder
    try:
        tag = (folder / TRACKER_FILE).read_text(encoding="utf-8").strip()
    except OSError:
        return folder
    if tag == "release":
        return folder / "release"
    return folder / f"iter_{int(tag):07d}" if tag.isdigit() else folder


def is_torch_dist(folder) -> bool:
    """True if ``folder`` is a finished Megatron ``torch_dist`` checkpoint.

    That is a ``metadata.json`` naming the ``torch_dist`` backend next to DCP's ``.metadata``. A Megatron-LM
    save root (``latest_checkpointed_iteration.txt`` + ``release/`` or ``iter_XXXXXXX/``, what
    ``--load``/``--ref-load`` point at) counts when the folder its tracker names is one.
    """
    folder = _resolve(Path(folder))
    return _backend(folder) == "torch_dist" and (folder / DCP_METADATA_FILE).is_file()


# ------------------------------------------------------------------------------------------- key mapping
_STACKED = re.compile(r"^(.*?\blayers\.)(?!\d+\.)(.+)$")
_NORM_NAMES = (("self_attention.linear_qkv.layer_norm_", "input_layernorm."),
               ("mlp.linear_fc1.layer_norm_", "pre_mlp_layernorm."))
_GLU_HALVES = re.compile(r"^(.*\.linear_fc1\.weight)_([wv])$")
_DECODER_LAYER = re.compile(r"^decoder\.layers\.(\d+)\.")


def _is_model_key(key: str) -> bool:
    return not key.removeprefix("model.").startswith("optimizer") and "_extra_state" not in key


def _local_name(key: str) -> str:
    """Stored key (per layer) -> the local layer spec's ``state_dict`` key."""
    key = key.removeprefix("model.")
    for stored, local in _NORM_NAMES:
        head, sep, tail = key.rpartition(f".{stored}")
        if sep and re.search(r"\blayers\.\d+$", head):
            return f"{head}.{local}{tail}"
    return key


# ------------------------------------------------------------------------------------------ tensor reads
def _chunk_slices(key, chunk, size, path):
    offsets, sizes = tuple(chunk.offsets), tuple(chunk.sizes)
    if len(offsets) != len(size) or len(sizes) != len(size) or any(
            o < 0 or n < 0 or o + n > s for o, n, s in zip(offsets, sizes, size)):
        raise TorchDistReadError(f"{path}: chunk {offsets}+{sizes} of {key} lies outside its size {tuple(size)}")
    return tuple(slice(o, o + n) for o, n in zip(offsets, sizes)), sizes


def _load_chunk(blob: bytes, where: str):
    try:
        tensor = torch.load(io.BytesIO(blob), map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises RuntimeError, pickle errors, zip errors...
        raise TorchDistReadError(f"{where}: unreadable tensor ({type(exc).__name__}: {exc})") from exc
    if not isinstance(tensor, torch.Tensor):
        raise TorchDistReadError(f"{where}: expected a tensor, found {type(tensor).__name__}")
    return tensor


def _read_tensors(folder: Path, metadata, keys: list[str]) -> dict[str, torch.Tensor]:
    """Assemble each key's global tensor from its chunks, reading each ``.distcp`` file once in order."""
    meta_path = folder / DCP_METADATA_FILE
    storage = {(index.fqn, tuple(index.offset or ())): info for index, info in metadata.storage_data.items()}
    out, filled, per_file = {}, {}, {}
    for key in keys:
        entry = metadata.state_dict_metadata[key]
        out[key] = torch.empty(tuple(entry.size), dtype=entry.properties.dtype)
        filled[key] = 0
        for chunk in entry.chunks:
            slices, sizes = _chunk_slices(key, chunk, entry.size, meta_path)
            info = storage.get((key, tuple(chunk.offsets)))
            if info is None:
                raise TorchDistReadError(f"{meta_path}: no storage entry for chunk {tuple(chunk.offsets)} of {key}")
            if getattr(info, "transform_descriptors", None):
                raise TorchDistReadError(f"{meta_path}: {key} is stored with transforms "
                                         f"{info.transform_descriptors}, which this reader does not support")
            name = str(info.relative_path)
            if os.path.basename(name) != name or name in ("", ".", ".."):
                raise TorchDistReadError(f"{meta_path}: storage file {name!r} of {key} is not a file of the folder")
            per_file.setdefault(name, []).append((info.offset, info.length, key, slices, sizes))
    for name, items in sorted(per_file.items()):
        path = folder / name
        if not path.is_file():
            raise TorchDistReadError(f"{path}: missing (holds {items[0][2]} among {len(items)} chunks)")
        file_size = path.stat().st_size
        with open(path, "rb") as handle:
            for offset, length, key, slices, sizes in sorted(items, key=lambda item: item[0]):
                where = f"{path} [{key} at byte {offset}]"
                if offset + length > file_size:
                    raise TorchDistReadError(f"{where}: truncated, the chunk ends at byte {offset + length} "
                                             f"but the file has {file_size}")
                handle.seek(offset)
                blob = handle.read(length)
                if len(blob) != length:
                    raise TorchDistReadError(f"{where}: truncated, read {len(blob)} of {length} bytes")
                tensor = _load_chunk(blob, where)
                if tuple(tensor.shape) != tuple(sizes) or tensor.dtype != out[key].dtype:
                    raise TorchDistReadError(f"{where}: chunk is {tuple(tensor.shape)} {tensor.dtype}, "
                                             f"the metadata says {tuple(sizes)} {out[key].dtype}")
                out[key][slices] = tensor
                filled[key] += tensor.numel()
    for key, tensor in out.items():
        if filled[key] != tensor.numel():
            raise TorchDistReadError(f"{meta_path}: the chunks of {key} cover {filled[key]} of "
                                     f"{tensor.numel()} elements")
    return out


def _join_glu_halves(tensors: dict[str, torch.Tensor], folder: Path) -> dict[str, torch.Tensor]:
    """``linear_fc1.weight_w`` + ``_v`` (singleton_local_shards saves) -> ``linear_fc1.weight`` = [w; v]."""
    halves, joined = {}, {}
    for key, tensor in tensors.items():
        match = _GLU_HALVES.match(key)
        if match:
            halves.setdefault(match.group(1), {})[match.group(2)] = tensor
        else:
            joined[key] = tensor
    for base, parts in halves.items():
        if set(parts) != {"w", "v"}:
            raise TorchDistReadError(f"{folder}: {base}_w / {base}_v found only as {sorted(parts)}")
        stacked = _STACKED.match(base) is not None  # the layer axis comes first
        joined[base] = torch.cat([parts["w"], parts["v"]], dim=1 if stacked else 0)
    return joined


def _unstack(tensors: dict[str, torch.Tensor], folder: Path) -> dict[str, torch.Tensor]:
    state = {}
    for key in list(tensors):
        tensor = tensors.pop(key)  # the stacked tensor is freed once its layers are copied out
        match = _STACKED.match(key)
        if match is None:
            state[_local_name(key)] = tensor
            continue
        if tensor.dim() < 1:
            raise TorchDistReadError(f"{folder}: {key} should be stacked by layer but is a scalar")
        prefix, rest = match.groups()
        for index, layer in enumerate(tensor.unbind(0)):
            state[_local_name(f"{prefix}{index}.{rest}")] = layer.clone()
    return state


def read_model_state(folder, num_layers: int | None = None) -> dict[str, torch.Tensor]:
    """The model weights of a torch_dist checkpoint as full tensors keyed like a TP-1 ``GPTModel.state_dict()``.

    ``folder`` is the checkpoint folder or a Megatron-LM save root (see :func:`is_torch_dist`). Layers stacked
    by Megatron are split into ``decoder.layers.{i}.`` entries, TP chunks are joined, layer norms take the
    local spec's names; ``_extra_state``, optimizer, RNG and other non-tensor entries are left out.
    ``num_layers``, when given, must be the number of ``decoder.layers.{i}`` found (0..num_layers-1). Raises
    :class:`TorchDistReadError` naming the folder or file when the folder is not such a checkpoint, a
    ``.distcp`` file is missing or truncated, or no model weight is found; :class:`UnsafeMetadataError`
    when ``.metadata`` names a class outside the allow-list.
    """
    given = Path(folder)
    folder = _resolve(given)
    if not is_torch_dist(folder):
        found = _backend(folder)
        if found == "torch_dist":
            why = f"no {DCP_METADATA_FILE} in {folder}"
        elif found is not None:
            why = f"{folder / CONFIG_FILE} names backend {found!r}"
        else:
            why = f"no readable {CONFIG_FILE} with a sharded_backend in {folder}"
        raise TorchDistReadError(f"{given}: not a Megatron torch_dist checkpoint ({why})")
    metadata = read_dcp_metadata(folder / DCP_METADATA_FILE)
    keys = [key for key, entry in metadata.state_dict_metadata.items()
            if hasattr(entry, "chunks") and hasattr(entry, "size") and _is_model_key(key)]
    experts = [key for key in keys if ".experts." in key]
    if experts:
        raise TorchDistReadError(f"{folder}: MoE expert weights are not supported by this reader ({experts[0]})")
    if not keys:
        raise TorchDistReadError(f"{folder}: the checkpoint holds no model weights "
                                 f"({len(metadata.state_dict_metadata)} entries, none a model tensor)")
    tensors = _join_glu_halves(_read_tensors(folder, metadata, keys), folder)
    state = _unstack(tensors, folder)
    if num_layers is not None:
        found = sorted({int(m.group(1)) for m in map(_DECODER_LAYER.match, state) if m})
        if found != list(range(num_layers)):
            raise TorchDistReadError(f"{folder}: expected {num_layers} decoder layers, the checkpoint has "
                                     f"{len(found)} (indices {found[:3]}{'...' if len(found) > 3 else ''})")
    return state
