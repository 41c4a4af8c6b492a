/* moe__alloc_big: small buffers 64-byte aligned, from 4 MiB on 2 MiB aligned (whole huge pages) and
 * writable over what was asked, sizes that overflow refused; moe__calloc_big zeroes; a layer's
 * parameters, gradients and an optimizer's moments take them (the alignment shows it). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "test.h"

#define MIB ((size_t)1 << 20)

static int aligned(const void *p, size_t a) { return ((uintptr_t)p & (a - 1)) == 0; }

TEST(big_alloc_alignment_and_zeroing) {
  const size_t sizes[] = {1, 100, 4 * MIB - 1, 4 * MIB, 5 * MIB + 3};
  for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
    size_t n = sizes[i];
    unsigned char *p = moe__alloc_big(n), *z = moe__calloc_big(n, 1);
    ASSERT(p && z);
    ASSERT(aligned(p, n >= 4 * MIB ? 2 * MIB : 64));
    ASSERT(aligned(z, n >= 4 * MIB ? 2 * MIB : 64));
    memset(p, 0xab, n); /* all of it is ours (ASan would say otherwise) */
    size_t nonzero = 0;
    for (size_t j = 0; j < n; j++) nonzero += z[j] != 0;
    ASSERT_EQ_INT((int)nonzero, 0);
    free(p);
    free(z);
  }
  /* what the rounding up to whole pages, or the count times the size, would wrap */
  ASSERT(moe__alloc_big(SIZE_MAX - 100) == NULL);
  ASSERT(moe__calloc_big(SIZE_MAX / 2, 4) == NULL);
  ASSERT(moe__calloc_big(((size_t)1 << 62) + 1, 4) == NULL);
  moe_optim_config oc;
  moe_optim_config_default(&oc);
  moe_optim_t o;
  ASSERT_EQ_INT(moe_optim_init_n(&o, &oc, ((size_t)1 << 62) + 1), MOE_ERR_NOMEM);
}

TEST(big_alloc_holds_layer_and_optimizer_state) {
  moe_layer_config c;
  moe_layer_config_default(&c);
  c.E = 4, c.D = 256, c.H = 1024; /* 2 M parameters: 8 MiB each of parameters and gradients */
  moe_layer_t l;
  ASSERT_EQ_INT(moe_layer_init(&l, &c), MOE_OK);
  ASSERT(l.numel * 4 >= 4 * MIB);
  ASSERT(aligned(l.params, 2 * MIB) && aligned(l.grads, 2 * MIB));
  moe_optim_config oc;
  moe_optim_config_default(&oc);
  moe_optim_t o;
  ASSERT_EQ_INT(moe_optim_init_n(&o, &oc, l.numel), MOE_OK);
  ASSERT(aligned(o.m, 2 * MIB) && aligned(o.v, 2 * MIB));
  ASSERT(o.m[0] == 0 && o.m[l.numel - 1] == 0 && o.v[l.numel - 1] == 0);
  moe_optim_free(&o);
  moe_layer_free(&l);
}
