/* The FlexMoE placement table (src/flex/): the initial placement against expert parallelism's blocks,
 * the invariant checker on broken tables, Expand / Shrink / Migrate and the transfers they return, the
 * invariants after random sequences of primitives, and the replica groups' all-reduce order. */
#include <stdint.h>

#include "flex/flex.h"
#include "flex_ops.h"
#include "test.h"

/* Rank g's slots as a string of expert ids ("01", "-"...) for messages. */
static const char *slots_of(const moe__flex_table *t, int g, char *buf) {
  for (int s = 0; s < t->Ev; s++) {
    int e = t->slot[g * t->Ev + s];
    buf[s] = e < 0 ? '-' : (char)('0' + e);
  }
  buf[t->Ev] = 0;
  return buf;
}

#define ASSERT_SLOTS(t, g, want)                                                             \
  do { char b_[64]; slots_of((t), (g), b_);                                                  \
    if (strcmp(b_, (want))) FAIL_("rank %d slots %s, want %s", (g), b_, (want)); } while (0)

TEST(flex_table_initial_placement) {
  moe__flex_table t;
  ASSERT_OK(moe__flex_table_init(&t, 2, 2, 4, 100)); /* E_v = E/W: expert parallelism's blocks */
  ASSERT_SLOTS(&t, 0, "01");
  ASSERT_SLOTS(&t, 1, "23");
  ASSERT_OK(moe__flex_table_check(&t));
  moe__flex_table_free(&t);
  ASSERT_OK(moe__flex_table_init(&t, 2, 4, 4, 100)); /* twice the slots: each rank's experts twice */
  ASSERT_SLOTS(&t, 0, "0011");
  ASSERT_SLOTS(&t, 1, "2233");
  ASSERT_EQ_INT(moe__flex_count(&t, 1, 0), 2);
  ASSERT_EQ_INT(moe__flex_count(&t, 1, 1), 0);
  ASSERT_EQ_INT(moe__flex_replicas(&t, 3), 2);
  moe__flex_table_free(&t);
  ASSERT_OK(moe__flex_table_init(&t, 4, 1, 2, 100)); /* fewer experts than ranks: replicas from the start */
  int ranks[4];
  ASSERT_EQ_INT(moe__flex_ranks(&t, 0, ranks), 2);
  ASSERT_EQ_INT(ranks[0], 0);
  ASSERT_EQ_INT(ranks[1], 1);
  ASSERT_EQ_INT(moe__flex_ranks(&t, 1, ranks), 2);
  ASSERT_EQ_INT(ranks[0], 2);
  ASSERT_OK(moe__flex_table_check(&t));
  moe__flex_table_free(&t);
  ASSERT_OK(moe__flex_table_init(&t, 3, 2, 5, 100)); /* 6 slots for 5 experts: expert 0 twice */
  ASSERT_SLOTS(&t, 0, "00");
  ASSERT_SLOTS(&t, 1, "12");
  ASSERT_SLOTS(&t, 2, "34");
  moe__flex_table_free(&t);
  ASSERT_STATUS(moe__flex_table_init(&t, 2, 1, 4, 100), MOE_ERR_ARG); /* 2 slots for 4 experts */
  ASSERT(strstr(moe_last_error(), "E_v >= E/W"));
  ASSERT_STATUS(moe__flex_table_init(&t, 0, 1, 1, 100), MOE_ERR_ARG);
  ASSERT_STATUS(moe__flex_table_init(&t, MOE__FLEX_MAX_RANKS + 1, 1, 1, 100), MOE_ERR_ARG);
}

TEST(flex_table_check_names_the_violation) {
  moe__flex_table t;
  ASSERT_OK(moe__flex_table_init(&t, 2, 2, 4, 100));
  t.slot[1] = 7; /* not an expert */
  ASSERT_STATUS(moe__flex_table_check(&t), MOE_ERR_STATE);
  ASSERT(strstr(moe_last_error(), "rank 0 slot 1 holds expert 7"));
  t.slot[1] = 0; /* counts left saying expert 1 is there */
  ASSERT_STATUS(moe__flex_table_check(&t), MOE_ERR_STATE);
  ASSERT(strstr(moe_last_error(), "expert 0 on rank 0 counted 1 replicas but its slots hold 2"));
  t.n[0 * 2 + 0] = 2, t.n[1 * 2 + 0] = 0; /* consistent now, but expert 1 has no replica */
  ASSERT_STATUS(moe__flex_table_check(&t), MOE_ERR_STATE);
  ASSERT(strstr(moe_last_error(), "expert 1 has no replica"));
  moe__flex_table_free(&t);
}

