/* A check that fails on one rank only (a NaN among its tokens, a backward missing its dx) is an error on
 * every rank at the layer's next collective, not a hang with the others waiting in an exchange. The
 * test runs itself under mpirun -np 2 (the child's role is the same test, under an MPI launcher). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "run_cli.h"
#include "test.h"

enum { D = 8, H = 16, E = 4, T = 6 };

/* On each of the two ranks: the failure of one is returned on both, with a message naming it. */
static void child(int *failed_) {
  moe_dist *d = NULL;
  ASSERT_OK(moe_dist_init(&d, NULL, NULL));
  int rank = moe_dist_rank(d);
  ASSERT_EQ_INT(moe_dist_size(d), 2);
  moe_layer_config cfg;
  moe_layer_config_default(&cfg);
  cfg.D = D, cfg.H = H, cfg.E = E, cfg.threads = 1, cfg.dist = d;
  moe_layer_t l;
  ASSERT_OK(moe_layer_init(&l, &cfg));
  moe_layer_init_params(&l, 1);
  static float x[T * D], y[T * D], dx[T * D];
  for (int i = 0; i < T * D; i++) x[i] = (float)((i * 37 + rank * 11) % 17) / 17.0f - 0.5f;
  float keep = x[3];
  if (rank == 1) x[3] = NAN;
  moe_status st = moe_layer_forward(&l, x, T, y, NULL, NULL);
  if (rank == 1) ASSERT(st == MOE_ERR_VALUE && strstr(moe_last_error(), "inputs must be finite"));
  else if (st != MOE_ERR_STATE || !strstr(moe_last_error(), "rank 1 of 2 failed"))
    FAIL_("rank 0: forward gave %d (%s), want MOE_ERR_STATE naming rank 1", st, moe_last_error());
  x[3] = keep;
  ASSERT_OK(moe_layer_forward(&l, x, T, y, NULL, NULL)); /* nothing was left half done */
  st = moe_layer_backward(&l, y, 0.0f, 0.0f, NULL, NULL, rank == 0 ? NULL : dx);
  if (rank == 0) ASSERT(st == MOE_ERR_ARG && strstr(moe_last_error(), "dx must not be NULL"));
  else if (st != MOE_ERR_STATE || !strstr(moe_last_error(), "rank 0 of 2 failed"))
    FAIL_("rank 1: backward gave %d (%s), want MOE_ERR_STATE naming rank 0", st, moe_last_error());
  ASSERT_OK(moe_layer_backward(&l, y, 0.0f, 0.0f, NULL, NULL, dx)); /* the forward is still there */
  moe_layer_free(&l);
  moe_dist_finalize(d);
}

TEST(ep_one_rank_fails_every_rank_returns) {
  if (getenv("OMPI_COMM_WORLD_SIZE")) { /* the child */
    child(failed_);
    return;
  }
  if (!test_have_mpirun()) return;
  char cmd[1024], out[8192];
  int rc = test_mpirun_self(2, "ep_one_rank_fails_every_rank_returns", 120, cmd, sizeof cmd, out, sizeof out);
  if (rc) /* 124 in the status: a rank hung in an exchange */
    FAIL_("%s: status %d, output:\n%s", cmd, rc, out);
}
