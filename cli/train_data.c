/* See train_data.h. */
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