TEST(flex_expand_shrink_migrate_transfers) {
  moe__flex_table t;
  moe__flex_xfers x = {0};
  ASSERT_OK(moe__flex_table_init(&t, 4, 2, 8, 1000)); /* "01" "23" "45" "67" */
  ASSERT_STATUS(moe__flex_expand(&t, 0, 3, &x), MOE_ERR_ARG); /* rank 3 is full */
  ASSERT(strstr(moe_last_error(), "no free slot"));
  ASSERT_STATUS(moe__flex_shrink(&t, 6, 3), MOE_ERR_ARG); /* its only replica */
  ASSERT(strstr(moe_last_error(), "only replica"));
  /* Expert 0 to rank 3 and 6 to rank 0: two copies, as neither rank holds the other's expert. */
  ASSERT_OK(moe__flex_migrate(&t, 0, 0, 6, 3, &x));
  ASSERT_SLOTS(&t, 0, "61");
  ASSERT_SLOTS(&t, 3, "07");
  ASSERT_EQ_INT(x.n, 2);
  ASSERT(x.x[0].src == 0 && x.x[0].dst == 3 && x.x[0].expert == 0 && x.x[0].bytes == 1000);
  ASSERT(x.x[1].src == 3 && x.x[1].dst == 0 && x.x[1].expert == 6 && x.x[1].bytes == 1000);
  ASSERT_STATUS(moe__flex_shrink(&t, 3, 0), MOE_ERR_ARG);
  ASSERT(strstr(moe_last_error(), "rank 0 holds no replica of expert 3"));
  moe__flex_table_free(&t);
  x.n = 0;
  ASSERT_OK(moe__flex_table_init(&t, 4, 2, 4, 1000)); /* "00" "11" "22" "33" */
  ASSERT_OK(moe__flex_shrink(&t, 1, 1));               /* a tag: no transfer */
  ASSERT_SLOTS(&t, 1, "1-");
  ASSERT_EQ_INT(x.n, 0);
  ASSERT_OK(moe__flex_expand(&t, 3, 1, &x)); /* 3 is on rank 3 only: copied 3 -> 1 */
  ASSERT_SLOTS(&t, 1, "13");
  ASSERT_EQ_INT(x.n, 1);
  ASSERT(x.x[0].src == 3 && x.x[0].dst == 1 && x.x[0].expert == 3 && x.x[0].bytes == 1000);
  ASSERT_OK(moe__flex_shrink(&t, 0, 0));
  ASSERT_OK(moe__flex_expand(&t, 3, 0, &x)); /* holders 1 and 3: the nearest, rank 1, sends */
  ASSERT_EQ_INT(x.n, 2);
  ASSERT(x.x[1].src == 1 && x.x[1].dst == 0 && x.x[1].expert == 3);
  ASSERT_OK(moe__flex_shrink(&t, 2, 2));
  ASSERT_OK(moe__flex_expand(&t, 2, 2, &x)); /* back into a rank that holds it: shared weights, no copy */
  ASSERT_EQ_INT(x.n, 2);
  ASSERT_SLOTS(&t, 2, "22");
  /* Migrate copies only what the destination does not hold yet. */
  ASSERT_STATUS(moe__flex_migrate(&t, 3, 1, 1, 3, &x), MOE_ERR_ARG); /* rank 3 holds no 1 */
  ASSERT_OK(moe__flex_migrate(&t, 1, 1, 3, 3, &x)); /* 1 -> 3 copied (3 lacks 1), 3 -> 1 shared (1 has 3) */
  ASSERT_SLOTS(&t, 1, "33");
  ASSERT_SLOTS(&t, 3, "31");
  ASSERT_EQ_INT(x.n, 3);
  ASSERT(x.x[2].src == 1 && x.x[2].dst == 3 && x.x[2].expert == 1);
  ASSERT_STATUS(moe__flex_migrate(&t, 3, 1, 3, 3, &x), MOE_ERR_ARG); /* same expert */
  ASSERT_OK(moe__flex_table_check(&t));
  moe__flex_xfers_free(&x);
  moe__flex_table_free(&t);
}

