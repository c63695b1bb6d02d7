"""Reads flatshard checkpoints offline, without a cluster (docs/checkpoints.md).

    ckpt = flatshard.checkpoint.load("checkpoints/gpt/step-00000200")
    model.load_state_dict(ckpt.model_state(as_torch=True), strict=True)

FULL checkpoints are one model and one optimizer file. SHARDED ones (format
version 2) hold in rank r's files the elements of every tensor that rank's flat
shard held: each a 1-D piece, a contiguous range of the tensor's row-major
flattening, whose first element the file's metadata records under
``element_offsets``; the pieces tile each tensor, whose shape the manifest
gives. ``<fqn>.step`` is whole (0-dim) in every optimizer file. Version 1
SHARDED files held rows ``torch.chunk(W, dim=0)[r]`` instead; both are read.
File sizes are checked against the manifest; `flatshard ckpt verify` also checks
the xxh3 digests.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any, Dict, List

import numpy as np

from flatshard._safetensors import bf16_bits_to_float32, read_safetensors

_BF16 = "BF16"


@dataclass
class Checkpoint:
    """A checkpoint read into memory: tensors by name, as the files hold them."""
    path: str
    manifest: Dict[str, Any]
    model: Dict[str, np.ndarray]   # FQN -> value (tied aliases included)
    optim: Dict[str, np.ndarray]   # "<fqn>.<state>" -> value, "<fqn>.step" 0-dim
    bf16: set                      # names whose file dtype is bfloat16 (kept as raw bits)

    @property
    def step(self) -> int:
        return int(self.manifest["step"])

    @property
    def model_spec(self) -> Dict[str, Any]:
        """The job's model in the wire form (``flatshard.torch_modules.build``)."""
        return self.manifest["job_spec"]["model"]

    def model_state(self, as_torch: bool = False) -> Dict[str, Any]:
        """The model's state dict: numpy (bf16 widened to float32) or torch."""
        return {name: _output(name, value, name in self.bf16, as_torch)
                for name, value in self.model.items()}

    def optim_state(self, as_torch: bool = False) -> Dict[str, Any]:
        return {name: _output(name, value, name in self.bf16, as_torch)
                for name, value in self.optim.items()}


def load_safetensors(path: str, as_torch: bool = False) -> Dict[str, Any]:
    """A safetensors file (e.g. `flatshard summon --out FILE`) by tensor name."""
    tensors, dtypes, _ = read_safetensors(path)
    return {name: _output(name, value, dtypes[name] == _BF16, as_torch)
            for name, value in tensors.items()}


def load(path: str) -> Checkpoint:
    """Reads a FULL or SHARDED checkpoint, whichever the manifest says."""
    manifest = _manifest(path)
    kind = manifest.get("state_dict_type")
    if kind == "FULL_STATE_DICT":
        return load_full(path)
    if kind == "SHARDED_STATE_DICT":
        return load_sharded(path)
    raise ValueError(f"{path}: a {kind} holds flat shards tied to one layout; convert it with "
                     f"`flatshard ckpt consolidate {path} -o OUT` and load OUT")


def load_full(path: str) -> Checkpoint:
    manifest = _manifest(path)
    _expect(path, manifest, "FULL_STATE_DICT")
    _check_sizes(path, manifest)
    model, model_dtypes, _ = read_safetensors(os.path.join(path, "model.safetensors"))
    optim, optim_dtypes, _ = read_safetensors(os.path.join(path, "optim.safetensors"))
    checkpoint = Checkpoint(path, manifest, model, optim,
                            _bf16_names(model_dtypes) | _bf16_names(optim_dtypes))
    _check_shapes(checkpoint)
    return checkpoint


def load_sharded(path: str) -> Checkpoint:
    manifest = _manifest(path)
    _expect(path, manifest, "SHARDED_STATE_DICT")
    _check_sizes(path, manifest)
    world = int(manifest["world_size"])
    pieces_v2 = int(manifest.get("format_version", 1)) >= 2
    parts: Dict[str, Dict[str, List[np.ndarray]]] = {"model": {}, "optim": {}}
    offsets: Dict[str, Dict[str, List[int]]] = {"model": {}, "optim": {}}
    bf16: set = set()
    for kind in ("model", "optim"):
        for rank in range(world):
            file = os.path.join(path, f"{kind}-rank{rank:05d}-of-{world:05d}.safetensors")
            tensors, dtypes, metadata = read_safetensors(file)
            bf16 |= _bf16_names(dtypes)
            file_offsets = json.loads(metadata.get("element_offsets", "{}")) if pieces_v2 else {}
            for name, value in tensors.items():
                parts[kind].setdefault(name, []).append(value)
                if name in file_offsets:
                    offsets[kind].setdefault(name, []).append(int(file_offsets[name]))
    merged: Dict[str, Dict[str, np.ndarray]] = {"model": {}, "optim": {}}
    for kind, by_name in parts.items():
        for name, pieces in by_name.items():
            if name in offsets[kind]:
                merged[kind][name] = _assemble(path, manifest, kind, name, pieces,
                                               offsets[kind][name])
            else:
                merged[kind][name] = _merge(path, name, pieces, pieces_v2)
    # The ranks' files hold each tensor once; a tied alias (GPT's lm_head.weight)
    # is only named in the manifest, as in FSDP's sharded state dict, and is the
    # same tensor as its primary in the model state, as in a FULL checkpoint.
    for alias, primary in manifest.get("tied", {}).items():
        if alias not in merged["model"] and primary in merged["model"]:
            merged["model"][alias] = merged["model"][primary]
            if primary in bf16:
                bf16.add(alias)
    checkpoint = Checkpoint(path, manifest, merged["model"], merged["optim"], bf16)
    _check_shapes(checkpoint)
    return checkpoint


