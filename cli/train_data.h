/* What moe train and moe eval share: loading a split of an IDX data directory. */
#ifndef MOE_TRAIN_DATA_H
#define MOE_TRAIN_DATA_H

#include <stdio.h>

#include "moe.h"

/* The default --data: the repository's MNIST (scripts/get-mnist.sh). */
#define DEFAULT_DATA "data/mnist"
/* split "train" or "t10k": DIR/<split>-images-idx3-ubyte and DIR/<split>-labels-idx1-ubyte. DEFAULT_DATA
 * is looked for in the current directory, then beside the build directory of this moe. */
moe_status load_split(const char *dir, const char *split, moe_dataset *d);

#endif
