"""torch.nn modules that compute exactly what flatshard's composite types do.

flatshard runs a model from its spec (docs/model-spec.md); the leaf types are
torch's own (Linear, LayerNorm, Embedding, GELU, ReLU, Dropout, Identity) and
the containers are Sequential / ModuleList / ModuleDict plus the composites
below, whose forward the workers implement:

    ModuleList          the children in order when called   (nn.ModuleList cannot be)
    Residual            y = x + children(x)                 (in order)
    MLP                 the children in order (c_fc, act, c_proj in GPT-2)
    CausalSelfAttention GPT-2's: c_attn -> q|k|v columns, num_heads heads,
                        softmax(q k^T / sqrt(hd)) causal, -> c_proj
    TransformerBlock    pre-LN: x + attn(ln_1(x)), then + mlp(ln_2(x))
    GPT                 wte(ids) + wpe(positions) -> h -> ln_f -> lm_head

Build your model from these (or subclass them) and `flatshard.from_torch`
writes its spec; `build(model_spec)` goes the other way, so a checkpoint or a
summoned model loads with ``load_state_dict(strict=True)``.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Any, Dict, Mapping, Union

import torch
from torch import nn
from torch.nn import functional as F

from flatshard.v1 import common_pb2


class Residual(nn.Sequential):
    """y = x + (children in order)(x)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # noqa: D102
        return x + super().forward(x)


class MLP(nn.Sequential):
    """The children in order; a type of its own so wrap policies can name it."""


class ModuleList(nn.ModuleList):
    """nn.ModuleList that, like flatshard's, runs its children in order when
    called (a ModuleList of blocks inside a Sequential is a stack of blocks)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # noqa: D102
        for module in self:
            x = module(x)
        return x


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd: int, num_heads: int, bias: bool = True) -> None:
        super().__init__()
        if n_embd % num_heads:
            raise ValueError(f"n_embd {n_embd} is not divisible by num_heads {num_heads}")
        self.num_heads = num_heads
        self.c_attn = nn.Linear(n_embd, 3 * n_embd, bias=bias)
        self.c_proj = nn.Linear(n_embd, n_embd, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # noqa: D102
        b, t, c = x.shape
        q, k, v = self.c_attn(x).split(c, dim=-1)
        heads = lambda z: z.view(b, t, self.num_heads, c // self.num_heads).transpose(1, 2)
        y = F.scaled_dot_product_attention(heads(q), heads(k), heads(v), is_causal=True)
        return self.c_proj(y.transpose(1, 2).reshape(b, t, c))


class TransformerBlock(nn.Module):
    def __init__(self, n_embd: int, num_heads: int, mlp_ratio: int = 4,
                 gelu_approximate: str = "tanh") -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd)
        self.attn = CausalSelfAttention(n_embd, num_heads)
        self.ln_2 = nn.LayerNorm(n_embd)
        self.mlp = MLP(OrderedDict([
            ("c_fc", nn.Linear(n_embd, mlp_ratio * n_embd)),
            ("act", nn.GELU(approximate=gelu_approximate)),
            ("c_proj", nn.Linear(mlp_ratio * n_embd, n_embd)),
        ]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # noqa: D102
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """GPT-2's decoder, its LM head tied to the token embedding."""

    def __init__(self, vocab_size: int, context_length: int, n_embd: int, n_layer: int,
                 num_heads: int, tie_weights: bool = True) -> None:
        super().__init__()
        self.context_length = context_length
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.wpe = nn.Embedding(context_length, n_embd)
        self.h = nn.ModuleList(TransformerBlock(n_embd, num_heads) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(n_embd)
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        if tie_weights:
            self.lm_head.weight = self.wte.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:  # noqa: D102
        """ids [B, T] (T <= context_length) -> logits [B, T, vocab]."""
        t = ids.shape[-1]
        if t > self.wpe.num_embeddings:
            raise ValueError(f"sequence length {t} exceeds the {self.wpe.num_embeddings} "
                             "positions of wpe")
        x = self.wte(ids) + self.wpe(torch.arange(t, device=ids.device))
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))


# -- spec -> module ------------------------------------------------------------
_TORCH_DTYPES = {
    common_pb2.DTYPE_UNSPECIFIED: torch.float32, common_pb2.DTYPE_FLOAT32: torch.float32,
    common_pb2.DTYPE_FLOAT64: torch.float64, common_pb2.DTYPE_FLOAT16: torch.float16,
    common_pb2.DTYPE_BFLOAT16: torch.bfloat16, common_pb2.DTYPE_INT32: torch.int32,
    common_pb2.DTYPE_INT64: torch.int64,
}
ModelSpecLike = Union[common_pb2.ModelSpec, Mapping[str, Any]]


