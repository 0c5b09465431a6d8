import pytest

from minillm.flash_history import VERSIONS, pick_flash


@pytest.mark.parametrize("gpu,training,want", [
    ("B200", False, "FlashAttention-4"), ("B200", True, "FlashAttention-3"), ("H200", True, "FlashAttention-3"),
    ("H100", False, "FlashAttention-3"), ("A100", True, "FlashAttention-2"), ("L40S", False, "FlashAttention-2"),
    ("T4", False, "FlashAttention-2 (safe default)"),
])
def test_pick_flash_by_generation(gpu, training, want):
    assert pick_flash(gpu, training) == want


def test_pick_flash_never_picks_forward_only_version_for_training():
    fwd_only = {v.name for v in VERSIONS if not v.backward}
    assert all(pick_flash(g, True) not in fwd_only for g in ("B200", "GB200", "H100", "A100"))


def test_pick_flash_rejects_empty_name():
    with pytest.raises(ValueError):
        pick_flash("", True)


def test_versions_are_in_order():
    assert [v.year for v in VERSIONS] == sorted(v.year for v in VERSIONS) and len(VERSIONS) == 4
