"""Keyword options <-> the C config structs. Defaults come from the library (moe_*_config_default);
names are parsed and printed by its own moe_*_parse / moe_*_name, so the options and their error
messages are those of the C API and the moe command."""
import ctypes as C

from ._lib import check, fail, lib, text

# field -> (parse, name) for the fields that hold a C enum
ENUMS = {
    "act": (lib.moe_act_parse, lib.moe_act_name),
    "dispatch": (lib.moe_dispatch_parse, lib.moe_dispatch_name),
    "priority": (lib.moe_priority_parse, lib.moe_priority_name),
    "router": (lib.moe_router_parse, lib.moe_router_name),
    "dtype": (lib.moe_dtype_parse, lib.moe_compute_dtype_name),
    "memory_reuse": (lib.moe_reuse_parse, lib.moe_reuse_name),
    "score": (lib.moe_score_parse, lib.moe_score_name),
    "group_score": (lib.moe_group_score_parse, lib.moe_group_score_name),
    "loss": (lib.moe_loss_parse, lib.moe_loss_name),
    "kind": (lib.moe_opt_parse, lib.moe_opt_name),
}
BOOLS = ("gate_bias", "expert_bias", "select_bias", "shared_gate")
# moe_layer_config fields a caller may set (dist and external_experts are for MPI and serving)
LAYER = ("D", "H", "E", "top_k", "capacity_setting", "normalize_topk", "act", "dispatch", "priority",
         "router", "proj_dim", "gate_bias", "expert_bias", "threads", "inner_experts", "inner_top_k", "dtype",
         "pipeline", "memory_reuse", "memory_budget", "score", "select_bias", "n_group", "topk_group",
         "group_score", "routed_scale", "shared_H", "shared_gate", "swiglu_alpha", "swiglu_limit")
MODEL = ("in_dim", "classes", "blocks", "loss", "aux_weight", "z_weight")
OPTIM = ("kind", "beta1", "beta2", "eps", "momentum", "weight_decay")
# what moe_layer_load may override (moe_layer_overrides; the others keep the file's values)
OVERRIDES = ("top_k", "capacity_setting", "normalize_topk", "act", "dispatch", "priority", "router",
             "threads", "dtype")


def to_c(field, value):
    """The C value of option `field`: enum names parsed, normalize_topk None -> -1 (auto)."""
    if field in ENUMS:
        out = C.c_int()
        check(ENUMS[field][0](text(value), text(field), C.byref(out)))
        return out.value
    if field == "normalize_topk":
        return -1 if value is None else int(bool(value))
    return int(bool(value)) if field in BOOLS else value


def to_py(field, value):
    if field in ENUMS:
        return ENUMS[field][1](value).decode()
    if field == "normalize_topk":
        return None if value < 0 else bool(value)
    return bool(value) if field in BOOLS else value


def apply(struct, fields, options, what):
    """Sets struct's `fields` from the options dict; a name outside them is MOE_ERR_ARG."""
    for k, v in options.items():
        if k not in fields:
            raise fail("MOE_ERR_ARG", f"{what}: unknown option '{k}' (options: {', '.join(fields)})")
        setattr(struct, k, to_c(k, v))


def read(struct, fields):
    return {k: to_py(k, getattr(struct, k)) for k in fields}


def split(options, fields):
    """(the options among fields, the rest)."""
    return ({k: v for k, v in options.items() if k in fields},
            {k: v for k, v in options.items() if k not in fields})
