/* See train_data.h. */
#include <errno.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "rank_errors.h"
#include "train_data.h"

static int is_dir(const char *p) {
  struct stat st;
  return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

/* The default data directory, data/mnist, is the repository's: found from the current directory, else
 * next to the build directory of this moe (so build/moe works from anywhere in a checkout). */
static const char *find_default(const char *dir, char *buf, size_t n) {
  if (strcmp(dir, DEFAULT_DATA) || is_dir(dir)) return dir;
  char exe[1024];
  ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (len <= 0) return dir;
  exe[len] = 0;
  snprintf(buf, n, "%s/../" DEFAULT_DATA, dirname(exe));
  return is_dir(buf) ? buf : dir;
}

moe_status load_split(const char *dir, const char *split, moe_dataset *d) {
  char found[1024];
  dir = find_default(dir, found, sizeof found);
  if (!is_dir(dir) && !cli_quiet_rank()) /* the loader says what it could not open; this how to get the data */
    fprintf(stderr, "moe: no data directory '%s': scripts/get-mnist.sh of the repository fetches MNIST into "
                    "data/mnist, or give --data DIR with train- and t10k- IDX files\n", dir);
  char img[1100], lab[1100];
  snprintf(img, sizeof img, "%s/%s-images-idx3-ubyte", dir, split);
  snprintf(lab, sizeof lab, "%s/%s-labels-idx1-ubyte", dir, split);
  return moe_dataset_load_idx(d, img, lab);
}

int hold_out(moe_dataset *d, int n, moe_dataset *val) {
  memset(val, 0, sizeof *val);
  if (n <= 0 || n >= d->n) return 1;
  size_t F = (size_t)d->rows * d->cols, first = (size_t)(d->n - n);
  *val = *d;
  val->n = n;
  val->images = malloc((size_t)n * F * sizeof *val->images);
  val->labels = malloc((size_t)n);
  if (!val->images || !val->labels) {
    moe_dataset_free(val);
    return 1;
  }
  memcpy(val->images, d->images + first * F, (size_t)n * F * sizeof *val->images);
  memcpy(val->labels, d->labels + first, (size_t)n);
  d->n -= n;
  return 0;
}

/* A uniform draw in [-1, 1) from the top 53 bits of h. */
static double unit_pm1(uint64_t h) { return (double)(h >> 11) * 0x1p-52 - 1.0; }

static uint64_t mix(uint64_t z) { /* splitmix64 finalizer */
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

int train_batch_init(train_batch *b, const moe_dataset *d, int B) {
  memset(b, 0, sizeof *b);
  b->d = d;
  b->B = B;
  b->perm = malloc((size_t)d->n * sizeof *b->perm);
  b->x = malloc((size_t)B * d->rows * d->cols * sizeof *b->x);
  b->y = malloc((size_t)B);
  if (!b->perm || !b->x || !b->y) {
    train_batch_free(b);
    return 1;
  }
  return 0;
}

void train_batch_free(train_batch *b) {
  free(b->perm);
  free(b->x);
  free(b->y);
  memset(b, 0, sizeof *b);
}

void train_batch_epoch(train_batch *b, uint64_t seed, int epoch, const train_augment *aug) {
  b->seed = seed;
  b->epoch = epoch;
  b->aug = *aug;
  moe_train_shuffle(b->perm, b->d->n, seed, epoch);
}

void train_batch_fill(train_batch *b, int s, int threads) {
  const moe_dataset *d = b->d;
  int R = d->rows, C = d->cols, a = b->aug.shift, warp = b->aug.rotate > 0 || b->aug.scale > 0;
#pragma omp parallel for num_threads(threads) if (warp) /* a shift alone is a copy, not worth the threads */
  for (int i = 0; i < b->B; i++) {
    int pos = s * b->B + i, idx = b->perm[pos];
    const float *src = d->images + (size_t)idx * R * C;
    float *dst = b->x + (size_t)i * R * C;
    b->y[i] = d->labels[idx];
    uint64_t h = mix(b->seed ^ mix(((uint64_t)b->epoch << 32) ^ (uint64_t)pos));
    int dy = 0, dx = 0;
    if (a > 0) { /* a random shift of up to a pixels each way, zeros shifted in */
      dy = (int)(h % (uint64_t)(2 * a + 1)) - a;
      dx = (int)((h >> 32) % (uint64_t)(2 * a + 1)) - a;
    }
    if (warp) {
      uint64_t h1 = mix(h ^ 0x5CA1E), h2 = mix(h1);
      augment_warp(src, dst, R, C, b->aug.rotate * unit_pm1(h1), 1.0 + b->aug.scale * unit_pm1(h2), dy, dx);
      continue;
    }
    for (int r = 0; r < R; r++)
      for (int c = 0; c < C; c++) {
        int sr = r - dy, sc = c - dx;
        dst[r * C + c] = sr >= 0 && sr < R && sc >= 0 && sc < C ? src[sr * C + sc] : 0.0f;
      }
  }
}

int evaluate(moe_model_t *m, const moe_dataset *d, int B, double *acc) {
  const moe_dist *dist = m->cfg.moe.dist; /* expert-parallel: each rank takes its slice of a batch */
  int W = moe_dist_size(dist), r = moe_dist_rank(dist);
  double hits = 0;
  int F = d->rows * d->cols;
  for (int s = 0; s < d->n; s += B) {
    int n = d->n - s < B ? d->n - s : B, b0 = s + n * r / W, b1 = s + n * (r + 1) / W;
    if (moe_model_forward(m, d->images + (size_t)b0 * F, NULL, b1 - b0, NULL) != MOE_OK) return 1;
    const int32_t *p = moe_model_predictions(m);
    for (int i = 0; i < b1 - b0; i++) hits += p[i] == d->labels[b0 + i];
  }
  if (dist && moe_dist_allreduce(dist, &hits, 1) != MOE_OK) return 1;
  *acc = d->n ? hits / d->n : 0;
  return 0;
}

moe_status trace_open(trace_writer *t, const char *path, int64_t from) {
  memset(t, 0, sizeof *t);
  t->path = path;
  t->f = open_memstream(&t->buf, &t->len);
  if (!t->f) {
    fprintf(stderr, "moe: trace %s: %s\n", path, strerror(errno));
    return MOE_ERR_NOMEM;
  }
  fprintf(t->f, "step,layer,expert,tokens\n");
  FILE *old = from > 0 ? fopen(path, "r") : NULL;
  if (old) { /* a resumed run: the steps before it stay in the trace */
    char line[256];
    long long s;
    while (fgets(line, sizeof line, old))
      if (sscanf(line, "%lld,", &s) == 1 && s < from) fputs(line, t->f);
    fclose(old);
  }
  return MOE_OK;
}

moe_status trace_step(trace_writer *t, const moe_model_t *m, int64_t step) {
  for (int l = 0; l < m->cfg.blocks; l++) {
    const int32_t *c = moe_model_layer_stats(m, l)->expert_counts;
    for (int e = 0; e < m->cfg.moe.E; e++)
      if (c[e] > 0) fprintf(t->f, "%lld,%d,%d,%d\n", (long long)step, l, e, c[e]);
  }
  return ferror(t->f) ? MOE_ERR_IO : MOE_OK;
}

moe_status trace_close(trace_writer *t) {
  int bad = fclose(t->f) != 0;
  t->f = NULL;
  moe_status st = bad ? MOE_ERR_NOMEM : moe_write_file_atomic(t->path, t->buf, t->len);
  if (st != MOE_OK) fprintf(stderr, "moe: cannot write trace %s: %s\n", t->path, bad ? "out of memory" : moe_last_error());
  free(t->buf);
  t->buf = NULL;
  return st;
}
