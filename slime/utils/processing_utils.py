"""slime's `processing_utils` import path, text models only: `load_tokenizer`, `load_processor`.

Multimodal prompts are not implemented here (docs/plugins.md), so `load_processor` returns None
for a text model, as slime does, and refuses a checkpoint whose processor is more than a tokenizer.
"""

from __future__ import annotations


def load_tokenizer(name_or_path: str, **kwargs):
    """`AutoTokenizer.from_pretrained(name_or_path, **kwargs)`."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(name_or_path, **kwargs)


def load_processor(name_or_path: str, **kwargs):
    """None for a text model (its `AutoProcessor` is just the tokenizer); a multimodal processor
    raises, since multimodal prompts are not implemented."""
    from transformers import AutoProcessor, PreTrainedTokenizerBase

    processor = AutoProcessor.from_pretrained(name_or_path, **kwargs)  # a missing checkpoint raises
    if isinstance(processor, PreTrainedTokenizerBase):
        return None
    raise NotImplementedError(f"{name_or_path} has a multimodal processor ({type(processor).__name__}); "
                              "multimodal prompts are not implemented (docs/plugins.md)")
