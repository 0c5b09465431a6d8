"""A step's metadata: slot mapping, reserved drafts, the explicit RaggedStep."""
import numpy as np
import pytest

from minillm.serving import SamplingParams, Sequence, StepBatch
from minillm.serving.batch import RaggedStep, slot_mapping


def test_slot_mapping_one_table_and_one_row_per_sequence():
    np.testing.assert_array_equal(slot_mapping([7, 2, 5], np.arange(3, 10), 4), [31, 8, 9, 10, 11, 20, 21])
    tables = np.array([[7, 2, 5], [1, 0, 3]])
    np.testing.assert_array_equal(slot_mapping(tables, np.array([9, 2]), 4), [21, 6])


def decoding(seq_id, prompt_len=5, table=(3, 4)):
    s = Sequence(seq_id, list(range(prompt_len)), SamplingParams(max_tokens=8))
    s.output, s.num_computed, s.block_table = [9], prompt_len, list(table)
    return s


def test_reserved_drafts_must_be_filled_before_the_arrays():
    seqs = [decoding(0), decoding(1, table=(5, 6))]
    b = StepBatch.build(seqs, [3, 1], 4, [[-1, -1], []])
    assert b.needs_drafts and b.num_draft_tokens == 2
    with pytest.raises(RuntimeError, match="not filled"):
        b.input_ids
    with pytest.raises(ValueError, match="as long as its reservation"):
        b.set_drafts([[1], []])
    with pytest.raises(ValueError, match=">= 0"):
        b.set_drafts([[1, -2], []])
    b.set_drafts([[11, 12], []])
    assert not b.needs_drafts
    np.testing.assert_array_equal(b.input_ids, [9, 11, 12, 9])
    np.testing.assert_array_equal(b.slot_mapping, [17, 18, 19, 25])   # positions 5-7 in block 4, 5 in block 6
    np.testing.assert_array_equal(b.row_drafts(), [11, 12, -1, -1])
    with pytest.raises(RuntimeError, match="after the step's arrays"):
        b.set_drafts([[1, 2], []])


def test_ragged_step_derives_lengths_and_last_rows():
    st = RaggedStep([1, 2, 3, 4], [5, 6, 7, 0], [0, 1, 2, 3], [[0, 1], [2, 0]], [3, 1])
    np.testing.assert_array_equal(st.context_lens, [8, 1])
    np.testing.assert_array_equal(st.logits_rows, [2, 3])
    assert st.num_tokens == 4 and st.num_seqs == 2
    with pytest.raises(ValueError, match="one entry per token"):
        RaggedStep([1, 2], [5, 6, 7], [0, 1, 2], [[0]], [3])
