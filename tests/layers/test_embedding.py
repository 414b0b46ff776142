"""FeatureEmbedding (fused table, numeric modes, NaN) and FieldNorm."""

from __future__ import annotations

import pytest
import torch
from batches import random_batch
from torch import nn

import ctrcal.layers.embedding as embedding_module
from ctrcal.layers.embedding import FeatureEmbedding, FieldNorm
from ctrcal.layers.mc_layernorm.module import MCLayerNorm

VOCAB = [5, 3, 7]
FN = 4
D = 8


def _inputs(b: int = 6, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    return random_batch(VOCAB, FN, b, seed)


@pytest.mark.parametrize("mode", ["linear", "scaled", "bucket"])
def test_shapes_and_field_order(mode):
    bounds = [[-1.0, 0.0, 1.0]] * FN
    emb = FeatureEmbedding(VOCAB, FN, D, numeric_embedding=mode, bucket_boundaries=bounds)
    cat, num = _inputs()
    out = emb(cat, num)
    assert out.shape == (6, FN + len(VOCAB), D)
    assert emb.num_fields == FN + len(VOCAB) and emb.output_dim == (FN + len(VOCAB)) * D
    # categorical fields come after the numeric ones, looked up in the one fused table
    rows = emb.offsets[-len(VOCAB) :] + cat
    assert torch.equal(out[:, FN:], emb.table.weight[rows])


def test_one_fused_table_with_offsets():
    emb = FeatureEmbedding(VOCAB, FN, D)
    tables = [m for m in emb.modules() if isinstance(m, nn.Embedding)]
    assert len(tables) == 1 and tables[0].num_embeddings == sum(VOCAB)
    assert emb.offsets.tolist() == [0, 5, 8]
    # the same local id in two fields reads two different rows
    cat = torch.zeros(1, 3, dtype=torch.long)
    out = emb(cat, torch.zeros(1, FN))
    assert not torch.equal(out[0, FN], out[0, FN + 1])
    assert emb.embedding_tables() == [emb.table.weight]


def test_one_gather_per_batch(monkeypatch):
    emb = FeatureEmbedding(VOCAB, FN, D, numeric_embedding="bucket", bucket_boundaries=[[0.0]] * FN)
    cat, num = _inputs()
    calls = []
    from ctrcal.layers import embedding as embedding_module

    original = embedding_module.table_lookup

    def counting(table, ids, *args, **kwargs):
        calls.append(ids.shape)
        return original(table, ids, *args, **kwargs)

    monkeypatch.setattr(embedding_module, "table_lookup", counting)
    emb(cat, num)
    # numeric buckets and categorical ids in one lookup
    assert calls == [torch.Size([cat.shape[0], FN + len(VOCAB)])]


@pytest.mark.parametrize("mode", ["linear", "scaled", "bucket"])
def test_nan_is_embedded_as_missing_vector_without_propagating(mode):
    emb = FeatureEmbedding(
        VOCAB, FN, D, numeric_embedding=mode, bucket_boundaries=[[0.0, 1.0]] * FN
    )
    cat, num = _inputs()
    num[0, 1] = float("nan")
    num[3, :] = float("nan")
    out = emb(cat, num)
    assert torch.isfinite(out).all()
    out.square().sum().backward()
    for p in emb.parameters():
        assert p.grad is None or torch.isfinite(p.grad).all()
    # every missing value of a field maps to the same learned vector
    assert torch.equal(out[0, 1], out[3, 1])
    if mode != "bucket":
        torch.testing.assert_close(out[0, 1], emb.numeric_missing[1])
        assert emb.numeric_missing.grad[1].abs().sum() > 0
        assert emb.numeric_missing.grad[0].abs().sum() > 0  # row 3 is missing everywhere


def test_linear_is_x_times_v_plus_b_and_scaled_is_x_times_v():
    lin = FeatureEmbedding(VOCAB, FN, D, numeric_embedding="linear")
    sc = FeatureEmbedding(VOCAB, FN, D, numeric_embedding="scaled")
    cat, num = _inputs()
    x = num.unsqueeze(-1)
    torch.testing.assert_close(lin(cat, num)[:, :FN], x * lin.numeric_weight + lin.numeric_bias)
    torch.testing.assert_close(sc(cat, num)[:, :FN], x * sc.numeric_weight)
    assert sc.numeric_bias is None


def _normed_numeric(mode: str, values: list[float]) -> torch.Tensor:
    torch.manual_seed(0)
    # a trained-scale init: with the default 1e-4 the norm's eps dominates and hides the pitfall
    emb = FeatureEmbedding([3], 1, 16, numeric_embedding=mode, init_std=1.0)
    norm = FieldNorm(2, 16, "layernorm")
    num = torch.tensor(values).unsqueeze(1)
    cat = torch.zeros(len(values), 1, dtype=torch.long)
    return norm(emb(cat, num))[:, 0]


def test_linear_keeps_the_value_after_a_per_field_layernorm():
    out = _normed_numeric("linear", [0.5, 2.0, 0.51])
    assert (out[0] - out[1]).abs().max() > 0.1
    # and it is continuous: a small shift moves the output a little, not nothing
    assert 0 < (out[0] - out[2]).abs().max() < 0.1


def test_scaled_keeps_only_the_sign_after_a_per_field_layernorm():
    out = _normed_numeric("scaled", [0.5, 2.0, -0.5])
    torch.testing.assert_close(out[0], out[1], atol=1e-4, rtol=0)
    assert (out[0] + out[2]).abs().max() < 1e-4  # the sign flips it


def test_bucketize_uses_stored_boundaries_and_missing_bucket():
    bounds = [[0.0, 1.0], [5.0]]
    emb = FeatureEmbedding([2], 2, 4, numeric_embedding="bucket", bucket_boundaries=bounds)
    num = torch.tensor(
        [[-3.0, 4.0], [0.0, 5.0], [0.5, 6.0], [1.0, float("nan")], [2.0, 7.0], [float("nan"), -1.0]]
    )
    ids = emb._bucketize(num)
    # bucket i holds boundaries[i-1] < x <= boundaries[i]; missing -> len(boundaries) + 1
    assert ids.tolist() == [[0, 0], [0, 0], [1, 1], [1, 2], [2, 1], [3, 0]]
    assert emb.table.num_embeddings == (2 + 2) + (1 + 2) + 2
    out = emb(torch.zeros(6, 1, dtype=torch.long), num)
    assert torch.equal(out[0, 0], out[1, 0]) and not torch.equal(out[0, 0], out[2, 0])
    assert torch.equal(out[3, 1], emb.table.weight[4 + 2])  # field 1's missing bucket


def test_bucket_needs_boundaries():
    with pytest.raises(ValueError, match="bucket boundaries"):
        FeatureEmbedding(VOCAB, FN, D, numeric_embedding="bucket")
    with pytest.raises(ValueError, match="strictly increasing"):
        FeatureEmbedding([2], 1, 4, numeric_embedding="bucket", bucket_boundaries=[[1.0, 0.0]])


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"vocab_sizes": [0, 3]}, "vocab size"),
        ({"numeric_embedding": "cubic"}, "unknown numeric_embedding"),
        ({"embedding_dim": 0}, "embedding_dim"),
        ({"vocab_sizes": [], "num_numeric": 0}, "at least one field"),
    ],
)
def test_bad_arguments(kwargs, match):
    args = {"vocab_sizes": VOCAB, "num_numeric": FN, "embedding_dim": D, **kwargs}
    with pytest.raises(ValueError, match=match):
        FeatureEmbedding(**args)


