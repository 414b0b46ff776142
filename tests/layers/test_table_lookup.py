"""The fused embedding lookup: F.embedding + cat, with the table's gradient where asked."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from ctrcal.layers import table_lookup as table_lookup_module
from ctrcal.layers.kernels import cpu_kernels
from ctrcal.layers.table_lookup import table_lookup

SIZES = [7, 3, 50_000]  # the last field spans several threads' row ranges
D = 5


def _setup(batch: int = 64, seed: int = 0):
    torch.manual_seed(seed)
    table = nn.Embedding(sum(SIZES), D)
    offsets = torch.tensor([0, *SIZES[:-1]]).cumsum(0)
    g = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.randint(0, s, (batch,), generator=g) for s in SIZES], 1)
    ids[:8, 0] = 2  # repeated rows: contributions add up
    lead = torch.randn(batch, 2, D, generator=g, requires_grad=True)
    return table, offsets, ids, lead


def _reference(table, offsets, ids, lead):
    return torch.cat([lead, F.embedding(ids + offsets, table.weight)], dim=1)


@pytest.fixture
def kernels():
    if cpu_kernels.cpu_kernels() is None:
        pytest.skip(f"no C kernel here: {cpu_kernels.kernel_error()}")


@pytest.mark.parametrize("mode", ["dense", "sparse", "in_place"])
@pytest.mark.parametrize("with_lead", [True, False])
def test_outputs_and_gradients_equal_embedding_then_cat(kernels, mode, with_lead):
    table, offsets, ids, lead = _setup()
    ref_table = nn.Embedding.from_pretrained(table.weight.detach().clone(), freeze=False)
    lead_ref = lead.detach().clone().requires_grad_(True) if with_lead else None
    table.sparse = mode == "sparse"
    use_lead = lead if with_lead else None
    out = table_lookup(table, ids, offsets, use_lead, grad_in_place=mode == "in_place")
    if with_lead:
        ref = _reference(ref_table, offsets, ids, lead_ref)
    else:
        ref = F.embedding(ids + offsets, ref_table.weight)
    torch.testing.assert_close(out, ref, rtol=0, atol=0)
    # an upstream gradient with a wider row stride (a view): read in place by the kernel
    g = torch.randn(ref.shape[0], ref.shape[1] + 1, D)[:, 1:]
    assert not g.is_contiguous()
    out.backward(g)
    ref.backward(g)
    got = table.weight.grad
    assert got.is_sparse is (mode == "sparse")
    torch.testing.assert_close(got.to_dense(), ref_table.weight.grad, rtol=1e-6, atol=1e-6)
    if with_lead:
        torch.testing.assert_close(lead.grad, lead_ref.grad)


def test_in_place_adds_to_the_existing_grad_buffer(kernels):
    table, offsets, ids, lead = _setup()
    buffer = torch.full_like(table.weight, 0.5)
    table.weight.grad = buffer
    out = table_lookup(table, ids, offsets, lead, grad_in_place=True)
    g = torch.randn_like(out)
    out.backward(g)
    assert table.weight.grad is buffer  # no table-sized tensor allocated
    expected = torch.zeros_like(buffer).index_add_(
        0, (ids + offsets).flatten(), g[:, 2:].reshape(-1, D)
    )
    torch.testing.assert_close(buffer - 0.5, expected, rtol=1e-5, atol=1e-6)


def test_out_of_range_id_is_an_index_error_naming_it(kernels):
    table, offsets, ids, lead = _setup()
    ids[5, 1] = 3  # field 1 has 3 ids, but the row (7 + 3) still lies inside the table
    table_lookup(table, ids, offsets, lead)
    ids[9, 2] = SIZES[2]  # past the table's last row
    with pytest.raises(IndexError, match=r"id 50000 of field 2 \(batch row 9\)"):
        table_lookup(table, ids, offsets, lead)
    ids[9, 2] = -1 - sum(SIZES[:2])
    with pytest.raises(IndexError, match="outside the table"):
        table_lookup(table, ids, offsets, lead)


def test_without_the_kernel_the_torch_path_gives_the_same(monkeypatch):
    table, offsets, ids, lead = _setup()
    out_kernel = table_lookup(table, ids, offsets, lead)
    monkeypatch.setattr(table_lookup_module, "cpu_kernels", lambda: None)
    out_torch = table_lookup(table, ids, offsets, lead, grad_in_place=True)
    torch.testing.assert_close(out_kernel, out_torch, rtol=0, atol=0)
    out_torch.sum().backward()  # in place asked, torch path: autograd accumulates the same
    expected = torch.zeros_like(table.weight).index_add_(
        0, (ids + offsets).flatten(), torch.ones(ids.numel(), D)
    )
    torch.testing.assert_close(table.weight.grad, expected)


def test_gradient_does_not_depend_on_the_thread_count(kernels):
    grads = []
    old = torch.get_num_threads()
    try:
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            table, offsets, ids, lead = _setup(batch=2000)
            out = table_lookup(table, ids, offsets, lead, grad_in_place=True)
            out.backward(torch.linspace(-1, 1, out.numel()).view_as(out))
            grads.append(table.weight.grad.clone())
    finally:
        torch.set_num_threads(old)
    assert torch.equal(grads[0], grads[1]) and torch.equal(grads[0], grads[2])
