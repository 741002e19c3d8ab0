"""DDTREE's decode memory check (and so the retraction) reserves exactly the
2 x max(b, B + 1) per request that DDTREE's decode step allocates, not EAGLE's
2 x max((b - 1) x K, B + 1) (patch ddtree-kv-reserve). Harness: _decode_reserve_harness.py."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.sglang_deps


@pytest.fixture(scope="module")
def report(patched_site, harness):
    return harness(patched_site, "_decode_reserve_harness.py")


def test_reserve_is_the_allocated_window(report):
    for c in report["cases"]:
        assert c["reserve"] == 2 * max(c["b"], c["B"] + 1), c
        assert c["alloc_reserve"] == c["reserve"], c


def test_check_counts_what_prepare_for_decode_allocates(report):
    # Page size 1 only: at page > 1 SGLang's generic estimate (ceil_align of committed +
    # reserve over allocated) and page_aligned_decode_alloc_lens (rounds committed + reserve
    # up to a page) differ by up to a page per request for every spec algorithm; not DDTREE's.
    for c in [c for c in report["cases"] if c["page"] == 1]:
        assert c["check_tokens"] == c["alloc_tokens"], c