def test_only_numeric_or_only_categorical():
    only_num = FeatureEmbedding([], 3, 4)
    assert only_num(torch.zeros(2, 0, dtype=torch.long), torch.randn(2, 3)).shape == (2, 3, 4)
    only_cat = FeatureEmbedding([4, 4], 0, 4)
    assert only_cat(torch.zeros(2, 2, dtype=torch.long), torch.zeros(2, 0)).shape == (2, 2, 4)


def test_small_normal_init():
    emb = FeatureEmbedding([50_000], 2, 16)
    assert 0.5e-4 < emb.table.weight.std().item() < 2e-4


def test_fieldnorm_fused_layernorm_equals_per_field_layers():
    torch.manual_seed(0)
    norm = FieldNorm(5, 8, "layernorm")
    for n in norm.norms:  # distinct per-field affine parameters
        nn.init.normal_(n.weight)
        nn.init.normal_(n.bias)
    x = torch.randn(7, 5, 8)
    expected = torch.stack([n(x[:, i]) for i, n in enumerate(norm.norms)], dim=1)
    torch.testing.assert_close(norm(x), expected)


@pytest.mark.parametrize("backend", ["c", "triton", "torch"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_fieldnorm_fused_layernorm_gradients_equal_per_field_layers(monkeypatch, backend, dtype):
    """The fused per-field LayerNorm (the C or Triton kernel with the full set, or layer_norm
    and the stacked affine) matches F separate nn.LayerNorm layers in output and every
    gradient, also for rows far from zero, and draws nothing from torch's RNG."""
    from ctrcal.layers.kernels import mcln_kernel, mcln_triton

    if backend == "c" and not mcln_kernel.kernel_available():
        pytest.skip("the C kernel does not build here")
    if backend == "triton":
        if not (mcln_triton.HAVE_TRITON and mcln_triton.interpreting()):
            pytest.skip("triton is not installed, or TRITON_INTERPRET is off")
        if dtype == torch.float64:
            pytest.skip("the Triton kernel accumulates in float32")
    monkeypatch.setenv("CTRCAL_MCLN_BACKEND", backend)
    torch.manual_seed(0)
    fields, dim = 6, 16
    norm = FieldNorm(fields, dim, "layernorm").to(dtype)
    for n in norm.norms:
        nn.init.normal_(n.weight)
        nn.init.normal_(n.bias)
    reference = [nn.LayerNorm(dim).to(dtype) for _ in range(fields)]
    for ref, n in zip(reference, norm.norms, strict=True):
        ref.load_state_dict(n.state_dict())
    x = (torch.randn(33, fields, dim, dtype=dtype) * 3 + 1e3).requires_grad_()
    x_ref = x.detach().clone().requires_grad_()
    dy = torch.randn(33, fields, dim, dtype=dtype)
    rng = torch.get_rng_state()
    y = norm(x)
    assert torch.equal(torch.get_rng_state(), rng)
    y_ref = torch.stack([ref(x_ref[:, i]) for i, ref in enumerate(reference)], dim=1)
    (y * dy).sum().backward()
    (y_ref * dy).sum().backward()
    tol = {"atol": 2e-4, "rtol": 1e-4} if dtype == torch.float32 else {}
    torch.testing.assert_close(y, y_ref, **tol)
    torch.testing.assert_close(x.grad, x_ref.grad, **tol)
    for ref, n in zip(reference, norm.norms, strict=True):
        torch.testing.assert_close(n.weight.grad, ref.weight.grad, **tol)
        torch.testing.assert_close(n.bias.grad, ref.bias.grad, **tol)


def test_fused_layernorm_runs_the_kernel_on_cpu(monkeypatch):
    """On CPU the per-field LayerNorm is one kernel call, not layer_norm plus the affine."""
    from ctrcal.layers.kernels import mcln_kernel

    if not mcln_kernel.kernel_available():
        pytest.skip("the C kernel does not build here")
    monkeypatch.delenv("CTRCAL_MCLN_BACKEND", raising=False)
    calls = []
    real = mcln_kernel.kernel_mc_layer_norm
    monkeypatch.setattr(
        mcln_kernel, "kernel_mc_layer_norm", lambda *a: calls.append(a[3]) or real(*a)
    )
    monkeypatch.setattr(torch.nn.functional, "layer_norm", None)  # any use of it fails
    FieldNorm(4, 8, "layernorm")(torch.randn(5, 4, 8))
    assert calls == [8]  # k = D: the full set


def test_fieldnorm_takes_any_registry_norm():
    norm = FieldNorm(3, 8, "mclayernorm")
    assert all(isinstance(n, MCLayerNorm) for n in norm.norms)
    x = torch.randn(4, 3, 8)
    norm.eval()  # one-shot: a plain LayerNorm over all features
    torch.testing.assert_close(norm(x), torch.nn.functional.layer_norm(x, (8,)))
    norm.train()
    assert norm(x).shape == x.shape
    assert isinstance(FieldNorm(3, 8, "none").norms[0], nn.Identity)


def test_numeric_embedding_stays_float32_under_autocast():
    emb = FeatureEmbedding(VOCAB, FN, D)
    cat, num = _inputs()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = emb(cat, num + 1e-3)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, emb(cat, num + 1e-3))


@pytest.mark.parametrize("mode", ["linear", "scaled"])
@pytest.mark.parametrize("threads", [1, 3])
def test_numeric_kernel_equals_the_torch_path(mode, threads, monkeypatch):
    # the C pass against the block-diagonal product it replaces: values, missing values,
    # gradients of every numeric parameter, rows split into chunks for 1 or 3 threads
    torch.manual_seed(0)
    emb = FeatureEmbedding(VOCAB, FN, D, numeric_embedding=mode, init_std=0.5)
    cat, num = random_batch(VOCAB, FN, 700, seed=3)
    num[::7, 1] = float("nan")
    num[5, :] = float("nan")
    weights = torch.randn(700, FN + len(VOCAB), D)

    def run():
        emb.zero_grad(set_to_none=True)
        out = emb(cat, num)
        (out * weights).sum().backward()
        return out.detach(), {n: p.grad.clone() for n, p in emb.named_parameters()}

    monkeypatch.setattr(torch, "get_num_threads", lambda: threads)
    calls = []
    apply = embedding_module._NumericEmbedFn.apply
    monkeypatch.setattr(
        embedding_module._NumericEmbedFn, "apply", lambda *a: calls.append(1) or apply(*a)
    )
    out, grads = run()
    assert calls == [1]
    monkeypatch.setattr(embedding_module, "cpu_kernels", lambda: None)
    ref, ref_grads = run()
    assert calls == [1]  # the torch path ran
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)
    assert grads.keys() == ref_grads.keys()
    for name in ref_grads:
        torch.testing.assert_close(grads[name], ref_grads[name], rtol=1e-5, atol=1e-5, msg=name)
    assert grads["numeric_missing"][1].abs().sum() > 0


