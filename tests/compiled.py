"""One compiled-versus-eager run for the torch.compile tests.

Imported by tests as ``from compiled import compiled_and_eager`` (``tests/`` is on
``sys.path`` through its ``conftest.py``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn


def compiled_and_eager(
    module: nn.Module,
    x: torch.Tensor,
    loss: Callable[[torch.Tensor], torch.Tensor],
    backend: str = "aot_eager",
    seed: int = 7,
) -> tuple[int, list[str], list[tuple[torch.Tensor, tuple[torch.Tensor, ...]]]]:
    """Run ``module`` compiled (fullgraph) and then eager on ``x`` from the same RNG state.

    Returns:
        The number of compiled frames, the targets of every node of the compiled graphs, and
        per run (compiled first) the output and the gradients of ``loss(output)`` with respect
        to ``x`` and every parameter of ``module``.
    """
    from torch._dynamo.testing import CompileCounterWithBackend

    counter = CompileCounterWithBackend(backend)
    compiled = torch.compile(module, backend=counter, fullgraph=True)
    results = []
    for run in (compiled, module):
        torch.manual_seed(seed)
        xi = x.clone().requires_grad_()
        y = run(xi)
        results.append((y, torch.autograd.grad(loss(y), [xi, *module.parameters()])))
    ops = [str(n.target) for g in counter.graphs for n in g.graph.nodes]
    return counter.frame_count, ops, results
