"""``dir(rc)`` is the public API: what ``__all__`` names, lazily imported policies included
(issue 55)."""

from __future__ import annotations

import pytest

import rlconnect as rc


def test_dir_lists_the_public_names_and_hides_the_typing_helpers():
    names = dir(rc)
    assert {"MLPPolicy", "TorchPolicy", "LSTMPolicy", "EnvRunner", "serve"} <= set(names)
    assert "Any" not in names and "TYPE_CHECKING" not in names
    assert names == sorted(rc.__all__)
    assert all(getattr(rc, n) is not None for n in names)  # every listed name resolves


def test_a_misspelled_attribute_suggests_the_public_name():
    with pytest.raises(
        AttributeError, match=r"no attribute 'MLPPolicyy' \(did you mean 'MLPPolicy'\?\)"
    ):
        rc.MLPPolicyy
