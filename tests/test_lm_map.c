/* Loading a language model by mapping its checkpoint (DESIGN 4.8c) against the copying loader
 * (MOE_NO_MMAP's): every family fixture, safetensors and GGUF, loads to the same parameters bit for bit
 * and the same logits; on a model whose tensors span pages most bytes are the file's own pages (read
 * off /proc/self/maps), gone when the model is freed; a write to a mapped weight never reaches the
 * file; a truncated file is still an error naming the tensor. */
#include <dirent.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "lm/lm_map.h"
#include "lm_check.h"
#include "test.h"

/* Loads path with mapping on or off; 0 after printing on a failure. */
static int load(const char *path, int map, moe_lm_t *m) {
  moe__lm_set_mapping(map);
  moe_status st = moe_lm_load(m, path, NULL);
  moe__lm_set_mapping(-1);
  if (st == MOE_OK) return 1;
  fprintf(stderr, "  %s (%s): %s\n", path, map ? "mapped" : "read", moe_last_error());
  return 0;
}

/* path loaded both ways: the same parameters bit for bit, and bit-identical logits on T tokens;
 * *mapped: the mapped load's mapped bytes. 0 after printing on a difference. */
static int same_both_ways(const char *path, const int32_t *tok, int T, size_t *mapped) {
  moe_lm_t a, b;
  if (!load(path, 0, &a)) return 0;
  if (!load(path, 1, &b)) return moe_lm_free(&a), 0;
  int ok = lm_same_tensors(path, &a, &b);
  *mapped = moe_lm_mapped_bytes(&b);
  if (moe_lm_mapped_bytes(&a)) ok = 0, fprintf(stderr, "  %s: the copying load maps bytes\n", path);
  int32_t *t = malloc((size_t)T * sizeof *t);
  for (int i = 0; t && i < T; i++) t[i] = tok[i] % a.cfg.vocab;
  float *la = ok && t ? lm_logits(&a, t, 1, T) : NULL, *lb = la ? lm_logits(&b, t, 1, T) : NULL;
  if (!lb || memcmp(la, lb, (size_t)T * a.cfg.vocab * sizeof *la)) {
    size_t at = 0;
    if (lb) fprintf(stderr, "  %s: logits differ by %g (at %zu)\n", path, lm_max_err(la, lb, (size_t)T * a.cfg.vocab, &at), at);
    ok = 0;
  }
  free(t), free(la), free(lb);
  moe_lm_free(&a);
  moe_lm_free(&b);
  return ok;
}

static const int32_t tokens[6] = {1, 7, 3, 12, 5, 9};

TEST(lm_map_every_fixture_matches_the_copying_load) {
  const char *sub[2] = {"lm", "gguf_lm"};
  int n = 0;
  for (int s = 0; s < 2; s++) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/%s", test_fixture_dir(), sub[s]);
    DIR *d = opendir(dir);
    ASSERT(d);
    struct dirent *e;
    while ((e = readdir(d))) {
      if (e->d_name[0] == '.') continue;
      char path[1024];
      size_t mapped;
      snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
      int ok = same_both_ways(path, tokens, 6, &mapped);
      if (!ok) closedir(d);
      ASSERT(ok);
      n++;
    }
    closedir(d);
  }
  ASSERT(n >= 19); /* the 14 Hugging Face cases and the 5 GGUF files */
}

/* A Mixtral of tensors that span pages: experts (256, 64) are 64 KiB, the embedding and head 128 KiB. */
static int paged_model(moe_lm_t *m) {
  moe_lm_config c;
  moe_lm_config_default(&c);
  c.vocab = 512, c.n_layers = 2, c.n_heads = 4, c.n_kv_heads = 2, c.head_dim = 16, c.max_seq = 32;
  c.moe.D = 64, c.moe.H = 256, c.moe.E = 4, c.moe.top_k = 2;
  if (moe_lm_init(m, &c) != MOE_OK) return 0;
  moe_lm_init_params(m, 3);
  return 1;
}

