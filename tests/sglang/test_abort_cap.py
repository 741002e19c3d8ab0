"""An abort that lands on a speculative accept run crossing max_new_tokens: the request ends
aborted with at most max_new_tokens tokens (found by the soak: 5 tokens for max_new_tokens 4,
DDTREE, an abort after 2 streamed tokens). Harness: _abort_cap_harness.py."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.sglang_deps


@pytest.fixture(scope="module")
def report(patched_site, harness):
    return {c["name"]: c for c in harness(patched_site, "_abort_cap_harness.py")["cases"]}


def test_an_abort_emits_no_more_than_max_new_tokens(report):
    c = report["abort, the run crosses the cap"]
    assert c.get("error") is None, c
    assert c["finish"]["type"] == "abort", c
    assert c["emitted"] == c["max_new"] == 4, c


def test_an_abort_inside_the_cap_keeps_every_token(report):
    c = report["abort, inside the cap"]
    assert c["finish"]["type"] == "abort" and c["emitted"] == 3, c


def test_a_length_finish_is_unchanged(report):
    c = report["no abort, the run crosses the cap"]
    assert c.get("error") is None, c
    assert c["finish"]["type"] == "length" and c["emitted"] == 4, c