def test_numeric_values_that_need_a_gradient_get_one():
    emb = FeatureEmbedding(VOCAB, FN, D, init_std=0.5)
    cat, num = _inputs()
    num.requires_grad_(True)
    emb(cat, num).sum().backward()
    assert num.grad is not None and num.grad.abs().sum() > 0


@pytest.mark.parametrize("width", [1, 2, 3, 7, 8, 9, 31])
def test_count_below_is_searchsorted_ties_and_padding_included(width):
    from ctrcal.layers.embedding import count_below

    gen = torch.Generator().manual_seed(width)
    bounds = torch.sort(torch.randn(4, width, generator=gen), dim=1).values
    bounds[3, width // 2 :] = float("inf")  # a field with fewer boundaries, padded
    values = torch.randn(200, 4, generator=gen)
    # every boundary itself (a tie), the ends, and infinities
    finite = bounds.nan_to_num(posinf=7.0)
    values[: width * 4].view(-1)[: finite.numel()] = finite.t().reshape(-1)[: width * 4 * 4]
    values[-2], values[-1] = float("inf"), -float("inf")
    want = torch.searchsorted(bounds, values.t().contiguous(), right=False).t()
    assert torch.equal(count_below(bounds, values), want)
    values[5, 1] = float("nan")
    assert count_below(bounds, values)[5, 1] == 0
