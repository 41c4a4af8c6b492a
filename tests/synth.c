/* A small synthetic IDX data set for the training tests (see synth.h). */
#include <stdlib.h>
#include <sys/stat.h>

#include "synth.h"
#include "test.h"

#define SIDE 12
static char data_dir[512];

static void put_be32(FILE *f, uint32_t v) {
  unsigned char b[4] = {v >> 24, v >> 16, v >> 8, v};
  fwrite(b, 1, 4, f);
}

static void write_split(const char *split, int n, uint64_t seed) {
  char p[700];
  snprintf(p, sizeof p, "%s/%s-images-idx3-ubyte", data_dir, split);
  FILE *fi = fopen(p, "wb");
  snprintf(p, sizeof p, "%s/%s-labels-idx1-ubyte", data_dir, split);
  FILE *fl = fopen(p, "wb");
  put_be32(fi, 0x803);
  put_be32(fi, (uint32_t)n);
  put_be32(fi, SIDE);
  put_be32(fi, SIDE);
  put_be32(fl, 0x801);
  put_be32(fl, (uint32_t)n);
  for (int i = 0; i < n; i++) {
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    int c = (int)((seed >> 33) % 10), cr = 2 + (c / 5) * 6, cc = 1 + (c % 5) * 2;
    unsigned char img[SIDE * SIDE];
    for (int j = 0; j < SIDE * SIDE; j++) {
      seed = seed * 6364136223846793005ull + 1442695040888963407ull;
      int r = j / SIDE, col = j % SIDE, near = abs(r - cr) <= 2 && abs(col - cc) <= 1;
      img[j] = (unsigned char)((near ? 150 : 0) + (seed >> 58));
    }
    fwrite(img, 1, sizeof img, fi);
    unsigned char lab = (unsigned char)c;
    fwrite(&lab, 1, 1, fl);
  }
  fclose(fi);
  fclose(fl);
}

const char *synth_data_dir(void) {
  if (data_dir[0]) return data_dir;
  test_tmp_path("synth", data_dir, sizeof data_dir);
  mkdir(data_dir, 0755);
  write_split("train", 600, 1);
  write_split("t10k", 200, 2);
  return data_dir;
}

