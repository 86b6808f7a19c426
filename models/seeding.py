"""Parameter initialisation from a private random generator.

``torch.manual_seed(s); model = Net()`` draws the initial weights from the process-wide
generator, so two models built at the same time in two threads (the Prefect thread pool trains
several models × seeds at once) interleave their draws and the weights depend on thread timing.
:func:`reset_parameters_` redraws every parameter from a ``torch.Generator`` the caller owns,
with the distributions of torch's own ``reset_parameters`` for each layer kind, so the initial
weights are a function of the seed alone.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from models.multihead import AttentionConfigError


def _uniform_(t: torch.Tensor, bound: float, g: torch.Generator) -> None:
    nn.init.uniform_(t, -bound, bound, generator=g)


@torch.no_grad()
def reset_parameters_(model: nn.Module, generator: torch.Generator) -> nn.Module:
    """Re-initialise every parameter of ``model`` in place from ``generator`` (modules in
    ``model.modules()`` order, parameters in registration order), as torch does by default:

    * ``Linear``: weight Kaiming-uniform with ``a = sqrt(5)``, bias U(±1/sqrt(fan_in));
    * ``Embedding``: N(0, 1) (padding row zero); ``LayerNorm``: ones / zeros;
    * ``LSTM``, ``GRU``: every weight and bias U(±1/sqrt(hidden_size)).

    Raises :class:`AttentionConfigError` for a module holding its own parameters of any other
    kind (it would otherwise keep weights from the process-wide generator). Returns ``model``.
    """
    for mod in model.modules():
        own = list(mod.parameters(recurse=False))
        if not own:
            continue
        if isinstance(mod, nn.Linear):
            nn.init.kaiming_uniform_(mod.weight, a=math.sqrt(5), generator=generator)
            if mod.bias is not None:
                _uniform_(mod.bias, 1.0 / math.sqrt(mod.in_features) if mod.in_features > 0 else 0.0, generator)
        elif isinstance(mod, nn.Embedding):
            nn.init.normal_(mod.weight, generator=generator)
            if mod.padding_idx is not None:
                mod.weight[mod.padding_idx].fill_(0)
        elif isinstance(mod, nn.LayerNorm):
            for p in own:
                p.fill_(1.0 if p is mod.weight else 0.0)
        elif isinstance(mod, (nn.LSTM, nn.GRU)):
            for p in own:
                _uniform_(p, 1.0 / math.sqrt(mod.hidden_size), generator)
        else:
            raise AttentionConfigError(f"no seeded initialisation for {type(mod).__name__} parameters")
    return model
