"""Row padding of the trainer's micro-batches (data_split.row_pad_multiple)."""

import pytest

from slime.backends.megatron_utils.data_split import row_pad_multiple


@pytest.mark.parametrize("tp,sp,fp8,multiplier,expect", [
    (1, False, False, None, 1),
    (4, True, False, None, 4),      # bf16 under SP: the row splits over TP
    (4, True, True, None, 512),     # FP8 under SP: 128 tokens per rank (slime's TP x 128)
    (2, False, True, None, 128),    # FP8 without SP: every TP rank runs the whole row
    (4, True, False, 128, 512),     # --data-pad-size-multiplier 128: slime's padding
    (2, True, True, 3, 768),
])
def test_rows_are_padded_for_sequence_parallel_and_fp8(tp, sp, fp8, multiplier, expect):
    pad = row_pad_multiple(tp, sp, fp8, multiplier)
    assert pad == expect
    if fp8:  # each rank's GEMM sees a multiple of 16 tokens (TE's FP8 requirement)
        assert (pad // (tp if sp else 1)) % 16 == 0
