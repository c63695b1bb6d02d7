"""Model factories for torch_test.py, named as `python -m flatshard.from_torch models:NAME`."""
from collections import OrderedDict

from torch import nn

from flatshard import torch_modules


def small_gpt() -> nn.Module:
    """A GPT small enough to train in a test, its head tied to wte."""
    return torch_modules.GPT(vocab_size=64, context_length=16, n_embd=32, n_layer=2, num_heads=2)


class MyBlock(torch_modules.TransformerBlock):
    """A user's subclass of a composite: it is a TransformerBlock."""


def gpt_with_user_blocks() -> nn.Module:
    model = small_gpt()
    model.h[1] = MyBlock(32, 2)
    return model


class CustomBlock(nn.Module):
    """A forward flatshard cannot know."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        return self.fc(x).sin()


def with_custom_block() -> nn.Module:
    return nn.Sequential(OrderedDict([
        ("input", nn.Linear(4, 8)),
        ("blocks", nn.ModuleList([nn.Linear(8, 8), CustomBlock()])),
    ]))