def _manifest(path: str) -> Dict[str, Any]:
    file = os.path.join(path, "manifest.json")
    try:
        with open(file, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: no manifest.json (not a committed flatshard checkpoint; "
                                "a '.partial' directory is a save that never committed)") from None


def _expect(path: str, manifest: Dict[str, Any], kind: str) -> None:
    if manifest.get("state_dict_type") != kind:
        raise ValueError(f"{path}: is a {manifest.get('state_dict_type')}, not a {kind} "
                         "(flatshard.checkpoint.load reads either)")


def _check_sizes(path: str, manifest: Dict[str, Any]) -> None:
    for entry in manifest.get("files", []):
        file = os.path.join(path, entry["name"])
        size = os.path.getsize(file)
        if size != int(entry["bytes"]):
            raise ValueError(f"{file}: {size} bytes, the manifest says {entry['bytes']} "
                             "(a damaged or foreign file)")


def _merge(path: str, name: str, pieces: List[np.ndarray], pieces_v2: bool) -> np.ndarray:
    if pieces_v2 and pieces[0].ndim != 0:
        raise ValueError(f"{path}: '{name}' has no element offset (only 0-dim values are whole "
                         "in every rank's file)")
    if pieces[0].ndim == 0:
        if any(not np.array_equal(p, pieces[0]) for p in pieces[1:]):
            raise ValueError(f"{path}: 0-dim '{name}' differs between the ranks' files")
        return pieces[0]
    return np.concatenate(pieces, axis=0)


def _assemble(path: str, manifest: Dict[str, Any], kind: str, name: str,
              pieces: List[np.ndarray], offsets: List[int]) -> np.ndarray:
    """A version 2 SHARDED tensor from its 1-D pieces, which must tile it."""
    fqn = name if kind == "model" else name.rsplit(".", 1)[0]
    info = manifest.get("params", {}).get(fqn)
    if info is None:
        raise ValueError(f"{path}: piece '{name}' belongs to no parameter of the manifest")
    shape = tuple(int(d) for d in info["shape"])
    numel = int(np.prod(shape, dtype=np.int64)) if shape else 1
    if len(offsets) != len(pieces):
        raise ValueError(f"{path}: '{name}' is a piece in some files and whole in others")
    out = np.empty(numel, dtype=pieces[0].dtype)
    covered = 0
    for offset, piece in sorted(zip(offsets, pieces), key=lambda p: p[0]):
        if piece.ndim != 1 or offset != covered or offset + piece.size > numel:
            raise ValueError(f"{path}: the pieces of '{name}' do not tile its {numel} elements "
                             f"(a piece of {piece.size} at {offset}, {covered} covered)")
        out[offset:offset + piece.size] = piece
        covered += piece.size
    if covered != numel:
        raise ValueError(f"{path}: the pieces of '{name}' hold {covered} of its {numel} elements")
    return out.reshape(shape)


def _check_shapes(checkpoint: Checkpoint) -> None:
    for fqn, info in checkpoint.manifest.get("params", {}).items():
        want = tuple(int(d) for d in info["shape"])
        got = checkpoint.model.get(fqn)
        if got is None:
            raise ValueError(f"{checkpoint.path}: parameter '{fqn}' is in the manifest but not "
                             "in the model files")
        if got.shape != want:
            raise ValueError(f"{checkpoint.path}: parameter '{fqn}' has shape {got.shape}, the "
                             f"manifest says {want}")


def _bf16_names(dtypes: Dict[str, str]) -> set:
    return {name for name, dtype in dtypes.items() if dtype == _BF16}


def _output(name: str, value: np.ndarray, bf16: bool, as_torch: bool) -> Any:
    if not as_torch:
        return bf16_bits_to_float32(value) if bf16 else value
    import torch  # optional: only as_torch needs it

    if bf16:
        return torch.from_numpy(value.view(np.int16).copy()).view(torch.bfloat16)
    return torch.from_numpy(value.copy())
