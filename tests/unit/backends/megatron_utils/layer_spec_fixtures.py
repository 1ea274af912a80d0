"""`--spec MODULE FUNCTION` targets for the tests: a spec function of our own, called as slime calls
it, plus broken ones for the error messages."""

import functools

CALLS = []  # (args.num_layers, type(config).__name__, vp_stage) of every call, per process


@functools.cache
def local_layer_spec():
    """megatron-core's local GPT layer spec (one object per process)."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    return get_gpt_layer_local_spec()


def __getattr__(name):  # LOCAL_LAYER_SPEC: a ModuleSpec attribute, built on first access
    if name == "LOCAL_LAYER_SPEC":
        return local_layer_spec()
    raise AttributeError(name)


def post_norm_spec(args, config, vp_stage):
    """Our local spec, with the layer's pre-MLP norm dropped when args.post_mlp_layernorm is off
    (any visible change works: the test checks the built model follows this function)."""
    from megatron.core.transformer.identity_op import IdentityOp

    from slime.backends.megatron_utils.layer_specs import local_block_spec

    CALLS.append((args.num_layers, type(config).__name__, vp_stage))
    block = local_block_spec(config, vp_stage=vp_stage)
    if args.post_mlp_layernorm:
        for layer in block.layer_specs:
            layer.submodules.pre_mlp_layernorm = IdentityOp
    return block


def raising_spec(args, config, vp_stage):
    raise KeyError("no such layer")


NOT_A_SPEC = 42


def not_a_spec_fn(args, config, vp_stage):
    return "a string"
