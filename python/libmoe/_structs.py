"""ctypes mirrors of the structs of include/moe.h that the package reads or fills (same field order
and types; tests/test_python.c passes the C sizes to python/tests, which compares them)."""
import ctypes as C

_i, _f, _p = C.c_int, C.c_float, C.c_void_p


class LayerConfig(C.Structure):
    _fields_ = [("D", _i), ("H", _i), ("E", _i), ("top_k", _i), ("capacity_setting", _f),
                ("normalize_topk", _i), ("act", _i), ("dispatch", _i), ("priority", _i), ("router", _i),
                ("proj_dim", _i), ("gate_bias", _i), ("expert_bias", _i), ("threads", _i),
                ("inner_experts", _i), ("inner_top_k", _i), ("dist", _p), ("external_experts", _i),
                ("dtype", _i), ("pipeline", _i), ("memory_reuse", _i), ("memory_budget", C.c_size_t),
                ("parallel_r", _i), ("replica_slots", _i), ("a2a_auto", _i),
                ("score", _i), ("select_bias", _i), ("n_group", _i), ("topk_group", _i),
                ("group_score", _i), ("routed_scale", _f), ("shared_H", _i), ("shared_gate", _i),
                ("swiglu_alpha", _f), ("swiglu_limit", _f), ("seq_aux_alpha", _f), ("seq_len", _i), ("expert_type", _i)]


class ParamInfo(C.Structure):
    _fields_ = [("name", C.c_char_p), ("ndim", _i), ("shape", C.c_int64 * 3), ("offset", C.c_size_t),
                ("numel", C.c_size_t)]


class Layer(C.Structure):
    pass


Layer._fields_ = [("cfg", LayerConfig), ("inner", C.POINTER(Layer)), ("cache", _p),
                  ("expert_capacity", C.POINTER(C.c_int32)), ("expert_capacity_tokens", _i),
                  ("cached", C.POINTER(C.c_int32)), ("cached_T", _i), ("nparams", _i),
                  ("info", ParamInfo * 16), ("numel", C.c_size_t), ("params", C.POINTER(_f)),
                  ("grads", C.POINTER(_f)), ("st", _p)]


class LayerStats(C.Structure):
    _fields_ = [("aux_loss", _f), ("z_loss", _f), ("capacity", _i), ("dropped", _i),
                ("expert_counts", C.POINTER(C.c_int32)), ("experts", C.POINTER(C.c_int32)),
                ("weights", C.POINTER(_f)), ("fresh", C.POINTER(C.c_int32)), ("router_overlapped", _i),
                ("pipeline", _i), ("pipeline_trial", _i), ("memory_reuse", _i),
                ("router_seconds", C.c_double), ("seq_aux_loss", _f)]


class LayerOverrides(C.Structure):
    _fields_ = [("top_k", _i), ("capacity_setting", _f), ("normalize_topk", _i), ("act", _i),
                ("dispatch", _i), ("priority", _i), ("router", _i), ("threads", _i), ("dtype", _i),
                ("pipeline", _i), ("memory_reuse", _i), ("dist", _p), ("expert_order", C.POINTER(C.c_int32))]


class ModelConfig(C.Structure):
    _fields_ = [("in_dim", _i), ("classes", _i), ("blocks", _i), ("moe", LayerConfig), ("loss", _i),
                ("aux_weight", _f), ("z_weight", _f)]


class TensorRef(C.Structure):
    _fields_ = [("name", C.c_char * 64), ("ndim", _i), ("shape", C.c_int64 * 3), ("numel", C.c_size_t),
                ("data", C.POINTER(_f)), ("grad", C.POINTER(_f))]


class Model(C.Structure):
    _fields_ = [("cfg", ModelConfig), ("layers", C.POINTER(Layer)), ("nrefs", _i),
                ("refs", C.POINTER(TensorRef)), ("numel", C.c_size_t), ("dense", C.POINTER(_f)),
                ("dense_grad", C.POINTER(_f)), ("file", _p), ("caches", _p), ("st", _p)]


class ModelStats(C.Structure):
    _fields_ = [("loss", C.c_double), ("aux", C.c_double), ("z", C.c_double), ("correct", _i),
                ("dropped", _i), ("capacity_max", _i)]


class OptimConfig(C.Structure):
    _fields_ = [("kind", _i), ("beta1", _f), ("beta2", _f), ("eps", _f), ("momentum", _f),
                ("weight_decay", _f)]


class Optim(C.Structure):
    _fields_ = [("cfg", OptimConfig), ("step", C.c_int64), ("n", C.c_size_t), ("m", C.POINTER(_f)),
                ("v", C.POINTER(_f))]