/* Whether /proc/self/maps has a mapping of `file` (a path ending so) holding address p (NULL: any). */
static int mapped_from(const char *file, const void *p) {
  FILE *f = fopen("/proc/self/maps", "r");
  char line[4096];
  int found = 0;
  size_t fl = strlen(file);
  while (f && !found && fgets(line, sizeof line, f)) {
    unsigned long lo, hi;
    int at = 0;
    if (sscanf(line, "%lx-%lx %*s %*s %*s %*s %n", &lo, &hi, &at) != 2 || !at) continue;
    char *name = line + at;
    name[strcspn(name, "\n")] = 0;
    size_t nl = strlen(name);
    found = nl >= fl && !strcmp(name + nl - fl, file) && (!p || ((uintptr_t)p >= lo && (uintptr_t)p < hi));
  }
  if (f) fclose(f);
  return found;
}

/* An address inside ref r's data that is a whole page's first byte, or NULL. */
static const void *inner_page(const moe_tensor_ref *r) {
  size_t pg = (size_t)sysconf(_SC_PAGESIZE);
  uintptr_t a = ((uintptr_t)r->data + pg - 1) / pg * pg;
  return a + pg <= (uintptr_t)(r->data + r->numel) ? (const void *)a : NULL;
}

TEST(lm_map_weights_are_the_files_pages_until_freed) {
  moe_lm_t m;
  ASSERT(paged_model(&m));
  char dir[512], gguf[512];
  ASSERT_OK(moe_lm_save(&m, test_tmp_path("lm_map_paged", dir, sizeof dir)));
  ASSERT_OK(moe_lm_save_gguf(&m, test_tmp_path("lm_map_paged.gguf", gguf, sizeof gguf), NULL));
  const char *paths[2] = {dir, gguf}, *files[2] = {"lm_map_paged/model.safetensors", "lm_map_paged.gguf"};
  for (int k = 0; k < 2; k++) {
    size_t mapped;
    ASSERT(same_both_ways(paths[k], tokens, 6, &mapped));
    moe_lm_t r;
    ASSERT(load(paths[k], 1, &r));
    ASSERT(lm_same_tensors(paths[k], &m, &r));
    /* GGUF's q and k are permuted, and pieces of pages at each run's ends are read: most, not all */
    if (moe_lm_mapped_bytes(&r) < r.numel * 4 / 2) {
      fprintf(stderr, "  %s: %zu of %zu bytes mapped\n", paths[k], moe_lm_mapped_bytes(&r), r.numel * 4);
      moe_lm_free(&r);
      ASSERT(0);
    }
    const moe_tensor_ref *e = moe_lm_find(&r, "model.layers.1.block_sparse_moe.experts.3.w2.weight"),
                         *emb = moe_lm_find(&r, "model.embed_tokens.weight");
    int ok = e && emb && inner_page(e) && mapped_from(files[k], inner_page(e)) && mapped_from(files[k], inner_page(emb));
    moe_lm_free(&r);
    ASSERT(ok);
    ASSERT(!mapped_from(files[k], NULL)); /* moe_lm_free unmapped it */
  }
  moe_lm_free(&m);
}

/* A GGUF file whose experts, attention and head stay in their stored type (Q8_0): mapped, they are
 * the file's pages; read, the file's bytes in anonymous memory (2 MiB pages: lm_map.h), none of it
 * mapped while the model lives; the same logits either way. */
TEST(lm_map_quantized_gguf_mapped_or_read_in) {
  moe_lm_t m;
  ASSERT(paged_model(&m));
  char gguf[512];
  moe_lm_gguf_options o = {MOE_GGUF_Q8_0, NULL, NULL};
  ASSERT_OK(moe_lm_save_gguf(&m, test_tmp_path("lm_map_q8.gguf", gguf, sizeof gguf), &o));
  moe_lm_free(&m);
  size_t mapped;
  ASSERT(same_both_ways(gguf, tokens, 6, &mapped));
  ASSERT(mapped > 0);
  moe_lm_t a, b;
  ASSERT(load(gguf, 1, &a));
  int in_a = mapped_from("lm_map_q8.gguf", NULL);
  moe_lm_free(&a);
  ASSERT(load(gguf, 0, &b));
  int in_b = mapped_from("lm_map_q8.gguf", NULL);
  size_t mb = moe_lm_mapped_bytes(&b);
  int q8 = b.cfg.moe.expert_type == MOE_GGUF_Q8_0;
  moe_lm_free(&b);
  ASSERT(q8);
  ASSERT(in_a);
  ASSERT(!in_b);
  ASSERT(mb == 0);
}

