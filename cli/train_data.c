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