class TrainState(C.Structure):
    _fields_ = [("epoch", _i), ("step", C.c_int64), ("seed", C.c_uint64), ("extra", C.c_char * 1024)]


class Dataset(C.Structure):
    _fields_ = [("n", _i), ("rows", _i), ("cols", _i), ("classes", _i), ("images", C.POINTER(_f)),
                ("labels", C.POINTER(C.c_uint8))]


class LMYarn(C.Structure):
    _fields_ = [("factor", _f), ("original_max_pos", _i), ("beta_fast", _f), ("beta_slow", _f), ("mscale", _f),
                ("mscale_all_dim", _f), ("truncate", _i)]


class LMMla(C.Structure):
    _fields_ = [("kv_lora_rank", _i), ("q_lora_rank", _i), ("qk_nope_dim", _i), ("v_head_dim", _i),
                ("rope_interleave", _i)]


class LMConfig(C.Structure):
    _fields_ = [("vocab", _i), ("n_layers", _i), ("n_heads", _i), ("n_kv_heads", _i), ("head_dim", _i),
                ("max_seq", _i), ("rope_theta", _f), ("rms_eps", _f), ("aux_coef", _f), ("tie_embeddings", _i),
                ("sliding_window", _i), ("moe", LayerConfig), ("family", _i), ("qkv_bias", _i), ("qk_norm", _i),
                ("clip_qkv", _f), ("dense_H", _i), ("dense_layers", C.c_uint8 * (1024 // 8)),
                ("o_bias", _i), ("attn_sinks", _i), ("full_layers", C.c_uint8 * (1024 // 8)), ("yarn", LMYarn),
                ("mla", LMMla)]


class LM(C.Structure):
    _fields_ = [("cfg", LMConfig), ("layers", C.POINTER(Layer)), ("nrefs", _i), ("refs", C.POINTER(TensorRef)),
                ("numel", C.c_size_t), ("dense", C.POINTER(_f)), ("dense_grad", C.POINTER(_f)), ("st", _p)]


class LMStreamConfig(C.Structure):  # moe_lm_stream_config
    _fields_ = [("budget", C.c_size_t), ("policy", _i), ("prefetch", _i), ("keep_page_cache", _i), ("placement", _i),
                ("placement_trace", _p), ("pin_trace", _p), ("pin", _i)]


class Trace(C.Structure):  # moe_trace
    _fields_ = [("steps", C.c_int64), ("layers", _i), ("experts", _i), ("tokens", C.POINTER(C.c_int32))]


class LMExperts(C.Structure):  # moe_lm_experts
    _fields_ = [("caches", C.POINTER(_p)), ("n", _i), ("prefetch", _p), ("budget", C.c_size_t)]


class ExpertCacheStats(C.Structure):  # moe_expert_cache_stats
    _fields_ = [("accesses", C.c_int64), ("misses", C.c_int64), ("resident_bytes", C.c_size_t),
                ("expert_bytes", C.c_size_t), ("dtype", _i), ("slots", _i), ("loads", C.c_int64),
                ("bytes_read", C.c_int64), ("stall_seconds", C.c_double), ("prefetches", C.c_int64),
                ("prefetch_used", C.c_int64), ("predicted", C.c_int64), ("predicted_hit", C.c_int64),
                ("actual", C.c_int64), ("pinned", _i), ("read_seconds", C.c_double), ("prefetch_skipped", C.c_int64)]


class EngineConfig(C.Structure):
    _fields_ = [("slots", _i), ("tok", _p), ("eos", C.POINTER(C.c_int32)), ("n_eos", _i), ("on_step", _p),
                ("on_decode", _p), ("ctx", _p)]


class EngineParams(C.Structure):
    _fields_ = [("prompt", C.POINTER(C.c_int32)), ("n_prompt", _i), ("max_tokens", _i), ("temperature", _f),
                ("top_p", _f), ("seed", C.c_uint64), ("ignore_eos", _i), ("stop", C.POINTER(C.c_char_p)),
                ("n_stop", _i), ("logprobs", _i), ("top_logprobs", _i), ("prompt_logprobs", _i)]


class EngineState(C.Structure):
    _fields_ = [("n", _i), ("tokens", C.POINTER(C.c_int32)), ("done", _i), ("stop", _i), ("text_safe", C.c_size_t),
                ("error", C.c_char_p), ("ttft_s", C.c_double), ("total_s", C.c_double),
                ("logprobs", C.POINTER(_f)), ("top_ids", C.POINTER(C.c_int32)), ("top_logprobs", C.POINTER(_f)),
                ("n_top", _i), ("prompt_logprobs", C.POINTER(_f)), ("prompt_top_ids", C.POINTER(C.c_int32)),
                ("prompt_top_logprobs", C.POINTER(_f))]


class EngineStats(C.Structure):
    _fields_ = [("queued", _i), ("running", _i), ("steps", C.c_int64), ("tokens", C.c_int64),
                ("prompt_tokens", C.c_int64), ("busy_s", C.c_double), ("prefills", C.c_int64),
                ("forwards", C.c_int64)]


class TrainBatchStats(C.Structure):
    _fields_ = [("loss", C.c_double), ("ce", C.c_double), ("tokens", _i), ("dropped", _i), ("assigned", C.c_double),
                ("expert_flops", C.c_double), ("attention_s", C.c_double), ("experts_s", C.c_double),
                ("router_s", C.c_double), ("aux", C.c_double), ("correct", _i)]


class TrainModel(C.Structure):  # from moe_train_lm or _classifier, for moe_trainer_new; its functions opaque
    _fields_ = [("self", _p), ("refs", _p), ("nrefs", _i), ("numel", C.c_size_t), ("dist", _p), ("layer", _p),
                ("whole_numel", C.c_size_t), ("samples", C.c_int64), ("steps_per_epoch", _i), ("moe_layers", _p),
                ("n_moe_layers", _i), ("layer_stats", _p), ("rows", _i)] + \
        [(n, _p) for n in ("batch", "forward", "backward", "params_changed", "update", "evaluate", "save", "gather",
                           "scatter", "checkpoint", "balance_bias", "free")]


class Augment(C.Structure):
    _fields_ = [("shift", _i), ("rotate", _f), ("scale", _f)]


class CacheSwitch(C.Structure):
    _fields_ = [("on", _f), ("off", _f), ("min_epoch", _i)]


class TrainAdjust(C.Structure):
    _fields_ = [("dynamic_capacity", _i), ("delta_launch", _i), ("headroom", _f), ("cache_assignments", _i),
                ("cache", CacheSwitch)]


class TrainerConfig(C.Structure):
    _fields_ = [("lr", _f), ("steps", _i), ("warmup", _i), ("time_budget", _f), ("stop_after", _i), ("eval_every", _i),
                ("optim", OptimConfig), ("on_nan", _i), ("checkpoint", C.c_char_p), ("keep_best", C.c_char_p),
                ("context", _i), ("batch", _i), ("eval_windows", _i), ("seed", C.c_uint64), ("adjust", TrainAdjust),
                ("bias_rate", _f), ("on_batch", _p), ("on_step", _p), ("on_eval", _p), ("ctx", _p)]


class TrainStep(C.Structure):
    _fields_ = [("step", C.c_int64), ("lr", _f), ("seconds", C.c_double), ("train_seconds", C.c_double),
                ("batch", TrainBatchStats), ("skipped", _i), ("epoch_end", _i), ("frac_same", C.c_double),
                ("caching", _i), ("caching_from", C.c_int64), ("evaluated", _i), ("valid_loss", C.c_double),
                ("best", _i), ("valid_accuracy", C.c_double)]


class TrainerInfo(C.Structure):
    _fields_ = [("step", C.c_int64), ("last", C.c_int64), ("skipped", C.c_int64), ("train_seconds", C.c_double),
                ("best_loss", C.c_double)]


# C name -> mirror, for the size check of python/tests
MIRRORS = {"moe_layer_config": LayerConfig, "moe_param_info": ParamInfo, "moe_layer_t": Layer,
           "moe_layer_stats": LayerStats, "moe_layer_overrides": LayerOverrides,
           "moe_model_config": ModelConfig, "moe_tensor_ref": TensorRef, "moe_model_t": Model,
           "moe_model_stats": ModelStats, "moe_optim_config": OptimConfig, "moe_optim_t": Optim,
           "moe_train_state": TrainState, "moe_dataset": Dataset, "moe_lm_config": LMConfig, "moe_lm_t": LM,
           "moe_engine_config": EngineConfig, "moe_engine_params": EngineParams, "moe_engine_state": EngineState,
           "moe_engine_stats": EngineStats, "moe_train_batch_stats": TrainBatchStats, "moe_train_model": TrainModel,
           "moe_cache_switch": CacheSwitch, "moe_train_adjust": TrainAdjust, "moe_trainer_config": TrainerConfig,
           "moe_train_step": TrainStep, "moe_trainer_info": TrainerInfo, "moe_augment": Augment,
           "moe_lm_stream_config": LMStreamConfig, "moe_lm_experts": LMExperts,
           "moe_expert_cache_stats": ExpertCacheStats, "moe_trace": Trace}
