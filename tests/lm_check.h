/* The language model against its PyTorch reference fixtures (tests/fixtures/lm/<case>/), for the tests. */
#ifndef MOE_TEST_LM_CHECK_H
#define MOE_TEST_LM_CHECK_H

#include <stddef.h>
#include <stdint.h>

#include "moe.h"

#define LM_TOL 1e-4 /* absolute: logits, losses and gradients are of order 0.01 to 10 */

/* Max |a - b| over n values, and where. */
double lm_max_err(const float *a, const float *b, size_t n, size_t *at);
/* The fixture case's directory, in buf. */
const char *lm_case_dir(const char *name, char *buf, size_t n);
/* Loads the case, runs forward and backward and compares the logits, losses and every parameter's
 * gradient with its ref.safetensors within LM_TOL; returns 0 (after printing what differs) on a mismatch. */
int lm_check_case(const char *name);
/* As lm_check_case with the model loaded under config c (NULL: its config.json's). */
int lm_check_case_config(const char *name, const moe_lm_config *c);
/* The tokens (B, T) of the fixture in dir, malloc'd; NULL on failure. */
int32_t *lm_fixture_tokens(const char *dir, int *B, int *T);
/* The logits of m on the tokens t (B, T), malloc'd; NULL after printing on a failure. */
float *lm_logits(moe_lm_t *m, const int32_t *t, int B, int T);
/* Whether b has a's parameters (names, sizes, values bit for bit); prints the first that differs
 * (what names the case). */
int lm_same_tensors(const char *what, const moe_lm_t *a, const moe_lm_t *b);
/* The fixture case `family` with config.json's `field` set to the JSON `value` (NULL: removed) and its
 * weights linked, in a new directory dir (of n bytes); with `drop`, the weights written again without
 * that tensor. Returns 0 on failure. */
int lm_patched(const char *family, const char *field, const char *value, const char *drop, char *dir, size_t n);
/* Loads the case, saves it into a new directory (its path in dir, of n bytes) and loads that: the
 * same configuration, the same parameters by name and order, bit-identical logits on the fixture's
 * tokens. Returns 0 (after printing what differs) on a failure. */
int lm_check_save_load(const char *name, char *dir, size_t n);
/* 12 SGD steps (rate 0.2) from the loaded case (on threads threads; 0: its default) on its tokens as one
 * sequence, each predicting the next, then a save and load: the loss falls below 0.8 of the first, the
 * reloaded model has the trained loss (within 1e-6), and the parameter keep (NULL: none), which has no
 * gradient, has not changed. Returns 0 (after printing) on a failure. */
int lm_check_train_from_checkpoint(const char *name, int threads, const char *keep);

/* Whether the config read from a file is the model's (a) in everything it computes; prints what differs
 * (what names the case). */
int lm_same_config(const char *what, const moe_lm_config *a, const moe_lm_config *b);
/* Whether a and b give the same logits on the tokens of the fixture case `fixture`, bit for bit;
 * prints how many differ. */
int lm_same_logits(const char *what, const char *fixture, moe_lm_t *a, moe_lm_t *b);
/* Whether m saved as GGUF to a new path is MOE_ERR_ARG whose message names `setting`, with no file
 * left there; prints the status and message otherwise. */
int lm_gguf_refused(const moe_lm_t *m, const char *setting);
/* src copied to dst with tensor `drop` left out, tensor `shrink` one row shorter (of every matrix of a
 * stack), key `key` set to the string `value` ("f32:<number>": that float; NULL: the key left out)
 * (drop, shrink, key NULL: unchanged). */
moe_status lm_gguf_rewrite(const char *src, const char *dst, const char *drop, const char *shrink, const char *key,
                           const char *value);
/* Whether the last error names every one of the strings (b, c may be NULL); prints it otherwise. */
int lm_error_names(const char *a, const char *b, const char *c);
/* The fixture case `name` loaded under its config.json changed by edit(c, e); 0 after printing on a
 * failure. */
int lm_load_edited(const char *name, void (*edit)(moe_lm_config *c, int e), int e, moe_lm_t *m);
/* Whether g has key `key` of type u32 and value want; prints what it has otherwise. */
int lm_gguf_u32_is(const moe_gguf *g, const char *key, uint32_t want);
/* Whether g has tensor `name` of type `type` and ne "a b c" (absent dims 1); prints otherwise. */
int lm_gguf_tensor_is(const moe_gguf *g, const char *name, const char *ne, moe_gguf_type type);
/* hf (the fixture case `name`'s model) saved as an F32 GGUF file at gguf and read back: the same
 * config, as many parameters, the same logits bit for bit on the fixture's tokens; then saved from there
 * as a checkpoint directory and loaded: the same tensors and config. 0 after printing on a failure. */
int lm_gguf_round_trip(const char *name, moe_lm_t *hf, const char *gguf);

/* A copy of the fixture case `family`'s config.json and model.safetensors into dir (made afresh); 0 on failure. */
int lm_copy_fixture(const char *family, const char *dir);
/* The checkpoint directory src's config.json, and its model.safetensors split into n shards
 * model-0000k-of-0000n.safetensors (tensor i in shard i % n, as stored: an expert's projections in
 * different shards) named by a model.safetensors.index.json, in dir (made afresh); 0 on failure. */
int lm_shard_checkpoint(const char *src, const char *dir, int n);
/* The path of shard k (from 1) of n that lm_shard_checkpoint wrote in dir, in buf. */
const char *lm_shard_path(const char *dir, int k, int n, char *buf, size_t size);
/* The file offset of tensor name's data in dir's model.safetensors (its bytes in *nbytes), or -1. */
long long lm_st_offset(const char *dir, const char *name, size_t *nbytes);
/* A quiet NaN (F32) written at byte `at` of tensor name's data in dir's model.safetensors: the tensor's
 * file offset (its bytes in *nb), or -1. */
long long lm_st_poison(const char *dir, const char *name, long long at, size_t *nb);
/* A field of /proc/self/status in KiB ("VmRSS:", "VmHWM:"), or -1. */
long long lm_status_kib(const char *key);
/* Resets the process's peak resident memory (VmHWM) to its current (Linux 4.0 on); returns that, VmRSS in
 * KiB, or -1 when it cannot. */
long long lm_peak_reset_kib(void);

#endif
