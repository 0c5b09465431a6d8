import pytest

from minillm.flash_history import NO_FLASH, VERSIONS, compute_capability, pick_flash, supports

BY_NAME = {v.name: v for v in VERSIONS}


def test_supported_architectures_follow_the_flash_attention_readme():
    # FA1 "Turing or Ampere"; FA2 "Ampere, Ada, or Hopper GPUs"; FA3 "optimized for Hopper GPUs (e.g. H100)";
    # FA4 "optimized for Hopper and Blackwell GPUs (e.g. H100, B200)", with backward kernels for both
    assert BY_NAME["FlashAttention-1"].compute_capabilities == {(7, 5), (8, 0), (8, 6)}
    assert BY_NAME["FlashAttention-2"].compute_capabilities == {(8, 0), (8, 6), (8, 9), (9, 0)}
    assert BY_NAME["FlashAttention-3"].compute_capabilities == {(9, 0)}
    assert BY_NAME["FlashAttention-4"].compute_capabilities == {(9, 0), (10, 0)}
    assert BY_NAME["FlashAttention-4"].backward


@pytest.mark.parametrize("gpu,training,want", [
    ("B200", False, "FlashAttention-4"), ("GB200", False, "FlashAttention-4"),
    ("B200", True, "FlashAttention-4"),  # FA3 is Hopper-only and FA2 stops at sm90; FA4 has a backward pass
    # Hopper: FA3, written for sm90; FA4 runs there too but was written for Blackwell and is a pre-release
    ("H200", True, "FlashAttention-3"), ("H100", True, "FlashAttention-3"),
    ("H100", False, "FlashAttention-3"), ("GH200", False, "FlashAttention-3"),
    ("A100", True, "FlashAttention-2"), ("A6000", False, "FlashAttention-2"), ("L40S", False, "FlashAttention-2"),
    ("L4", True, "FlashAttention-2"), ("RTX 4090", False, "FlashAttention-2"),
    ("T4", False, "FlashAttention-1"), ("T4", True, "FlashAttention-1"),  # Turing: FA1 only
    ("V100", False, NO_FLASH), ("V100", True, NO_FLASH),  # Volta: no version supports sm70
])
def test_pick_flash_by_compute_capability(gpu, training, want):
    assert pick_flash(gpu, training) == want


@pytest.mark.parametrize("cc,want", [((7, 5), "FlashAttention-1"), ((8, 9), "FlashAttention-2"),
                                     ((9, 0), "FlashAttention-3"), ((10, 0), "FlashAttention-4"),
                                     ((7, 0), NO_FLASH), ((12, 0), NO_FLASH)])
def test_pick_flash_accepts_a_compute_capability(cc, want):
    assert pick_flash(cc, training=True) == want


def test_pick_flash_only_returns_versions_that_support_the_gpu():
    for gpu in ("T4", "A100", "A6000", "L40S", "H100", "H200", "B200", "GB200", "V100"):
        for training in (False, True):
            got = pick_flash(gpu, training)
            if got != NO_FLASH:
                assert compute_capability(gpu) in BY_NAME[got].compute_capabilities
                assert BY_NAME[got].backward or not training


def test_pick_flash_never_picks_a_hopper_only_version_off_hopper():
    assert all(pick_flash(g, t) != "FlashAttention-3" for g in ("B200", "A100", "T4") for t in (False, True))


@pytest.mark.parametrize("bad", ["", "   ", "Quadro K2200", (9,), None])
def test_pick_flash_rejects_unknown_or_empty(bad):
    with pytest.raises(ValueError):
        pick_flash(bad, True)


def test_versions_are_in_order():
    assert [v.year for v in VERSIONS] == sorted(v.year for v in VERSIONS) and len(VERSIONS) == 4


@pytest.mark.parametrize("version,gpu,training,want", [
    ("FlashAttention-3", "H100", True, True), ("FlashAttention-3", "B200", True, False),
    ("FlashAttention-2", "T4", False, False), ("FlashAttention-2", "A100", True, True),
    ("FlashAttention-4", "B200", True, True), ("FlashAttention-4", "A100", False, False),
    ("FlashAttention-1", "V100", False, False),
])
def test_supports_checks_a_recommendation(version, gpu, training, want):
    assert supports(version, gpu, training) is want


def test_supports_rejects_an_unknown_version():
    with pytest.raises(ValueError):
        supports("FlashAttention-9", "H100", False)


def test_hopper_training_gets_the_kernel_written_for_hopper_not_the_blackwell_prerelease():
    # the old pick_flash took the newest version whose builds cover sm90, FlashAttention-4 (a pre-release)
    assert pick_flash("H100", training=True) == "FlashAttention-3"
    assert BY_NAME["FlashAttention-4"].prerelease and (9, 0) not in BY_NAME["FlashAttention-4"].designed_for
    assert (9, 0) in BY_NAME["FlashAttention-3"].designed_for


def test_designed_for_is_within_what_the_builds_support():
    assert all(v.designed_for and v.designed_for <= v.compute_capabilities for v in VERSIONS)
