"""Convert a Megatron ``torch_dist`` checkpoint to Hugging Face safetensors.

Usage: ``python tools/convert_torch_dist_to_hf.py --input-dir SAVE/iter_XXXXXXX --output-dir OUT
--origin-hf-dir HF_DIR [${MODEL_ARGS[@]}]``. Runs on one process (dist_checkpointing reshards
any saved TP / PP / EP layout); without MODEL_ARGS the shape comes from HF_DIR/config.json. Copies
config.json, tokenizer files and generation_config.json from HF_DIR. Work stays under the
``__main__`` guard (dist_checkpointing may spawn processes that re-import this file).
"""

import logging
import sys


def main(argv=None) -> None:
    """Parse paths (+ optional MODEL_ARGS), convert, tear the process groups down."""
    from slime.backends.megatron_utils.hf_convert import (
        convert_torch_dist_to_hf,
        parse_torch_dist_to_hf_args,
    )
    from slime.backends.megatron_utils.parallel import destroy_parallel

    args = parse_torch_dist_to_hf_args(argv)
    try:
        convert_torch_dist_to_hf(args.input_dir, args.output_dir, args.origin_hf_dir, args)
    except ValueError as err:
        logging.getLogger(__name__).error("%s", err)
        sys.exit(2)
    destroy_parallel()


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    main()
