"""Parsing what KubernetesHost.attach reads back from a pod (no cluster needed)."""

from __future__ import annotations

import pytest

from kernel_sandbox.backends.kubernetes.attach import kernel_number


@pytest.mark.parametrize(
    ("listing", "expected"),
    [
        ("", 1),  # no restart yet: the supervisor's first kernel
        ("go-*\n", 1),  # the shell's unmatched glob
        ("go-1\n", 2),
        ("go-1\ngo-2\ngo-3\n", 4),
        ("go-2\ngo-10\n", 11),  # numbers, not names, are compared
        # what sandbox code might plant there is skipped
        ("go-1\ngo-x\ngo--5\ngo-1234567890123\nnot-go-9\n", 2),
    ],
)
def test_kernel_number_counts_on_from_the_go_files(listing: str, expected: int) -> None:
    assert kernel_number(listing) == expected
