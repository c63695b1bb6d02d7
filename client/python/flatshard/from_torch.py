"""Writes the model spec of a torch.nn.Module (docs/model-spec.md).

    python -m flatshard.from_torch mypkg.models:make_model -o model.yaml

MODULE:FACTORY names a callable returning the module (or a module instance).
The tree is walked in registration order (``named_children``), which is the
order FSDP flattens parameters in; each module becomes its flatshard type with
torch's own sizes, tied parameters are found by identity (the first FQN is the
primary, as ``named_parameters()`` reports it), and anything flatshard cannot
run is an error naming its FQN and type.
"""
from __future__ import annotations

import argparse
import importlib
import inspect
import os
import sys
from typing import Any, Dict, List, Optional

import torch
import yaml
from torch import nn

from flatshard import torch_modules

_DTYPE_NAMES = {torch.float32: "float32", torch.float64: "float64", torch.float16: "float16",
                torch.bfloat16: "bfloat16"}
# The composites: a subclass maps onto the flatshard type it derives from, so a
# user's `class Block(flatshard.torch_modules.TransformerBlock)` is a TransformerBlock.
_COMPOSITES = [(torch_modules.Residual, "Residual"), (torch_modules.MLP, "MLP"),
               (torch_modules.CausalSelfAttention, "CausalSelfAttention"),
               (torch_modules.TransformerBlock, "TransformerBlock"), (torch_modules.GPT, "GPT")]
_CONTAINERS = [(nn.Sequential, "Sequential"), (nn.ModuleList, "ModuleList"),
               (torch_modules.ModuleList, "ModuleList"), (nn.ModuleDict, "ModuleDict")]
SUPPORTED = ("Linear, LayerNorm, Embedding, MultiheadAttention, GELU, ReLU, Dropout, Identity, "
             "Sequential, ModuleList, ModuleDict and flatshard.torch_modules' ModuleList, "
             "Residual, MLP, CausalSelfAttention, TransformerBlock, GPT (or subclasses of them "
             "that change only their construction)")


class UnsupportedModule(ValueError):
    """A module flatshard cannot run; the message names its FQN and type."""


def model_spec(module: nn.Module, name: str = "") -> Dict[str, Any]:
    """The model spec of ``module`` as a dict (write it with yaml.safe_dump)."""
    dtypes = {p.dtype for p in module.parameters()}
    default = _dtype_name(next(iter(dtypes)), "<root>") if len(dtypes) == 1 else "float32"
    spec: Dict[str, Any] = {}
    if name:
        spec["name"] = name
    spec["dtype"] = default
    root = _module(module, "", default)
    root.pop("name", None)
    spec["root"] = root
    tied = _ties(module)
    if tied:
        spec["tied"] = tied
    return spec


def _qualname(module: nn.Module) -> str:
    cls = type(module)
    return f"{cls.__module__}.{cls.__qualname__}"


def _dtype_name(dtype: torch.dtype, fqn: str) -> str:
    if dtype not in _DTYPE_NAMES:
        raise UnsupportedModule(f"{fqn}: parameters of dtype {dtype} are not supported "
                                f"(supported: {', '.join(_DTYPE_NAMES.values())})")
    return _DTYPE_NAMES[dtype]


def _overridden(subclass: type, cls: type) -> List[str]:
    """The methods `cls` runs with (its own and those it inherits below
    nn.Module, forward among them, and __call__; not construction) that
    `subclass` replaces."""
    names = {"__call__"}
    for base in cls.__mro__:
        if base is nn.Module:
            break
        names.update(name for name, method in vars(base).items()
                     if not name.startswith("__") and (
                         callable(method) or isinstance(method, (staticmethod, classmethod))))
    return sorted(name for name in names
                  if inspect.getattr_static(subclass, name, None)
                  is not inspect.getattr_static(cls, name, None))


def _type_of(module: nn.Module, fqn: str) -> str:
    for cls, kind in _COMPOSITES:
        if isinstance(module, cls):
            # The workers run `cls`'s computation: a subclass may add to its
            # construction, not change what forward (or a method it calls) does.
            changed = _overridden(type(module), cls)
            if changed:
                raise UnsupportedModule(
                    f"{fqn or '<root>'}: {_qualname(module)} overrides {', '.join(changed)} of "
                    f"flatshard.torch_modules.{cls.__name__}; the cluster runs {kind}'s own, "
                    f"so it would train another model than this one")
            return kind
    exact = {nn.Linear: "Linear", nn.LayerNorm: "LayerNorm", nn.Embedding: "Embedding",
             nn.GELU: "GELU", nn.ReLU: "ReLU", nn.Dropout: "Dropout", nn.Identity: "Identity",
             nn.MultiheadAttention: "MultiheadAttention"}
    if type(module) in exact:
        return exact[type(module)]
    for cls, kind in _CONTAINERS:
        # A subclass of a container may override forward: only the exact types are known.
        if type(module) is cls:
            return kind
    raise UnsupportedModule(
        f"{fqn or '<root>'}: {_qualname(module)} is not a module type flatshard can run; "
        f"supported: {SUPPORTED}")


