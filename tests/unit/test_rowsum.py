"""ccoll.codecs.rowsum.add_rows_: the row-order sum decode_sum is specified by, on both of its branches
(one add_ per row for few rows, index_add_ for many)."""
import pytest
import torch

from ccoll.codecs.rowsum import ADD_ROWS_MAX, add_rows_


@pytest.mark.parametrize("p", [1, 2, ADD_ROWS_MAX, ADD_ROWS_MAX + 1, 70])
def test_given_rows_whose_sum_depends_on_order_expect_row_order_bits(p):
    """Rows of large and small magnitudes with alternating signs: fp32 sums in any other order round
    differently, so only the row-order loop's bits match. -0.0 rows stay +0.0 in a sum from +0.0."""
    g = torch.Generator().manual_seed(p)
    numel = 1000
    scale = torch.tensor([1e8 if i % 3 == 0 else 1.0 for i in range(p)])[:, None]
    rows = torch.randn(p, numel, generator=g) * scale * torch.where(torch.arange(p) % 2 == 0, 1.0, -1.0)[:, None]
    rows[:, :10] = -0.0
    expected = torch.zeros(numel)
    for r in range(p):
        expected = expected + rows[r]
    acc = torch.zeros(1, numel)
    add_rows_(acc, rows)
    assert torch.equal(acc.view(-1).view(torch.int32), expected.view(torch.int32))
    shuffled = torch.zeros(1, numel)
    add_rows_(shuffled, rows.flip(0))
    assert p < 3 or not torch.equal(shuffled, acc)  # the data does tell the order apart