/* MOE_NO_MMAP 1 reads, 0 maps; otherwise a load reads what fits in half the memory available, and maps
 * when that is unknown. */
TEST(lm_map_choice_follows_the_environment_and_the_memory) {
  ASSERT(moe__lm_map_choice("1", 10, 1000) == 0);
  ASSERT(moe__lm_map_choice("0", 10, 1000) == 1);
  ASSERT(moe__lm_map_choice("0", 900, 1000) == 1);
  ASSERT(moe__lm_map_choice("1", 900, 1000) == 0);
  ASSERT(moe__lm_map_choice(NULL, 500, 1000) == 0);
  ASSERT(moe__lm_map_choice(NULL, 501, 1000) == 1);
  ASSERT(moe__lm_map_choice("yes", 400, 1000) == 0);
  ASSERT(moe__lm_map_choice(NULL, 10, 0) == 1);
}

/* The whole file, malloc'd, its size in *n. */
static unsigned char *slurp(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  *n = (size_t)ftell(f);
  rewind(f);
  unsigned char *b = malloc(*n);
  if (b && fread(b, 1, *n, f) != *n) free(b), b = NULL;
  fclose(f);
  return b;
}

TEST(lm_map_writes_copy_the_page_not_the_file) {
  moe_lm_t m, r;
  ASSERT(paged_model(&m));
  char dir[512], file[600];
  ASSERT_OK(moe_lm_save(&m, test_tmp_path("lm_map_write", dir, sizeof dir)));
  moe_lm_free(&m);
  snprintf(file, sizeof file, "%s/model.safetensors", dir);
  size_t n0, n1;
  unsigned char *before = slurp(file, &n0);
  ASSERT(before);
  ASSERT(load(dir, 1, &r));
  const moe_tensor_ref *e = moe_lm_find(&r, "model.layers.0.block_sparse_moe.experts.1.w1.weight");
  float *w = e ? (float *)inner_page(e) : NULL;
  int was_mapped = w && mapped_from("lm_map_write/model.safetensors", w);
  if (w) w[0] = 42.0f; /* a training step's write */
  int kept = w && w[0] == 42.0f;
  moe_lm_init_params(&r, 9); /* writes every parameter */
  moe_lm_free(&r);
  unsigned char *after = slurp(file, &n1);
  int same = after && n0 == n1 && !memcmp(before, after, n0);
  free(before), free(after);
  ASSERT(was_mapped);
  ASSERT(kept);
  ASSERT(same);
}

TEST(lm_map_truncated_file_names_the_tensor) {
  moe_lm_t m;
  ASSERT(paged_model(&m));
  char dir[512], gguf[512], file[600];
  ASSERT_OK(moe_lm_save(&m, test_tmp_path("lm_map_cut", dir, sizeof dir)));
  ASSERT_OK(moe_lm_save_gguf(&m, test_tmp_path("lm_map_cut.gguf", gguf, sizeof gguf), NULL));
  moe_lm_free(&m);
  snprintf(file, sizeof file, "%s/model.safetensors", dir);
  const char *cut[2] = {file, gguf}, *load_from[2] = {dir, gguf};
  for (int k = 0; k < 2; k++) {
    size_t n;
    unsigned char *b = slurp(cut[k], &n);
    ASSERT(b);
    free(b);
    ASSERT(truncate(cut[k], (off_t)(n - 100000)) == 0);
    moe_lm_t r;
    moe__lm_set_mapping(1);
    moe_status st = moe_lm_load(&r, load_from[k], NULL);
    moe__lm_set_mapping(-1);
    if (st == MOE_OK) moe_lm_free(&r);
    ASSERT(st != MOE_OK);
    if (!strstr(moe_last_error(), "tensor '")) FAIL_("%s: no tensor named in: %s", cut[k], moe_last_error());
  }
}