def _module(module: nn.Module, fqn: str, default_dtype: str) -> Dict[str, Any]:
    where = fqn or "<root>"
    kind = _type_of(module, fqn)
    out: Dict[str, Any] = {"name": fqn.rpartition(".")[2], "type": kind}
    own = list(module.named_parameters(recurse=False))
    buffers = [n for n, _ in module.named_buffers(recurse=False)]
    if buffers:
        raise UnsupportedModule(f"{where}: {_qualname(module)} has buffers ({', '.join(buffers)}); "
                                "flatshard shards parameters only")
    dtypes = {p.dtype for _, p in own}
    if len(dtypes) > 1:
        raise UnsupportedModule(f"{where}: parameters of mixed dtypes {sorted(map(str, dtypes))}")
    if dtypes:
        name = _dtype_name(next(iter(dtypes)), where)
        if name != default_dtype:
            out["dtype"] = name
    frozen = {not p.requires_grad for _, p in own}
    if len(frozen) > 1:
        raise UnsupportedModule(f"{where}: some parameters are frozen and some are not; "
                                "flatshard freezes whole modules")
    if frozen == {True}:
        out["frozen"] = True

    if kind == "Linear":
        out.update(in_features=module.in_features, out_features=module.out_features,
                   bias=module.bias is not None)
    elif kind == "Dropout":
        if module.p != 0:
            raise UnsupportedModule(f"{where}: Dropout(p={module.p}); flatshard's workers pass "
                                    "the input through (no dropout), so the cluster would train "
                                    "another model: set p=0 or use nn.Identity")
    elif kind == "LayerNorm":
        if len(module.normalized_shape) != 1:
            raise UnsupportedModule(f"{where}: LayerNorm over {list(module.normalized_shape)}; "
                                    "flatshard normalises the last dimension only")
        out.update(normalized_shape=module.normalized_shape[0],
                   elementwise_affine=module.elementwise_affine,
                   bias=getattr(module, "bias", None) is not None)
        if module.eps != 1e-5:
            out["attrs"] = {"eps": repr(module.eps)}
    elif kind == "Embedding":
        for attr in ("padding_idx", "max_norm"):
            if getattr(module, attr) is not None:
                raise UnsupportedModule(f"{where}: Embedding with {attr}={getattr(module, attr)} "
                                        "is not supported")
        out.update(num_embeddings=module.num_embeddings, embedding_dim=module.embedding_dim)
    elif kind == "GELU":
        if module.approximate != "none":
            out["attrs"] = {"approximate": module.approximate}
    elif kind == "MultiheadAttention":
        if not module._qkv_same_embed_dim or module.bias_k is not None:
            raise UnsupportedModule(f"{where}: MultiheadAttention with kdim/vdim or add_bias_kv "
                                    "is not supported")
        out.update(embed_dim=module.embed_dim, bias=module.in_proj_bias is not None)
        return out  # out_proj is part of the shorthand
    elif kind == "CausalSelfAttention":
        out["attrs"] = {"num_heads": str(module.num_heads)}
    elif kind == "GPT":
        out["attrs"] = {"context_length": str(module.wpe.num_embeddings)}
    if kind in ("Linear", "LayerNorm", "Embedding", "GELU", "ReLU", "Dropout", "Identity"):
        return out
    if own:
        raise UnsupportedModule(f"{where}: a {kind} ({_qualname(module)}) with parameters of its "
                                f"own ({', '.join(n for n, _ in own)}); put them in a Linear, "
                                "LayerNorm or Embedding child")
    children: List[Dict[str, Any]] = []
    for child_name, child in module.named_children():
        children.append(_module(child, f"{fqn}.{child_name}" if fqn else child_name,
                                out.get("dtype", default_dtype)))
    if children:
        out["children"] = children
    return out


def _ties(module: nn.Module) -> List[Dict[str, str]]:
    first: Dict[int, str] = {}
    tied = []
    for fqn, param in module.named_parameters(remove_duplicate=False):
        if id(param) in first:
            tied.append({"alias": fqn, "primary": first[id(param)]})
        else:
            first[id(param)] = fqn
    return tied


def load_factory(target: str) -> nn.Module:
    """MODULE:FACTORY -> the module it makes (the current directory is importable)."""
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"'{target}': expected MODULE:FACTORY, e.g. mypkg.models:make_model")
    sys.path.insert(0, os.getcwd())
    obj = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    made = obj if isinstance(obj, nn.Module) else obj()
    if not isinstance(made, nn.Module):
        raise ValueError(f"'{target}' returned a {type(made).__name__}, not a torch.nn.Module")
    return made


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m flatshard.from_torch",
        description="Write the flatshard model spec (docs/model-spec.md) of a torch.nn.Module.")
    parser.add_argument("factory", metavar="MODULE:FACTORY",
                        help="a callable returning the module (or a module instance)")
    parser.add_argument("-o", "--output", required=True, help="the model spec to write (YAML)")
    parser.add_argument("--name", default="", help="the spec's name (default: the class name)")
    args = parser.parse_args(argv)
    try:
        module = load_factory(args.factory)
        spec = model_spec(module, args.name or type(module).__name__.lower())
    except (UnsupportedModule, ValueError, ImportError, AttributeError) as error:
        print(f"from_torch: {error}", file=sys.stderr)
        return 2
    with open(args.output, "w", encoding="utf-8") as f:
        f.write(f"# Written by python -m flatshard.from_torch {args.factory}\n")
        yaml.safe_dump(spec, f, sort_keys=False, default_flow_style=None, width=100)
    params = sum(p.numel() for p in module.parameters())
    print(f"wrote {args.output}: {params:,} parameters, "
          f"{len(list(module.parameters()))} tensors, {len(spec.get('tied', []))} tied")
    return 0


if __name__ == "__main__":
    sys.exit(main())
