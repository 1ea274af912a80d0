"""Convert a Hugging Face checkpoint to a Megatron ``torch_dist`` checkpoint.

Usage: ``[torchrun --nproc-per-node N] python tools/convert_hf_to_torch_dist.py ${MODEL_ARGS[@]}
--hf-checkpoint HF_DIR --save OUT_DIR``. Plain ``python`` runs one rank; under torchrun any
TP / PP / EP layout that divides the world size. Writes ``OUT_DIR/iter_0000000/`` and
``OUT_DIR/latest_checkpointed_iteration.txt``. The work stays under the ``__main__`` guard:
dist_checkpointing starts a spawn-method multiprocessing Manager that re-imports this file.
"""

import logging
import sys


def main(argv=None) -> None:
    """Parse MODEL_ARGS + paths, convert, tear the process groups down."""
    from slime.backends.megatron_utils.hf_convert import (
        convert_hf_to_torch_dist,
        parse_hf_to_torch_dist_args,
    )
    from slime.backends.megatron_utils.parallel import destroy_parallel

    args = parse_hf_to_torch_dist_args(argv)
    try:
        convert_hf_to_torch_dist(args)
    except ValueError as err:
        logging.getLogger(__name__).error("%s", err)
        sys.exit(2)
    destroy_parallel()


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    main()
