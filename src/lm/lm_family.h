/* The language-model families' Hugging Face names (moe.h, moe_lm_family): what the parameter table,
 * the checkpoint reader and writer and the expert-parallel maps need to know of a family. */
#ifndef MOE_LM_FAMILY_H
#define MOE_LM_FAMILY_H

#include "moe.h"

typedef struct {
  const char *model_type;   /* config.json's "model_type" */
  const char *architecture; /* its "architectures" entry */
  const char *experts_key;  /* the config field of the expert count: num_local_experts or num_experts */
  const char *expert_H_key; /* of the experts' width: intermediate_size or moe_intermediate_size */
  const char *ffn;          /* the feed-forward's module: block_sparse_moe or mlp */
  const char *router;       /* its router's module: gate, or router (gpt-oss) */
  const char *expert[3];    /* an expert's tensors in HF order: w1 w2 w3, or gate_proj up_proj down_proj;
                               "" for gpt-oss, whose experts are fused tensors (lm_gptoss.h) */
  int fc[3];                /* expert[j] is a slice of the layer's experts.fc<fc[j] + 1>.weight */
} moe__lm_family_info;

const moe__lm_family_info *moe__lm_family(moe_lm_family f);
/* Whether ref name is a routed expert's tensor (model.layers.<i>.<ffn>.experts.<e>.<expert[j]>.weight):
 * then *e = e and *j = j. */
int moe__lm_expert_of(moe_lm_family f, const char *name, int *e, int *j);

/* The MoE layers of c (the others dense). */
int moe__lm_moe_layers(const moe_lm_config *c);

#endif