TEST(flex_primitives_keep_invariants) {
  /* Random Expand/Shrink/Migrate on a 4 x 3 table of 6 experts: every accepted op keeps the invariants,
   * every refused one leaves the table as it was, and the slots on each rank stay E_v. */
  uint64_t seed = 16;
  moe__flex_table t, before;
  moe__flex_xfers x = {0};
  ASSERT_OK(moe__flex_table_init(&t, 4, 3, 6, 64));
  ASSERT_OK(moe__flex_table_clone(&before, &t));
  int accepted[3] = {0};
  for (int it = 0; it < 2000; it++) {
    moe__flex_op op = flex_random_op(&seed, 6, 4);
    moe__flex_table_assign(&before, &t);
    int n0 = x.n;
    if (moe__flex_apply(&t, &op, &x) == MOE_OK) {
      accepted[op.kind]++;
      ASSERT_OK(moe__flex_table_check(&t));
    } else {
      ASSERT(!memcmp(before.slot, t.slot, sizeof(int) * 12));
      ASSERT_EQ_INT(x.n, n0);
    }
    for (int i = n0; i < x.n; i++) /* a copy comes from a holder of the expert, to another rank */
      ASSERT(x.x[i].src != x.x[i].dst && moe__flex_count(&before, x.x[i].expert, x.x[i].src) > 0);
  }
  for (int k = 0; k < 3; k++)
    if (accepted[k] < 20) FAIL_("op kind %d accepted only %d times of 2000", k, accepted[k]);
  moe__flex_xfers_free(&x);
  moe__flex_table_free(&before);
  moe__flex_table_free(&t);
}

TEST(flex_sync_groups_ascending) {
  moe__flex_table t;
  moe__flex_xfers x = {0};
  ASSERT_OK(moe__flex_table_init(&t, 3, 2, 3, 8)); /* "00" "11" "22" */
  moe__flex_group g[3];
  int n;
  ASSERT_OK(moe__flex_sync_groups(&t, -1, g, &n));
  ASSERT_EQ_INT(n, 0); /* no expert on two ranks: nothing to sum */
  ASSERT_OK(moe__flex_migrate(&t, 2, 2, 0, 0, &x)); /* "02" "11" "20": 0 and 2 on ranks 0 and 2 */
  ASSERT_OK(moe__flex_migrate(&t, 1, 1, 2, 2, &x)); /* "02" "12" "10": 1 on 1, 2; 2 on 0, 1 */
  ASSERT_OK(moe__flex_sync_groups(&t, -1, g, &n));
  ASSERT_EQ_INT(n, 3);
  const int want[3][2] = {{0, 2}, {1, 2}, {0, 1}};
  for (int i = 0; i < 3; i++) {
    ASSERT_EQ_INT(g[i].expert, i);
    ASSERT_EQ_INT(g[i].n, 2);
    ASSERT(g[i].ranks[0] == want[i][0] && g[i].ranks[1] == want[i][1]);
  }
  /* Each rank's own calls: the groups holding it, still ascending. */
  const int mine[3][2] = {{0, 2}, {1, 2}, {0, 1}};
  for (int r = 0; r < 3; r++) {
    ASSERT_OK(moe__flex_sync_groups(&t, r, g, &n));
    ASSERT_EQ_INT(n, 2);
    ASSERT(g[0].expert == mine[r][0] && g[1].expert == mine[r][1]);
  }
  ASSERT_STATUS(moe__flex_sync_groups(&t, 3, g, &n), MOE_ERR_ARG);
  moe__flex_xfers_free(&x);
  moe__flex_table_free(&t);
}

/* The groups merged by their ranks: one communicator and one sum for the experts held by the same
 * ranks, numbered by their lowest expert; experts on one rank in none. */
TEST(flex_rank_sets_merge_groups_of_the_same_ranks) {
  moe__flex_table t;
  moe__flex_xfers x = {0};
  ASSERT_OK(moe__flex_table_init(&t, 4, 2, 4, 8)); /* "00" "11" "22" "33" */
  int set_of[4];
  uint64_t masks[4];
  ASSERT_EQ_INT(moe__flex_rank_sets(&t, set_of, masks), 0);
  for (int e = 0; e < 4; e++) ASSERT_EQ_INT(set_of[e], -1);
  ASSERT_OK(moe__flex_migrate(&t, 2, 2, 3, 3, &x)); /* "00" "11" "32" "23": 2 and 3 on ranks 2, 3 */
  ASSERT_OK(moe__flex_migrate(&t, 0, 0, 1, 1, &x)); /* "10" "01": 0 and 1 on ranks 0, 1 */
  ASSERT_EQ_INT(moe__flex_rank_sets(&t, set_of, masks), 2);
  const int want[4] = {0, 0, 1, 1};
  for (int e = 0; e < 4; e++) ASSERT_EQ_INT(set_of[e], want[e]);
  ASSERT(masks[0] == 0x3 && masks[1] == 0xC);
  ASSERT_OK(moe__flex_migrate(&t, 1, 0, 3, 2, &x)); /* "30" "01" "12" "23": 0 {0,1}, 1 {1,2}, 2 {2,3}, 3 {0,3} */
  ASSERT_EQ_INT(moe__flex_rank_sets(&t, set_of, masks), 4);
  const uint64_t m[4] = {0x3, 0x6, 0xC, 0x9};
  for (int e = 0; e < 4; e++) ASSERT(set_of[e] == e && masks[e] == m[e]);
  moe__flex_xfers_free(&x);
  moe__flex_table_free(&t);
}