def build(model_spec: ModelSpecLike) -> nn.Module:
    """A torch module with the spec's module tree, FQNs, shapes, dtypes and ties.

    ``model_spec`` is the wire form (``flatshard.v1.ModelSpec``: `Job.model_spec()`,
    or the ``job_spec.model`` of a checkpoint manifest as a dict), in which every
    parameter is explicit. Values are torch's default initialisation; load a
    checkpoint or a summoned model into it.
    """
    if not isinstance(model_spec, common_pb2.ModelSpec):
        from google.protobuf import json_format
        model_spec = json_format.ParseDict(dict(model_spec), common_pb2.ModelSpec())
    module = _build(model_spec.root, "")
    for tie in model_spec.tied:
        owner_fqn, _, name = tie.alias_fqn.rpartition(".")
        owner = module.get_submodule(owner_fqn)
        setattr(owner, name, module.get_parameter(tie.primary_fqn))
    return module


def _shape(spec, name: str):
    for p in spec.params:
        if p.name == name:
            return list(p.shape), _TORCH_DTYPES[p.dtype], p.frozen
    return None


def _build(spec, fqn: str) -> nn.Module:
    where = fqn or "<root>"
    children = OrderedDict((c.name, _build(c, f"{fqn}.{c.name}" if fqn else c.name))
                           for c in spec.children)
    kind = spec.type
    attrs = dict(spec.attrs)
    if kind == "Linear":
        (out_f, in_f), dtype, _ = _shape(spec, "weight")
        module = nn.Linear(in_f, out_f, bias=_shape(spec, "bias") is not None, dtype=dtype)
    elif kind == "LayerNorm":
        weight = _shape(spec, "weight")
        dim = weight[0][0] if weight else int(attrs.get("normalized_shape", 0))
        if not weight and not dim:
            raise ValueError(f"{where}: a LayerNorm without weight needs attrs.normalized_shape")
        module = nn.LayerNorm(dim, eps=float(attrs.get("eps", 1e-5)),
                              elementwise_affine=weight is not None,
                              bias=_shape(spec, "bias") is not None,
                              dtype=weight[1] if weight else None)
    elif kind == "Embedding":
        (num, dim), dtype, _ = _shape(spec, "weight")
        module = nn.Embedding(num, dim, dtype=dtype)
    elif kind == "GELU":
        module = nn.GELU(approximate=attrs.get("approximate", "none"))
    elif kind == "Dropout":
        module = nn.Dropout(p=0.0)  # the workers pass the input through
    elif kind in ("ReLU", "Identity"):
        module = {"ReLU": nn.ReLU, "Identity": nn.Identity}[kind]()
    elif kind in ("Sequential", "Module"):
        module = nn.Sequential(children)
    elif kind in ("Residual", "MLP"):
        module = {"Residual": Residual, "MLP": MLP}[kind](children)
    elif kind == "ModuleList":
        module = ModuleList(children.values())
    elif kind == "ModuleDict":
        module = nn.ModuleDict(children)
    elif kind == "CausalSelfAttention":
        module = CausalSelfAttention.__new__(CausalSelfAttention)
        nn.Module.__init__(module)
        module.num_heads = int(attrs["num_heads"])
        for name, child in children.items():
            module.add_module(name, child)
    elif kind in ("TransformerBlock", "GPT"):
        cls = TransformerBlock if kind == "TransformerBlock" else GPT
        module = cls.__new__(cls)
        nn.Module.__init__(module)
        if kind == "GPT":
            module.context_length = int(attrs.get("context_length", 0))
        for name, child in children.items():
            module.add_module(name, child)
    else:
        raise ValueError(f"{where}: module type '{kind}' has no torch counterpart here")
    if kind in ("Linear", "LayerNorm", "Embedding"):
        for p in spec.params:
            getattr(module, p.name).requires_grad_(not p.frozen)
    elif spec.params:
        raise ValueError(f"{where}: a {kind} with parameters of its own has no torch counterpart")
    return module


def state_dict_for(module: nn.Module, tensors: Dict[str, Any]) -> Dict[str, torch.Tensor]:
    """``tensors`` (numpy or torch, by FQN) as a state dict in the module's dtypes."""
    out = {}
    for name, current in module.state_dict().items():
        value = tensors[name] if name in tensors else None
        if value is None:
            continue  # load_state_dict(strict=True) names what is missing
        value = value if isinstance(value, torch.Tensor) else torch.from_numpy(value)
        out[name] = value.to(current.dtype)
    for name in tensors:
        out.setdefault(name, torch.as_tensor(tensors[name]))  # and what is unexpected
    return out


__all__ = ["Residual", "MLP", "ModuleList", "CausalSelfAttention", "TransformerBlock", "GPT", "build",
           "state_dict_for"]
